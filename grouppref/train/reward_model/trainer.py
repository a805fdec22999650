"""The reward-model training loop on ``accelerate``: checkpoint to resume from -> load (LoRA on
when set) -> encode and split -> held-out eval -> the shared loop of
:mod:`grouppref.train.engine.driver` (accumulation, clipping, schedule, metrics every
``logging_steps`` into ``OUT/metrics.jsonl`` and the ``report_to`` trackers, held-out eval
every ``eval_steps``, checkpoints every ``save_steps``) -> held-out eval -> save the model
(LoRA merged or the adapter alone) and tokenizer into ``OUT`` (the pieces are in
:mod:`grouppref.train.reward_model.model`).

``resume``: model, optimizer, scheduler, RNG states and the position in the data come back from
the checkpoint (:mod:`grouppref.train.engine.checkpoint`), so a resumed run ends where an
uninterrupted one does; settings that shape the optimisation may not change.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from grouppref.schemas import ValidatedGroup
from grouppref.schemas.reports import RewardModelGroups, RewardModelStats
from grouppref.train.engine import checkpoint
from grouppref.train.engine.driver import Hooks, drive, end_trackers, optimizer_step, save_model
from grouppref.train.engine.metric_sums import reduce_sums
from grouppref.train.engine.model_folder import public_name
from grouppref.train.engine.prepare import LoopRun, autocast_dtype, fresh_accelerator
from grouppref.train.reward_model.model import (
    TRAIN_METRICS,
    RewardModelResult,
    batch_metrics,
    context_length,
    evaluate_rm,
    load_reward_model,
    prepare_groups,
    prepare_model,
    reward_loss,
    reward_scores,
    weighted_pairs,
)
from grouppref.train.settings.reward_model import RewardModelConfig
from grouppref.train.settings.shared import check_precision, check_trackers
from grouppref.train.tensors.batch import TokenizedGroup, collate_groups


@dataclass(kw_only=True)
class _Run(LoopRun):
    """The reward-model loop's run: it also counts pairs."""

    config: RewardModelConfig
    out_dir: Path
    train_set: list[TokenizedGroup]
    pairs: int = 0  # weighted pairs trained on

    def eval(self) -> dict[str, float]:
        model = self.accelerator.unwrap_model(self.model)
        return evaluate_rm(model, self.held_out, self.config, self.pad_token_id,
                           autocast_dtype(self.config.mixed_precision))

    def log_eval(self) -> dict[str, float]:
        """Evaluate on the held-out groups and log it (nothing when none is held out)."""
        metrics = self.eval()
        if metrics:
            self.log.write(self.state.step, self.state.epoch_progress(self.steps_per_epoch),
                           "eval", metrics)
        return metrics


def _micro_step(run: _Run, batch: Any, window: checkpoint.Window) -> None:
    with run.accelerator.accumulate(run.model):
        s = reward_scores(run.model, batch)
        loss = reward_loss(s, batch, run.config)
        optimizer_step(run, loss.mean(), window)
    window.sums.add({"loss": loss.detach(), **batch_metrics(s.detach(), batch)})
    window.groups += len(batch.group_ids)
    window.tokens += int(batch.cand_mask.sum())
    run.pairs += weighted_pairs(batch)


def _build(config: RewardModelConfig, acc: Any, model: Any, train_set: list[TokenizedGroup],
           held_out: list[TokenizedGroup], out_dir: Path) -> _Run:
    from torch.utils.data import DataLoader
    from transformers import get_scheduler

    pad = model.config.pad_token_id
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=config.lr, weight_decay=config.weight_decay)
    # torch's stubs want a Dataset; a list is a map-style dataset to the loader itself
    loader: DataLoader[TokenizedGroup] = DataLoader(
        train_set, batch_size=config.batch_size, shuffle=True,  # type: ignore[arg-type]
        collate_fn=partial(collate_groups, pad_token_id=pad))
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / config.grad_accum)
    total = config.max_steps or config.epochs * steps_per_epoch
    # Not prepared: accelerate would step it once per process; we step it once per update.
    scheduler = get_scheduler(config.lr_scheduler, optimizer,
                              num_warmup_steps=config.warmup_steps, num_training_steps=total)
    acc.register_for_checkpointing(scheduler)
    return _Run(config=config, accelerator=acc, model=model, optimizer=optimizer,
                scheduler=scheduler, loader=loader, held_out=held_out, pad_token_id=pad,
                total_steps=total, steps_per_epoch=steps_per_epoch, out_dir=out_dir,
                train_set=train_set,
                log=checkpoint.MetricsLog(out_dir, acc))


def _start(config: RewardModelConfig, groups: Sequence[ValidatedGroup], out: Path,
           resume: bool | str | Path) -> tuple[_Run, Any, list[Any]]:
    """Checkpoint found and checked (before any model loads), model and data prepared, the
    loop's state restored when resuming, the metrics log and trackers opened."""
    from accelerate.utils import set_seed

    acc = fresh_accelerator(config, log_with=list(config.report_to) or None,
                            project_config=checkpoint.project_config(out))
    ckpt = checkpoint.find(out, resume) if resume else None
    if ckpt is not None:
        checkpoint.check_compatible(ckpt, config)
    model, tokenizer = load_reward_model(config.model, config.seed)
    set_seed(config.seed)  # the loop's RNG (LoRA dropout) starts from the seed, as train's does
    max_length = context_length(model, tokenizer, config.max_length)
    train_set, held_out, rejects = prepare_groups(groups, tokenizer, max_length, config)
    run = _build(config, acc, prepare_model(model, config), train_set, held_out, out)
    if ckpt is not None:
        run.state = checkpoint.load(acc, ckpt, config, run.scheduler)
    run.log.open(fresh=ckpt is None, after_step=run.state.step)
    acc.init_trackers("grouppref", config=checkpoint.flat_config(config))
    return run, tokenizer, rejects


def train_reward_model(config: RewardModelConfig, groups: Sequence[ValidatedGroup],
                       out_dir: str | Path, *,
                       resume: bool | str | Path = False) -> RewardModelResult:
    """Train a reward model on ``groups`` and save it with its tokenizer into ``out_dir``.

    Args:
        resume (bool | str | Path): ``True``: continue from the newest checkpoint in
            ``out_dir/checkpoints``; a path: from that checkpoint.

    Returns:
        RewardModelResult: its :class:`~grouppref.schemas.reports.RewardModelStats` (without
        ``data_fingerprint``), rejects, and the ids of the groups used.

    Raises:
        ConfigError / ModelNotFoundError: bad settings, tracker or model, or settings that
            differ from the checkpoint's (before any training).
        StageError: no trainable group, or no checkpoint to resume from.
    """
    check_trackers(config.report_to)
    check_precision(config.mixed_precision)
    out = Path(out_dir)
    run, tokenizer, rejects = _start(config, groups, out, resume)
    resumed_from = run.state.step
    if run.state.step == 0:
        run.log_eval()
    t0 = time.perf_counter()
    drive(run, Hooks(micro_step=partial(_micro_step, run),
                     metric_names=lambda window: list(TRAIN_METRICS), evaluate=run.log_eval,
                     out_dir=out))
    seconds = time.perf_counter() - t0
    eval_end = run.log_eval()
    save_model(run, tokenizer, out)
    end_trackers(run)
    train_set, held_out = run.train_set, run.held_out
    eval_start = {k: v for k, v in run.log.first("eval").items()
                  if k not in ("step", "epoch", "split")}
    stats = RewardModelStats(
        steps=run.state.step, epochs=run.state.epoch_progress(run.steps_per_epoch),
        loss=config.loss, train=checkpoint.strict_json(run.last_train),
        eval_start=checkpoint.strict_json(eval_start), eval=checkpoint.strict_json(eval_end),
        groups=RewardModelGroups(train=len(train_set), held_out=len(held_out),
                                 rejected=sum(r.scope == "row" for r in rejects),
                                 dropped_candidates=sum(r.scope == "part" for r in rejects)),
        pairs_per_s=reduce_sums([run.pairs])[0] / max(seconds, 1e-9), seconds=seconds,
        base_model=public_name(config.model) if config.model else "embedded SmolLM2",
        lora=config.lora is not None, resumed_from_step=resumed_from)
    used = [g.group_id for g in train_set + held_out]
    return RewardModelResult(stats=stats, out_dir=out, rejects=rejects, used=used)
