"""Settings of ``grouppref eval`` and the ``eval`` stage. Light (no torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grouppref.runs.stage import StageSpec
from grouppref.train.settings.shared import DataConfig


class EvalConfig(BaseModel):
    """Settings of the ``eval`` stage: pair accuracy and margins of models on a group dataset."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        default=None,
        description="Model to evaluate (in a run: default the model RUN/train saved).",
    )
    baseline: str | None = Field(
        default=None,
        description="Model to compare with (in a run: default the model training started from).",
    )
    ref_model: str | None = Field(
        default=None,
        description="Reference of the implicit reward beta*(log pi - log pi_ref) (default: the "
        "baseline); without one only the models' own log-prob orderings are scored.",
    )
    split: Literal["test", "train", "all"] = Field(
        default="test", description="Which groups to score: the held-out split, train, or all."
    )
    beta: float | None = Field(
        default=None, gt=0,
        description="Implicit reward scale (default: the one RUN/train used, else 0.1).",
    )
    length_normalise: bool | None = Field(
        default=None, description="Divide each candidate's log-ratio by its token count "
        "(default: as RUN/train did, else off).",
    )
    batch_size: int = Field(default=8, ge=1, description="Groups per forward pass.")
    share_prefix: bool = Field(default=True, description="Compute each prompt once per group.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Precision of the scoring passes."
    )
    data: DataConfig = Field(default_factory=DataConfig,
                             description="Tokenisation: max lengths, overflow, chat template.")


def _eval_reads(config: EvalConfig) -> tuple[str, ...]:
    return ("validate",) if config.model else ("validate", "train")


EVAL = StageSpec(name="eval", config=EvalConfig,
                 summary="Compare the trained model with its start on the held-out split.",
                 reads=_eval_reads)
