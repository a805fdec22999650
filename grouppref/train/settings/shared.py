"""What both trainers are configured with alike: tokenisation (:class:`DataConfig`), LoRA
(:class:`LoraSettings`), the metric backends, and the checks of precision and trackers that run
before any model loads. Light (no torch at import)."""

from __future__ import annotations

import importlib.util
from typing import Literal

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


def check_trackers(report_to: list[str]) -> None:
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
