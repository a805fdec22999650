"""``grouppref demo``: the whole pipeline on the embedded defaults (offline, CPU).

The demo is ``examples/demo.yaml`` run by the same code as ``grouppref run``; ``--quick``
shrinks it (6 prompts, short answers, 2 training steps) for a smoke test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from grouppref.commands.run import console, print_outcome
from grouppref.config import load_config
from grouppref.pipeline.runner import RunConfig, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = ROOT / "examples" / "demo.yaml"
DEMO_PROMPTS = ROOT / "data" / "demo_prompts.jsonl"


def demo_config(out: Path, quick: bool = False) -> RunConfig:
    """The demo's validated config, writing into ``out``."""
    cfg = load_config(RunConfig, DEMO_CONFIG, {"run_dir": str(out)})
    updates: dict[str, Any] = {"prompts": cfg.prompts.model_copy(update={"source": str(DEMO_PROMPTS)})}
    updates["export"] = [e.model_copy(update={"to_dir": str(out / "export" / "groups")})
                         if e.to_dir else e for e in cfg.export]
    if quick:
        updates["prompts"] = updates["prompts"].model_copy(update={"limit": 8})
        # re-validated, since the counts per model follow from k
        updates["generate"] = type(cfg.generate).model_validate(
            {**cfg.generate.model_dump(), "k": 3, "max_new_tokens": 16,
             "models": [{"name": "embedded"}]})
        updates["train"] = cfg.train.model_copy(update={"max_steps": 2, "batch_size": 2})
        updates["validation"] = cfg.validation.model_copy(update={"test_fraction": 0.3})
    return cfg.model_copy(update=updates)


def demo(
    out: Annotated[Path, typer.Option("--out", help="Run directory.")] = Path("runs/demo"),
    force: Annotated[bool, typer.Option("--force", help="Re-run every stage.")] = False,
    quick: Annotated[bool, typer.Option(help="A small, fast version (smoke test).")] = False,
) -> None:
    """Run the demo pipeline end to end on the shipped prompts and embedded models."""
    cfg = demo_config(out, quick=quick)
    outcome = run_pipeline(cfg, force=["all"] if force else None, console=console)
    print_outcome(outcome, cfg.run_dir)


def register(app: typer.Typer) -> None:
    app.command()(demo)
