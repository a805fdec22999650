"""What both trainers are configured with alike, declared once: :class:`TrainingSettings` (the
fields the policy's and the reward model's settings share, each with the one description that is
also its CLI help), tokenisation (:class:`DataConfig`), LoRA (:class:`LoraSettings`), the metric
backends, and the checks of precision and trackers that run before any model loads. Light (no
torch at import)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from grouppref.errors import ConfigError

Tracker = Literal["tensorboard", "trackio"]


_TRACKER_PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio"}


class DataConfig(BaseModel):
    """How groups are turned into tokens."""

    model_config = ConfigDict(extra="forbid")

    max_prompt_length: int = Field(
        default=512, ge=1, description="Longest prompt in tokens; a longer prompt rejects its group.")
    max_response_length: int = Field(
        default=512, ge=1, description="Longest response in tokens, EOS included; see 'overflow'.")
    overflow: Literal["truncate", "reject"] = Field(
        default="truncate",
        description="A response over max_response_length: 'truncate' it, or 'reject' the "
                    "candidate (a group left with fewer than 2 candidates is rejected).")
    chat_template: bool = Field(
        default=True,
        description="Render prompts with the tokenizer's chat template (needed for chat "
                    "prompts); off: the prompt text is used as is.")


class LoraSettings(BaseModel):
    """Low-rank adapters through ``peft`` (only the adapters train; the base stays frozen)."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=16, ge=1, description="LoRA rank.")
    alpha: float = Field(default=32.0, gt=0, description="LoRA scaling numerator (alpha / r).")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Module names to adapt (e.g. q_proj v_proj), or 'all-linear'.",
    )
    save: Literal["merged", "adapter"] = Field(
        default="merged",
        description="'merged': save the full model with the adapters folded in (loads like any "
        "model); 'adapter': save only the peft adapter (small; load with peft).",
    )


# one description per field, shared by both trainers' settings; ``lr`` is a type so that each
# trainer keeps its own default with the same help
LearningRate = Annotated[float, Field(gt=0, description="Peak learning rate (AdamW).")]


class TrainingSettings(BaseModel):
    """The settings both trainers read alike, declared once: the policy's
    :class:`~grouppref.train.settings.policy.TrainConfig` and the reward model's
    :class:`~grouppref.train.settings.reward_model.RewardModelConfig` extend it. Each field's
    description is its YAML documentation and its CLI help in both commands."""

    model_config = ConfigDict(extra="forbid")

    target_temperature: float = Field(
        default=1.0, gt=0.0, description="nca and infonca: temperature alpha of the soft "
        "targets softmax(strengths / alpha) over a group's candidates (strengths: the "
        "aggregated Bradley-Terry log-strengths; small alpha: all weight on the best).")
    pair_targets: Literal["soft", "hard"] = Field(
        default="soft",
        description="gspo only. soft: the aggregation's p_ij and confidence w_ij; hard: p=1 for "
        "the winner of every pair in different consensus tiers, weight 1, tied pairs left out.",
    )
    lr: LearningRate = 5e-6
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up steps.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        default="linear", description="Learning-rate schedule after warm-up.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    epochs: int = Field(default=1, ge=1, description="Passes over the training groups.")
    max_steps: int | None = Field(
        default=None, ge=1, description="Stop after this many optimizer steps (overrides epochs).")
    batch_size: int = Field(default=4, ge=1, description="Groups per device per micro-batch "
                            "(a group is K candidates).")
    eval_batch_size: int = Field(default=8, ge=1, description="Groups per device per forward "
                                 "pass when evaluating.")
    grad_accum: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        default="no", description="Autocast precision: bf16 (CPU or a bf16 GPU), fp16 (CUDA only).")
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward to save memory (the "
        "policy with share_prefix: models on sdpa attention only).")
    lora: LoraSettings | None = Field(
        default=None, description="Train LoRA adapters only (peft); the base stays frozen (a "
        "reward model's score head trains fully).")
    seed: int = Field(default=0, description="Seed of initialisation (a reward model's head), "
                      "shuffling, dropout and a reward model's held-out split.")
    logging_steps: int = Field(default=10, ge=1, description="Log training metrics every N steps.")
    eval_steps: int | None = Field(
        default=None, ge=1, description="Evaluate on the held-out groups every N steps (always "
        "at start and end).")
    save_steps: int | None = Field(
        default=None, ge=1, description="Write a resumable checkpoint every N steps "
        "(OUT/checkpoints; --resume continues from the newest).")
    save_total_limit: int = Field(default=2, ge=1, description="Checkpoints kept (oldest removed).")
    report_to: list[Tracker] = Field(
        default_factory=list, description="Extra metric backends: tensorboard, trackio (logs "
        "under OUT/logs).")


def check_trackers(report_to: Sequence[str]) -> None:
    """Fail before any loading when a requested metric backend is not installed.

    Raises:
        ConfigError: a backend of ``report_to`` whose package is missing.
    """
    for name in report_to:
        if importlib.util.find_spec(_TRACKER_PACKAGES[name]) is None:
            raise ConfigError(f"report_to {name!r}: the package {_TRACKER_PACKAGES[name]!r} is "
                              f"not installed; `pip install {_TRACKER_PACKAGES[name]}` or drop it")


def check_precision(mixed_precision: str) -> None:
    """Fail early when the hardware cannot run the requested precision.

    Raises:
        ConfigError: fp16 without CUDA, or bf16 on a GPU without bf16 support.
    """
    import torch

    if mixed_precision == "fp16" and not torch.cuda.is_available():
        raise ConfigError("mixed_precision 'fp16' needs a CUDA GPU; use 'bf16' (CPU works) or 'no'")
    if (mixed_precision == "bf16" and torch.cuda.is_available()
            and not torch.cuda.is_bf16_supported()):
        raise ConfigError("mixed_precision 'bf16': this GPU has no bf16; use 'fp16' or 'no'")
