"""``grouppref demo``: the whole pipeline on the embedded defaults (offline, CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from grouppref.commands.core import report_stage
from grouppref.pipeline.prompts import PromptsConfig, run_prompts
from grouppref.pipeline.store import RunStore

DEMO_PROMPTS = Path(__file__).resolve().parents[2] / "data" / "demo_prompts.jsonl"


def demo(
    out: Annotated[Path, typer.Option("--out", help="Run directory.")] = Path("runs/demo"),
    force: Annotated[bool, typer.Option("--force", help="Re-run every stage.")] = False,
) -> None:
    """Run the demo pipeline on the shipped prompts."""
    store = RunStore(out)
    stage = run_prompts(store, PromptsConfig(source=str(DEMO_PROMPTS)), force=force)
    report_stage("prompts", stage.cached, stage.manifest.counts.model_dump(), stage.dir,
                 [r.one_line() for r in stage.rejects()])


def register(app: typer.Typer) -> None:
    app.command()(demo)
