"""``grouppref run CONFIG`` and ``grouppref report RUN``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from grouppref.commands.arguments import AllowStale, RunArg, StaleRunExtras
from grouppref.commands.options import Extra, config_command
from grouppref.commands.output import err, esc, out
from grouppref.errors import StageError
from grouppref.pipeline.report.config import ReportConfig
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.stages import NAMES

_STAGES = ", ".join(s for s in NAMES if s != "import")


def print_outcome(outcome: Any, run_dir: str) -> None:
    """The closing lines of a run: where everything is, or what it waits for."""
    if outcome.status == "waiting":
        err.print(f"[yellow]{esc(outcome.message)}[/]")
        err.print(f"state saved in {esc(run_dir)}; run the same command again to go on (or add "
                  "--wait)")
        return
    out.print(f"[bold green]run complete[/]: {esc(run_dir)} (computed: "
              f"{', '.join(outcome.ran) or 'nothing'}; cached: "
              f"{', '.join(outcome.cached) or 'nothing'})")
    if outcome.report:
        out.print(f"report: {esc(str(outcome.report))}")
    out.print(f"inspect it: grouppref inspect {esc(run_dir)}")


def run(
    config: Annotated[Path, typer.Argument(help="Run config (YAML, TOML or JSON).", metavar="CONFIG",
                                           show_default=False)],
    start: Annotated[str | None, typer.Option(
        "--from", help=f"First stage to run ({_STAGES}).", show_default=False)] = None,
    until: Annotated[str | None, typer.Option(help="Last stage to run.", show_default=False)] = None,
    force: Annotated[list[str] | None, typer.Option(
        help="Re-run this stage even when cached (repeatable; 'all' for every stage).",
        show_default=False)] = None,
    wait: Annotated[bool, typer.Option(help="Poll Argilla until enough human rankings are in "
                                       "instead of stopping.")] = False,
    run_dir: Annotated[str | None, typer.Option(help="Override the config's run_dir.",
                                                show_default=False)] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override one setting: KEY.PATH=VALUE (VALUE is YAML), e.g. "
        "--set rank.rankers.0.model=path/to/rm (repeatable).", show_default=False)] = None,
    allow_stale: AllowStale = False,
) -> None:
    """Run the stages of CONFIG in order; unchanged stages are skipped (cached)."""
    from grouppref.runner import check_stages, load_run_config, run_pipeline

    check_stages(start, until, force)  # before reading anything
    cfg = load_run_config(config, set_, run_dir)
    outcome = run_pipeline(cfg, start=start, until=until, force=force, wait=wait, console=err,
                           allow_stale=allow_stale, source=str(config))
    print_outcome(outcome, cfg.run_dir)


def _report(config: ReportConfig, extras: StaleRunExtras, force: bool) -> None:
    from grouppref.pipeline.report.stage import run_report

    store = RunStore(extras["run"])
    if not store.manifests():
        raise StageError(f"{extras['run']}: no stage has run here; give a run directory")
    stage = run_report(store, config,
                       StageContext(force=force, allow_stale=extras["allow_stale"]))
    out.print(f"report: {esc(stage.outputs['html'])}")


report = config_command(
    ReportConfig, _report, name="report", section="report",
    extras=[Extra("run", RunArg), Extra("allow_stale", AllowStale, False)],
    doc="Write the run's self-contained HTML report (no external requests).",
    force_help="Render again even when no stage changed.")


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(report)
