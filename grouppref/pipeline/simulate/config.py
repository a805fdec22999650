"""Settings of the ``simulate`` stage."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grouppref.runs.stage import StageSpec
from grouppref.schemas.records import AnnotatorKind

AUTOMATIC_KINDS: tuple[AnnotatorKind, ...] = ("reward_model", "rule", "llm_judge")
STAGE = "simulate"


STAGE_VERSION = "1"


class AnnotatorSpec(BaseModel):
    """One simulated annotator."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, pattern=r"^\S+$", description="Annotator id in the rankings.")
    behavior: Literal["noisy", "random", "reversed"] = Field(
        default="noisy", description="noisy: Mallows around the truth with `flip_rate`; random: "
        "uniform permutations; reversed: the true order backwards.")
    flip_rate: float = Field(default=0.1, ge=0.0, le=0.5, description="Expected share of "
                             "pairwise votes against the truth (noisy annotators).")

    def expected_flip_rate(self) -> float:
        return {"noisy": self.flip_rate, "random": 0.5, "reversed": 1.0}[self.behavior]


def _default_panel() -> list[AnnotatorSpec]:
    return [AnnotatorSpec(id=f"sim-{i + 1}", flip_rate=f) for i, f in enumerate((0.05, 0.15, 0.3))]


class SimulateConfig(BaseModel):
    """Settings of the ``simulate`` stage."""

    model_config = ConfigDict(extra="forbid")

    input_stage: str = Field(default="rank", description="Stage whose AnnotatedGroups get the "
                             "simulated rankings (rank or label).")
    annotators: list[AnnotatorSpec] = Field(default_factory=_default_panel, min_length=1,
                                            description="The simulated panel.")
    per_group: int | None = Field(default=None, ge=1, description="How many panel members rank "
                                  "each group (drawn at random); all of them when unset.")
    truth_kinds: list[AnnotatorKind] = Field(
        default_factory=lambda: list(AUTOMATIC_KINDS), min_length=1,
        description="Kinds of existing rankings whose mean gives the true scores.")
    truth_annotator: str | None = Field(default=None, description="Take the truth from this one "
                                        "annotator id instead of the mean over truth_kinds.")
    truth_use_scores: bool = Field(default=True, description="Use a ranking's min-max normalised "
                                   "scores when it has them for every candidate (else positions).")
    seed: int = Field(default=0, description="Random seed of the panel.")
    shard_size: int = Field(default=1000, ge=1, description="Groups per resumable shard.")


def _reads(config: SimulateConfig) -> tuple[str, ...]:
    return (config.input_stage,)


SIMULATE = StageSpec(
    name=STAGE, config=SimulateConfig,
    summary="Add a simulated annotator panel into RUN/simulate.", reads=_reads)
