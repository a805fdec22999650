"""Which groups ``label push`` sends to people (``--select``, ``--budget``, ``--uncertainty``).

* ``all`` (the default): every group of the source stage.
* ``random``: ``budget`` groups drawn uniformly without replacement (``seed``), the baseline.
* ``uncertain``: the ``budget`` groups whose *automatic* rankings (kinds reward_model, rule,
  llm_judge) are least certain, by one criterion (the math is in
  :mod:`grouppref.stats.uncertainty`):

  - ``bt_posterior``: the aggregate's Bradley-Terry fit of the automatic rankings (default
    aggregate settings: kind weights, annotator reliability, prior strength 0.1; except that
    an annotator found unreliable keeps its small reliability weight instead of being
    dropped: with few rankers all of them can look unreliable, and dropping them would make
    every group equally uncertain), then the expected share of the group's pairs that the
    Laplace posterior orders the other way round from the MAP
    (:func:`~grouppref.stats.uncertainty.expected_pair_error`);
  - ``kendall_w``: ``1 - W`` between the automatic rankings
    (:func:`~grouppref.stats.uncertainty.disagreement`);
  - ``rm_margin``: the smallest gap between adjacent scores of the group's reward-model
    rankings, each reward model's scores divided by their standard deviation over the run (so
    models on different scales count alike); the smallest over the group's reward models, and
    ``uncertainty = -gap`` (a group without reward scores counts as gap 0).

Equal uncertainties are ordered at random (``seed``), so a budget that cuts through a run of
ties takes a random sample of it.

**Audit groups** (``audit_share`` F, with ``uncertain``): ``round(F * budget)`` groups are
drawn uniformly without replacement from *all* groups first (``seed``), and the rest of the
budget is the most uncertain of the other groups. The audit groups are a simple random sample
of the source stage, independent of the automatic rankings, so an annotator's agreement with
the consensus on them measures its reliability without the selection's bias; the aggregate
uses only them for an annotator who also saw uncertain groups
(:mod:`grouppref.stats.reliability`). Every selected group has a ``role`` (``uncertain``,
``audit``, ``random`` or ``all``) that the push writes into the record's metadata
(``selection``), and pull copies onto the human rankings it reads back.

The selection is a typed
:class:`~grouppref.schemas.label_reports.LabelSelection` that the push writes to
``RUN/label/selection.json``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import torch

from grouppref.errors import ConfigError
from grouppref.labeling.config import PushConfig
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.core import ParsedInput, encode_rankings, fit_parsed
from grouppref.pipeline.simulate.config import AUTOMATIC_KINDS
from grouppref.schemas import AnnotatedGroup
from grouppref.schemas.label_reports import LabelSelection, SelectedGroup, SelectionRole
from grouppref.stats import bt
from grouppref.stats.uncertainty import disagreement, expected_pair_error, smallest_margin, top_n

MEASURES = {
    "bt_posterior": "expected share of the group's pairs ordered the other way round under the "
                    "Bradley-Terry posterior of the automatic rankings (0 to 0.5)",
    "kendall_w": "1 - Kendall's W between the automatic rankings (0: full agreement)",
    "rm_margin": "minus the smallest gap between adjacent reward-model scores, in units of "
                 "each reward model's score standard deviation",
}


def automatic_only(groups: Sequence[AnnotatedGroup]) -> ParsedInput:
    """The groups with their automatic rankings only, indexed as the aggregate stage does."""
    kept = [g.model_copy(update={"rankings": [r for r in g.rankings
                                              if r.annotator.kind in AUTOMATIC_KINDS]})
            for g in groups]
    parsed = ParsedInput(source="label push", inputs=len(groups), groups=kept)
    for g in kept:
        for r in g.rankings:
            if r.annotator.id not in parsed.index:
                parsed.index[r.annotator.id] = len(parsed.annotators)
                parsed.annotators.append(r.annotator.id)
                parsed.kinds.append(r.annotator.kind)
    return parsed


def _need_rankers(parsed: ParsedInput, criterion: str, source: str) -> None:
    if len(parsed.annotators) < 2:
        have = ", ".join(parsed.annotators) or "none"
        raise ConfigError(
            f"--uncertainty {criterion} compares automatic rankings, but the {source} stage has "
            f"{len(parsed.annotators)} automatic ranker(s) ({have}); rank with two or more "
            "(`grouppref rank RUN --ranker ... --ranker ...`), or use --uncertainty rm_margin "
            "(a reward model's scores) or --select random")


def kendall_w_uncertainty(parsed: ParsedInput) -> torch.Tensor:
    """``1 - W`` per group, ``(B,)``."""
    ranks, ann, _ = encode_rankings(parsed)
    return disagreement(ranks, ann >= 0)


def bt_uncertainty(parsed: ParsedInput) -> torch.Tensor:
    """Expected pair error under the aggregate's BT posterior per group, ``(B,)``."""
    config = AggregateConfig(pair_targets="soft", drop_unreliable=False)
    fit = fit_parsed(parsed, config).fit
    theta, wins = torch.from_numpy(fit.theta), torch.from_numpy(fit.wins)
    _, _, valid = encode_rankings(parsed)
    cov = bt.covariance_pairwise(theta, wins, config.prior_strength)
    return expected_pair_error(theta, cov, valid)


def margin_uncertainty(groups: Sequence[AnnotatedGroup], source: str) -> torch.Tensor:
    """Minus the smallest normalised reward-model margin per group, ``(B,)``.

    Raises:
        ConfigError: no ranking of kind reward_model with scores.
    """
    by_model: dict[str, list[float]] = {}
    for g in groups:
        for r in g.rankings:
            if r.annotator.kind == "reward_model" and r.scores:
                by_model.setdefault(r.annotator.id, []).extend(r.scores.values())
    if not by_model:
        raise ConfigError(
            f"--uncertainty rm_margin needs reward-model scores, but the {source} stage has no "
            "ranking of kind reward_model with scores; rank with a reward model first "
            "(`grouppref rank RUN --ranker reward:MODEL`), or use --uncertainty kendall_w / "
            "bt_posterior")
    scale = {m: (float(torch.tensor(v, dtype=torch.float64).std()) if len(v) > 1 else 1.0)
             for m, v in by_model.items()}
    out = torch.zeros(len(groups), dtype=torch.float64)
    for b, g in enumerate(groups):
        gaps = [_gap(list(r.scores.values()), scale[r.annotator.id] or 1.0)
                for r in g.rankings if r.annotator.kind == "reward_model" and r.scores]
        gaps = [x for x in gaps if math.isfinite(x)]
        out[b] = -min(gaps) if gaps else 0.0
    return out


def _gap(scores: list[float], scale: float) -> float:
    s = torch.tensor([scores], dtype=torch.float64) / scale
    return float(smallest_margin(s, torch.ones_like(s, dtype=torch.bool))[0])


def uncertainty_of(groups: Sequence[AnnotatedGroup], criterion: str, source: str
                   ) -> torch.Tensor:
    """The criterion's uncertainty of every group, ``(B,)`` (larger: less certain).

    Raises:
        ConfigError: the criterion's inputs are missing (fewer than two automatic rankers;
            no reward-model scores).
    """
    if criterion == "rm_margin":
        return margin_uncertainty(groups, source)
    parsed = automatic_only(groups)
    _need_rankers(parsed, criterion, source)
    compute: Callable[[ParsedInput], torch.Tensor] = (
        kendall_w_uncertainty if criterion == "kendall_w" else bt_uncertainty)
    return compute(parsed)


def check_budget(config: PushConfig, groups: int, source: str) -> None:
    """Raises ConfigError: a budget larger than the run's groups."""
    if config.budget is not None and config.budget > groups:
        raise ConfigError(
            f"--budget {config.budget} is more than the {groups} groups of the {source} stage; give "
            f"a budget of at most {groups}, or --select all to send every group")


def select_groups(groups: Sequence[AnnotatedGroup], config: PushConfig, source: str
                  ) -> LabelSelection:
    """The groups to send (see the module docstring), most uncertain first.

    Raises:
        ConfigError: a budget larger than the run, or a criterion whose inputs are missing.
    """
    selection = partial(LabelSelection, select=config.select, budget=config.budget,
                        seed=config.seed, source_stage=source, groups=len(groups),
                        audit_share=config.audit_share or 0.0)
    if config.select == "all":
        return selection(selected=[SelectedGroup(
            group_id=g.group_id, uncertainty=None, role="all") for g in groups])
    check_budget(config, len(groups), source)
    n = config.budget or len(groups)
    gen = torch.Generator().manual_seed(config.seed)
    if config.select == "random":
        picked = torch.randperm(len(groups), generator=gen)[:n].tolist()
        return selection(selected=[SelectedGroup(
            group_id=groups[i].group_id, uncertainty=None, role="random") for i in picked])
    u = uncertainty_of(groups, config.uncertainty, source)
    audit, targeted = split_budget(u, n, config.audit_share or 0.0, gen)
    rest = sorted(set(range(len(groups))) - set(audit) - set(targeted))
    sent: list[tuple[int, SelectionRole]] = ([(i, "uncertain") for i in targeted]
                                             + [(i, "audit") for i in audit])
    return selection(
        uncertainty=config.uncertainty, measure=MEASURES[config.uncertainty],
        selected=[SelectedGroup(group_id=groups[i].group_id, uncertainty=float(u[i]), role=role)
                  for i, role in sent],
        threshold=float(u[targeted[-1]]) if targeted else None,
        rest_mean=float(u[rest].mean()) if rest else None)


def split_budget(uncertainty: torch.Tensor, n: int, audit_share: float,
                 generator: torch.Generator) -> tuple[list[int], list[int]]:
    """``(audit, targeted)``: ``round(audit_share * n)`` indices drawn uniformly from all
    groups, then the ``n - len(audit)`` most uncertain of the others, most uncertain first."""
    b = uncertainty.shape[0]
    n_audit = round(audit_share * n)
    audit = torch.randperm(b, generator=generator)[:n_audit].tolist() if n_audit else []
    u = uncertainty.clone()
    u[audit] = -math.inf  # never picked again while others remain
    return audit, top_n(u, n - n_audit, generator)
