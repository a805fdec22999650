"""Subcommands ``train`` and ``eval`` (thin wrappers over :mod:`grouppref.train`).

Under ``torchrun``/``accelerate launch`` every process runs the same command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypedDict

import typer
from rich.table import Table

from grouppref.commands.arguments import AllowStale
from grouppref.commands.options import Custom, Extra, config_command, help_of
from grouppref.commands.output import err, esc, out, print_counts, print_stage
from grouppref.commands.rank import ENSEMBLE_HELP, RANKER_HELP, parse_rankers
from grouppref.errors import ConfigError
from grouppref.pipeline.rank.settings import parse_weights
from grouppref.runs.stage import StageContext
from grouppref.schemas.reports import EvalReport, TrainStats
from grouppref.train.settings.evaluation import EvalConfig
from grouppref.train.settings.mix import MixConfig
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.settings.refresh import RefreshConfig

DataArg = Annotated[str, typer.Argument(metavar="DATA",
    help="A run directory (reads RUN/validate), anything `grouppref export` writes (a saved "
    "dataset folder, Parquet files per split, a Hub-layout folder, groups or TRL pairs), or a "
    "Hub dataset id.", show_default=False)]


def _clip(text: str) -> list[float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError as e:
        raise ConfigError(f"--importance-clip {text!r}: give two numbers 'LOW,HIGH', e.g. "
                          "0.5,2.0") from e
    return [low, high]


class LoraSwitch(TypedDict):
    lora: bool | None  # --lora/--no-lora


class TrainingExtras(LoraSwitch):  # what train and train-rm take besides their settings
    data: str  # DataArg
    out: Path | None
    resume: bool
    resume_from: Path | None
    allow_stale: bool


class _TrainExtras(TrainingExtras):
    reference_cache: Path | None


class _EvalExtras(TypedDict):
    data: str
    out: Path | None
    allow_stale: bool


def _lora_switch(data: dict[str, Any], extras: LoraSwitch) -> dict[str, Any]:
    """``--lora`` turns LoRA on with its defaults (any ``--lora-*`` option does too);
    ``--no-lora`` turns it off whatever the config file says."""
    if extras["lora"] is False:
        data["lora"] = None
    elif extras["lora"] and not isinstance(data.get("lora"), dict):
        data["lora"] = {}
    return data


def _run_train(config: TrainConfig, extras: _TrainExtras, force: bool) -> None:
    from grouppref.runs.store import RunStore
    from grouppref.train.data.sources import is_run
    from grouppref.train.engine.distributed import process_state
    from grouppref.train.policy.stage import run_train, train_dataset

    data, where, resume = extras["data"], extras["out"], extras["resume_from"] or extras["resume"]
    main = process_state().is_main_process
    if is_run(data):
        context = StageContext(force=force, allow_stale=extras["allow_stale"], resume=resume)
        stage = run_train(RunStore(data), config, context, out_dir=where,
                          reference_cache=extras["reference_cache"])
        if main:
            print_stage(stage, name="train")
            _print_stats(TrainStats.model_validate(stage.manifest.stats), stage.outputs["model"])
        return
    if where is None:
        raise ConfigError(f"{data} is not a run directory: pass --out DIR for the model")
    outcome = train_dataset(data, config, where, resume=resume,
                            reference_cache=extras["reference_cache"])
    if main:
        for reject in outcome.rejects[:20]:
            err.print(f"[red]reject[/] {esc(reject.one_line())}")
        print_counts("train", outcome.counts, outcome.out_dir)
        _print_stats(outcome.stats, str(outcome.out_dir))


def metrics_table(title: str, names: tuple[str, ...],
                  columns: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> Table:
    """A training's metrics (``names`` that have a value) before, after and in the last train
    window (``columns``): the table ``train`` and ``train-rm`` print."""
    table = Table(title=title)
    table.add_column("metric")
    for col in ("start (held-out)", "end (held-out)", "last train window"):
        table.add_column(col, justify="right")
    for name in names:
        cells = [_fmt(d.get(name)) for d in columns]
        if any(c != "" for c in cells):
            table.add_row(name, *cells)
    return table


def _print_stats(stats: TrainStats, model_dir: str) -> None:
    out.print(metrics_table(f"train -> {esc(model_dir)}", (
        "loss", "pair_accuracy", "margin", "reward_best", "reward_worst", "kl",
        "logp_pair_accuracy", "grad_norm", "groups_per_s", "tokens_per_s"),
        (stats.eval_start, stats.eval, stats.train)))
    if stats.refresh:
        _print_refresh(stats)
    if stats.groups.truncated_responses:
        err.print(f"{stats.groups.truncated_responses} responses were truncated to "
                  "max_response_length (--overflow reject drops them instead)")


def _print_refresh(stats: TrainStats) -> None:
    """One row per refresh round: what it added, the rankers' mean score of the policy's
    samples, held-out pair accuracy, on-policy KL to the reference, where the time went."""
    rankers = sorted({k for r in stats.refresh for k in r.scores})
    table = Table(title="refresh rounds")
    for col in ("round", "step", "groups", "added", "buffer", *rankers, "held-out acc.",
                "KL ref", "gen s", "train s"):
        table.add_column(col, justify="right")
    for r in stats.refresh:
        table.add_row(str(r.round), str(r.step), str(r.groups), str(r.added), str(r.buffer),
                      *[_fmt(r.scores.get(k)) for k in rankers],
                      _fmt(r.held_out.get("pair_accuracy")), _fmt(r.kl_ref),
                      _fmt(r.seconds.get("generate")), _fmt(r.seconds.get("train")))
    out.print(table)


def _fmt(value: Any) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


train = config_command(
    TrainConfig, _run_train, name="train", section="train", prepare=_lora_switch,
    doc="Train a causal LM on ranked groups with GSPO (Groupwise Supervised Preference "
    "Optimization), Plackett-Luce or DPO; saves model, tokenizer and metrics.",
    extras=[
        Extra("data", DataArg),
        Extra("out", Annotated[Path | None, typer.Option(
            "--out", help="Where the model, tokenizer and metrics go (default in a run: "
            "RUN/train/model; required otherwise).", show_default=False)], None),
        Extra("lora", Annotated[bool | None, typer.Option(
            "--lora/--no-lora", help="Train LoRA adapters only (with the --lora-* settings).",
            show_default=False)], None),
        Extra("resume", Annotated[bool, typer.Option(
            "--resume", help="Continue from the newest checkpoint in OUT/checkpoints.")], False),
        Extra("resume_from", Annotated[Path | None, typer.Option(
            "--resume-from", help="Continue from this checkpoint folder.",
            show_default=False)], None),
        Extra("reference_cache", Annotated[Path | None, typer.Option(
            "--reference-cache", help="Folder of cached reference log-probs (default: "
            "RUN/train/reference in a run, else OUT/reference).", show_default=False)], None),
        Extra("allow_stale", AllowStale, False),
    ],
    flatten={"data": "{}", "lora": "lora-{}", "refresh": "refresh-{}", "mix": "mix-{}"},
    rename={"lora.target_modules": "--lora-target", "refresh.fresh_share": "--fresh-share",
            "refresh.buffer": "--buffer"},
    custom={"importance_clip": Custom("--importance-clip", help_of(TrainConfig, "importance_clip")
                                      + " Format: LOW,HIGH.", _clip, metavar="LOW,HIGH"),
            "refresh.rankers": Custom(
                "--refresh-ranker", help_of(RefreshConfig, "rankers") + " " + RANKER_HELP,
                parse_rankers, multiple=True, metavar="SPEC"),
            "mix.schedule": Custom("--mix", help_of(MixConfig, "schedule"), str,
                                   metavar="SCHEDULE"),
            "refresh.ensemble": Custom(
                "--refresh-ensemble", ENSEMBLE_HELP, lambda spec: {"weights": parse_weights(spec)},
                metavar="KEY=WEIGHT,...")},
    force_help="Train again even when RUN/train is cached.")


def _run_eval(config: EvalConfig, extras: _EvalExtras, force: bool) -> None:
    from grouppref.models.loading import cache_root
    from grouppref.runs.store import RunStore
    from grouppref.train.data.sources import is_run, load_groups
    from grouppref.train.eval.stage import compare_models, run_eval

    data = extras["data"]
    if is_run(data):
        stage = run_eval(RunStore(data), config,
                         StageContext(force=force, allow_stale=extras["allow_stale"]))
        report = EvalReport.model_validate(stage.manifest.stats)
        print_stage(stage, name="eval")
    else:
        source = load_groups(data, stage="eval")
        for reject in source.rejects:
            err.print(f"[red]reject[/] {esc(reject.one_line())}")
        report = compare_models(source.groups, config, cache_dir=cache_root() / "reference").report
    if extras["out"] is not None:
        extras["out"].write_text(report.model_dump_json(indent=2) + "\n")
    _print_eval(report)


def _print_eval(report: EvalReport) -> None:
    table = Table(title=f"eval on {report.groups} {report.split} groups (beta {report.beta}, "
                  f"reference {esc(str(report.ref_model))})")
    table.add_column("metric")
    roles = [r for r in ("baseline", "model") if r in report.metrics]
    for role in roles:
        table.add_column(f"{role}: {esc(str(getattr(report, role)))}", justify="right")
    if report.delta:
        table.add_column("delta", justify="right")
    for name in sorted({k for s in report.metrics.values() for k in s} - {"groups"}):
        cells = [_fmt(report.metrics[r].get(name)) for r in roles]
        if report.delta:
            cells.append(_fmt(report.delta.get(name)))
        table.add_row(name, *cells)
    out.print(table)


eval_command = config_command(
    EvalConfig, _run_eval, name="eval", section="eval",
    doc="Pair accuracy and margins of a model (and a baseline) on a group dataset's consensus.",
    extras=[Extra("data", DataArg),
            Extra("out", Annotated[Path | None, typer.Option(
                "--out", help="Also write the report as JSON here (a run always writes "
                "RUN/eval/metrics.json).", show_default=False)], None),
            Extra("allow_stale", AllowStale, False)],
    flatten={"data": "{}"}, force_help="Re-run even when cached.")


def register(app: typer.Typer) -> None:
    app.command()(train)
    app.command(name="eval")(eval_command)
