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
Checkpoints and their restore live in :mod:`grouppref.train.checkpoint`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from grouppref.errors import StageError
from grouppref.models.loading import load_causal_lm, load_tokenizer
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.schemas.reports import TrainStats
from grouppref.train import checkpoint
from grouppref.train.config import TrainConfig, check_precision, check_trackers
from grouppref.train.data import GroupBatch, TokenizedGroup, collate_groups, tokenize_groups
from grouppref.train.distributed import cpu_launch
from grouppref.train.eval import evaluate, reward_metrics
from grouppref.train.loop import Objective, step_loss
from grouppref.train.mix import MixSampler, check_sources, mix_loader
from grouppref.train.model_card import public_stats
from grouppref.train.reference import ReferenceInfo, ensure_reference, require_reference
from grouppref.train.trim import trim_for_loss

TRAIN_METRICS = ("loss", "pair_accuracy", "margin", "reward_best", "reward_worst", "kl")


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model (unwrapped) and its numbers."""

    model: Any
    tokenizer: Any
    stats: TrainStats
    out_dir: Path
    rejects: list[Reject]
    used: list[str] = field(default_factory=list)  # group ids trained or evaluated on


@dataclass
class _Run:
    """Everything the loop touches (one object instead of ten arguments)."""

    config: TrainConfig
    accelerator: Any
    model: Any
    optimizer: Any
    scheduler: Any
    loader: Any
    held_out: list[TokenizedGroup]
    pad_token_id: int
    out_dir: Path
    total_steps: int
    steps_per_epoch: int
    state: checkpoint.TrainState
    log: checkpoint.MetricsLog
    objective: Objective
    last_train: dict[str, float] = field(default_factory=dict)
    refresh: Any = None  # a grouppref.train.refresh.Refresher when config.refresh is set
    mix: MixSampler | None = None  # the batch sampler when config.mix is set


# -- one step ---------------------------------------------------------------------------------
def _micro_step(run: _Run, batch: GroupBatch, window: checkpoint.Window) -> None:
    """The shared step (:func:`grouppref.train.loop.step_loss`) under accelerate: forward,
    backward and (on a sync step) clip + optimizer + schedule."""
    acc, config = run.accelerator, run.config
    with acc.accumulate(run.model):
        out = step_loss(run.model, batch, run.objective, share_prefix=config.share_prefix)
        if run.refresh is not None:
            run.refresh.observe(batch, out.logps)
        acc.backward(out.loss.mean())
        if acc.sync_gradients:
            norm = acc.clip_grad_norm_(run.model.parameters(), config.max_grad_norm)
            window.grad_norms.append(float(norm))
            window.lr = run.scheduler.get_last_lr()[0]  # the rate this update uses
        run.optimizer.step()
        run.optimizer.zero_grad()
        if acc.sync_gradients:
            run.scheduler.step()
    stats = reward_metrics(out.logps, batch, config.beta, config.length_normalise)
    window.sums.add({"loss": out.loss.detach(), **stats, **out.extra})
    if run.mix is not None:  # realised and scheduled shares of the label sources
        window.sums.add({k: torch.tensor(v) for k, v in
                         run.mix.metrics(batch.group_ids, run.state.step).items()})
    window.groups += len(batch.group_ids)
    window.tokens += int(batch.prompt_mask.sum() + batch.cand_mask.sum())


# -- the loop ---------------------------------------------------------------------------------
def _after_step(run: _Run, window: checkpoint.Window) -> checkpoint.Window:
    """Log, evaluate and checkpoint as configured; returns the (possibly fresh) window."""
    config, step = run.config, run.state.step
    last = step >= run.total_steps
    if step % config.logging_steps == 0 or last:
        names = list(TRAIN_METRICS) + sorted(set(window.sums.sums) - set(TRAIN_METRICS))
        run.last_train = window.summary(names) | {"lr": window.lr}
        run.log.write(step, run.state.epoch_progress(run.steps_per_epoch), "train", run.last_train)
        window = checkpoint.Window()
    if run.held_out and config.eval_steps and step % config.eval_steps == 0 and not last:
        _log_eval(run)
    if config.save_steps and step % config.save_steps == 0:
        checkpoint.save(run.accelerator, run.out_dir, run.state, config)
    return window


def _log_eval(run: _Run) -> dict[str, float]:
    metrics = evaluate(run.model, run.held_out, beta=run.config.beta,
                       length_normalise=run.config.length_normalise,
                       batch_size=run.config.eval_batch_size, pad_token_id=run.pad_token_id,
                       share_prefix=run.config.share_prefix, autocast_dtype=_autocast(run))
    run.log.write(run.state.step, run.state.epoch_progress(run.steps_per_epoch), "eval", metrics)
    return metrics


def _autocast(run: _Run) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.config.mixed_precision)


def _loop(run: _Run) -> None:
    """Train until ``total_steps``; resumes mid-epoch by skipping the batches already seen."""
    acc, state = run.accelerator, run.state
    window = checkpoint.Window()
    bar = checkpoint.progress_bar(acc, run.total_steps, state.step)
    while state.step < run.total_steps:
        run.loader.set_epoch(state.epoch)
        if run.mix is not None:
            run.mix.set_epoch(state.epoch)
        loader = (acc.skip_first_batches(run.loader, state.batch_in_epoch)
                  if state.batch_in_epoch else run.loader)
        for batch in loader:
            if run.refresh is not None:  # runs a refresh round when due, adds fresh groups
                batch = run.refresh.mix(batch, state)
            _micro_step(run, batch, window)
            state.batch_in_epoch += 1
            if acc.sync_gradients:
                state.step += 1
                window = _after_step(run, window)
                bar.update(state.step, run.last_train)
                if state.step >= run.total_steps:
                    break
        else:
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
    bar.close()


# -- setup ------------------------------------------------------------------------------------
def split_groups(groups: Sequence[ValidatedGroup], tokenizer: Any, config: TrainConfig,
                 ) -> tuple[list[TokenizedGroup], list[TokenizedGroup], list[Reject]]:
    """Tokenize and split into (train, held-out, rejects); ``split=None`` counts as train.
    Training groups keep only the candidates the loss reads (:mod:`grouppref.train.trim`).

    Raises:
        StageError: no group is left to train on (the message gives the reject reasons).
    """
    tokenized, rejects = tokenize_groups(groups, tokenizer, config.data, stage="train")
    train_set = [trim_for_loss(g, config.loss) for g in tokenized if g.split != "test"]
    held_out = [g for g in tokenized if g.split == "test"]
    if not train_set:
        reasons = sorted({r.reason for r in rejects if r.scope == "row"})[:3]
        raise StageError(f"no trainable groups: {len(groups)} given, {len(held_out)} held out, "
                         f"{sum(r.scope == 'row' for r in rejects)} rejected (e.g. {reasons}); "
                         "fix the data or the max lengths")
    return train_set, held_out, rejects


def _disable_dropout(model: Any) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def _prepare_policy(model: Any, config: TrainConfig) -> Any:
    """Gradient checkpointing and LoRA adapters, then train mode."""
    if config.gradient_checkpointing:
        kwargs = {"use_reentrant": False}  # DDP and LoRA need the non-reentrant variant
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if config.lora is not None:
        from peft import LoraConfig, get_peft_model

        lora = config.lora
        model = get_peft_model(model, LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=lora.target_modules, task_type="CAUSAL_LM"))
        if config.gradient_checkpointing:
            model.enable_input_require_grads()
    return model.train()


def _with_reference(policy: Any, tokenizer: Any, groups: list[TokenizedGroup],
                    config: TrainConfig, cache_dir: Path) -> tuple[list[TokenizedGroup], ReferenceInfo]:
    """Reference log-probs for ``groups``: the loaded policy serves as the reference when it is
    the default one in float32, else the reference model is loaded, used and freed."""
    reuse = config.ref_model is None and config.ref_dtype == "float32"
    filled, info = ensure_reference(
        groups, model_name=config.reference_name(), cache_dir=cache_dir, data_config=config.data,
        batch_size=config.eval_batch_size, pad_token_id=tokenizer.pad_token_id,
        share_prefix=config.share_prefix, dtype=config.ref_dtype,
        model=policy if reuse else None)
    require_reference(filled)
    return filled, info


def _make_accelerator(config: TrainConfig, out_dir: Path) -> Any:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

    # accelerate keeps one global state per process; a second train() in the same process
    # (tests, notebooks) may use another precision or accumulation, so start it afresh. The
    # process group (PartialState) is kept.
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(
        cpu=cpu_launch(),
        gradient_accumulation_steps=config.grad_accum,
        mixed_precision=config.mixed_precision,
        log_with=list(config.report_to) or None,
        project_config=ProjectConfiguration(project_dir=str(out_dir),
                                             logging_dir=str(out_dir / "logs")),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True,
                                                  data_seed=config.seed),
    )


def _build_run(config: TrainConfig, accelerator: Any, model: Any, train_set: list[TokenizedGroup],
               held_out: list[TokenizedGroup], pad_token_id: int, out_dir: Path) -> _Run:
    from torch.utils.data import DataLoader
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    batch_size = (config.refresh.offline_per_batch(config.batch_size) if config.refresh
                  else config.batch_size)  # refresh: fresh groups fill the rest of each batch
    collate = partial(collate_groups, pad_token_id=pad_token_id)
    mix = None
    if config.mix is not None:  # batches follow the label-source schedule
        loader, mix = mix_loader(config, train_set, collate, accelerator.num_processes)
    else:
        loader = DataLoader(train_set, batch_size=batch_size, shuffle=True,  # type: ignore[arg-type]
                            collate_fn=collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps_per_epoch = math.ceil(len(loader) / config.grad_accum)
    total = config.max_steps or config.epochs * steps_per_epoch
    # Not prepared: accelerate would step it once per process; we step it once per update.
    scheduler = get_scheduler(config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps,
                              num_training_steps=total)
    accelerator.register_for_checkpointing(scheduler)
    return _Run(config=config, accelerator=accelerator, model=model, optimizer=optimizer,
                scheduler=scheduler, loader=loader, held_out=held_out, pad_token_id=pad_token_id,
                out_dir=out_dir, total_steps=total, steps_per_epoch=steps_per_epoch,
                state=checkpoint.TrainState(), log=checkpoint.MetricsLog(out_dir, accelerator),
                objective=Objective.of(config), mix=mix)


def _save_model(run: _Run, tokenizer: Any) -> Any:
    """Save the model (LoRA merged, or the adapter only) and tokenizer into ``out_dir``."""
    acc, config = run.accelerator, run.config
    acc.wait_for_everyone()
    model = acc.unwrap_model(run.model)
    lora = config.lora
    if lora is not None:  # peft: merged weights or the adapter alone (DDP / single device)
        if lora.save == "merged":
            model = model.merge_and_unload()
        model.save_pretrained(run.out_dir, is_main_process=acc.is_main_process)
    else:  # get_state_dict gathers sharded (FSDP / DeepSpeed) weights
        model.save_pretrained(run.out_dir, is_main_process=acc.is_main_process,
                              save_function=acc.save, state_dict=acc.get_state_dict(run.model))
    if acc.is_main_process:
        tokenizer.save_pretrained(run.out_dir)
    acc.wait_for_everyone()
    return model


def train(config: TrainConfig, groups: Sequence[ValidatedGroup], out_dir: str | Path, *,
          resume: bool | str | Path = False, reference_cache: Path | None = None,
          refresh_dir: Path | None = None) -> TrainResult:
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
            ``out_dir/refresh``; see :mod:`grouppref.train.refresh`).

    Returns:
        TrainResult: the trained model, tokenizer, final metrics and rejects.

    Raises:
        ConfigError: a tracker is not installed, or the precision is not supported here.
        StageError: no trainable group, missing reference log-probs, or an unusable checkpoint.
    """
    check_trackers(config.report_to)
    check_precision(config.mixed_precision)
    from accelerate.utils import set_seed

    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    accelerator = _make_accelerator(config, out_dir)
    set_seed(config.seed)
    ckpt = checkpoint.find(out_dir, resume) if resume else None  # fail before loading models
    if ckpt is not None:
        checkpoint.check_compatible(ckpt, config)
    tokenizer = load_tokenizer(config.model, padding_side="right")
    train_set, held_out, rejects = split_groups(groups, tokenizer, config)
    if config.mix is not None:  # every source the schedule draws from has groups
        check_sources(config.mix, [config.mix.source_of(g.kinds) for g in train_set])
    plan = None
    if config.refresh is not None:  # refresh: checked before any model loads
        from grouppref.train.refresh_round import plan_refresh

        plan = plan_refresh(config, groups, tokenizer, accelerator.distributed_type.value)
    policy = load_causal_lm(config.model, device=str(accelerator.device))
    if config.disable_dropout:
        _disable_dropout(policy)
    filled, ref_info = _with_reference(policy, tokenizer, train_set + held_out, config,
                                       reference_cache or out_dir / "reference")
    train_set, held_out = filled[:len(train_set)], filled[len(train_set):]
    run = _build_run(config, accelerator, _prepare_policy(policy, config), train_set, held_out,
                     tokenizer.pad_token_id, out_dir)
    if ckpt is not None:
        run.state = checkpoint.load(accelerator, ckpt, config)
    run.log.open(fresh=ckpt is None, after_step=run.state.step)
    accelerator.init_trackers("grouppref", config=checkpoint.flat_config(config))
    if plan is not None:
        from grouppref.train.refresh import Refresher

        run.refresh = Refresher(plan, run, tokenizer, refresh_dir or out_dir / "refresh",
                                reference_cache or out_dir / "reference")
        run.refresh.start(fresh=ckpt is None)
    if held_out and run.state.step == 0:
        _log_eval(run)
    _loop(run)
    final_eval = _log_eval(run) if held_out else {}
    model = _save_model(run, tokenizer)
    stats = TrainStats.model_validate(checkpoint.strict_json({
        "steps": run.state.step, "epochs": run.state.epoch_progress(run.steps_per_epoch),
        "train": run.last_train, "eval_start": run.log.first("eval"), "eval": final_eval,
        "groups": {"train": len(train_set), "held_out": len(held_out),
                   "rejected": sum(r.scope == "row" for r in rejects),
                   "dropped_candidates": sum(r.scope == "part" for r in rejects),
                   "truncated_responses": sum(g.num_truncated for g in filled)},
        "reference": {"model": ref_info.model, "cached": ref_info.cached,
                      "entry": str(ref_info.entry)},
        "seconds": round(time.perf_counter() - t0, 3),
        "refresh": [r.model_dump(mode="json") for r in run.refresh.rounds] if run.refresh else [],
    }))
    if run.refresh is not None:
        run.refresh.close()
    if accelerator.is_main_process:
        published = public_stats(stats)  # no local path in the folder one publishes
        (out_dir / "metrics.json").write_text(published.model_dump_json(indent=2) + "\n")
    accelerator.end_training()
    return TrainResult(model=model, tokenizer=tokenizer, stats=stats, out_dir=out_dir,
                       rejects=rejects, used=[g.group_id for g in train_set + held_out])
