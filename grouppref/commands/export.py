"""Subcommands ``validate`` and ``export`` (thin wrappers over the pipeline stages)."""

from __future__ import annotations

import typer
from rich.table import Table

from grouppref.commands.arguments import AllowStale, RunArg, RunExtras, StaleRunExtras
from grouppref.commands.options import Extra, config_command
from grouppref.commands.output import err, esc, out, print_stage
from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas.reports import ExportReport


def _run_validate(config: ValidateConfig, extras: RunExtras, force: bool) -> None:
    from grouppref.pipeline.validate.core import CHECKS
    from grouppref.pipeline.validate.stage import load_report, run_validate

    store = RunStore(extras["run"])
    stage = run_validate(store, config, StageContext(force=force))
    report = load_report(store)
    table = Table(title=f"validate {extras['run']}")
    for col in ("check", "failed", "first failure"):
        table.add_column(col, justify="right" if col == "failed" else "left", overflow="fold")
    for check in CHECKS:
        first = next((f for f in report.failures if f.check == check), None)
        where = f"row {first.row}" + (f", {first.field}" if first.field else "") if first else ""
        reason = first.reason.removeprefix(f"{check}: ") if first else ""
        table.add_row(check, str(report.checks[check]), esc(f"{where}: {reason}") if first else "",
                      style="red" if first else "")
    out.print(table)
    splits = ", ".join(f"{s}: {v['groups']} groups / {v['pairs']} pairs"
                       for s, v in report.splits.items())
    out.print(f"splits: {splits}; prompts in both splits: {report.prompt_overlap}")
    print_stage(stage, max_rejects=0)
    if report.rejected:
        err.print(f"rejected rows, one per line: {esc(str(stage.dir / 'rejects.jsonl'))}; "
                  f"report: {esc(str(stage.dir / 'report.json'))}")


validate = config_command(
    ValidateConfig, _run_validate, name="validate", section="validate",
    doc="Check RUN/aggregate (schemas, duplicates, ranges), split train/test by prompt, report.",
    extras=[Extra("run", RunArg)], rename={"reject_flags": "--reject-flag"})


def _run_export(config: ExportConfig, extras: StaleRunExtras, force: bool) -> None:
    from grouppref.pipeline.export.stage import run_export

    stage = run_export(RunStore(extras["run"]), config,
                       StageContext(force=force, allow_stale=extras["allow_stale"]))
    for reject in stage.rejects()[:20]:
        err.print(f"[red]left out[/] {esc(reject.one_line())}")
    report = ExportReport.model_validate(stage.manifest.stats)
    rows = ", ".join(f"{s}: {n}" for s, n in report.rows.items())
    skipped = f"; pairs left out: {report.skipped_pairs}" if report.skipped_pairs else ""
    cached = " [yellow](cached: same settings and input; --force exports again)[/]" if stage.cached else ""
    out.print(f"[green]export[/] ({config.format}) {rows} rows{esc(skipped)} -> "
              f"{esc(report.location)}{cached}")
    for name in report.files:
        out.print(f"  {esc(name)}")


export = config_command(
    ExportConfig, _run_export, name="export", section="export",
    doc="Export RUN/validate as groups or TRL pairs to a directory, a Parquet file or the Hub.",
    extras=[Extra("run", RunArg), Extra("allow_stale", AllowStale, False)],
    rename={"to_dir": "--to", "private": "--private"},
    force_help="Export again even when the same export of the same input exists.")


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.command()(export)
