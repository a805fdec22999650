"""Annotator reliability and the label-noise estimate, over a whole dataset at once.

Two measures per annotator, both over tensors of all groups (chunked by ``batch_size``):

* ``tau``: ``(c - d) / (c + d)`` of each of its rankings against the *leave-one-out*
  consensus (the weighted BT fit of the group's other rankings), ``c``/``d`` the pairs both
  order strictly the same / the other way (Kendall's tau when neither ties; Goodman-Kruskal's
  gamma when one does), averaged over its groups. Leaving the
  annotator out matters: with 3 annotators a group's full consensus is pulled towards each
  one's own votes. ``tau`` drives the annotator weights: ``annotator_weight = kind_weight * clip(tau, 0, 1)``,
  iterated (consensus -> tau -> weights -> refit) ``reliability_iterations`` times.
  With ``weight="log_odds"`` the weight is instead the log-odds of the annotator's pairwise
  votes agreeing with that consensus (:func:`log_odds_weight`: ``log((1 - e) / e)`` of its
  shrunk disagreement rate ``e``, floored at 0 and capped).
  An annotator is *unreliable* when its ``tau`` is not significantly above chance:
  ``tau <= unreliable_tau + z * se(tau)`` (se over its groups).
* ``flip_rate``: the share of its pairwise votes against the (unknown) truth, from pairwise
  agreement between annotators (:func:`~grouppref.stats.noise.flip_rates_moment`). It needs
  no consensus, so it is not biased by the consensus' own errors: on simulated panels it lands
  within ~0.01 of the true flip rate, where "votes against the consensus" reads 0.24 for a
  true 0.40. The dataset's noise estimate is the vote-weighted mean of ``flip_rate`` over the
  annotators used (falling back to the leave-one-out disagreement for an annotator with fewer
  than two overlap partners).
* Selection-aware reliability (``design``). ``label push --select uncertain`` sends people
  the groups where the machines' consensus is least trustworthy, so an annotator judged
  against the leave-one-out consensus of *those* groups looks worse than it is (measured in
  docs/evidence.md, "Humans where it matters": a 5%-flip human's weight fell from ~0.5 under
  random selection to 0.34, and an oracle selection's human was dropped). Each ranking may
  say how its group was chosen (:data:`UNMARKED`, :data:`UNIFORM`: a uniform draw or every
  group, e.g. ``audit``/``random``/``all``; :data:`TARGETED`: chosen by its uncertainty). An
  annotator with at least one targeted ranking and ``min_groups`` comparable uniform ones is
  judged on its uniform rankings only (:func:`reliability_slots`):
  ``tau_a = mean_{g in U_a} tau_ag``, ``U_a`` its groups drawn uniformly from the whole source
  stage (``--audit-share``). Those are a simple random sample of all groups, so ``tau_a``
  estimates the same population mean that a random selection measures; the targeted groups
  still count in everyone else's leave-one-out consensus and in the final fit. Departures:
  no Horvitz-Thompson use of the targeted groups (their inclusion probability given the
  automatic rankings is 1 or 0, so no reweighting can make them representative); an
  annotator with fewer than ``min_groups`` comparable uniform groups is judged on all its
  groups, as before (biased low, but it still catches a random clicker: keeping its kind
  weight instead let one at flip 0.5 cost up to 0.15 of pair accuracy, docs/evidence.md); an
  unmarked ranking of an annotator with targeted ones is not counted as uniform. The same
  slots count in its pairwise agreement (flip rate), not in its vote count. Annotators
  without targeted rankings (every automatic ranker, data without markers) are judged on all
  their groups, exactly as before.
* Ties. Pairs that some used ranking of a group puts in one tier are *undecided*: the flip
  rates and the noise estimate are over decided pairs only, and the share of undecided pairs
  is reported on its own (``tied_share``), with each annotator's own ``tie_rate``. Ties that
  no ranking declares (every annotator forced to order two equal candidates) cannot be told
  from noise by agreement statistics with three annotators per group; they read as noise
  (docs/aggregate.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from grouppref.runs.processes import MapFn
from grouppref.stats import bt, noise, rankstats

UNMARKED, UNIFORM, TARGETED = 0, 1, 2  # how a ranking's group was chosen (``design`` codes)


def reliability_slots(ann: torch.Tensor, design: torch.Tensor, n: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rankings count in each annotator's reliability, given how their groups were chosen.

    ``targeted_a = any(design[s] == TARGETED for the slots s of annotator a)``; a slot counts
    when it is a ranking and ``not targeted_a or design[s] == UNIFORM``.

    Args:
        ann (torch.Tensor): ``(B, A)`` annotator index of each slot, ``-1`` for padding.
        design (torch.Tensor): ``(B, A)`` :data:`UNMARKED` / :data:`UNIFORM` /
            :data:`TARGETED` of each slot.
        n (int): number of annotators.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``count`` ``(B, A)`` bool and ``targeted`` ``(N,)``
        bool (the annotators judged on their uniform groups only).
    """
    slot = ann >= 0
    targeted = torch.zeros(n, dtype=torch.bool)
    targeted[ann[slot & (design == TARGETED)]] = True
    count = slot & (~targeted[ann.clamp(min=0)] | (design == UNIFORM))
    return count, targeted


@dataclass
class Reliability:
    """Per-annotator results; every tensor has shape ``(N,)`` (N annotators)."""

    annotator_weight: torch.Tensor  # final weight of the annotator's rankings in the fit
    tau: torch.Tensor  # mean (c-d)/(c+d) against the leave-one-out consensus (NaN: no comparable group)
    tau_se: torch.Tensor  # its standard error over groups
    groups: torch.Tensor  # groups with a comparable leave-one-out consensus
    votes: torch.Tensor  # strict pairwise votes cast on decided pairs (no used ranking ties them)
    loo_disagreement: torch.Tensor  # share of its votes against the leave-one-out consensus
    flip_rate: torch.Tensor  # moment estimate (NaN: not identified)
    unreliable: torch.Tensor  # bool: not significantly better than chance
    dropped: torch.Tensor  # bool: left out of the fit
    tie_rate: torch.Tensor  # share of the pairs it ranked that it put in one tier (NaN: none)
    tied_share: float | None  # dataset: share of group pairs some used ranking ties (None: no pairs)
    audit_only: torch.Tensor | None = None  # bool: judged on its uniform (audit) groups only


WEIGHTS = ("tau", "log_odds")  # how the reliability weight is made from the agreement


def log_odds_weight(disagree: torch.Tensor, pairs: torch.Tensor, prior_pairs: float = 2.0,
                    min_rate: float = 0.02) -> torch.Tensor:
    """Reliability weight from an annotator's pairwise disagreement with the consensus.

    ``e = (d + m / 2) / (n + m)``, ``w = log((1 - e) / e)`` clipped to
    ``[0, log((1 - min_rate) / min_rate)]``, where ``d`` of the annotator's ``n`` strict
    pairwise votes go against the consensus and ``m = prior_pairs``.

    Under a one-coin noise model (each vote flips the true order with probability ``e``,
    independently: Dawid and Skene 1979 with one error rate per annotator), ``log((1 - e) /
    e)`` is the log-likelihood ratio one vote carries, i.e. what it is worth in the optimal
    weighted majority (Nitzan and Paroush 1982); in a Bradley-Terry fit it multiplies the
    annotator's votes. ``e`` is the posterior mean under a ``Beta(m/2, m/2)`` prior, which
    shrinks an annotator with few pairs towards 0.5 (weight 0) and keeps a perfect record
    finite; ``min_rate`` caps the weight (``log(49) = 3.89`` at 0.02). Departures: ``e`` is
    measured against the (leave-one-out) consensus, not the truth, so the consensus' own
    errors count against the annotator (Dawid-Skene would fit ``e`` and the truth jointly by
    EM); an annotator worse than chance (``e > 0.5``) gets 0, not a negative weight (its
    votes are not reversed).

    Args:
        disagree (torch.Tensor): ``(N,)`` votes against the consensus ``d``.
        pairs (torch.Tensor): ``(N,)`` strict votes compared with it ``n`` (``d <= n``).
        prior_pairs (float): ``m > 0``, pseudo-votes of the prior (half of them against).
        min_rate (float): smallest ``e`` used, in ``(0, 0.5)``.

    Returns:
        torch.Tensor: ``(N,)`` weights, ``>= 0``.
    """
    e = (disagree + prior_pairs / 2) / (pairs + prior_pairs)
    e = e.clamp(min=min_rate, max=0.5)
    return torch.log((1 - e) / e)


def fit_batches(wins: torch.Tensor, alpha: float, batch_size: int, max_iter: int) -> torch.Tensor:
    """:func:`bt.map_pairwise` over ``(B, K, K)`` wins in chunks of ``batch_size``; ``(B, K)``."""
    parts = [bt.map_pairwise(wins[s : s + batch_size], alpha, max_iter=max_iter)
             for s in range(0, wins.shape[0], batch_size)]
    return torch.cat(parts) if parts else torch.zeros(wins.shape[:-1], dtype=bt.DTYPE)


def loo_concordance(ranks: torch.Tensor, slot_w: torch.Tensor, alpha: float, max_iter: int,
                    tie_tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Concordant / discordant pairs of each ranking against its leave-one-out consensus.

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        slot_w (torch.Tensor): ``(B, A)`` weight of each ranking.
        alpha (float): prior strength of the fits.
        max_iter (int): Newton iterations allowed.
        tie_tol (float): strength gap under which the consensus ties two candidates.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: two ``(B, A)`` tensors (0 for padded slots).
    """
    b, a, k = ranks.shape
    votes = bt.votes_rankings(ranks)  # (B, A, K, K)
    wins = torch.einsum("ba,baij->bij", slot_w, votes)
    loo = (wins[:, None] - slot_w[..., None, None] * votes).clamp(min=0)  # (B, A, K, K)
    slot = (ranks >= 0).any(-1)  # (B, A)
    # the leave-one-out consensus orders only candidates the other rankings compared (a
    # candidate only this ranking names, e.g. in a partial ranking, has no place in it)
    valid = ((loo + loo.transpose(-1, -2)) > 0).any(-1)  # (B, A, K)
    # a ranking whose group has no other (weighted) vote has no consensus: nothing to fit,
    # and no candidate of it is ordered, whatever theta holds (the fit of no votes is 0)
    fitted = slot & valid.any(-1)
    theta = torch.zeros(b, a, k, dtype=bt.DTYPE)
    theta[fitted] = bt.map_pairwise(loo[fitted], alpha, max_iter=max_iter)
    cons = rankstats.tiers_strengths(theta.reshape(b * a, k), valid.reshape(b * a, k), tie_tol)
    c, d = rankstats.concordance(ranks, cons.reshape(b, a, k))
    return torch.where(slot, c, 0), torch.where(slot, d, 0)


# one batch's leave-one-out problem: ranks (b, A, K), slot weights (b, A), alpha, max_iter,
# tie_tol; numpy arrays, so that another process can be handed it
LooBatch = tuple[np.ndarray, np.ndarray, float, int, float]


def loo_batch(batch: LooBatch) -> tuple[np.ndarray, np.ndarray]:
    """:func:`loo_concordance` of one batch, as numpy arrays (a :class:`MapFn`'s task)."""
    ranks, slot_w, alpha, max_iter, tie_tol = batch
    c, d = loo_concordance(torch.from_numpy(ranks), torch.from_numpy(slot_w), alpha, max_iter,
                           tie_tol)
    return c.numpy(), d.numpy()


def _tau_stats(ranks: torch.Tensor, ann: torch.Tensor, annotator_w: torch.Tensor, n: int,
               alpha: float, batch_size: int, max_iter: int, tie_tol: float,
               masks: tuple[torch.Tensor, ...], map_batches: MapFn = map
               ) -> list[dict[str, torch.Tensor]]:
    """Per-annotator tau against the leave-one-out consensus, once over the slots of each
    ``(B, A)`` mask (the leave-one-out fits are shared). The batches' fits are made by
    ``map_batches`` (in other processes, say) and summed in batch order."""
    keys = ("sum", "sq", "groups", "c", "d")
    accs = [{key: torch.zeros(n, dtype=bt.DTYPE) for key in keys} for _ in masks]
    starts = range(0, ranks.shape[0], batch_size)

    def batch(s: int) -> LooBatch:
        idx = ann[s : s + batch_size]
        slot_w = torch.where(idx >= 0, annotator_w[idx.clamp(min=0)], 0)
        return ranks[s : s + batch_size].numpy(), slot_w.numpy(), alpha, max_iter, tie_tol

    for s, (c_np, d_np) in zip(starts, map_batches(loo_batch, map(batch, starts)), strict=True):
        idx = ann[s : s + batch_size]
        c, d = torch.from_numpy(c_np), torch.from_numpy(d_np)
        comparable = (idx >= 0) & (c + d > 0)
        tau = torch.where(comparable, (c - d) / (c + d).clamp(min=1), 0)
        for acc, mask in zip(accs, masks, strict=True):
            has = comparable & mask[s : s + batch_size]
            who = idx[has]
            acc["sum"].index_add_(0, who, tau[has])
            acc["sq"].index_add_(0, who, tau[has] ** 2)
            acc["groups"].index_add_(0, who, torch.ones_like(tau[has]))
            acc["c"].index_add_(0, who, c[has])
            acc["d"].index_add_(0, who, d[has])
    return [_tau_summary(acc) for acc in accs]


def _tau_summary(acc: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    g = acc["groups"]
    mean = torch.where(g > 0, acc["sum"] / g.clamp(min=1), math.nan)
    var = torch.where(g > 1, (acc["sq"] - g * mean**2) / (g - 1).clamp(min=1), math.nan)
    return {"tau": mean, "tau_se": (var.clamp(min=0) / g.clamp(min=1)).sqrt(), "groups": g,
            "against": acc["d"], "compared": acc["c"] + acc["d"],
            "loo_disagreement": torch.where(acc["c"] + acc["d"] > 0,
                                            acc["d"] / (acc["c"] + acc["d"]).clamp(min=1), math.nan)}


@dataclass
class Agreement:
    """Pairwise agreement between annotators, pooled over groups (N annotators)."""

    agree: torch.Tensor  # (N, N) agreeing strict votes of a and b on decided pairs
    total: torch.Tensor  # (N, N) decided pairs both ranked strictly
    votes: torch.Tensor  # (N,) strict votes on decided pairs
    ties: torch.Tensor  # (N,) pairs the annotator put in one tier
    ranked: torch.Tensor  # (N,) pairs the annotator ranked (tied or not)
    tied_pairs: float  # group pairs that some used ranking ties (left out of the counts above)
    covered_pairs: float  # group pairs ranked by at least one used ranking


def pairwise_agreement(ranks: torch.Tensor, ann: torch.Tensor, n: int, batch_size: int,
                       annotator_w: torch.Tensor | None = None,
                       count: torch.Tensor | None = None) -> Agreement:
    """Agreement counts for the moment estimator, on *decided* pairs only.

    A pair that some used ranking of its group puts in one tier (a rule ranker scoring two
    candidates alike, an annotator marking a tie) is left out of every annotator's counts:
    when the truth ties a pair, annotators forced to order it agree only by chance, and the
    moment estimator would read that as noise (``2A - 1`` shrinks by the share of such
    pairs). Used rankings: annotator weight > 0 (all, when ``annotator_w`` is None).

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        ann (torch.Tensor): ``(B, A)`` annotator index of each slot, ``-1`` for padding.
        n (int): number of annotators.
        batch_size (int): groups per chunk.
        annotator_w (torch.Tensor | None): ``(N,)`` annotator weights.
        count (torch.Tensor | None): ``(B, A)`` bool, slots whose agreement counts (both slots
            of a pair must count; :func:`reliability_slots`); all when None. Votes, ties and
            the tied-pair shares count every slot.

    Returns:
        Agreement: pooled counts.
    """
    agree = torch.zeros(n, n, dtype=bt.DTYPE)
    total = torch.zeros(n, n, dtype=bt.DTYPE)
    votes, ties, ranked = (torch.zeros(n, dtype=bt.DTYPE) for _ in range(3))
    tied_pairs = covered_pairs = 0.0
    for s in range(0, ranks.shape[0], batch_size):
        r, idx = ranks[s : s + batch_size], ann[s : s + batch_size]
        used = idx >= 0
        if annotator_w is not None:
            used = used & (annotator_w[idx.clamp(min=0)] > 0)
        tied, covered = rankstats.declared_ties(r, used)
        tied_pairs += float(tied.sum())
        covered_pairs += float(covered.sum())
        c, d = rankstats.concordance_slots(r, decided=~tied)  # (B, A, A)
        a = idx.shape[1]
        pair = (idx[:, :, None] >= 0) & (idx[:, None, :] >= 0) & ~torch.eye(a, dtype=torch.bool)
        if count is not None:
            cnt = count[s : s + batch_size]
            pair = pair & cnt[:, :, None] & cnt[:, None, :]
        ia = idx[:, :, None].expand(-1, a, a)[pair]
        ib = idx[:, None, :].expand(-1, a, a)[pair]
        agree.index_put_((ia, ib), c[pair], accumulate=True)
        total.index_put_((ia, ib), (c + d)[pair], accumulate=True)
        diag = torch.diagonal(c + d, dim1=-2, dim2=-1)  # strict decided pairs of each ranking
        own_tied, own_ranked = rankstats.tied_pairs_slots(r)  # (B, A) each
        slot = idx >= 0
        votes.index_add_(0, idx[slot], diag[slot])
        ties.index_add_(0, idx[slot], own_tied[slot])
        ranked.index_add_(0, idx[slot], own_ranked[slot])
    return Agreement(agree=agree, total=total, votes=votes, ties=ties, ranked=ranked,
                     tied_pairs=tied_pairs, covered_pairs=covered_pairs)


def estimate_reliability(ranks: torch.Tensor, ann: torch.Tensor, kind_w: torch.Tensor, *,
                         alpha: float, iterations: int, min_groups: int, unreliable_tau: float,
                         z: float, drop: bool, batch_size: int, max_iter: int,
                         tie_tol: float, design: torch.Tensor | None = None,
                         weight: str = "tau", map_batches: MapFn = map) -> Reliability:
    """Iterate consensus -> tau -> weights, then estimate flip rates.

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        ann (torch.Tensor): ``(B, A)`` annotator index of each slot, ``-1`` for padding.
        kind_w (torch.Tensor): ``(N,)`` weight of each annotator's kind (0: not used).
        design (torch.Tensor | None): ``(B, A)`` how each ranking's group was chosen
            (:data:`UNMARKED`, :data:`UNIFORM`, :data:`TARGETED`); None: every ranking counts
            (the estimator before selection markers; see the module docstring).
        weight (str): ``tau`` (``clip(tau, 0, 1)``) or ``log_odds`` (:func:`log_odds_weight`
            of its votes against the leave-one-out consensus, on the same groups as tau).
        alpha, iterations, min_groups, unreliable_tau, z, drop, batch_size, max_iter, tie_tol:
            the :class:`~grouppref.pipeline.aggregate.config.AggregateConfig` settings.
        map_batches (MapFn): what makes the leave-one-out fits of the batches (the builtin
            ``map``, or processes': :func:`~grouppref.runs.processes.process_map`); the
            result is the same.

    Returns:
        Reliability: per-annotator tensors.
    """
    n = kind_w.shape[0]
    if n == 0:  # no group has a ranking: nothing to estimate
        empty = torch.zeros(0, dtype=bt.DTYPE)
        none = torch.zeros(0, dtype=torch.bool)
        return Reliability(annotator_weight=empty, tau=empty, tau_se=empty, groups=empty,
                           votes=empty, loo_disagreement=empty, flip_rate=empty,
                           unreliable=none, dropped=none, tie_rate=empty, tied_share=None)
    slots = ann >= 0
    if design is None:
        count, targeted = slots, torch.zeros(n, dtype=torch.bool)
    else:
        count, targeted = reliability_slots(ann, design, n)
    annotator_w = kind_w.clone()
    unreliable = torch.zeros(n, dtype=torch.bool)
    for _ in range(max(iterations, 1)):  # one pass even without weighting: tau is reported
        every, audit = _tau_stats(ranks, ann, annotator_w, n, alpha, batch_size, max_iter,
                                  tie_tol, (slots, count), map_batches)
        audit_only = targeted & (audit["groups"] >= min_groups)  # else: all groups, as before
        st = {key: torch.where(audit_only, audit[key], every[key]) for key in every}
        enough = st["groups"] >= min_groups
        unreliable = enough & (st["tau"] <= unreliable_tau + z * st["tau_se"].nan_to_num(0.0))
        if iterations > 0:
            annotator_w = kind_w * torch.where(enough, _weight(st, weight), 1.0)
        if drop:
            annotator_w = torch.where(unreliable, 0.0, annotator_w)
    agr = pairwise_agreement(ranks, ann, n, batch_size, annotator_w,
                             slots & (~audit_only[ann.clamp(min=0)] | count))
    return Reliability(annotator_weight=annotator_w, tau=st["tau"], tau_se=st["tau_se"],
                       groups=st["groups"], votes=agr.votes, loo_disagreement=st["loo_disagreement"],
                       flip_rate=noise.flip_rates_moment(agr.agree, agr.total),
                       unreliable=unreliable, dropped=unreliable & drop & (kind_w > 0),
                       tie_rate=torch.where(agr.ranked > 0, agr.ties / agr.ranked.clamp(min=1), math.nan),
                       tied_share=agr.tied_pairs / agr.covered_pairs if agr.covered_pairs else None,
                       audit_only=audit_only)


def _weight(st: dict[str, torch.Tensor], weight: str) -> torch.Tensor:
    """The reliability weight of each annotator from its tau statistics (``weight``: WEIGHTS)."""
    if weight == "log_odds":
        return log_odds_weight(st["against"], st["compared"])
    return st["tau"].nan_to_num(0.0).clamp(0, 1)


def noise_rate(rel: Reliability) -> float | None:
    """Vote-weighted mean flip rate over the annotators used (annotator weight > 0)."""
    used = rel.annotator_weight > 0
    f = torch.where(torch.isnan(rel.flip_rate), rel.loo_disagreement, rel.flip_rate)
    ok = used & ~torch.isnan(f) & (rel.votes > 0)
    if not bool(ok.any()):
        return None
    return float((f[ok] * rel.votes[ok]).sum() / rel.votes[ok].sum())
