"""Subcommands ``validate`` and ``export`` (thin wrappers over the pipeline stages)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

from grouppref.commands.core import report_stage
from grouppref.commands.options import help_of
from grouppref.errors import ConfigError
from grouppref.pipeline.export.stage import ExportConfig, run_export
from grouppref.pipeline.validate.stage import CHECKS, ValidateConfig, load_report, run_validate
from grouppref.runs.store import RunStore

console = Console()

RunArg = Annotated[Path, typer.Argument(help="Run directory, e.g. runs/demo.")]
V, E = ValidateConfig, ExportConfig
SplitBy = Literal["prompt", "prompt_text"]
Format = Literal["groups", "trl-pairs"]
Pairs = Literal["consensus", "best_worst"]
Chat = Literal["auto", "always"]


def _build(model: type[BaseModel], command: str, **values: Any) -> Any:
    """Validate settings; a pydantic error becomes one ``ConfigError`` line naming the option."""
    try:
        return model(**values)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        option = f"--{where.replace('_', '-')}: " if where else ""
        raise ConfigError(f"{command}: {option}{first['msg'].removeprefix('Value error, ')}"
                          ) from e


def validate(
    run: RunArg,
    test_fraction: Annotated[float, typer.Option(help=help_of(V, "test_fraction"))] = 0.1,
    seed: Annotated[int, typer.Option(help=help_of(V, "seed"))] = 0,
    split_by: Annotated[SplitBy, typer.Option(help=help_of(V, "split_by"))] = "prompt",
    min_pairs: Annotated[int, typer.Option(help=help_of(V, "min_pairs"))] = 1,
    reject_flag: Annotated[list[str] | None, typer.Option(
        help=help_of(V, "reject_flags") + " Repeat the option for several.")] = None,
    shard_size: Annotated[int, typer.Option(help=help_of(V, "shard_size"))] = 1000,
    force: Annotated[bool, typer.Option("--force", help="Re-run even when cached.")] = False,
) -> None:
    """Check RUN/aggregate (schemas, duplicates, ranges), split train/test by prompt, report."""
    config = _build(ValidateConfig, "validate", test_fraction=test_fraction, seed=seed,
                    split_by=split_by, min_pairs=min_pairs, reject_flags=reject_flag or [],
                    shard_size=shard_size)
    store = RunStore(run)
    stage = run_validate(store, config, force=force)
    report = load_report(store)
    table = Table(title=f"validate {run}")
    for col in ("check", "failed", "first failure"):
        table.add_column(col, justify="right" if col == "failed" else "left")
    for check in CHECKS:
        first = next((f for f in report.failures if f.check == check), None)
        where = f"row {first.row}" + (f", {first.field}" if first.field else "") if first else ""
        reason = first.reason.removeprefix(f"{check}: ") if first else ""
        table.add_row(check, str(report.checks[check]), f"{where}: {reason}" if first else "",
                      style="red" if first else "")
    console.print(table)
    splits = ", ".join(f"{s}: {v['groups']} groups / {v['pairs']} pairs"
                       for s, v in report.splits.items())
    console.print(f"splits: {splits}; prompts in both splits: {report.prompt_overlap}")
    report_stage(stage.manifest.stage, stage.cached, stage.manifest.counts.model_dump(),
                 stage.dir, [], max_lines=0)
    if report.rejected:
        console.print(f"rejected rows, one per line: {stage.dir / 'rejects.jsonl'}; "
                      f"report: {stage.dir / 'report.json'}")


def export(
    run: RunArg,
    to: Annotated[Path | None, typer.Option("--to", help=help_of(E, "to_dir"))] = None,
    parquet: Annotated[Path | None, typer.Option("--parquet", help=help_of(E, "parquet"))] = None,
    hub: Annotated[str | None, typer.Option("--hub", help=help_of(E, "hub"))] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=help_of(E, "dry_run"))] = False,
    dry_run_dir: Annotated[Path | None, typer.Option(help=help_of(E, "dry_run_dir"))] = None,
    format: Annotated[Format, typer.Option("--format", help=help_of(E, "format"))] = "groups",
    pairs: Annotated[Pairs, typer.Option(help=help_of(E, "pairs"))] = "consensus",
    min_weight: Annotated[float, typer.Option(help=help_of(E, "min_weight"))] = 0.0,
    chat: Annotated[Chat, typer.Option(help=help_of(E, "chat"))] = "auto",
    license: Annotated[str, typer.Option(help=help_of(E, "license"))] = "other",
    pretty_name: Annotated[str | None, typer.Option(help=help_of(E, "pretty_name"))] = None,
    private: Annotated[bool, typer.Option("--private/--public",
                                          help=help_of(E, "private"))] = True,
    max_shard_size: Annotated[str, typer.Option(help=help_of(E, "max_shard_size"))] = "500MB",
) -> None:
    """Export RUN/validate as groups or TRL pairs to a directory, a Parquet file or the Hub."""
    config = _build(
        ExportConfig, "export", format=format, to_dir=str(to) if to else None,
        parquet=str(parquet) if parquet else None,
        hub=hub, dry_run=dry_run, dry_run_dir=str(dry_run_dir) if dry_run_dir else None,
        pairs=pairs, min_weight=min_weight, chat=chat, license=license, pretty_name=pretty_name,
        private=private, max_shard_size=max_shard_size)
    result = run_export(RunStore(run), config)
    for reject in result.rejects[:20]:
        console.print(f"[red]left out[/] {reject.one_line()}", highlight=False, soft_wrap=True)
    rows = ", ".join(f"{s}: {n}" for s, n in result.rows.items())
    skipped = f"; pairs left out: {result.skipped_pairs}" if result.skipped_pairs else ""
    console.print(f"[green]export[/] ({config.format}) {rows} rows{skipped} -> {result.location}")
    for name in result.files:
        console.print(f"  {name}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.command()(export)
