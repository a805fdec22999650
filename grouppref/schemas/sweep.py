"""What ``grouppref sweep`` writes to ``DIR/summary.json`` (and the report's sweep section reads):
every trial, and each setting's mean and interval over its seeds."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TrialState = Literal["complete", "pruned", "failed", "interrupted", "duplicate", "running",
                     "waiting"]


class SweepTrial(BaseModel):
    """One Optuna trial: one setting trained with every seed (or stopped early)."""

    model_config = ConfigDict(extra="forbid")

    number: int
    state: TrialState
    params: dict[str, Any] = Field(description="The swept settings of the trial.")
    value: float | None = Field(default=None, description="Mean held-out metric over seeds.")
    seed_values: list[float] = Field(default_factory=list,
                                     description="The held-out metric of each seed trained.")
    last_intermediate: float | None = Field(
        default=None, description="The last intermediate held-out value (a pruned trial's).")
    steps: int | None = Field(default=None, description="Optimizer steps per seed.")
    groups: int | None = Field(default=None, description="Training groups per seed.")
    tokens: int | None = Field(default=None, description="Trained tokens per seed (estimated "
                               "from the tokenised groups the steps read).")
    reads: int | None = Field(default=None, description="Annotation reads of the groups the "
                              "trial trained on (a group of k costs k).")
    error: str | None = Field(default=None, description="Why a failed trial failed, one line.")
    seconds: float | None = None
    duplicate_of: int | None = Field(default=None, description="A grid point drawn twice "
                                     "(two workers at once): the trial that measures it.")


class SweepSetting(BaseModel):
    """One setting over its seeds (of every complete trial with these params)."""

    model_config = ConfigDict(extra="forbid")

    params: dict[str, Any]
    n: int = Field(description="Seeds measured.")
    mean: float
    low: float | None = Field(default=None, description="95% t-interval's lower end "
                              "(None with one seed).")
    high: float | None = None
    trials: list[int] = Field(default_factory=list)


class SweepSummary(BaseModel):
    """The whole study: settings ranked by mean, the trials, and the best setting."""

    model_config = ConfigDict(extra="forbid")

    study: str
    storage: str = Field(description="The storage URL, password removed.")
    key: str = Field(description="Cache key: the data's fingerprint and the search space.")
    metric: str
    direction: Literal["maximize", "minimize"]
    budget: Literal["steps", "tokens", "annotation"]
    amount: int | None
    sampler: str
    seeds: list[int]
    space: dict[str, Any]
    total: int = Field(description="Trials the sweep runs in all.")
    settings: list[SweepSetting] = Field(description="Best first.")
    trials: list[SweepTrial]
    best: dict[str, Any] | None = Field(default=None, description="The best setting's params.")
