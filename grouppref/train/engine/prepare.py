"""What both trainers (the policy's, :mod:`grouppref.train.policy.trainer`, and the reward model's,
:mod:`grouppref.train.reward_model.trainer`) prepare before their loop the same way: a fresh ``Accelerator``,
gradient checkpointing, LoRA adapters, the autocast dtype, the check that some group is left
to train on, and the fields of the object their loop works on (:class:`LoopRun`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from grouppref.errors import StageError
from grouppref.schemas import Reject
from grouppref.train.engine import checkpoint
from grouppref.train.engine.distributed import cpu_launch
from grouppref.train.settings.shared import LoraSettings, TrainingSettings
from grouppref.train.tensors.batch import TokenizedGroup

if TYPE_CHECKING:
    from accelerate import Accelerator

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(kw_only=True)
class LoopRun:
    """Everything a training loop touches (one object instead of ten arguments); each trainer
    adds its own fields."""

    config: TrainingSettings
    accelerator: Accelerator
    model: Any  # prepared (wrapped) by accelerate: the model's own type or a DDP/FSDP wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: Any  # a DataLoader prepared by accelerate (its own subclass)
    held_out: list[TokenizedGroup]
    pad_token_id: int
    total_steps: int
    steps_per_epoch: int
    log: checkpoint.MetricsLog
    state: checkpoint.TrainState = field(default_factory=checkpoint.TrainState)
    last_train: dict[str, float] = field(default_factory=dict)  # the last logging window


def fresh_accelerator(config: TrainingSettings, **extra: Any) -> Accelerator:
    """An ``Accelerator`` for ``config`` (``grad_accum``, ``mixed_precision``, ``seed``): seeded,
    resumable data order; ``extra`` goes to ``Accelerator`` (trackers, project folders).

    accelerate keeps one global state per process; a second training in the same process
    (tests, notebooks) may use another precision or accumulation, so it starts afresh. The
    process group (``PartialState``) is kept.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DataLoaderConfiguration

    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(cpu=cpu_launch(), gradient_accumulation_steps=config.grad_accum,
                       mixed_precision=config.mixed_precision,
                       dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True,
                                                                 data_seed=config.seed),
                       **extra)


def enable_checkpointing(model: Any) -> None:
    """Recompute activations in backward (non-reentrant: DDP and LoRA need that variant)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def add_lora(model: Any, lora: LoraSettings, task_type: str, gradient_checkpointing: bool) -> Any:
    """``model`` with peft LoRA adapters from ``lora`` (a ``LoraSettings``); ``task_type``
    ``CAUSAL_LM`` (the policy) or ``SEQ_CLS`` (a reward model: peft adds the score head to
    ``modules_to_save``, so it trains fully). With gradient checkpointing the inputs require
    gradients, so the frozen base still back-propagates into the adapters."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(
        # peft annotates lora_alpha as int; it only divides it by r (a float alpha works)
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,  # type: ignore[arg-type]
        target_modules=lora.target_modules, task_type=task_type))
    if gradient_checkpointing:
        model.enable_input_require_grads()
    return model


def autocast_dtype(mixed_precision: str) -> torch.dtype | None:
    """The autocast dtype of a ``mixed_precision`` setting (``None`` for ``no``)."""
    return _AUTOCAST.get(mixed_precision)


def require_trainable(train_set: Sequence[Any], held_out: Sequence[Any], rejects: list[Reject],
                      given: int, fix: str) -> None:
    """Raise when no group is left to train on.

    Raises:
        StageError: naming how many groups were given, held out and rejected, up to three
            reject reasons, and ``fix``.
    """
    if train_set:
        return
    reasons = sorted({r.reason for r in rejects if r.scope == "row"})[:3]
    raise StageError(f"no trainable groups: {given} given, {len(held_out)} held out, "
                     f"{sum(r.scope == 'row' for r in rejects)} rejected (e.g. {reasons}); "
                     f"fix the data or {fix}")
