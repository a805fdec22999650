"""Settings of the refresh rounds of a policy training (``train --refresh-*``; docs/train.md,
"Refresh"). Light (no torch)."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from grouppref.models.loading import ModelDtype
from grouppref.pipeline.rank.config import EnsembleSettings, RankConfig
from grouppref.pipeline.rank.settings import RankerSettings, validation_message
from grouppref.schemas import MAX_K, MIN_K


class RefreshConfig(BaseModel):
    """Offline-online hybrid (docs/train.md, "Refresh"): every ``every`` optimizer steps, sample
    ``k`` candidates for ``prompts`` prompts from the *current* policy, rank them with
    automatic rankers, aggregate them like the aggregate stage, and mix the newest ``buffer``
    of these fresh groups into each batch at the share ``fresh_share``."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(ge=1, description="Run a refresh round every N optimizer steps (the "
                       "first before step 1).")
    prompts: int = Field(ge=1, description="Prompts per round (M), shared out between processes.")
    k: int = Field(default=4, ge=MIN_K, le=MAX_K, description="Candidates per prompt.")
    rankers: list[RankerSettings] = Field(
        min_length=1, description="Automatic rankers of the fresh groups, as in the rank stage "
        "(reward model, rules / verifiable answers, similarity, judge).")
    ensemble: EnsembleSettings | None = Field(
        default=None, description="Weighted ensemble of the rankers' z-scored scores, as an "
        "extra ranking (as in the rank stage).")
    fresh_share: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Share of each batch taken from the fresh "
        "buffer, the rest from the offline data (0: generate and report only; 1: fresh only).")
    buffer: int | None = Field(default=None, ge=1, description="Fresh groups kept, the newest "
                               "(default: 2 x prompts, the last two rounds).")
    source: str | None = Field(
        default=None, description="Prompt file (JSONL/JSON/CSV/Parquet), saved dataset or Hub "
        "id to refresh from (default: the prompts of the training groups).")
    temperature: float = Field(default=1.0, gt=0.0, le=10.0, description="Sampling temperature "
                               "(1 keeps the on-policy KL estimate unbiased).")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass kept.")
    max_new_tokens: int = Field(default=128, ge=1, description="Most tokens per fresh "
                                "candidate (below data.max_response_length).")
    max_resample: int = Field(default=3, ge=0, le=20, description="Re-samples of an empty or "
                              "duplicate candidate before it is left out.")
    batch_size: int = Field(default=16, ge=1, description="Sequences per generate call.")
    tie_tolerance: float = Field(default=1e-6, ge=0.0, description="Ranker scores this close "
                                 "share a tier (a tie).")

    @model_validator(mode="after")
    def _rankers_agree(self) -> RefreshConfig:
        try:
            self.rank_config()
        except ValidationError as e:  # repeated annotator ids, unknown ensemble keys
            raise ValueError(validation_message(e)) from e
        return self

    def rank_config(self, device: str = "cpu", dtype: ModelDtype = "float32") -> RankConfig:
        """The rank stage's settings for these rankers (the refresh rounds rank with them)."""
        return RankConfig(rankers=self.rankers, ensemble=self.ensemble,
                          tie_tolerance=self.tie_tolerance, device=device, dtype=dtype)

    def buffer_size(self) -> int:
        """``buffer``, or two rounds' worth of groups."""
        return self.buffer if self.buffer is not None else 2 * self.prompts

    def fresh_per_batch(self, batch_size: int) -> int:
        """Fresh groups in a micro-batch of ``batch_size``: ``floor(F * b + 1/2)``."""
        return math.floor(self.fresh_share * batch_size + 0.5)

    def offline_per_batch(self, batch_size: int) -> int:
        """Offline groups per micro-batch (the data loader's batch size). With ``fresh_share``
        1 the offline batches only pace the epochs (and stand in while the buffer is empty)."""
        fresh = self.fresh_per_batch(batch_size)
        return batch_size if fresh == batch_size else batch_size - fresh

    def check_split(self, batch_size: int) -> None:
        """Raise ``ValueError`` when ``fresh_share`` rounds to no fresh or no offline group."""
        fresh = self.fresh_per_batch(batch_size)
        share = self.fresh_share
        if 0 < share < 1 and fresh in (0, batch_size):
            raise ValueError(
                f"refresh.fresh_share {share:g} with batch_size {batch_size} gives {fresh} fresh "
                f"and {batch_size - fresh} offline groups per batch; use a larger batch_size, or "
                "fresh_share 0 (report only) / 1 (fresh groups only)")
