"""The accelerate loop both trainers run (the policy's, :mod:`grouppref.train.policy.trainer`, and the
reward model's, :mod:`grouppref.train.reward_model.trainer`): epochs over a seedable loader, resuming
mid-epoch by skipping the micro-batches already seen; on each optimizer step the clip, update
and schedule; after it the train window logged every ``logging_steps``, the held-out eval every
``eval_steps`` and a checkpoint every ``save_steps``. What a trainer does differently (its
forward and loss, its metrics, a batch sampler or a refresher) comes in as callables. Then
the model saved alike (:func:`save_model`).

The run object is a :class:`~grouppref.train.engine.prepare.LoopRun` whose ``config`` has
``max_grad_norm``, ``logging_steps``, ``eval_steps``, ``save_steps`` and ``save_total_limit``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouppref.train.engine import checkpoint
from grouppref.train.engine.prepare import LoopRun

MicroStep = Callable[[Any, checkpoint.Window], None]  # (batch, window): forward, backward, step


@dataclass
class Hooks:
    """What a trainer adds to the shared loop (all optional but the two first)."""

    micro_step: MicroStep
    metric_names: Callable[[checkpoint.Window], list[str]]  # the train window's metrics
    evaluate: Callable[[], object] | None = None  # logs a held-out eval (when there is one)
    on_epoch: Callable[[int], None] | None = None  # e.g. a batch sampler's set_epoch
    on_batch: Callable[[Any], Any] | None = None  # may replace the batch (refresh)
    out_dir: Path | None = None  # where checkpoints go (save_steps)


def optimizer_step(run: LoopRun, loss: Any, window: checkpoint.Window) -> None:
    """Backward of ``loss`` and, on a sync step, clip + optimizer + schedule; call it inside
    ``accelerator.accumulate(run.model)``. The window gets the grad norm and the rate used."""
    acc = run.accelerator
    acc.backward(loss)
    if acc.sync_gradients:
        norm = acc.clip_grad_norm_(run.model.parameters(), run.config.max_grad_norm)
        window.grad_norms.append(float(norm))
        window.lr = float(run.scheduler.get_last_lr()[0])  # the rate this update uses
    run.optimizer.step()
    run.optimizer.zero_grad()
    if acc.sync_gradients:
        run.scheduler.step()


def after_step(run: LoopRun, window: checkpoint.Window, hooks: Hooks) -> checkpoint.Window:
    """Log the window, evaluate and checkpoint as configured; returns the (maybe fresh) window."""
    config, step = run.config, run.state.step
    last = step >= run.total_steps
    if step % config.logging_steps == 0 or last:
        run.last_train = window.summary(hooks.metric_names(window)) | {"lr": window.lr}
        run.log.write(step, run.state.epoch_progress(run.steps_per_epoch), "train", run.last_train)
        window = checkpoint.Window()
    if (hooks.evaluate is not None and run.held_out and config.eval_steps
            and step % config.eval_steps == 0 and not last):
        hooks.evaluate()
    if config.save_steps and step % config.save_steps == 0 and hooks.out_dir is not None:
        checkpoint.save(run.accelerator, hooks.out_dir, run.state, config)
    return window


_END = object()


def _skipped(acc: Any, loader: Any, skip: int) -> Iterator[Any]:
    """``loader``'s batches after the first ``skip`` (a resume mid-epoch), drawing nothing from
    torch's global RNG: a DataLoader draws its base seed from it when an iterator starts, which
    the uninterrupted run did at the start of the epoch, before the checkpoint saved the RNG
    state. Without this, a resumed run with dropout (LoRA's) would drift from the
    uninterrupted one."""
    import torch

    with torch.random.fork_rng(devices=[]):
        batches = iter(acc.skip_first_batches(loader, skip))
        first = next(batches, _END)
    if first is _END:
        return
    yield first
    yield from batches


def drive(run: LoopRun, hooks: Hooks) -> None:
    """Train until ``run.total_steps``; resumes mid-epoch by skipping the batches already seen
    (``run.state.batch_in_epoch``), the loader's order being seeded by epoch."""
    acc, state = run.accelerator, run.state
    window = checkpoint.Window()
    bar = checkpoint.progress_bar(acc, run.total_steps, state.step)
    while state.step < run.total_steps:
        run.loader.set_epoch(state.epoch)
        if hooks.on_epoch is not None:
            hooks.on_epoch(state.epoch)
        loader = _skipped(acc, run.loader, state.batch_in_epoch) if state.batch_in_epoch else run.loader
        for batch in loader:
            if hooks.on_batch is not None:
                batch = hooks.on_batch(batch)
            hooks.micro_step(batch, window)
            state.batch_in_epoch += 1
            if acc.sync_gradients:
                state.step += 1
                window = after_step(run, window, hooks)
                bar.update(state.step, run.last_train)
                if state.step >= run.total_steps:
                    break
        else:
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
    bar.close()


def save_model(run: LoopRun, tokenizer: Any, out_dir: Path) -> Any:
    """Save the trained model (with ``run.config.lora``: merged into the weights, or the adapter
    alone) and the tokenizer into ``out_dir``; returns the model as saved (unwrapped)."""
    acc, lora = run.accelerator, run.config.lora
    acc.wait_for_everyone()
    model = acc.unwrap_model(run.model)
    if lora is not None:  # peft: merged weights or the adapter alone (DDP / single device)
        if lora.save == "merged":
            model = model.merge_and_unload()
        model.save_pretrained(out_dir, is_main_process=acc.is_main_process)
    else:  # get_state_dict gathers sharded (FSDP / DeepSpeed) weights
        model.save_pretrained(out_dir, is_main_process=acc.is_main_process,
                              save_function=acc.save, state_dict=acc.get_state_dict(run.model))
    if acc.is_main_process:
        tokenizer.save_pretrained(out_dir)
    acc.wait_for_everyone()
    return model


def end_trackers(run: LoopRun) -> None:
    """Close the ``report_to`` trackers (main process only): ``Accelerator.end_training``
    without its ``destroy_process_group``. A launch's processes still meet after training (a
    run's stage waits for every process before the main one returns its manifest; a second
    training may follow in the same launch), which needs the process group."""
    for tracker in run.accelerator.trackers:
        tracker.finish()
