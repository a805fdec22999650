"""Subcommands ``validate`` and ``export`` (thin wrappers over the pipeline stages)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from grouppref.commands.core import report_stage
from grouppref.commands.options import help_of
from grouppref.pipeline.export import ExportConfig, run_export
from grouppref.pipeline.store import RunStore
from grouppref.pipeline.validate import CHECKS, ValidateConfig, load_report, run_validate

console = Console()

RunArg = Annotated[Path, typer.Argument(help="Run directory, e.g. runs/demo.")]
V, E = ValidateConfig, ExportConfig


def validate(
    run: RunArg,
    test_fraction: Annotated[float, typer.Option(help=help_of(V, "test_fraction"))] = 0.1,
    seed: Annotated[int, typer.Option(help=help_of(V, "seed"))] = 0,
    split_by: Annotated[str, typer.Option(help=help_of(V, "split_by"))] = "prompt",
    min_pairs: Annotated[int, typer.Option(help=help_of(V, "min_pairs"))] = 1,
    reject_flag: Annotated[list[str] | None, typer.Option(
        help=help_of(V, "reject_flags") + " Repeat the option for several.")] = None,
    shard_size: Annotated[int, typer.Option(help=help_of(V, "shard_size"))] = 1000,
    force: Annotated[bool, typer.Option("--force", help="Re-run even when cached.")] = False,
) -> None:
    """Check RUN/aggregate (schemas, duplicates, ranges), split train/test by prompt, report."""
    config = ValidateConfig(test_fraction=test_fraction, seed=seed, split_by=split_by,
                            min_pairs=min_pairs, reject_flags=reject_flag or [],
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
        table.add_row(check, str(report.checks[check]),
                      f"{where}: {first.reason}" if first else "", style="red" if first else "")
    console.print(table)
    splits = ", ".join(f"{s}: {v['groups']} groups / {v['pairs']} pairs"
                       for s, v in report.splits.items())
    console.print(f"splits: {splits}; prompts in both splits: {report.prompt_overlap}")
    report_stage(stage.manifest.stage, stage.cached, stage.manifest.counts.model_dump(),
                 stage.dir, [], max_lines=0)
    if report.rejected:
        console.print(f"rejected rows, one per line: {stage.dir / 'rejects.jsonl'}; "
                      f"report: {stage.dir / 'report.json'}")
