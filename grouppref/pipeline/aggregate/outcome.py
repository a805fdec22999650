"""From fitted tensors to ValidatedGroup rows (noise rules applied) and the aggregate report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

import numpy as np
import torch

from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.fit import BTFit
from grouppref.pipeline.aggregate.parse import ParsedInput
from grouppref.schemas import Agreement, PairPreference, Reject, ValidatedGroup
from grouppref.schemas.reports import (
    AggregateReport,
    AggregateSettings,
    AggregateSummary,
    AnnotatorReliability,
    Distribution,
    Histogram,
    NoiseEstimate,
    NoiseFilter,
    Recommendation,
    RuleOutcome,
)
from grouppref.stats import rankstats
from grouppref.stats.reliability import Reliability, noise_rate

RULES = ("too_few_rankings", "low_agreement", "cycle", "coin_flip", "disconnected")
NOTE = ("a recommendation only: the trainer's loss is never switched automatically "
        "(docs/evidence.md, issue-16 runs: with soft targets DPO gained more true reward than "
        "gspo from an estimated 29-40% noise; with hard consensus targets gspo never fell "
        "significantly behind DPO)")


def rule_matches(used_n: np.ndarray, fit: BTFit, config: AggregateConfig
                 ) -> dict[str, np.ndarray]:
    """Which groups each noise rule matches; every array is ``(B,)`` bool."""
    theta, valid = fit.theta, fit.tiers >= 0
    spread = (np.where(valid, theta, -np.inf).max(-1) - np.where(valid, theta, np.inf).min(-1))
    p_extreme = 1 / (1 + np.exp(-spread))  # p(best > worst)
    kw = fit.kendall_w
    if fit.labels is not None:  # the fit's own labels (BTFit.numpy): count them
        parts = (fit.labels == np.arange(fit.labels.shape[-1])).sum(-1)
    else:
        parts = rankstats.components(torch.from_numpy(fit.wins),
                                     torch.from_numpy(valid)).numpy()
    return {
        "no_rankings": used_n == 0,
        "too_few_rankings": used_n < config.min_rankings,
        "low_agreement": ~np.isnan(kw) & (kw < config.min_kendall_w),
        "cycle": fit.cycle.astype(bool),
        "coin_flip": p_extreme < 0.5 + config.coin_flip_margin,
        "disconnected": (used_n > 0) & (parts > 1),
    }


def _detail(rule: str, b: int, used_n: np.ndarray, fit: BTFit,
            config: AggregateConfig) -> str:
    if rule in ("too_few_rankings", "no_rankings"):
        return f"{rule} ({used_n[b]} used < {config.min_rankings})"
    if rule == "low_agreement":
        return f"low_agreement (Kendall's W {fit.kendall_w[b]:.3f} < {config.min_kendall_w})"
    if rule == "cycle":
        return "cycle (intransitive pairwise majority)"
    if rule == "disconnected":
        labels = _labels(fit, b)
        return (f"disconnected (the comparisons split the candidates into "
                f"{len(set(labels[labels >= 0].tolist()))} unlinked sets; their order across "
                "sets comes from the prior, not the data)")
    return f"coin_flip (p(best > worst) < {0.5 + config.coin_flip_margin:.2f})"


class PairFields(TypedDict):
    """The fields of a :class:`PairPreference` (its stored row)."""

    winner: str
    loser: str
    p: float
    weight: float
    votes_for: float
    votes_against: float


class AgreementFields(TypedDict):
    """The fields of an :class:`Agreement` (its stored row)."""

    num_annotators: int
    kendall_w: float | None
    mean_tau: float | None
    noise: float | None


def pair_fields(ids: list[str], p: np.ndarray, w: np.ndarray, wins: np.ndarray,
                labels: np.ndarray) -> list[PairFields]:
    """Every pair of the group as the fields of a :class:`PairPreference` (all six, defaults
    included: what ``model_dump`` gives); a pair no chain of comparisons links (different
    components of the comparison graph) has ``p = 0.5`` and weight 0: the fit's order across
    components comes from the prior, and its confidence there from the prior's centring, not
    from data."""
    out: list[PairFields] = []
    p, w, wins, labels = p.tolist(), w.tolist(), wins.tolist(), labels.tolist()  # floats
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            if labels[i] != labels[j]:
                out.append({"winner": ids[i], "loser": ids[j], "p": 0.5, "weight": 0.0,
                            "votes_for": 0.0, "votes_against": 0.0})
                continue
            win, lose = (i, j) if p[i][j] >= 0.5 else (j, i)
            out.append({"winner": ids[win], "loser": ids[lose], "p": max(p[win][lose], 0.5),
                        "weight": w[win][lose], "votes_for": wins[win][lose],
                        "votes_against": wins[lose][win]})
    return out


def _nanmean_or_none(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else None


def _labels(fit: BTFit, b: int) -> np.ndarray:
    """Component label of each candidate of group ``b`` in its comparison graph."""
    return fit.labels[b]


@dataclass
class GroupAggregate:
    """What aggregation adds to group ``b``: the fields a ValidatedGroup has beyond its
    AnnotatedGroup, as plain values (pairs and agreement as the fields of their records)."""

    consensus: list[list[str]]
    strengths: dict[str, float]
    pairs: list[PairFields]
    agreement: AgreementFields
    flags: list[str]
    consensus_kinds: list[str]

    def holds(self) -> bool:
        """Every check of ValidatedGroup and its parts holds, so a record or row can be made
        without validating it again: non-empty consensus tiers, finite strengths, pair and
        agreement values in their ranges (by construction they are; a fit gone wrong is left
        to the records' own validation, which names it)."""
        def unit(x: object, low: float = 0.0) -> bool:
            return x is None or (isinstance(x, float) and low <= x <= 1.0)

        a = self.agreement
        return (all(self.consensus) and all(map(math.isfinite, self.strengths.values()))
                and all(unit(q["p"], 0.5) and unit(q["weight"])
                        and math.isfinite(q["votes_for"]) and q["votes_for"] >= 0
                        and math.isfinite(q["votes_against"]) and q["votes_against"] >= 0
                        for q in self.pairs)
                and unit(a["kendall_w"]) and unit(a["mean_tau"], -1.0) and unit(a["noise"]))


def group_aggregate(ids: list[str], kinds: Sequence[str], b: int, fit: BTFit,
                    used: np.ndarray, flags: list[str]) -> GroupAggregate:
    """The aggregate of group ``b`` (candidate ``ids``; ``kinds``: its rankings' annotator
    kinds, in order) from the fit's arrays."""
    k = len(ids)
    tiers = fit.tiers[b, :k]
    c, d = fit.conc[b][used[b]].sum(), fit.disc[b][used[b]].sum()
    kw = fit.kendall_w[b]
    return GroupAggregate(
        consensus=[[ids[i] for i in range(k) if tiers[i] == t]
                   for t in range(int(tiers.max()) + 1)],
        strengths={cid: float(fit.theta[b, i]) for i, cid in enumerate(ids)},
        pairs=pair_fields(ids, fit.p[b, :k, :k], fit.w[b, :k, :k], fit.wins[b, :k, :k],
                          _labels(fit, b)[:k]),
        agreement={"num_annotators": int(used[b].sum()),
                   "kendall_w": None if math.isnan(kw) else float(min(max(kw, 0.0), 1.0)),
                   "mean_tau": _nanmean_or_none(fit.tau[b][used[b]]),
                   "noise": float(d / (c + d)) if c + d > 0 else None},
        flags=flags,
        consensus_kinds=sorted({kind for kind, u in zip(kinds, used[b], strict=False) if u}))


def validated_group(parsed: ParsedInput, b: int, fit: BTFit, used: np.ndarray,
                    flags: list[str]) -> ValidatedGroup:
    """Group ``b`` with its aggregate as a ValidatedGroup (``flags``: :func:`group_flags`)."""
    group = parsed.groups[b]
    part = group_aggregate(group.candidate_ids(), [r.annotator.kind for r in group.rankings],
                           b, fit, used, flags)
    fields = dict(  # dict(group): the validated sub-records are reused, not re-parsed
        **dict(group), consensus=part.consensus, strengths=part.strengths,
        pairs=[PairPreference(**q) for q in part.pairs], agreement=Agreement(**part.agreement),
        flags=part.flags, consensus_kinds=part.consensus_kinds)
    if part.holds():
        # every check of ValidatedGroup holds by construction: the group, its rankings, pairs
        # and agreement were validated, the consensus covers each candidate once (in
        # non-empty tiers), the strengths name each candidate, the pairs each pair once;
        # validating the whole again cost ~0.6 ms a group
        return ValidatedGroup.model_construct(**fields)
    return ValidatedGroup(**fields)


def group_flags(b: int, dec: Decisions, config: AggregateConfig) -> list[str]:
    """The flags of a kept group ``b``: the rules set to flag that match it."""
    flags = ["no_rankings"] if dec.matches["no_rankings"][b] else []
    flags += [r for r in RULES if dec.matches[r][b] and getattr(config, r) == "flag"]
    if dec.had_dropped[b]:
        flags.append("unreliable_annotator_dropped")
    return flags


@dataclass
class Decisions:
    """What happens to each group, decided for all at once (arrays over B groups)."""

    used: np.ndarray  # (B, A) bool: rankings used in the fit
    used_n: np.ndarray  # (B,) int: how many
    matches: dict[str, np.ndarray]  # rule -> (B,) bool
    had_dropped: np.ndarray  # (B,) bool: a ranking by a dropped annotator
    rejected: np.ndarray  # (B,) bool: the row is rejected (no_rankings=reject or a drop rule)
    flagged: np.ndarray  # (B,) bool: kept with at least one flag


def slot_weights(ann: torch.Tensor, per_annotator: torch.Tensor) -> torch.Tensor:
    """``(B, A)`` the value of each ranking slot's annotator, 0 for padding (also when no
    group has a ranking at all: ``per_annotator`` is then empty)."""
    if per_annotator.numel() == 0:
        return torch.zeros(ann.shape, dtype=per_annotator.dtype)
    return torch.where(ann >= 0, per_annotator[ann.clamp(min=0)],
                       torch.zeros((), dtype=per_annotator.dtype))


def decide(ann: torch.Tensor, rel: Reliability, fit: BTFit,
           config: AggregateConfig) -> Decisions:
    """Apply the noise rules to every group (vectorised)."""
    used = slot_weights(ann, rel.annotator_weight).numpy() > 0
    had_dropped = np.asarray((slot_weights(ann, rel.dropped.to(torch.float64)).numpy() > 0)
                             .any(-1))
    used_n = used.sum(-1)
    matches = rule_matches(used_n, fit, config)
    rejected = matches["no_rankings"] & (config.no_rankings == "reject")
    flagged = matches["no_rankings"] | had_dropped
    for rule in RULES:
        action = getattr(config, rule)
        rejected = rejected | (matches[rule] & (action == "drop"))
        flagged = flagged | (matches[rule] & (action == "flag"))
    return Decisions(used=used, used_n=used_n, matches=matches, had_dropped=had_dropped, rejected=rejected,
                     flagged=flagged & ~rejected)


def group_outcome(parsed: ParsedInput, b: int, fit: BTFit, dec: Decisions,
                  config: AggregateConfig, stage: str) -> ValidatedGroup | Reject:
    """Group ``b`` as a ValidatedGroup with its flags, or a row Reject naming the rules."""
    if dec.rejected[b]:
        return group_reject(parsed, b, fit, dec, config, stage)
    return validated_group(parsed, b, fit, dec.used, group_flags(b, dec, config))


def group_reject(parsed: ParsedInput, b: int, fit: BTFit, dec: Decisions,
                 config: AggregateConfig, stage: str) -> Reject:
    """The row Reject of a group the rules drop (``dec.rejected[b]``), naming the rules."""
    why = []
    if dec.matches["no_rankings"][b] and config.no_rankings == "reject":
        why.append("no usable ranking (none left after validation, kind weights and "
                   "dropped annotators)")
    why += [f"dropped by rule {_detail(r, b, dec.used_n, fit, config)}"
            for r in RULES if dec.matches[r][b] and getattr(config, r) == "drop"]
    return Reject(stage=stage, reason="; ".join(why), source=parsed.source,
                  row=parsed.rows[b], group_id=parsed.groups[b].group_id)


def _distribution(x: np.ndarray) -> Distribution:
    x = x[~np.isnan(x)]
    if not x.size:
        return Distribution(count=0)
    q = np.quantile(x, [0.1, 0.25, 0.5, 0.75, 0.9])
    hist, edges = np.histogram(x, bins=10, range=(0.0, 1.0))
    return Distribution(
        count=int(x.size), mean=float(x.mean()),
        quantiles=dict(zip(("p10", "p25", "p50", "p75", "p90"), map(float, q), strict=True)),
        histogram=Histogram(edges=[round(float(e), 2) for e in edges],
                            counts=[int(h) for h in hist]))


def _annotators(parsed: ParsedInput, rel: Reliability) -> list[AnnotatorReliability]:
    def num(t: torch.Tensor, i: int) -> float | None:
        v = float(t[i])
        return None if math.isnan(v) else v

    audit = rel.audit_only
    return [AnnotatorReliability(
        id=aid, kind=parsed.kinds[i], groups=int(rel.groups[i]), votes=int(rel.votes[i]),
        tau=num(rel.tau, i), tau_se=num(rel.tau_se, i), flip_rate=num(rel.flip_rate, i),
        tie_rate=num(rel.tie_rate, i),
        loo_disagreement=num(rel.loo_disagreement, i),
        annotator_weight=float(rel.annotator_weight[i]), unreliable=bool(rel.unreliable[i]),
        dropped=bool(rel.dropped[i]),
        reliability_groups="audit" if audit is not None and bool(audit[i]) else "all")
        for i, aid in enumerate(parsed.annotators)]


def recommendation(noise: float | None, threshold: float, all_unreliable: bool = False,
                   targets: Literal["soft", "hard"] = "soft") -> Recommendation:
    """The DPO fallback only when the noise is above ``threshold`` and the pair targets are
    soft (with hard targets gspo held its own against DPO at 30-40% noise); no loss at all (do
    not train) when every annotator was found unreliable."""
    def rec(loss: Literal["gspo", "dpo"] | None, reason: str) -> Recommendation:
        return Recommendation(loss=loss, noise=noise, threshold=threshold, pair_targets=targets,
                              note=NOTE, reason=reason)

    if all_unreliable:
        return rec(None, "every annotator was found unreliable (no better than chance): these "
                   "labels should not be trained on")
    if noise is None:
        return rec("gspo", "no noise estimate (no annotator's strict preferences overlap "
                   "another's: each group has one ranking, or the shared pairs are all ties)")
    high = noise > threshold
    if high and targets == "hard":
        return rec("gspo", f"estimated label noise {noise:.1%} > threshold {threshold:.1%}, "
                   "but the pair targets are the consensus' hard ones")
    return rec("dpo" if high else "gspo", f"estimated label noise {noise:.1%} "
               f"{'>' if high else '<='} threshold {threshold:.1%}")


THRESHOLDS = {"too_few_rankings": "min_rankings", "low_agreement": "min_kendall_w",
              "coin_flip": "coin_flip_margin"}  # each noise rule's threshold setting


def settings_of(parsed: ParsedInput, config: AggregateConfig) -> AggregateSettings:
    """The settings that shaped the numbers, and the audit share the rankings carry (groups
    with an ``audit`` ranking against those with an ``uncertain`` one)."""
    def groups_marked(value: str) -> int:
        return parsed.groups_marked(value)

    audit, targeted = groups_marked("audit"), groups_marked("uncertain")
    filters = {rule: NoiseFilter(action=config.no_rankings if rule == "no_rankings"
                                 else getattr(config, rule),
                                 threshold=getattr(config, THRESHOLDS[rule], None)
                                 if rule in THRESHOLDS else None)
               for rule in ("no_rankings", *RULES)}
    return AggregateSettings(
        prior_strength=config.prior_strength, reliability_weight=config.reliability_weight,
        reliability_iterations=config.reliability_iterations,
        reliability_groups=config.reliability_groups,
        kind_weights={str(k): w for k, w in config.kind_weights.items()},
        drop_unreliable=config.drop_unreliable, unreliable_z=config.unreliable_z,
        pair_targets=config.pair_targets, hard_targets_above=config.hard_targets_above,
        noise_filters=filters, audit_groups=audit, targeted_groups=targeted,
        audit_share=audit / (audit + targeted) if audit + targeted else None)


def build_report(parsed: ParsedInput, rel: Reliability, fit: BTFit, dec: Decisions,
                 config: AggregateConfig, source: str,
                 targets: Literal["soft", "hard"] = "soft") -> AggregateReport:
    """The report: annotators, agreement, noise, rules, recommendation; ``summary`` for the
    manifest stats."""
    kept = ~dec.rejected
    kw = np.clip(fit.kendall_w[kept], 0.0, 1.0)
    votes = (fit.conc + fit.disc).sum()
    observed = float(fit.disc.sum() / votes) if votes > 0 else None
    noise = noise_rate(rel)
    rules: dict[str, RuleOutcome] = {}
    for rule in ("no_rankings", *RULES):
        action = config.no_rankings if rule == "no_rankings" else getattr(config, rule)
        hit = dec.matches[rule]
        rules[rule] = RuleOutcome(action=action, matched=int(hit.sum()),
                                  flagged=int((hit & kept).sum()) if action == "flag" else 0,
                                  dropped=int(hit.sum()) if action in ("drop", "reject") else 0)
    annotators = _annotators(parsed, rel)
    all_unreliable = bool(annotators) and all(a.unreliable for a in annotators)
    rec = recommendation(noise, config.dpo_fallback_threshold, all_unreliable, targets)
    settings = settings_of(parsed, config)
    summary = AggregateSummary(
        input_stage=source, noise_rate=noise, noise_observed=observed,
        tied_pair_share=rel.tied_share, pair_targets=targets, recommendation=rec.loss,
        dpo_fallback_threshold=config.dpo_fallback_threshold, annotators=len(annotators),
        unreliable_annotators=[a.id for a in annotators if a.unreliable],
        dropped_annotators=[a.id for a in annotators if a.dropped],
        kendall_w_mean=float(np.nanmean(kw)) if np.isfinite(kw).any() else None,
        groups_flagged=int(dec.flagged.sum()),
        groups_with_dropped_annotator=int((dec.had_dropped & kept).sum()),
        rules={r: {"flagged": v.flagged, "dropped": v.dropped} for r, v in rules.items()},
        settings=settings)
    return AggregateReport(
        summary=summary, annotators=annotators, agreement={"kendall_w": _distribution(kw)},
        noise=NoiseEstimate(estimated=noise, observed_against_consensus=observed,
                            tied_pair_share=rel.tied_share,
                            method="vote-weighted mean of per-annotator flip rates from pairwise "
                            "agreement (moment estimator) on pairs that no used ranking ties; "
                            "observed = share of used votes against the final consensus (biased "
                            "low: each vote pulls the consensus)"),
        rules=rules, recommendation=rec, settings=settings)
