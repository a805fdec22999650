"""The reward-model training loop on ``accelerate``: load -> encode and split -> held-out eval ->
steps (accumulation, clipping, schedule, metrics every ``logging_steps`` into
``OUT/metrics.jsonl``, held-out eval every ``eval_steps``) -> held-out eval -> save the model
and tokenizer into ``OUT`` (the pieces are in :mod:`grouppref.train.rm_trainer`)."""

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
from grouppref.train import checkpoint
from grouppref.train.config import check_precision
from grouppref.train.data import TokenizedGroup, collate_groups
from grouppref.train.prepare import (
    LoopRun,
    autocast_dtype,
    enable_checkpointing,
    fresh_accelerator,
)
from grouppref.train.rm_config import RewardModelConfig
from grouppref.train.rm_trainer import (
    TRAIN_METRICS,
    RewardModelResult,
    batch_metrics,
    context_length,
    evaluate_rm,
    load_reward_model,
    prepare_groups,
    reward_loss,
    reward_scores,
    weighted_pairs,
)


@dataclass(kw_only=True)
class _Run(LoopRun):
    """The reward-model loop's run: it also counts pairs and its own time."""

    config: RewardModelConfig
    pairs: int = 0  # weighted pairs trained on
    seconds: float = 0.0  # of the loop

    def eval(self) -> dict[str, float]:
        model = self.accelerator.unwrap_model(self.model)
        return evaluate_rm(model, self.held_out, self.config, self.pad_token_id,
                           autocast_dtype(self.config.mixed_precision))


def _micro_step(run: _Run, batch: Any, window: checkpoint.Window) -> None:
    acc, config = run.accelerator, run.config
    with acc.accumulate(run.model):
        s = reward_scores(run.model, batch)
        loss = reward_loss(s, batch, config)
        acc.backward(loss.mean())
        if acc.sync_gradients:
            window.grad_norms.append(float(acc.clip_grad_norm_(run.model.parameters(),
                                                               config.max_grad_norm)))
            window.lr = run.scheduler.get_last_lr()[0]
        run.optimizer.step()
        run.optimizer.zero_grad()
        if acc.sync_gradients:
            run.scheduler.step()
    window.sums.add({"loss": loss.detach(), **batch_metrics(s.detach(), batch)})
    window.groups += len(batch.group_ids)
    window.tokens += int(batch.cand_mask.sum())
    run.pairs += weighted_pairs(batch)


def _after_step(run: _Run, window: checkpoint.Window) -> checkpoint.Window:
    step, config = run.state.step, run.config
    last = step >= run.total_steps
    epoch = run.state.epoch_progress(run.steps_per_epoch)
    if step % config.logging_steps == 0 or last:
        run.last_train = window.summary(list(TRAIN_METRICS)) | {"lr": window.lr}
        run.log.write(step, epoch, "train", run.last_train)
        window = checkpoint.Window()
    if run.held_out and config.eval_steps and step % config.eval_steps == 0 and not last:
        run.log.write(step, epoch, "eval", run.eval())
    return window


def _loop(run: _Run) -> None:
    acc, state = run.accelerator, run.state
    window = checkpoint.Window()
    bar = checkpoint.progress_bar(acc, run.total_steps, 0)
    t0 = time.perf_counter()
    while state.step < run.total_steps:
        run.loader.set_epoch(state.epoch)
        for batch in run.loader:
            _micro_step(run, batch, window)
            if acc.sync_gradients:
                state.step += 1
                window = _after_step(run, window)
                bar.update(state.step, run.last_train)
                if state.step >= run.total_steps:
                    break
        else:
            state.epoch += 1
    run.seconds = time.perf_counter() - t0
    bar.close()


def _build(config: RewardModelConfig, model: Any, train_set: list[TokenizedGroup],
           held_out: list[TokenizedGroup], out_dir: Path) -> _Run:
    from torch.utils.data import DataLoader
    from transformers import get_scheduler

    acc = fresh_accelerator(config)
    pad = model.config.pad_token_id
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=config.lr, weight_decay=config.weight_decay)
    loader = DataLoader(train_set, batch_size=config.batch_size, shuffle=True,  # type: ignore[arg-type]
                        collate_fn=partial(collate_groups, pad_token_id=pad))
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / config.grad_accum)
    total = config.max_steps or config.epochs * steps_per_epoch
    scheduler = get_scheduler(config.lr_scheduler, optimizer,
                              num_warmup_steps=config.warmup_steps, num_training_steps=total)
    return _Run(config=config, accelerator=acc, model=model, optimizer=optimizer,
                scheduler=scheduler, loader=loader, held_out=held_out, pad_token_id=pad,
                total_steps=total, steps_per_epoch=steps_per_epoch,
                log=checkpoint.MetricsLog(out_dir, acc))


def _save(run: _Run, tokenizer: Any, out_dir: Path) -> None:
    acc = run.accelerator
    acc.wait_for_everyone()
    model = acc.unwrap_model(run.model)
    model.save_pretrained(out_dir, is_main_process=acc.is_main_process, save_function=acc.save,
                          state_dict=acc.get_state_dict(run.model))
    if acc.is_main_process:
        tokenizer.save_pretrained(out_dir)
    acc.wait_for_everyone()


def train_reward_model(config: RewardModelConfig, groups: Sequence[ValidatedGroup],
                       out_dir: str | Path) -> RewardModelResult:
    """Train a reward model on ``groups`` and save it with its tokenizer into ``out_dir``.

    Returns:
        RewardModelResult: ``stats`` (the fields of
        :class:`~grouppref.schemas.reports.RewardModelStats` but ``data_fingerprint``),
        rejects, and the ids of the groups used.

    Raises:
        ConfigError / ModelNotFoundError: bad settings or model (before any training).
        StageError: no trainable group.
    """
    check_precision(config.mixed_precision)
    out = Path(out_dir)
    model, tokenizer = load_reward_model(config.model, config.seed)
    if config.gradient_checkpointing:
        enable_checkpointing(model)
    max_length = context_length(model, tokenizer, config.max_length)
    train_set, held_out, rejects = prepare_groups(groups, tokenizer, max_length, config)
    run = _build(config, model.train(), train_set, held_out, out)
    run.log.open(fresh=True)
    eval_start = run.eval()
    if eval_start:
        run.log.write(0, 0.0, "eval", eval_start)
    _loop(run)
    eval_end = run.eval()
    if eval_end:
        run.log.write(run.state.step, run.state.epoch_progress(run.steps_per_epoch), "eval",
                      eval_end)
    _save(run, tokenizer, out)
    stats = {"steps": run.state.step, "epochs": run.state.epoch_progress(run.steps_per_epoch),
             "loss": config.loss, "train": checkpoint.strict_json(run.last_train),
             "eval_start": checkpoint.strict_json(eval_start),
             "eval": checkpoint.strict_json(eval_end),
             "groups": {"train": len(train_set), "held_out": len(held_out),
                        "rejected": sum(r.scope == "row" for r in rejects),
                        "dropped_candidates": sum(r.scope == "part" for r in rejects)},
             "pairs_per_s": run.pairs / max(run.seconds, 1e-9), "seconds": run.seconds}
    used = [g.group_id for g in train_set + held_out]
    return RewardModelResult(stats=stats, out_dir=out, rejects=rejects, used=used)
