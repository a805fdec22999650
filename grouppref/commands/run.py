"""``grouppref run CONFIG`` and ``grouppref report RUN``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from grouppref.config import load_config
from grouppref.pipeline.report import ReportConfig, run_report
from grouppref.pipeline.runner import STAGES, RunConfig, RunOutcome, run_pipeline
from grouppref.pipeline.store import RunStore

console = Console()
_STAGES = ", ".join(STAGES)


def print_outcome(outcome: RunOutcome, run_dir: str) -> None:
    """The closing lines of a run: where everything is, or what it waits for."""
    if outcome.status == "waiting":
        console.print(f"[yellow]waiting[/]: {outcome.message}", highlight=False, soft_wrap=True)
        console.print(f"state saved in {run_dir}; run the same command again to go on "
                      "(or add --wait)", highlight=False)
        return
    console.print(f"[bold green]run complete[/]: {run_dir} (stages run: "
                  f"{', '.join(outcome.ran) or 'none'})", highlight=False)
    if outcome.report:
        console.print(f"report: {outcome.report}", highlight=False)
    console.print(f"inspect it: grouppref inspect {run_dir}", highlight=False)


def run(
    config: Annotated[Path, typer.Argument(help="Run config (YAML or TOML).")],
    start: Annotated[str | None, typer.Option("--from", help=f"First stage to run ({_STAGES}).")] = None,
    until: Annotated[str | None, typer.Option(help="Last stage to run.")] = None,
    force: Annotated[list[str] | None, typer.Option(
        help="Re-run this stage even when cached (repeatable; 'all' for every stage).")] = None,
    wait: Annotated[bool, typer.Option(help="Poll Argilla until enough human rankings are in "
                                       "instead of stopping.")] = False,
    run_dir: Annotated[str | None, typer.Option(help="Override the config's run_dir.")] = None,
) -> None:
    """Run the stages of CONFIG in order; unchanged stages are skipped."""
    overrides = {"run_dir": run_dir} if run_dir else {}
    cfg = load_config(RunConfig, config, overrides)
    outcome = run_pipeline(cfg, start=start, until=until, force=force, wait=wait,
                           console=console)
    print_outcome(outcome, cfg.run_dir)


def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory.")],
    output: Annotated[Path | None, typer.Option(help="HTML file (default RUN/report/report.html).")
                      ] = None,
) -> None:
    """Write the run's self-contained HTML report."""
    path = run_report(RunStore(run_dir), ReportConfig(output=str(output) if output else None))
    console.print(f"report: {path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(report)
