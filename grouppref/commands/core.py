"""Core subcommands: ``schema``, ``prompts``, ``inspect``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from grouppref.errors import ConfigError
from grouppref.pipeline.prompts.stage import PromptsConfig, run_prompts
from grouppref.readers.rows import ColumnMapping
from grouppref.runs.store import RunStore
from grouppref.schemas import RECORD_TYPES

console = Console()

RunArg = Annotated[Path, typer.Argument(help="Run directory, e.g. runs/demo.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Re-run even when the cache is valid.")]


def schema(
    name: Annotated[str | None, typer.Argument(help="Record name; all records when left out.")] = None,
) -> None:
    """Print the JSON Schema of a record (or of all records)."""
    if name is None:
        out = {n: cls.model_json_schema() for n, cls in RECORD_TYPES.items()}
    elif name in RECORD_TYPES:
        out = RECORD_TYPES[name].model_json_schema()
    else:
        raise ConfigError(f"unknown record {name!r}; choose one of {', '.join(RECORD_TYPES)}")
    typer.echo(json.dumps(out, indent=2))


def prompts(
    source: Annotated[str, typer.Argument(help="Prompt file, saved dataset dir or Hub id.")],
    out: Annotated[Path, typer.Option("--out", help="Run directory to write into.")],
    text_column: Annotated[str, typer.Option(help="Column with plain-text prompts.")] = "prompt",
    messages_column: Annotated[str, typer.Option(help="Column with chat messages.")] = "messages",
    id_column: Annotated[str, typer.Option(help="Column with prompt ids.")] = "prompt_id",
    reference_column: Annotated[str, typer.Option(help="Column with reference answers.")] = "reference",
    metadata_column: Annotated[list[str] | None, typer.Option(help="Column copied to metadata.")] = None,
    split: Annotated[str, typer.Option(help="Split of a dataset with splits.")] = "train",
    force: ForceOpt = False,
) -> None:
    """Read and validate prompts into RUN/prompts (bad rows go to rejects.jsonl)."""
    mapping = ColumnMapping(text=text_column, messages=messages_column, prompt_id=id_column,
                            reference=reference_column, metadata_columns=metadata_column or [])
    stage = run_prompts(RunStore(out), PromptsConfig(source=source, split=split, mapping=mapping),
                        force=force)
    report_stage(stage.manifest.stage, stage.cached, stage.manifest.counts.model_dump(),
                 stage.dir, [r.one_line() for r in stage.rejects()])


def report_stage(name: str, cached: bool, counts: dict[str, int], where: Path,
                 reject_lines: list[str], max_lines: int = 20) -> None:
    """Print what a stage did: cached or not, counts, where, and each reject on one line."""
    if cached:
        console.print(f"[yellow]{name}: unchanged config and input, skipped[/] "
                      f"(use --force to re-run) -> {where}")
    for line in reject_lines[:max_lines]:
        console.print(f"[red]reject[/] {line}", highlight=False, soft_wrap=True)
    if len(reject_lines) > max_lines:
        console.print(f"... and {len(reject_lines) - max_lines} more in {where / 'rejects.jsonl'}")
    console.print(f"[green]{name}[/]: {counts['inputs']} in, {counts['outputs']} out, "
                  f"{counts['rejected']} rejected -> {where}")


def inspect(run: RunArg) -> None:
    """Show a run's stages, counts, rejects and timings."""
    store = RunStore(run)
    manifests = store.manifests()
    if not manifests:
        raise ConfigError(f"{run}: no stage has run here (no */manifest.json)")
    table = Table(title=f"run {run}")
    for col in ("stage", "status", "in", "out", "rejected", "partial", "seconds", "finished"):
        table.add_column(col, justify="right" if col in ("in", "out", "rejected", "partial",
                                                          "seconds") else "left")
    for m in manifests:
        c = m.counts
        table.add_row(m.stage, m.status, str(c.inputs), str(c.outputs), str(c.rejected),
                      str(c.partial), f"{m.seconds:.1f}" if m.seconds is not None else "-",
                      m.finished_at.strftime("%Y-%m-%d %H:%M:%S") if m.finished_at else "-")
    console.print(table)
    for m in manifests:
        rejects = store.stage_dir(m.stage) / "rejects.jsonl"
        if rejects.exists() and rejects.stat().st_size:
            console.print(f"rejects of {m.stage}: {rejects}")


def register(app: typer.Typer) -> None:
    app.command()(schema)
    app.command()(prompts)
    app.command()(inspect)
