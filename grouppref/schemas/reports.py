"""Typed reports that stages hand to each other (and to the CLI and the HTML report).

A stage keeps its report in its manifest's ``stats`` (JSON); whoever reads it validates it
into one of these models instead of reading a dict by string keys. They live here, beside the
records, because stages in several layers read them (the report stage renders the train
stage's numbers, the eval stage reads the train stage's settings).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- export ---------------------------------------------------------------------------------------
class ExportReport(_Report):
    """What one export wrote (``RUN/export/<target>/manifest.json`` stats)."""

    format: Literal["groups", "trl-pairs"]
    target: str = Field(description="dir, parquet, hub or hub-dry-run.")
    location: str = Field(description="Where it went: a folder, a file or hub:owner/name.")
    rows: dict[str, int] = Field(description="Rows per split.")
    files: list[str] = Field(default_factory=list, description="Files written.")
    skipped_pairs: dict[str, int] = Field(default_factory=dict, description="trl-pairs: pairs "
                                          "left out, by reason.")
    groups: dict[str, int] = Field(default_factory=dict, description="Groups per split read.")


# -- aggregate ------------------------------------------------------------------------------------
class AnnotatorReliability(_Report):
    """One annotator as the aggregation saw it."""

    id: str
    kind: str
    groups: int = Field(description="Groups with a comparable leave-one-out consensus.")
    votes: int = Field(description="Strict pairwise votes cast.")
    tau: float | None = Field(description="Mean (c - d) / (c + d) against the leave-one-out "
                              "consensus (concordant / discordant strict pairs).")
    tau_se: float | None
    flip_rate: float | None = Field(description="Moment estimate of its share of flipped votes "
                                    "(on pairs no used ranking ties).")
    tie_rate: float | None = Field(default=None, description="Share of the pairs it ranked that "
                                   "it put in one tier.")
    loo_disagreement: float | None
    annotator_weight: float = Field(description="Weight of its rankings in the final fit "
                                    "(kind weight x reliability; 0: left out).")
    unreliable: bool
    dropped: bool
    reliability_groups: Literal["all", "audit"] = Field(
        default="all", description="Groups its tau and flip rate were measured on: all, or "
        "only those drawn uniformly (audit) because it also ranked groups chosen by "
        "uncertainty; `groups` counts them.")


class Histogram(_Report):
    edges: list[float]
    counts: list[int]


class Distribution(_Report):
    """A distribution over groups (count, mean, quantiles p10..p90, histogram on [0, 1])."""

    count: int
    mean: float | None = None
    quantiles: dict[str, float] = Field(default_factory=dict)
    histogram: Histogram | None = None


class NoiseEstimate(_Report):
    estimated: float | None = Field(description="Vote-weighted mean flip rate (moment "
                                    "estimator over pairwise agreement).")
    observed_against_consensus: float | None = Field(description="Share of used votes against "
                                                     "the final consensus (biased low).")
    tied_pair_share: float | None = Field(default=None, description="Share of group pairs that "
                                          "some used ranking puts in one tier; they are left out "
                                          "of the estimate (None: no pairs).")
    method: str


class RuleOutcome(_Report):
    action: str
    matched: int
    flagged: int
    dropped: int


class Recommendation(_Report):
    """The loss the data suggests; never applied automatically."""

    loss: Literal["gspo", "dpo"] | None
    noise: float | None
    threshold: float
    pair_targets: Literal["soft", "hard"] = Field(default="soft", description="The pair targets "
                                                  "written to the rows (AggregateConfig.pair_targets).")
    automatic: bool = False
    reason: str
    note: str


class NoiseFilter(_Report):
    """One noise rule's setting: its action and the threshold it tests."""

    action: str = Field(description="off, flag or drop (no_rankings: reject or flag).")
    threshold: float | None = Field(default=None, description="What the rule tests against: "
                                    "min_rankings, min_kendall_w or coin_flip_margin (none: "
                                    "the rule has no threshold).")


class AggregateSettings(_Report):
    """The settings that shaped an aggregate's numbers, named in its report (the manifest's
    config has them all; these are the ones a reader of the numbers needs)."""

    model: Literal["bradley_terry"] = Field(default="bradley_terry", description="The per-"
                                            "group fit: Bradley-Terry MAP on the half-win "
                                            "votes of the tiers (no Plackett-Luce fit: it has "
                                            "no standard treatment of ties; docs/aggregate.md).")
    prior_strength: float = Field(description="L2 prior alpha on the strengths.")
    reliability_weight: Literal["tau", "log_odds"] = Field(description="How an annotator's "
                                                           "reliability became its weight.")
    reliability_iterations: int = Field(description="Rounds of consensus -> reliability -> "
                                        "weights (0: kind weights only).")
    reliability_groups: Literal["auto", "all"] = Field(description="auto: annotators of "
                                                       "targeted groups judged on their audit "
                                                       "groups; all: on every group.")
    kind_weights: dict[str, float] = Field(description="Weight of each annotator kind.")
    drop_unreliable: bool
    unreliable_z: float = Field(description="Standard errors an annotator's tau must clear "
                                "above unreliable_tau not to be unreliable.")
    pair_targets: Literal["auto", "soft", "hard"] = Field(description="The pair-targets "
                                                          "setting (the targets written are "
                                                          "the summary's pair_targets).")
    hard_targets_above: float
    noise_filters: dict[str, NoiseFilter] = Field(default_factory=dict, description="Each "
                                                  "noise rule's action and threshold.")
    audit_groups: int = Field(default=0, description="Groups with a ranking whose metadata "
                              "selection is audit (drawn uniformly by `label push --select "
                              "uncertain --audit-share`).")
    targeted_groups: int = Field(default=0, description="Groups with a ranking whose metadata "
                                 "selection is uncertain (chosen by uncertainty).")
    audit_share: float | None = Field(default=None, description="audit_groups / (audit_groups "
                                      "+ targeted_groups): the audit share the rankings "
                                      "carry (none: no selected groups).")

    def describe(self) -> str:
        """One line naming every setting a reader of the aggregate's numbers needs."""
        rel = (f"reliability weight {self.reliability_weight} ({self.reliability_iterations} "
               f"rounds, measured on {self.reliability_groups} groups, unreliable annotators "
               f"{'dropped' if self.drop_unreliable else 'kept'}, z {self.unreliable_z:g})"
               if self.reliability_iterations else "no reliability weighting (kind weights only)")
        kinds = ", ".join(f"{k} {w:g}" for k, w in self.kind_weights.items())
        targets = f"pair targets {self.pair_targets}" + (
            f" (hard above {self.hard_targets_above:.0%} estimated noise)"
            if self.pair_targets == "auto" else "")
        rules = ", ".join(f"{name} {f.action}" + ("" if f.threshold is None else f" at {f.threshold:g}")
                          for name, f in self.noise_filters.items())
        selected = self.audit_groups + self.targeted_groups
        audit = (f"audit share {self.audit_share:.2f} ({self.audit_groups} audit of {selected} "
                 "selected groups)" if self.audit_share is not None
                 else "audit share: no groups selected by uncertainty")
        return (f"Bradley-Terry fit (prior {self.prior_strength:g}); {rel}; kind weights "
                f"{kinds}; {targets}; noise filters: {rules or 'none'}; {audit}.")


class AggregateSummary(_Report):
    """The headline numbers (the aggregate manifest's ``stats``)."""

    input_stage: str
    noise_rate: float | None
    noise_observed: float | None
    tied_pair_share: float | None = None
    pair_targets: Literal["soft", "hard"] = "soft"
    recommendation: Literal["gspo", "dpo"] | None
    dpo_fallback_threshold: float
    annotators: int
    unreliable_annotators: list[str]
    dropped_annotators: list[str]
    kendall_w_mean: float | None
    groups_flagged: int
    groups_with_dropped_annotator: int
    rules: dict[str, dict[str, int]]
    settings: AggregateSettings | None = Field(default=None, description="The settings that "
                                               "shaped these numbers (none: a report written "
                                               "before they were recorded).")


class AggregateReport(_Report):
    """``RUN/aggregate/report.json``: reliability, agreement, noise, rules, recommendation."""

    summary: AggregateSummary
    annotators: list[AnnotatorReliability]
    agreement: dict[str, Distribution]
    noise: NoiseEstimate
    rules: dict[str, RuleOutcome]
    recommendation: Recommendation
    counts: dict[str, int] = Field(default_factory=dict)
    settings: AggregateSettings | None = Field(default=None, description="The settings that "
                                               "shaped these numbers (none: a report written "
                                               "before they were recorded).")


# -- train and eval ---------------------------------------------------------------------------------
class GroupCounts(_Report):
    train: int
    held_out: int
    rejected: int
    dropped_candidates: int
    truncated_responses: int


class ReferenceInfo(_Report):
    model: str
    cached: bool
    entry: str


class RefreshRound(_Report):
    """One refresh round of training (``RUN/train/refresh/round-NNN`` manifest stats, one
    ``split: refresh`` line of ``metrics.jsonl`` and an entry of ``TrainStats.refresh``)."""

    round: int
    step: int = Field(description="Optimizer steps done when the round sampled (the policy's step).")
    prompts: int = Field(description="Prompts sampled this round (all processes).")
    groups: int = Field(description="Fresh groups generated and ranked (written to the round).")
    rejected: int = Field(description="Prompts without a group (too long, too few distinct "
                          "candidates).")
    without_signal: int = Field(description="Groups whose aggregate decides no pair (every "
                                "candidate tied): written, not trained on.")
    added: int = Field(description="Fresh groups added to the buffer.")
    buffer: int = Field(description="Fresh groups in the buffer after the round.")
    tokens_generated: int
    scores: dict[str, float] = Field(description="Mean score of the fresh candidates per ranker "
                                     "(annotator id): the rankers' reward of the current policy.")
    held_out: dict[str, float] = Field(description="Held-out metrics of the policy at this step "
                                       "(pair_accuracy, margin, kl, ...; empty: no held-out split).")
    kl_ref: float | None = Field(description="On-policy estimate of KL(policy || reference) per "
                                 "response: k3 estimate, mean of e^d - 1 - d with "
                                 "d = log pi_ref - log pi, over fresh candidates (never negative).")
    kl_ref_per_token: float | None = Field(description="The same per response token.")
    groups_trained: dict[str, int] = Field(
        default_factory=dict, description="Groups trained on since the previous round, per kind "
        "(offline; fresh_newest: from the newest round then; fresh_older: from earlier rounds).")
    rho: dict[str, dict[str, float]] = Field(
        description="Importance weights applied since the previous round, per kind of group "
        "(as in groups_trained): candidates with a behaviour log-prob, mean weight and share "
        "clipped (empty without importance_clip).")
    seconds: dict[str, float] = Field(
        description="Wall time of the round by phase (generate, rank, aggregate, score: "
        "behaviour and reference log-probs, eval) and of the training since the previous "
        "round (train).")
    loaded: bool = Field(default=False, description="Read back from disk on resume, not sampled "
                         "again.")


class _TrainingReport(_Report):
    """The numbers every training (policy or reward model) reports; each declares its metrics
    (``train``, ``eval_start``, ``eval``) with its own type."""

    steps: int
    epochs: float


class TrainStats(_TrainingReport):
    """What a training run measured (``RUN/train`` manifest stats and ``metrics.json``)."""

    train: dict[str, Any] = Field(description="Last logging window's training metrics.")
    eval_start: dict[str, Any] = Field(description="Held-out metrics before training (empty: "
                                       "nothing held out).")
    eval: dict[str, Any] = Field(description="Held-out metrics at the end.")
    groups: GroupCounts
    reference: ReferenceInfo | None = Field(description="The reference log-prob pass (None: "
                                            "trained reference_free, no reference pass).")
    seconds: float
    refresh: list[RefreshRound] = Field(default_factory=list, description="Refresh rounds, in "
                                        "order (empty without refresh).")


class RewardModelGroups(_Report):
    """Groups of a reward-model training."""

    train: int
    held_out: int
    rejected: int = Field(description="Groups left out with a row reject.")
    dropped_candidates: int = Field(description="Candidates left out (over max_length).")


class RewardModelMetrics(_Report):
    """A reward model's metrics on the held-out groups (an evaluation) or over a logging window
    of training; ``None``: not measured (nothing held out; a field of the other kind)."""

    loss: float | None = None
    pair_accuracy: float | None = Field(default=None, description="Share of the decided "
                                        "consensus pairs the scores order the same way, "
                                        "weighted by w_ij, a tie counting 1/2.")
    margin: float | None = Field(default=None, description="Winner minus loser score of the "
                                 "decided pairs, weighted by w_ij.")
    reward_mean: float | None = Field(default=None, description="Mean score within a group.")
    reward_std: float | None = Field(default=None, description="Spread of the scores within a "
                                     "group.")
    groups: float | None = Field(default=None, description="Groups evaluated (evaluation).")
    grad_norm: float | None = None  # the others: a training window
    lr: float | None = None
    groups_per_s: float | None = None
    tokens_per_s: float | None = None

    def measured(self) -> bool:
        """Whether anything was measured (an evaluation with no held-out group is empty)."""
        return self.loss is not None


class RewardModelStats(_TrainingReport):
    """What a reward-model training measured (``RUN/train_rm`` manifest stats, ``metrics.json``
    in the model folder; written without the ``None`` metrics)."""

    train: RewardModelMetrics = Field(description="Last logging window's training metrics.")
    eval_start: RewardModelMetrics = Field(description="Held-out metrics before training "
                                           "(empty: nothing held out).")
    eval: RewardModelMetrics = Field(description="Held-out metrics at the end.")
    loss: str
    groups: RewardModelGroups
    pairs_per_s: float = Field(description="Weighted pairs (i<j, w_ij>0) trained per second, "
                               "over the loop this process ran (after the resume point).")
    seconds: float
    data_fingerprint: str = Field(default="", description="Fingerprint of the training data.")
    base_model: str = Field(default="", description="The base model's public name (Hub id or "
                            "folder name).")
    lora: bool = Field(default=False, description="LoRA adapters (and the score head) trained, "
                       "not every weight.")
    resumed_from_step: int = Field(default=0, description="The checkpoint's step when this "
                                   "training resumed (0: it started afresh).")


class EvalReport(_Report):
    """A model (and its baseline) scored on a group dataset's consensus (``RUN/eval``)."""

    split: str
    groups: int
    rejected: int
    truncated_responses: int
    model: str
    baseline: str | None
    ref_model: str | None
    beta: float
    length_normalise: bool
    metrics: dict[str, dict[str, float | None]] = Field(description="Role (model, baseline) "
                                                        "-> metric -> value.")
    delta: dict[str, float | None] = Field(description="model - baseline, per metric.")


def report_of(model: type[_Report], stats: dict[str, Any]) -> Any:
    """``stats`` (a manifest's) validated as ``model``."""
    return model.model_validate(stats)


# -- inference servers (generate, rank) -----------------------------------------------------------
class ServerUsage(_Report):
    """What one stage asked of one model on an OpenAI-compatible server (manifest
    ``stats["servers"]``): requests, retries, failures and tokens, summed over every session
    that worked on the stage's output (a killed session counts up to its last finished shard)."""

    server: str = Field(description="host:port/path of the server (no credentials, no query).")
    model: str = Field(description="The model name as served.")
    requests: int = Field(default=0, description="HTTP requests sent, retries included.")
    succeeded: int = Field(default=0, description="Requests answered 200.")
    retried: int = Field(default=0, description="Requests sent again after a failure.")
    refused: int = Field(default=0, description="Requests refused for good (HTTP 400/413/422): "
                         "their rows were rejected.")
    failures: dict[str, int] = Field(default_factory=dict, description="Failed attempts by "
                                     "cause: an HTTP status, 'timeout' or 'connection'.")
    prompt_tokens: int = Field(default=0, description="Prompt tokens the server reported.")
    completion_tokens: int = Field(default=0, description="Completion tokens it reported.")
    request_seconds: float = Field(default=0.0, description="Sum of the requests' wall times.")


# -- training logs --------------------------------------------------------------------------------
class MetricsLine(BaseModel):
    """One line of a training's ``metrics.jsonl`` (the policy trainer's train and eval windows
    and refresh rounds, the reward-model trainer's train and eval windows;
    :class:`grouppref.train.engine.checkpoint.MetricsLog`). The metrics named here are the ones
    readers plot; any other key (a refresh round's ``score/NAME``, a new metric) is kept as an
    extra field. ``None``: not measured in this window (NaN is written as null)."""

    model_config = ConfigDict(extra="allow")

    step: int = Field(ge=0, description="Optimizer steps done.")
    epoch: float | None = Field(default=None, description="Epochs done (fractional).")
    split: str = Field(description="train (a logging window), eval (held-out) or refresh.")
    loss: float | None = None
    pair_accuracy: float | None = None
    margin: float | None = None
    kl: float | None = None
    reward_best: float | None = None
    reward_worst: float | None = None
    reward_mean: float | None = None
    reward_std: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    groups_per_s: float | None = None
    tokens_per_s: float | None = None
