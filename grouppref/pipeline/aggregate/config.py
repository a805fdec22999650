"""Settings of the ``aggregate`` stage."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grouppref.runs.processes import workers_for
from grouppref.runs.stage import StageSpec
from grouppref.schemas.records import AnnotatorKind

STAGE = "aggregate"


STAGE_VERSION = "2"  # 2: reliability on audit groups for annotators of targeted groups


SELECTION_KEY = "selection"  # Ranking.metadata key: how the ranking's group was chosen
UNIFORM_SELECTIONS = ("audit", "random", "all")  # drawn uniformly (or every group)
TARGETED_SELECTIONS = ("uncertain",)  # chosen by the automatic rankings' uncertainty


INPUT_STAGES = ("label", "simulate", "rank", "import")
PARALLEL_GROUPS = 20_000  # the fewest groups worth fitting and writing in other processes


Action = Literal["off", "flag", "drop"]


def _default_kind_weights() -> dict[AnnotatorKind, float]:
    return {"human": 1.0, "simulated": 1.0, "llm_judge": 0.5, "reward_model": 0.5, "rule": 0.5}


class AggregateConfig(BaseModel):
    """Settings of the ``aggregate`` stage."""

    model_config = ConfigDict(extra="forbid")

    input_stage: str | None = Field(default=None, description="Stage to read AnnotatedGroups "
                                    "from; default: the first complete of label, simulate, rank, "
                                    "import.")
    source: str | None = Field(default=None, description="Aggregate this dataset instead of a "
                               "stage of the run: groups with rankings, e.g. a `grouppref "
                               "export` in groups format (any container) or a Hub id; their "
                               "rankings are aggregated again.")
    prior_strength: float = Field(default=0.1, gt=0, description="L2 prior alpha on strengths "
                                  "(choix.opt_pairwise's alpha: prior variance 1/(2 alpha)).")
    kind_weights: dict[AnnotatorKind, float] = Field(
        default_factory=_default_kind_weights, description="Weight of annotator kinds relative "
        "to humans, merged over the defaults (human 1, simulated 1, llm_judge/reward_model/rule "
        "0.5); 0 leaves a kind out.")
    reliability_iterations: int = Field(default=3, ge=0, description="Rounds of consensus -> "
                                        "annotator tau -> weights -> refit (0: kind weights only).")
    reliability_groups: Literal["auto", "all"] = Field(
        default="auto", description="Groups an annotator's reliability is measured on. auto: an "
        "annotator with rankings of groups chosen by uncertainty (ranking metadata selection="
        "uncertain, from `label push --select uncertain`) is judged only on its groups drawn "
        "uniformly (selection=audit, `--audit-share`), since the hardest groups make anyone "
        "look unreliable; with fewer than min_groups_for_reliability of them, on all its "
        "groups as before. all: every group for everyone (biased under selection).")
    reliability_weight: Literal["tau", "log_odds"] = Field(
        default="tau", description="How an annotator's reliability weight is made from its "
        "agreement with the leave-one-out consensus (on the groups reliability_groups picks). "
        "tau: clip(Kendall's tau, 0, 1). log_odds: log((1 - e) / e) of its share e of "
        "pairwise votes against the consensus (shrunk towards 0.5 over few votes, floored "
        "at 0, capped at log 49), what a vote is worth under a one-coin noise model.")
    min_groups_for_reliability: int = Field(default=5, ge=1, description="Annotators with fewer "
                                            "comparable groups keep their kind weight, unflagged.")
    unreliable_tau: float = Field(default=0.0, ge=-1, le=1, description="Chance level of tau: an "
                                  "annotator not significantly above it is unreliable.")
    unreliable_z: float = Field(default=2.0, ge=0, description="Significance (standard errors) "
                                "an annotator's tau must clear above unreliable_tau.")
    drop_unreliable: bool = Field(default=True, description="Leave unreliable annotators' "
                                  "rankings out of the fit (kept in the rows, groups flagged).")
    min_rankings: int = Field(default=2, ge=1, description="Rule too_few_rankings: fewer used "
                              "rankings than this.")
    too_few_rankings: Action = Field(default="flag", description="Action of rule too_few_rankings.")
    min_kendall_w: float = Field(default=0.5, ge=0, le=1, description="Rule low_agreement: "
                                 "Kendall's W below this (random rankings give 1/m on average).")
    low_agreement: Action = Field(default="flag", description="Action of rule low_agreement.")
    cycle: Action = Field(default="flag", description="Action of rule cycle (intransitive "
                          "pairwise majority).")
    coin_flip_margin: float = Field(default=0.1, ge=0, le=0.5, description="Rule coin_flip: "
                                    "p(best > worst) below 0.5 + this margin.")
    coin_flip: Action = Field(default="flag", description="Action of rule coin_flip.")
    disconnected: Action = Field(default="flag", description="Action of rule disconnected: "
                                 "the used comparisons of a group do not link every candidate "
                                 "to every other (partial rankings, pairs), so the order across "
                                 "the unlinked sets comes from the prior, not the data.")
    no_rankings: Literal["reject", "flag"] = Field(default="reject", description="Groups with "
                                                   "no usable ranking: reject the row or flag it.")
    tie_tolerance: float = Field(default=1e-6, ge=0, description="Strength gap under which the "
                                 "consensus puts two candidates in one tier.")
    pair_targets: Literal["auto", "soft", "hard"] = Field(
        default="auto", description="Pair targets written to the rows: soft (the BT fit's p_ij "
        "and confidence w_ij), hard (p = 1 for the consensus winner, weight 1), or auto: soft "
        "up to hard_targets_above estimated noise, hard above it (docs/evidence.md, issue-16 "
        "runs: soft targets best up to 20% noise, hard ones at 30-40%).")
    hard_targets_above: float = Field(default=0.25, ge=0, le=1, description="With pair_targets "
                                      "auto: the estimated noise rate above which the targets "
                                      "are hard.")
    dpo_fallback_threshold: float = Field(default=0.25, ge=0, le=1, description="Recommend the "
                                          "dpo loss when the estimated noise rate is above this "
                                          "and the pair targets are soft (docs/evidence.md).")
    batch_size: int = Field(default=4096, ge=1, description="Groups fitted together per batch.")
    max_iter: int = Field(default=100, ge=1, description="Newton iterations per fit.")
    shard_size: int = Field(default=5000, ge=1, description="Groups per resumable shard.")
    workers: int = Field(default=0, ge=0, le=64, exclude=True, description="Processes that "
                         "fit and write a large input's groups (20,000 or more), a batch or a "
                         "shard each (0: one per CPU core, at most 8; 1: one process). The "
                         "result is the same for any number.")

    @field_validator("kind_weights")
    @classmethod
    def _non_negative(cls, v: dict[AnnotatorKind, float]) -> dict[AnnotatorKind, float]:
        bad = {k: w for k, w in v.items() if not w >= 0}
        if bad:
            raise ValueError(f"kind weights must be >= 0, got {bad}")
        return {**_default_kind_weights(), **v}


def workers_of(config: AggregateConfig, groups: int, tasks: int) -> int:
    """Processes for ``tasks`` batches (or shards) of an input of ``groups`` groups: as
    ``config.workers`` asks (:func:`~grouppref.runs.processes.workers_for`) from
    :data:`PARALLEL_GROUPS` groups on, else 1."""
    return workers_for(config.workers, tasks) if groups >= PARALLEL_GROUPS else 1


def _reads(config: AggregateConfig) -> tuple[str, ...]:
    if config.source:
        return ()
    return (config.input_stage,) if config.input_stage else INPUT_STAGES


AGGREGATE = StageSpec(
    name=STAGE, config=AggregateConfig,
    summary="Fit Bradley-Terry per group into RUN/aggregate.", reads=_reads)
