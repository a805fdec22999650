"""The simulate stage's core: simulated annotator panels ranking typed groups, no run store.

An annotator with flip rate ``f`` ranks each group by a Mallows model centred on the true
order: its dispersion ``phi`` is solved so that the *expected share of pairwise votes against
the truth* is exactly ``f`` (Kendall distance / number of pairs). ``random`` annotators rank
uniformly at random (f = 0.5), ``reversed`` ones return the true order backwards (f = 1).
Mallows keeps each ranking a consistent order, so flips cluster on close pairs (adjacent in
the true order), as with real annotators.

Truth: per group, true scores come from the rankings already there (by default the mean
normalised position, or normalised score, over the automatic rankings: reward models, rules,
LLM judges). Candidates with equal true scores are ordered at random and their pairs are left
out of the realised flip rates.

:func:`simulate_groups` is the stage on records (``Sequence[AnnotatedGroup]`` in,
:class:`Simulated` out); :func:`simulate_group` one group of it; :func:`simulate_order` one
annotator's order of true scores, for research that simulates rankings as tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from grouppref.errors import ConfigError
from grouppref.pipeline.simulate.config import AnnotatorSpec, SimulateConfig
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking


# -- Mallows ---------------------------------------------------------------------------------
def mallows_flip_rate(phi: float, k: int) -> float:
    """Expected share of discordant pairs of a Mallows(phi) ranking of ``k`` items.

    Repeated insertion: item ``i`` (1-based) adds ``j`` inversions with probability
    ``phi^j / sum_{l<i} phi^l``, so ``E[d] = sum_i sum_j j phi^j / sum_j phi^j``.
    """
    if k < 2:
        return 0.0
    total = 0.0
    for i in range(2, k + 1):
        weights = [phi**j for j in range(i)]
        total += sum(j * w for j, w in enumerate(weights)) / sum(weights)
    return total / (k * (k - 1) / 2)


@cache
def mallows_phi(flip_rate: float, k: int) -> float:
    """The dispersion ``phi`` in [0, 1] whose Mallows model has the given flip rate (bisection).

    Raises:
        ValueError: ``flip_rate`` outside [0, 0.5].
    """
    if not 0.0 <= flip_rate <= 0.5:
        raise ValueError(f"flip_rate must be in [0, 0.5], got {flip_rate}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mallows_flip_rate(mid, k) < flip_rate else (lo, mid)
    return (lo + hi) / 2


def sample_mallows(true_order: Sequence[int], phi: float, rng: np.random.Generator) -> list[int]:
    """One Mallows(phi) ranking around ``true_order`` (best first) by repeated insertion."""
    out: list[int] = []
    for i, item in enumerate(true_order):
        # inserting at position pos (pos = i: no inversion) adds i - pos inversions
        cum = np.cumsum(phi ** np.arange(i, -1, -1, dtype=float))
        pos = int(np.searchsorted(cum, rng.random() * cum[-1], side="right")) if phi > 0 else i
        out.insert(min(pos, i), item)
    return out


def simulate_order(scores: Sequence[float], spec: AnnotatorSpec,
                   rng: np.random.Generator) -> list[int]:
    """A simulated annotator's strict order (candidate indices, best first) of true ``scores``.

    Equal true scores are ordered at random.
    """
    k = len(scores)
    tiebreak = rng.permutation(k)
    truth = sorted(range(k), key=lambda i: (-scores[i], tiebreak[i]))
    if spec.behavior == "random":
        return [int(i) for i in rng.permutation(k)]
    if spec.behavior == "reversed":
        return truth[::-1]
    return sample_mallows(truth, mallows_phi(spec.flip_rate, k), rng)


def order_flips(order: Sequence[int], scores: Sequence[float]) -> tuple[int, int]:
    """(pairs against the truth, pairs with distinct true scores) of a strict ``order``."""
    pos = {c: r for r, c in enumerate(order)}
    flips = pairs = 0
    for i in range(len(scores)):
        for j in range(i + 1, len(scores)):
            if scores[i] == scores[j]:
                continue
            pairs += 1
            flips += (scores[i] > scores[j]) != (pos[i] < pos[j])
    return flips, pairs


# -- truth -------------------------------------------------------------------------------------
def ranking_scores(ranking: Ranking, ids: list[str], use_scores: bool) -> list[float]:
    """Per-candidate scores in [0, 1] (1 = best) of one ranking: min-max normalised
    ``scores`` when given for every candidate, else ``1 - (midrank - 1) / (K - 1)``."""
    if use_scores and ranking.scores and set(ranking.scores) >= set(ids):
        raw = [ranking.scores[c] for c in ids]
        lo, hi = min(raw), max(raw)
        return [0.5 if hi == lo else (x - lo) / (hi - lo) for x in raw]
    mid: dict[str, float] = {}
    above = 0
    for tier in ranking.tiers:
        for cid in tier:
            mid[cid] = above + (len(tier) + 1) / 2
        above += len(tier)
    k = len(ids)
    return [1 - (mid[c] - 1) / (k - 1) for c in ids]


def true_scores(group: AnnotatedGroup, config: SimulateConfig) -> list[float]:
    """The group's true scores per candidate (in candidate order).

    Raises:
        ValueError: no ranking of the group can supply the truth.
    """
    ids = group.candidate_ids()
    if config.truth_annotator is not None:
        source = [r for r in group.rankings if r.annotator.id == config.truth_annotator]
        what = f"annotator {config.truth_annotator!r}"
    else:
        source = [r for r in group.rankings if r.annotator.kind in config.truth_kinds]
        what = f"rankings of kind {config.truth_kinds}"
    # a partial ranking (it leaves candidates out) says nothing of the ones it leaves out
    complete = [r for r in source if sum(len(t) for t in r.tiers) == len(ids)]
    if source and not complete:
        raise ValueError(f"the {what} of this group are partial (they leave candidates out); "
                         "the truth needs a ranking of every candidate: rank the group first")
    source = complete
    if not source:
        raise ValueError(f"no {what} to take the true scores from; rank the group first or set "
                         "truth_kinds / truth_annotator")
    per = np.array([ranking_scores(r, ids, config.truth_use_scores) for r in source])
    return [float(x) for x in per.mean(0)]


def simulate_rankings(group: AnnotatedGroup, scores: Sequence[float],
                      panel: Sequence[AnnotatorSpec], rng: np.random.Generator
                      ) -> tuple[list[Ranking], dict[str, tuple[int, int]]]:
    """Rankings of ``group`` by each member of ``panel`` (kind ``simulated``), and each
    member's (flips, pairs) against ``scores``."""
    ids = group.candidate_ids()
    rankings, flips = [], {}
    for spec in panel:
        order = simulate_order(scores, spec, rng)
        flips[spec.id] = order_flips(order, scores)
        rankings.append(Ranking(
            annotator=Annotator(id=spec.id, kind="simulated", name=spec.behavior,
                                version=f"flip_rate={spec.expected_flip_rate():g}"),
            group_id=group.group_id, tiers=[[ids[i]] for i in order]))
    return rankings, flips


# -- the panel on groups ------------------------------------------------------------------------
def check_panel(config: SimulateConfig) -> None:
    """Raises ConfigError: duplicate annotator ids, or ``per_group`` larger than the panel."""
    ids = [a.id for a in config.annotators]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"simulate: annotator ids must be unique, got {ids}")
    if config.per_group is not None and config.per_group > len(ids):
        raise ConfigError(f"simulate: per_group={config.per_group} but the panel has only "
                          f"{len(ids)} annotators; lower per_group or add annotators")


def simulate_group(group: AnnotatedGroup, config: SimulateConfig, rng: np.random.Generator,
                   tally: dict[str, list[int]]) -> AnnotatedGroup:
    """``group`` with the rankings of ``config``'s panel (``per_group`` of its members drawn
    from ``rng`` when set) added; each member's (flips, pairs) against the truth are added to
    ``tally[annotator id]``.

    Raises:
        ValueError: no ranking of the group can supply the truth, or a panel member's id
            already ranks the group.
    """
    scores = true_scores(group, config)
    panel = list(config.annotators)
    if config.per_group is not None:
        panel = [panel[i] for i in sorted(rng.choice(len(panel), config.per_group, replace=False))]
    taken = {r.annotator.id for r in group.rankings} & {a.id for a in panel}
    if taken:
        raise ValueError(f"the group already has rankings by {sorted(taken)}; simulated ids "
                         "must differ from existing annotators")
    rankings, flips = simulate_rankings(group, scores, panel, rng)
    out = AnnotatedGroup(**{**group.model_dump(), "rankings": [*group.rankings, *rankings]})
    for aid, (f, n) in flips.items():
        tally.setdefault(aid, [0, 0])
        tally[aid][0] += f
        tally[aid][1] += n
    return out


@dataclass(frozen=True)
class Simulated:
    """What :func:`simulate_groups` makes: the groups with the panel's rankings added (in
    input order, those that failed left out), the failures as ``(index in the input, reason)``,
    and each annotator's (flips against the truth, pairs with distinct true scores)."""

    groups: list[AnnotatedGroup]
    failed: list[tuple[int, str]]
    flips: dict[str, tuple[int, int]]


def simulate_groups(groups: Sequence[AnnotatedGroup], config: SimulateConfig,
                    rng: np.random.Generator) -> Simulated:
    """The panel of ``config`` ranks every group, drawing from ``rng`` in group order.

    Raises:
        ConfigError: duplicate annotator ids or ``per_group`` larger than the panel.
    """
    check_panel(config)
    tally: dict[str, list[int]] = {}
    out: list[AnnotatedGroup] = []
    failed: list[tuple[int, str]] = []
    for i, group in enumerate(groups):
        try:
            out.append(simulate_group(group, config, rng, tally))
        except ValueError as e:
            failed.append((i, str(e)))
    return Simulated(groups=out, failed=failed,
                     flips={a: (f, n) for a, (f, n) in tally.items()})
