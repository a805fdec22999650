"""Subcommands ``train`` and ``eval`` (thin wrappers over :mod:`grouppref.train`).

Options left out keep the value of ``--config FILE`` (YAML/TOML/JSON of ``TrainConfig``), else
the default. Under ``torchrun``/``accelerate launch`` every process runs the same command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from grouppref.commands.core import report_stage
from grouppref.commands.options import help_of
from grouppref.config import format_validation_error, read_config_file
from grouppref.errors import ConfigError
from grouppref.train.config import EvalConfig, LoraSettings, TrainConfig
from grouppref.train.data import DataConfig

console = Console()
T, D, L, E = TrainConfig, DataConfig, LoraSettings, EvalConfig
DataArg = Annotated[str, typer.Argument(
    help="A run directory (reads RUN/validate), a saved dataset of ValidatedGroup rows, or a "
    "Hub dataset id.")]


def _opt(model: type, name: str, *flags: str, extra: str = "") -> Any:
    return typer.Option(*flags, help=help_of(model, name) + extra)


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict):
            out[key] = _merge(out.get(key) or {}, value)
        elif value is not None:
            out[key] = value
    return out


def _validated(model: type, config_file: Path | None, overrides: dict[str, Any]) -> Any:
    """``model`` from the file (if any) with the given options on top; one ConfigError."""
    base = read_config_file(config_file) if config_file else {}
    source = str(config_file) if config_file else "options"
    try:
        return model.model_validate(_merge(base, overrides))
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from e


def _lora(lora: bool | None, r: int | None, alpha: float | None, dropout: float | None,
          target: list[str] | None, save: str | None) -> dict[str, Any] | None:
    given = {"r": r, "alpha": alpha, "dropout": dropout, "save": save,
             "target_modules": target or None}
    if lora is False:
        return None
    if lora or any(v is not None for v in given.values()):
        return {k: v for k, v in given.items() if v is not None}
    return None


def _clip(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError as e:
        raise ConfigError(f"--importance-clip {text!r}: give two numbers 'LOW,HIGH', e.g. "
                          "0.5,2.0") from e
    return [low, high]


def train(
    data: DataArg,
    model: Annotated[str | None, _opt(T, "model", "--model")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Where the model, tokenizer and metrics go (default in a run: "
        "RUN/train/model; required otherwise).")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="YAML/TOML/JSON file of train settings; options override it.")] = None,
    ref_model: Annotated[str | None, _opt(T, "ref_model", "--ref-model")] = None,
    loss: Annotated[str | None, _opt(T, "loss", "--loss")] = None,
    beta: Annotated[float | None, _opt(T, "beta", "--beta")] = None,
    length_normalise: Annotated[bool | None, _opt(
        T, "length_normalise", "--length-normalise/--no-length-normalise")] = None,
    label_smoothing: Annotated[float | None, _opt(T, "label_smoothing", "--label-smoothing")] = None,
    robust: Annotated[bool | None, _opt(T, "robust", "--robust/--no-robust")] = None,
    sft_weight: Annotated[float | None, _opt(T, "sft_weight", "--sft-weight")] = None,
    importance_clip: Annotated[str | None, _opt(
        T, "importance_clip", "--importance-clip", extra=" Format: LOW,HIGH.")] = None,
    lr: Annotated[float | None, _opt(T, "lr", "--lr")] = None,
    weight_decay: Annotated[float | None, _opt(T, "weight_decay", "--weight-decay")] = None,
    warmup_steps: Annotated[int | None, _opt(T, "warmup_steps", "--warmup-steps")] = None,
    lr_scheduler: Annotated[str | None, _opt(T, "lr_scheduler", "--lr-scheduler")] = None,
    max_grad_norm: Annotated[float | None, _opt(T, "max_grad_norm", "--max-grad-norm")] = None,
    epochs: Annotated[int | None, _opt(T, "epochs", "--epochs")] = None,
    max_steps: Annotated[int | None, _opt(T, "max_steps", "--max-steps")] = None,
    batch_size: Annotated[int | None, _opt(T, "batch_size", "--batch-size")] = None,
    eval_batch_size: Annotated[int | None, _opt(T, "eval_batch_size", "--eval-batch-size")] = None,
    grad_accum: Annotated[int | None, _opt(T, "grad_accum", "--grad-accum")] = None,
    mixed_precision: Annotated[str | None, _opt(T, "mixed_precision", "--mixed-precision")] = None,
    gradient_checkpointing: Annotated[bool | None, _opt(
        T, "gradient_checkpointing", "--gradient-checkpointing/--no-gradient-checkpointing")] = None,
    share_prefix: Annotated[bool | None, _opt(
        T, "share_prefix", "--share-prefix/--no-share-prefix")] = None,
    lora: Annotated[bool | None, _opt(T, "lora", "--lora/--no-lora")] = None,
    lora_r: Annotated[int | None, _opt(L, "r", "--lora-r")] = None,
    lora_alpha: Annotated[float | None, _opt(L, "alpha", "--lora-alpha")] = None,
    lora_dropout: Annotated[float | None, _opt(L, "dropout", "--lora-dropout")] = None,
    lora_target: Annotated[list[str] | None, _opt(
        L, "target_modules", "--lora-target", extra=" Repeat for several.")] = None,
    lora_save: Annotated[str | None, _opt(L, "save", "--lora-save")] = None,
    seed: Annotated[int | None, _opt(T, "seed", "--seed")] = None,
    logging_steps: Annotated[int | None, _opt(T, "logging_steps", "--logging-steps")] = None,
    eval_steps: Annotated[int | None, _opt(T, "eval_steps", "--eval-steps")] = None,
    save_steps: Annotated[int | None, _opt(T, "save_steps", "--save-steps")] = None,
    save_total_limit: Annotated[int | None, _opt(T, "save_total_limit", "--save-total-limit")] = None,
    report_to: Annotated[list[str] | None, _opt(
        T, "report_to", "--report-to", extra=" Repeat for several.")] = None,
    ref_dtype: Annotated[str | None, _opt(T, "ref_dtype", "--ref-dtype")] = None,
    max_prompt_length: Annotated[int | None, _opt(D, "max_prompt_length", "--max-prompt-length")] = None,
    max_response_length: Annotated[int | None, _opt(
        D, "max_response_length", "--max-response-length")] = None,
    overflow: Annotated[str | None, _opt(D, "overflow", "--overflow")] = None,
    chat_template: Annotated[bool | None, _opt(
        D, "chat_template", "--chat-template/--no-chat-template")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue from the newest checkpoint in OUT/checkpoints.")] = False,
    resume_from: Annotated[Path | None, typer.Option(
        "--resume-from", help="Continue from this checkpoint folder.")] = None,
    reference_cache: Annotated[Path | None, typer.Option(
        "--reference-cache", help="Folder of cached reference log-probs (default: "
        "RUN/train/reference in a run, else OUT/reference).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Train again even when RUN/train "
                                        "is cached.")] = False,
) -> None:
    """Train a causal LM on ranked groups with GSPO (Groupwise Supervised Preference
    Optimization), Plackett-Luce or DPO; saves model, tokenizer and metrics."""
    from grouppref.train.stage import run_train

    overrides = {
        "model": model, "ref_model": ref_model, "loss": loss, "beta": beta,
        "length_normalise": length_normalise, "label_smoothing": label_smoothing,
        "robust": robust, "sft_weight": sft_weight, "importance_clip": _clip(importance_clip),
        "lr": lr, "weight_decay": weight_decay, "warmup_steps": warmup_steps,
        "lr_scheduler": lr_scheduler, "max_grad_norm": max_grad_norm, "epochs": epochs,
        "max_steps": max_steps, "batch_size": batch_size, "eval_batch_size": eval_batch_size,
        "grad_accum": grad_accum, "mixed_precision": mixed_precision,
        "gradient_checkpointing": gradient_checkpointing, "share_prefix": share_prefix,
        "seed": seed, "logging_steps": logging_steps, "eval_steps": eval_steps,
        "save_steps": save_steps, "save_total_limit": save_total_limit,
        "report_to": report_to or None, "ref_dtype": ref_dtype,
        "data": {"max_prompt_length": max_prompt_length, "max_response_length":
                 max_response_length, "overflow": overflow, "chat_template": chat_template},
    }
    overrides["lora"] = _lora(lora, lora_r, lora_alpha, lora_dropout, lora_target, lora_save)
    settings = _validated(TrainConfig, config, overrides)
    if lora is False:
        settings = settings.model_copy(update={"lora": None})
    outcome = run_train(data, settings, out, resume=resume_from or resume, force=force,
                        reference_cache=reference_cache)
    _print_train(outcome)


def _print_train(outcome: Any) -> None:
    from grouppref.train.config import process_state

    if not process_state().is_main_process:
        return
    where = outcome.stage_dir or outcome.out_dir
    report_stage("train", outcome.cached, outcome.counts, where, [r.one_line() for r in outcome.rejects])
    metrics = outcome.metrics
    table = Table(title=f"train -> {outcome.out_dir}")
    table.add_column("metric")
    for col in ("start (held-out)", "end (held-out)", "last train window"):
        table.add_column(col, justify="right")
    start, end, last = (metrics.get("eval_start") or {}, metrics.get("eval") or {},
                        metrics.get("train") or {})
    for name in ("loss", "pair_accuracy", "margin", "reward_best", "reward_worst", "kl",
                 "logp_pair_accuracy", "grad_norm", "groups_per_s", "tokens_per_s"):
        cells = [_fmt(d.get(name)) for d in (start, end, last)]
        if any(c != "" for c in cells):
            table.add_row(name, *cells)
    console.print(table)
    truncated = metrics.get("groups", {}).get("truncated_responses", 0)
    if truncated:
        console.print(f"{truncated} responses were truncated to max_response_length "
                      "(--overflow reject drops them instead)")


def _fmt(value: Any) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def eval_command(
    data: DataArg,
    model: Annotated[str | None, _opt(E, "model", "--model")] = None,
    baseline: Annotated[str | None, _opt(E, "baseline", "--baseline")] = None,
    ref_model: Annotated[str | None, _opt(E, "ref_model", "--ref-model")] = None,
    split: Annotated[str | None, _opt(E, "split", "--split")] = None,
    beta: Annotated[float | None, _opt(E, "beta", "--beta")] = None,
    length_normalise: Annotated[bool | None, _opt(
        E, "length_normalise", "--length-normalise/--no-length-normalise")] = None,
    batch_size: Annotated[int | None, _opt(E, "batch_size", "--batch-size")] = None,
    dtype: Annotated[str | None, _opt(E, "dtype", "--dtype")] = None,
    share_prefix: Annotated[bool | None, _opt(
        E, "share_prefix", "--share-prefix/--no-share-prefix")] = None,
    max_prompt_length: Annotated[int | None, _opt(D, "max_prompt_length", "--max-prompt-length")] = None,
    max_response_length: Annotated[int | None, _opt(
        D, "max_response_length", "--max-response-length")] = None,
    overflow: Annotated[str | None, _opt(D, "overflow", "--overflow")] = None,
    chat_template: Annotated[bool | None, _opt(
        D, "chat_template", "--chat-template/--no-chat-template")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Also write the report as JSON here (a run always writes "
        "RUN/eval/metrics.json).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Re-run even when cached.")] = False,
) -> None:
    """Pair accuracy and margins of a model (and a baseline) on a group dataset's consensus."""
    from grouppref.models.loading import cache_root
    from grouppref.runs.store import RunStore
    from grouppref.train.eval import compare_models, run_eval
    from grouppref.train.stage import is_run, load_groups

    data_opts = {"max_prompt_length": max_prompt_length, "max_response_length":
                 max_response_length, "overflow": overflow, "chat_template": chat_template}
    overrides = {"model": model, "baseline": baseline, "ref_model": ref_model, "split": split,
                 "beta": beta, "length_normalise": length_normalise, "batch_size": batch_size,
                 "dtype": dtype, "share_prefix": share_prefix}
    if any(v is not None for v in data_opts.values()):
        overrides["data"] = data_opts
    settings = _validated(EvalConfig, None, overrides)
    if is_run(data):
        stage = run_eval(RunStore(data), settings, force=force)
        report = stage.manifest.stats
        report_stage("eval", stage.cached, stage.manifest.counts.model_dump(), stage.dir,
                     [r.one_line() for r in stage.rejects()])
    else:
        source = load_groups(data, stage="eval")
        for reject in source.rejects:
            console.print(f"[red]reject[/] {reject.one_line()}", highlight=False)
        found = compare_models(source.groups, settings, cache_dir=cache_root() / "reference")
        report = found.report
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
    _print_eval(report)


def _print_eval(report: dict[str, Any]) -> None:
    scores = report["metrics"]
    table = Table(title=f"eval on {report['groups']} {report['split']} groups "
                  f"(beta {report['beta']}, reference {report['ref_model']})")
    table.add_column("metric")
    roles = [r for r in ("baseline", "model") if r in scores]
    for role in roles:
        table.add_column(f"{role}: {report[role]}", justify="right")
    if report["delta"]:
        table.add_column("delta", justify="right")
    for name in sorted({k for s in scores.values() for k in s} - {"groups"}):
        cells = [_fmt(scores[r].get(name)) for r in roles]
        if report["delta"]:
            cells.append(_fmt(report["delta"].get(name)))
        table.add_row(name, *cells)
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(train)
    app.command(name="eval")(eval_command)
