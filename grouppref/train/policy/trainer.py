"""The GSPO training loop, on ``accelerate`` so that ``accelerate launch`` / ``torchrun`` scale it
(DDP, FSDP, DeepSpeed) with no code of our own for distribution.

GSPO here is *Groupwise Supervised Preference Optimization*: offline, from aggregated group
rankings, with no critic and no sampling during training. It is not Qwen's Group Sequence
Policy Optimization.

One run: tokenize the groups (bad ones become rejects) -> load the policy -> reference
log-probs once (cached; reference model freed) -> optional LoRA / gradient checkpointing ->
loop (gradient accumulation, clipping, schedule, metrics every ``logging_steps``, held-out
eval every ``eval_steps`` and at start and end, checkpoints every ``save_steps``) -> save the
model and tokenizer into ``OUT`` with ``metrics.jsonl`` and ``metrics.json`` beside them.
The set-up before the loop lives in :mod:`grouppref.train.policy.setup`, checkpoints and their
restore in :mod:`grouppref.train.engine.checkpoint`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.reports import TrainStats
from grouppref.train.engine import checkpoint
from grouppref.train.engine.driver import Hooks, drive, end_trackers, optimizer_step, save_model
from grouppref.train.engine.prepare import LoopRun, autocast_dtype
from grouppref.train.eval.metrics import evaluate, reward_metrics
from grouppref.train.policy.mix_sampler import MixSampler, mix_loader
from grouppref.train.policy.model_card import public_stats
from grouppref.train.policy.setup import (
    Prepared,
    check_checkpointing,
    load_policy,
    prepare_data,
    split_groups,
)
from grouppref.train.policy.step import Objective, step_loss
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.settings.shared import check_precision, check_trackers
from grouppref.train.tensors.batch import GroupBatch, collate_groups

if TYPE_CHECKING:
    from grouppref.train.refresh.refresher import Refresher

__all__ = ["TRAIN_METRICS", "TrainResult", "check_checkpointing", "split_groups", "train"]

TRAIN_METRICS = ("loss", "pair_accuracy", "margin", "reward_best", "reward_worst", "kl")
# called with (step, held-out metrics) after each evaluation; it may raise to stop the run
EvalHook = Callable[[int, dict[str, float]], None]


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model (unwrapped) and its numbers."""

    model: Any
    tokenizer: Any
    stats: TrainStats
    out_dir: Path
    rejects: list[Reject]
    used: list[str] = field(default_factory=list)  # group ids trained or evaluated on


@dataclass(kw_only=True)
class _Run(LoopRun):
    """The policy loop's run: its output folder, objective, refresher and mix sampler."""

    config: TrainConfig
    out_dir: Path
    objective: Objective
    refresh: Refresher | None = None  # when config.refresh is set
    mix: MixSampler | None = None  # the batch sampler when config.mix is set
    on_eval: EvalHook | None = None  # called after each held-out evaluation


# -- one step ---------------------------------------------------------------------------------
def _micro_step(run: _Run, batch: GroupBatch, window: checkpoint.Window) -> None:
    """The shared step (:func:`grouppref.train.policy.step.step_loss`) under accelerate: forward,
    backward and (on a sync step) clip + optimizer + schedule."""
    with run.accelerator.accumulate(run.model):
        out = step_loss(run.model, batch, run.objective, share_prefix=run.config.share_prefix)
        if run.refresh is not None:
            run.refresh.observe(batch, out.logps)
        optimizer_step(run, out.loss.mean(), window)
    stats = reward_metrics(out.logps, batch, run.config.beta, run.config.length_normalise,
                           run.config.reference_free)
    window.sums.add({"loss": out.loss.detach(), **stats, **out.extra})
    if run.mix is not None:  # realised and scheduled shares of the label sources
        window.sums.add({k: torch.tensor(v) for k, v in
                         run.mix.metrics(batch.group_ids, run.state.step).items()})
    window.groups += len(batch.group_ids)
    window.tokens += int(batch.prompt_mask.sum() + batch.cand_mask.sum())


# -- the loop ---------------------------------------------------------------------------------
def _metric_names(window: checkpoint.Window) -> list[str]:
    return list(TRAIN_METRICS) + sorted(set(window.sums.sums) - set(TRAIN_METRICS))


def _log_eval(run: _Run) -> dict[str, float]:
    metrics = evaluate(run.model, run.held_out, beta=run.config.beta,
                       length_normalise=run.config.length_normalise,
                       batch_size=run.config.eval_batch_size, pad_token_id=run.pad_token_id,
                       share_prefix=run.config.share_prefix,
                       autocast_dtype=autocast_dtype(run.config.mixed_precision))
    run.log.write(run.state.step, run.state.epoch_progress(run.steps_per_epoch), "eval", metrics)
    if run.on_eval is not None:  # e.g. a sweep's pruner (it may raise to stop the run)
        run.on_eval(run.state.step, metrics)
    return metrics


def _loop(run: _Run) -> None:
    """Train until ``total_steps`` (:func:`grouppref.train.engine.driver.drive`), with the mix
    sampler's epochs and the refresher's fresh groups."""
    refresh, state = run.refresh, run.state
    drive(run, Hooks(
        micro_step=partial(_micro_step, run), metric_names=_metric_names,
        evaluate=partial(_log_eval, run), out_dir=run.out_dir,
        on_epoch=run.mix.set_epoch if run.mix is not None else None,
        on_batch=(lambda batch: refresh.mix(batch, state)) if refresh is not None else None))


# -- set-up of the loop ----------------------------------------------------------------------
def _build_run(config: TrainConfig, prep: Prepared, model: Any, out_dir: Path) -> _Run:
    from torch.utils.data import DataLoader
    from transformers import get_scheduler

    accelerator, pad_token_id = prep.accelerator, prep.tokenizer.pad_token_id
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    batch_size = (config.refresh.offline_per_batch(config.batch_size) if config.refresh
                  else config.batch_size)  # refresh: fresh groups fill the rest of each batch
    collate = partial(collate_groups, pad_token_id=pad_token_id)
    mix = None
    if config.mix is not None:  # batches follow the label-source schedule
        loader, mix = mix_loader(config, prep.train_set, collate, accelerator.num_processes)
    else:
        loader = DataLoader(prep.train_set, batch_size=batch_size, shuffle=True,  # type: ignore[arg-type]
                            collate_fn=collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / config.grad_accum)
    total = config.max_steps or config.epochs * steps_per_epoch
    # Not prepared: accelerate would step it once per process; we step it once per update.
    scheduler = get_scheduler(config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps,
                              num_training_steps=total)
    accelerator.register_for_checkpointing(scheduler)
    return _Run(config=config, accelerator=accelerator, model=model, optimizer=optimizer,
                scheduler=scheduler, loader=loader, held_out=prep.held_out,
                pad_token_id=pad_token_id, out_dir=out_dir, total_steps=total,
                steps_per_epoch=steps_per_epoch, log=checkpoint.MetricsLog(out_dir, accelerator),
                objective=Objective.of(config), mix=mix)


def _start_run(config: TrainConfig, prep: Prepared, policy: Any, out_dir: Path,
               cache_dir: Path, refresh_dir: Path) -> _Run:
    """The loop's state: optimizer, loader and schedule, restored from the checkpoint when
    resuming; the metrics log and trackers opened; the refresher started."""
    run = _build_run(config, prep, policy, out_dir)
    if prep.checkpoint is not None:
        run.state = checkpoint.load(prep.accelerator, prep.checkpoint, config,
                                    run.scheduler)
    run.log.open(fresh=prep.checkpoint is None, after_step=run.state.step)
    prep.accelerator.init_trackers("grouppref", config=checkpoint.flat_config(config))
    if prep.plan is not None:
        from grouppref.train.refresh.refresher import Refresher

        run.refresh = Refresher(prep.plan, run, prep.tokenizer, refresh_dir, cache_dir)
        run.refresh.start(fresh=prep.checkpoint is None)
    return run


# -- finish -----------------------------------------------------------------------------------
def _train_stats(run: _Run, prep: Prepared, final_eval: dict[str, float],
                 seconds: float) -> TrainStats:
    groups, rejects, ref = prep.train_set + prep.held_out, prep.rejects, prep.reference
    return TrainStats.model_validate(checkpoint.strict_json({
        "steps": run.state.step, "epochs": run.state.epoch_progress(run.steps_per_epoch),
        "train": run.last_train, "eval_start": run.log.first("eval"), "eval": final_eval,
        "groups": {"train": len(prep.train_set), "held_out": len(prep.held_out),
                   "rejected": sum(r.scope == "row" for r in rejects),
                   "dropped_candidates": sum(r.scope == "part" for r in rejects),
                   "truncated_responses": sum(g.num_truncated for g in groups)},
        "reference": None if ref is None else {"model": ref.model, "cached": ref.cached,
                                               "entry": str(ref.entry)},  # None: reference_free
        "seconds": round(seconds, 3),
        "refresh": [r.model_dump(mode="json") for r in run.refresh.rounds] if run.refresh else [],
    }))


def _finish(run: _Run, prep: Prepared, t0: float) -> TrainResult:
    """Final held-out eval, the model saved, ``metrics.json`` written, trackers closed."""
    final_eval = _log_eval(run) if run.held_out else {}
    model = save_model(run, prep.tokenizer, run.out_dir)
    stats = _train_stats(run, prep, final_eval, time.perf_counter() - t0)
    if run.refresh is not None:
        run.refresh.close()
    if run.accelerator.is_main_process:
        published = public_stats(stats)  # no local path in the folder one publishes
        (run.out_dir / "metrics.json").write_text(published.model_dump_json(indent=2) + "\n")
    end_trackers(run)
    return TrainResult(model=model, tokenizer=prep.tokenizer, stats=stats, out_dir=run.out_dir,
                       rejects=prep.rejects,
                       used=[g.group_id for g in prep.train_set + prep.held_out])


def train(config: TrainConfig, groups: Sequence[ValidatedGroup], out_dir: str | Path, *,
          resume: bool | str | Path = False, reference_cache: Path | None = None,
          refresh_dir: Path | None = None,
          on_eval: EvalHook | None = None) -> TrainResult:
    """Train ``config.model`` on ``groups`` with the configured group loss.

    Args:
        config (TrainConfig): the settings (validated; trackers and precision are checked
            before any model loads).
        groups (Sequence[ValidatedGroup]): aggregated groups; ``split="test"`` ones are held
            out for evaluation, the others train.
        out_dir (str | Path): where the model, tokenizer, ``metrics.jsonl``, ``metrics.json``,
            ``checkpoints/`` and (by default) the reference cache go.
        resume (bool | str | Path): ``True``: continue from the latest checkpoint in
            ``out_dir/checkpoints``; a path: from that checkpoint.
        reference_cache (Path | None): folder of reference log-prob caches
            (default ``out_dir/reference``).
        refresh_dir (Path | None): where refresh rounds are written (default
            ``out_dir/refresh``; see :mod:`grouppref.train.refresh.refresher`).
        on_eval (Callable | None): called as ``on_eval(step, metrics)`` after every held-out
            evaluation (start, every ``eval_steps``, end); an exception it raises ends the run
            (``grouppref sweep`` prunes trials this way).

    Returns:
        TrainResult: the trained model, tokenizer, final metrics and rejects.

    Raises:
        ConfigError: a tracker is not installed, or the precision is not supported here.
        StageError: no trainable group, missing reference log-probs, or an unusable checkpoint.
    """
    check_trackers(config.report_to)
    check_precision(config.mixed_precision)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    cache_dir = reference_cache or out_dir / "reference"
    prep = prepare_data(config, groups, out_dir, resume)  # fails before any model loads
    policy = load_policy(config, prep, cache_dir)
    run = _start_run(config, prep, policy, out_dir, cache_dir, refresh_dir or out_dir / "refresh")
    run.on_eval = on_eval
    if run.held_out and run.state.step == 0:
        _log_eval(run)
    _loop(run)
    return _finish(run, prep, t0)
