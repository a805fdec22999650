"""Subcommand ``train-rm``: a scalar reward model from ranked groups (docs/reward-model.md).

Under ``torchrun``/``accelerate launch`` every process runs the same command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from grouppref.commands.arguments import AllowStale
from grouppref.commands.options import Extra, config_command
from grouppref.commands.output import err, esc, out, print_counts, print_stage
from grouppref.commands.train import DataArg, TrainingExtras, _fmt, _lora_switch, metrics_table
from grouppref.errors import ConfigError
from grouppref.runs.stage import StageContext
from grouppref.schemas.reports import RewardModelStats
from grouppref.train.settings.reward_model import RewardModelConfig


def _run_train_rm(config: RewardModelConfig, extras: TrainingExtras, force: bool) -> None:
    from grouppref.runs.store import RunStore
    from grouppref.train.data.sources import is_run
    from grouppref.train.engine.distributed import process_state
    from grouppref.train.reward_model.stage import run_train_rm, train_rm_dataset

    data, where, resume = extras["data"], extras["out"], extras["resume_from"] or extras["resume"]
    main = process_state().is_main_process
    if is_run(data):
        context = StageContext(force=force, allow_stale=extras["allow_stale"], resume=resume)
        stage = run_train_rm(RunStore(data), config, context, out_dir=where)
        if main:
            print_stage(stage, name="train_rm")
            _print_stats(RewardModelStats.model_validate(stage.manifest.stats),
                         stage.outputs["model"])
        return
    if where is None:
        raise ConfigError(f"{data} is not a run directory: pass --out DIR for the reward model")
    outcome = train_rm_dataset(data, config, where, resume=resume)
    if main:
        for reject in outcome.rejects[:20]:
            err.print(f"[red]reject[/] {esc(reject.one_line())}")
        print_counts("train_rm", outcome.counts, outcome.out_dir)
        _print_stats(outcome.stats, str(outcome.out_dir))


def _print_stats(stats: RewardModelStats, model_dir: str) -> None:
    out.print(metrics_table(
        f"train-rm ({stats.loss}, {stats.steps} steps) -> {esc(model_dir)}",
        ("pair_accuracy", "loss", "margin", "reward_mean", "reward_std", "groups", "grad_norm",
         "groups_per_s", "tokens_per_s"),
        (stats.eval_start.model_dump(), stats.eval.model_dump(), stats.train.model_dump())))
    out.print(f"held-out pair accuracy: {_fmt(stats.eval.pair_accuracy)} "
              f"({stats.groups.held_out} groups); {stats.pairs_per_s:.4g} pairs/s")


train_rm = config_command(
    RewardModelConfig, _run_train_rm, name="train-rm", section="train_rm", prepare=_lora_switch,
    doc="Train a scalar reward model (a 1-output sequence classifier on a causal LM or "
    "encoder) on ranked groups with the soft Bradley-Terry group loss or Plackett-Luce; "
    "the folder loads as `grouppref rank --ranker reward:DIR`.",
    extras=[
        Extra("data", DataArg),
        Extra("out", Annotated[Path | None, typer.Option(
            "--out", help="Where the reward model, tokenizer, metrics and card go (default in "
            "a run: RUN/train_rm/model; required otherwise).", show_default=False)], None),
        Extra("lora", Annotated[bool | None, typer.Option(
            "--lora/--no-lora", help="Train LoRA adapters and the score head only (with the "
            "--lora-* settings).", show_default=False)], None),
        Extra("resume", Annotated[bool, typer.Option(
            "--resume", help="Continue from the newest checkpoint in OUT/checkpoints "
            "(written every --save-steps).")], False),
        Extra("resume_from", Annotated[Path | None, typer.Option(
            "--resume-from", help="Continue from this checkpoint folder.",
            show_default=False)], None),
        Extra("allow_stale", AllowStale, False),
    ],
    flatten={"lora": "lora-{}"}, rename={"lora.target_modules": "--lora-target"},
    force_help="Train again even when RUN/train_rm is cached.")


def register(app: typer.Typer) -> None:
    app.command(name="train-rm")(train_rm)
