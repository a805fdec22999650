"""Core subcommands: ``schema``, ``prompts``, ``inspect``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from grouppref.commands.arguments import OutExtras, OutOpt, RunArg
from grouppref.commands.options import Extra, config_command
from grouppref.commands.output import err, esc, out, print_stage
from grouppref.errors import ConfigError
from grouppref.pipeline.prompts.config import PromptsConfig
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.stages import position


def schema(
    name: Annotated[str | None, typer.Argument(
        help="Record name; all records when left out.", metavar="NAME")] = None,
) -> None:
    """Print the JSON Schema of a record (or of all records)."""
    from grouppref.schemas.records import RECORD_TYPES

    if name is None:
        found = {n: cls.model_json_schema() for n, cls in RECORD_TYPES.items()}
    elif name in RECORD_TYPES:
        found = RECORD_TYPES[name].model_json_schema()
    else:
        raise ConfigError(f"unknown record {name!r}; choose one of {', '.join(RECORD_TYPES)}")
    typer.echo(json.dumps(found, indent=2))


def _run_prompts(config: PromptsConfig, extras: OutExtras, force: bool) -> None:
    from grouppref.pipeline.prompts.stage import run_prompts

    print_stage(run_prompts(RunStore(extras["out"]), config, StageContext(force=force)))


prompts = config_command(
    PromptsConfig, _run_prompts, name="prompts", section="prompts",
    doc="Read and validate prompts into RUN/prompts (bad rows go to rejects.jsonl).",
    positional={"source": "Prompt file (JSONL/JSON/CSV/Parquet), saved dataset dir or Hub id."},
    extras=[Extra("out", OutOpt)], flatten={"mapping": "{}-column"},
    rename={"mapping.metadata_columns": "--metadata-column", "mapping.prompt_id": "--id-column",
            "mapping.metadata": "--metadata-object-column",
            "mapping.duplicate_ids": "--duplicate-ids"},
    exclude={"mapping.responses", "mapping.response"})


def _order(stage: str) -> tuple[int, str]:
    return (position(stage), stage)


def _status(store: RunStore, m: Any, record: Any) -> tuple[str, str | None]:
    """A stage's status cell and row style: not in this run, stale, or its own status."""
    from grouppref.runs.freshness import outside_run, stale_causes

    if outside_run(m, record):
        return "not in this run (made before it, not by its config)", "dim"
    stale = stale_causes(store, m.stage) if m.status == "complete" else []
    if stale:
        return f"stale (input changed: {', '.join(stale)})", "yellow"
    if m.status == "running" and m.stopped:
        return f"stopped ({m.stopped}); run it again to resume", "red"
    return m.status, None


def inspect(run: RunArg) -> None:
    """Show a run's stages in pipeline order: status (stale when an input changed since, not in
    this run when the last `grouppref run` did not make or read it), counts, rejects, timings."""
    from grouppref.runs.freshness import RUN_FILE, read_run_record

    store = RunStore(run)
    manifests = sorted(store.manifests(), key=lambda m: _order(m.stage))
    if not manifests:
        raise ConfigError(f"{run}: no stage has run here (no */manifest.json)")
    record = read_run_record(store)
    table = Table(title=f"run {esc(str(run))}")
    for col in ("stage", "status", "in", "out", "rejected", "partial", "seconds", "finished"):
        table.add_column(col, justify="right" if col in ("in", "out", "rejected", "partial",
                                                          "seconds") else "left")
    for m in manifests:
        c = m.counts
        status, style = _status(store, m, record)
        table.add_row(esc(m.stage), esc(status), str(c.inputs), str(c.outputs), str(c.rejected),
                      str(c.partial), f"{m.seconds:.1f}" if m.seconds is not None else "-",
                      m.finished_at.strftime("%Y-%m-%d %H:%M:%S") if m.finished_at else "-",
                      style=style)
    out.print(table)
    if record is not None:
        out.print(f"last `grouppref run`: {esc(record.config)} ({record.status}, started "
                  f"{record.started_at:%Y-%m-%d %H:%M:%S} UTC, config hash "
                  f"{record.config_hash[:12]}; {esc(str(store.root / RUN_FILE))})")
    for m in manifests:
        rejects = store.stage_dir(m.stage) / "rejects.jsonl"
        if rejects.exists() and rejects.stat().st_size:
            err.print(f"rejects of {esc(m.stage)}: {esc(str(rejects))}")


def register(app: typer.Typer) -> None:
    app.command()(schema)
    app.command()(prompts)
    app.command()(inspect)
