"""``grouppref run CONFIG`` and ``grouppref report RUN``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from grouppref.errors import StageError
from grouppref.pipeline.report.stage import ReportConfig, run_report
from grouppref.runner import STAGES, RunOutcome, check_stages, load_run_config, run_pipeline
from grouppref.runs.store import RunStore

console = Console()
_STAGES = ", ".join(STAGES)


def print_outcome(outcome: RunOutcome, run_dir: str) -> None:
    """The closing lines of a run: where everything is, or what it waits for."""
    if outcome.status == "waiting":
        console.print(f"[yellow]{outcome.message}[/]", highlight=False, soft_wrap=True)
        console.print(f"state saved in {run_dir}; run the same command again to go on "
                      "(or add --wait)", highlight=False, soft_wrap=True)
        return
    console.print(f"[bold green]run complete[/]: {run_dir} (computed: "
                  f"{', '.join(outcome.ran) or 'nothing'}; cached: "
                  f"{', '.join(outcome.cached) or 'nothing'})", highlight=False, soft_wrap=True)
    if outcome.report:
        console.print(f"report: {outcome.report}", highlight=False, soft_wrap=True)
    console.print(f"inspect it: grouppref inspect {run_dir}", highlight=False, soft_wrap=True)


def run(
    config: Annotated[Path, typer.Argument(help="Run config (YAML or TOML).")],
    start: Annotated[str | None, typer.Option(
        "--from", help=f"First stage to run ({_STAGES}).")] = None,
    until: Annotated[str | None, typer.Option(help="Last stage to run.")] = None,
    force: Annotated[list[str] | None, typer.Option(
        help="Re-run this stage even when cached (repeatable; 'all' for every stage).")] = None,
    wait: Annotated[bool, typer.Option(help="Poll Argilla until enough human rankings are in "
                                       "instead of stopping.")] = False,
    run_dir: Annotated[str | None, typer.Option(help="Override the config's run_dir.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override one setting: KEY.PATH=VALUE (VALUE is YAML), e.g. "
        "--set rank.rankers.0.model=path/to/rm (repeatable).")] = None,
) -> None:
    """Run the stages of CONFIG in order; unchanged stages are skipped (cached)."""
    check_stages(start, until, force)  # before reading anything
    cfg = load_run_config(config, set_, run_dir)
    outcome = run_pipeline(cfg, start=start, until=until, force=force, wait=wait,
                           console=console)
    print_outcome(outcome, cfg.run_dir)


def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory.")],
    output: Annotated[Path | None, typer.Option(
        help="HTML file (default RUN/report/report.html).")] = None,
    title: Annotated[str | None, typer.Option(help="Page title (default: the run name).")] = None,
) -> None:
    """Write the run's self-contained HTML report (no external requests)."""
    store = RunStore(run_dir)
    if not store.manifests():
        raise StageError(f"{run_dir}: no stage has run here; give a run directory")
    path = run_report(store, ReportConfig(output=str(output) if output else None, title=title))
    console.print(f"report: {path}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(report)
