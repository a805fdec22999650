"""Settings of the ``rank`` stage (the rankers' own settings: :mod:`grouppref.pipeline.rank.settings`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grouppref.config import validate
from grouppref.models.loading import ModelDtype
from grouppref.pipeline.rank.settings import (
    RankerSettings,
    annotator_for,
    ranker_keys,
)
from grouppref.runs.stage import StageSpec

STAGE = "rank"


STAGE_VERSION = "1"


class EnsembleSettings(BaseModel):
    """A weighted ensemble of rankers, added as one more ranking."""

    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] = Field(min_length=1, description="Ranker key -> weight (> 0), "
                                      "e.g. reward=1,verify=2; keys are ranker names or kinds.")
    name: str = Field(default="ensemble", pattern=r"^[A-Za-z0-9][\w.:-]{0,63}$",
                      description="Annotator id of the ensemble ranking.")


class RankConfig(BaseModel):
    """Settings of the ``rank`` stage."""

    model_config = ConfigDict(extra="forbid")

    rankers: list[RankerSettings] = Field(min_length=1, description="Rankers; each adds its own "
                                          "ranking (a union on `kind`: reward/rule/similarity/judge).")
    ensemble: EnsembleSettings | None = Field(default=None, description="Weighted ensemble "
                                              "of z-scored ranker scores, as an extra ranking.")
    tie_tolerance: float = Field(default=1e-6, ge=0.0, description="Scores within this absolute "
                                 "distance of a tier's best score share the tier (a tie).")
    input_stage: str = Field(default="generate", description="Stage whose groups are ranked.")
    shard_size: int = Field(default=64, ge=1, description="Groups per resumable shard.")
    device: str = Field(default="cpu", description="Torch device of the models (cpu, cuda, ...).")
    dtype: ModelDtype = Field(
        default="float32", description="Torch dtype of the reward and judge models.")

    @model_validator(mode="after")
    def _consistent(self) -> RankConfig:
        ids = [annotator_for(r).id for r in self.rankers]
        if self.ensemble is not None:
            ids.append(self.ensemble.name)
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"annotator ids {repeated} appear twice; give each ranker a `name`")
        if self.input_stage == STAGE:
            raise ValueError("input_stage cannot be 'rank' (it would read what it overwrites); "
                             "rank the output of generate, simulate or label")
        keys = ranker_keys(self.rankers)
        if len(set(keys)) != len(keys):
            raise ValueError(f"ranker names {keys} repeat; give each ranker a distinct `name`")
        if self.ensemble is not None:
            unknown = sorted(set(self.ensemble.weights) - set(keys))
            if unknown:
                raise ValueError(f"ensemble names unknown rankers {unknown}; the rankers are "
                                 f"{keys}")
            bad = {k: w for k, w in self.ensemble.weights.items() if not w > 0}
            if bad:
                raise ValueError(f"ensemble weights must be > 0, got {bad}")
        return self


def load_rank_config(data: dict[str, Any], where: str) -> RankConfig:
    """Validate settings from a file or the CLI into a ``RankConfig``.

    Raises:
        ConfigError: naming every invalid key and what is wrong with it.
    """
    return validate(RankConfig, data, where)


def _reads(config: RankConfig) -> tuple[str, ...]:
    return (config.input_stage,)


RANK = StageSpec(
    name=STAGE, config=RankConfig,
    summary="Rank every group with automatic rankers into RUN/rank.", reads=_reads)
