"""Ranking statistics over batched tiered rankings, as pure functions over torch tensors.

Shapes as in :mod:`grouppref.stats.bt`: ``B`` groups, ``A`` rankings per group, ``K``
candidates; a ranking is a ``(K,)`` vector of tier indices (0 = best; ties share a tier) with
``-1`` for a padded candidate or a candidate the ranking leaves out (a *partial* ranking:
every statistic here uses only the candidates a ranking names). Everything is float64.
Tied pairs count as neither concordant nor discordant (Kendall's tau-b, as
``scipy.stats.kendalltau``); Kendall's W uses mid-ranks with the tie correction.
"""

from __future__ import annotations

import math

import torch

DTYPE = torch.float64


def midranks(ranks: torch.Tensor) -> torch.Tensor:
    """1-based mid-ranks of tiered rankings: ``1 + #above + (#tied - 1) / 2``; ``(..., K)`` ->
    ``(..., K)`` float64 (0 where ``ranks`` is -1)."""
    valid = ranks >= 0
    both = valid[..., :, None] & valid[..., None, :]
    above = ((ranks[..., None, :] < ranks[..., :, None]) & both).sum(-1)
    tied = ((ranks[..., None, :] == ranks[..., :, None]) & both).sum(-1)
    return torch.where(valid, 1 + above + (tied - 1) / 2, 0).to(DTYPE)


def _kendall_w_complete(ranks: torch.Tensor, included: torch.Tensor) -> torch.Tensor:
    """The textbook tie-corrected W (every included ranking covers the same candidates)."""
    valid = (ranks >= 0) & included[..., None]  # (B, A, K)
    m = included.sum(-1).to(DTYPE)  # (B,)
    present = valid.any(1)  # (B, K)
    n = present.sum(-1).to(DTYPE)  # (B,)
    rr = torch.where(valid, midranks(ranks), 0)
    big_r = rr.sum(1)  # (B, K)
    s = torch.where(present, (big_r - (m * (n + 1) / 2)[:, None]) ** 2, 0).sum(-1)
    tie_size = ((ranks[..., None, :] == ranks[..., :, None]) & valid[..., None, :]
                & valid[..., :, None]).sum(-1).to(DTYPE)  # (B, A, K)
    t = torch.where(valid, tie_size**2 - 1, 0).sum((-1, -2))  # sum_a sum_groups (t^3 - t)
    denom = m**2 * (n**3 - n) - m * t
    ok = (m >= 2) & (denom > 0)
    return torch.where(ok, 12 * s / torch.where(ok, denom, 1), math.nan).clamp(max=1.0)


def spearman_common(ranks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Spearman's rho between every two rankings of a group, on the candidates both rank.

    Each ranking is reduced to the candidates it shares with the other, mid-ranked there, and
    the two mid-rank vectors are correlated (Pearson), as ``scipy.stats.spearmanr`` on the
    common candidates.

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for a candidate left out.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``rho`` ``(B, A, A)`` (NaN where undefined) and
        ``defined`` ``(B, A, A)`` bool: at least two common candidates, not all tied in
        either ranking.
    """
    valid = ranks >= 0
    common = valid[:, :, None, :] & valid[:, None, :, :]  # (B, A, A, K)
    ra = torch.where(common, ranks[:, :, None, :], -1)
    rc = torch.where(common, ranks[:, None, :, :], -1)
    ma, mc = midranks(ra), midranks(rc)  # (B, A, A, K), 0 outside the common set
    n = common.sum(-1).to(DTYPE)
    mean_a = ma.sum(-1) / n.clamp(min=1)
    mean_c = mc.sum(-1) / n.clamp(min=1)
    da = torch.where(common, ma - mean_a[..., None], 0)
    dc = torch.where(common, mc - mean_c[..., None], 0)
    cov = (da * dc).sum(-1)
    var = (da**2).sum(-1) * (dc**2).sum(-1)
    defined = (n >= 2) & (var > 1e-12)
    return torch.where(defined, cov / var.clamp(min=1e-300).sqrt(), math.nan), defined


def _kendall_w_partial(ranks: torch.Tensor, included: torch.Tensor) -> torch.Tensor:
    """``W = (1 + (m - 1) rho_bar) / m`` from the mean pairwise Spearman rho on common
    candidates; ``(B,)``, NaN where no two included rankings share two untied candidates."""
    rho, defined = spearman_common(torch.where(included[..., None], ranks, -1))
    a = ranks.shape[1]
    upper = torch.triu(torch.ones(a, a, dtype=torch.bool, device=ranks.device), diagonal=1)
    use = defined & upper
    count = use.sum((-1, -2)).to(DTYPE)
    rho_bar = torch.where(use, rho, 0).sum((-1, -2)) / count.clamp(min=1)
    m = included.sum(-1).to(DTYPE)
    w = (1 + (m - 1) * rho_bar) / m.clamp(min=1)
    return torch.where((count > 0) & (m >= 2), w.clamp(0.0, 1.0), math.nan)


def kendall_w(ranks: torch.Tensor, included: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """Kendall's coefficient of concordance W with the tie correction, per group.

    ``W = 12 S / (m^2 (n^3 - n) - m sum_a T_a)``, ``S = sum_i (R_i - m (n + 1) / 2)^2``,
    ``R_i`` = sum of mid-ranks of candidate ``i`` over the ``m`` included rankings,
    ``T_a = sum over tie groups of (t^3 - t)``. Under random rankings ``E[W] = 1 / m``.

    Partial rankings (a group whose included rankings do not all cover the same candidates)
    have no textbook W; there we use its identity with the mean pairwise Spearman correlation,
    ``W = (1 + (m - 1) rho_bar) / m`` (exact for complete untied rankings), with each pair's rho
    taken on the candidates both rank (:func:`spearman_common`) and pairs sharing fewer than
    two untied candidates left out. It keeps ``E[W] = 1 / m`` under random rankings.

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding or a candidate
            the ranking leaves out.
        included (torch.Tensor): ``(B, A)`` bool, rankings that take part.
        chunk (int): groups per batch of the partial computation (it is ``(A, A, K, K)`` per
            group).

    Returns:
        torch.Tensor: ``(B,)`` in ``[0, 1]``; NaN where ``m < 2``, every ranking is one tier,
        or (partial) no two rankings overlap on two untied candidates.
    """
    valid = (ranks >= 0) & included[..., None]
    union = valid.any(1, keepdim=True)  # (B, 1, K)
    complete = ((valid == union) | ~included[..., None]).all(-1).all(-1)  # (B,)
    w = _kendall_w_complete(ranks, included)
    partial = (~complete).nonzero()[:, 0]
    for s in range(0, partial.numel(), chunk):
        idx = partial[s : s + chunk]
        w[idx] = _kendall_w_partial(ranks[idx], included[idx])
    return w


def _signs(ranks: torch.Tensor) -> torch.Tensor:
    """``s[..., i, j] = sign(r_j - r_i)`` over valid pairs ``i < j`` (+1: i ranked above j)."""
    valid = ranks >= 0
    both = valid[..., :, None] & valid[..., None, :]
    upper = torch.triu(torch.ones(ranks.shape[-1], ranks.shape[-1], dtype=torch.bool,
                                  device=ranks.device), diagonal=1)
    s = torch.sign((ranks[..., None, :] - ranks[..., :, None]).to(DTYPE))
    return torch.where(both & upper, s, 0)


def concordance(ranks_a: torch.Tensor, ranks_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Concordant and discordant pair counts between two tiered rankings (pairs tied in either
    are neither); shapes broadcast, ``(..., K)`` -> two ``(...)`` tensors."""
    prod = _signs(ranks_a) * _signs(ranks_b)
    return (prod > 0).sum((-1, -2)).to(DTYPE), (prod < 0).sum((-1, -2)).to(DTYPE)


def kendall_tau(ranks_a: torch.Tensor, ranks_b: torch.Tensor) -> torch.Tensor:
    """Kendall's tau-b between tiered rankings: ``sum s_a s_b / sqrt(sum s_a^2 sum s_b^2)``
    over the pairs *both* rank (as ``scipy.stats.kendalltau`` on the candidates they share, so
    a partial ranking is compared on its own candidates only); ``(..., K)`` -> ``(...)``, NaN
    where either ranking is all one tier there."""
    joint = (ranks_a >= 0) & (ranks_b >= 0)
    sa = _signs(torch.where(joint, ranks_a, -1))
    sb = _signs(torch.where(joint, ranks_b, -1))
    num = (sa * sb).sum((-1, -2))
    den = ((sa**2).sum((-1, -2)) * (sb**2).sum((-1, -2))).sqrt()
    return torch.where(den > 0, num / torch.where(den > 0, den, 1), math.nan)


def majority_cycles(wins: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """Whether the strict pairwise majority ``W_ij > W_ji`` of each group is intransitive.

    The majority graph has an edge ``i -> j`` when ``i`` beats ``j``; it has a cycle iff its
    transitive closure (``ceil(log2 K)`` boolean squarings) reaches some ``i`` from itself.

    Args:
        wins (torch.Tensor): ``(B, K, K)`` win counts.
        eps (float): margin under which a pair counts as tied (no edge).

    Returns:
        torch.Tensor: ``(B,)`` bool.
    """
    reach = (wins - wins.transpose(-1, -2) > eps).to(DTYPE)  # (B, K, K)
    for _ in range(max(1, math.ceil(math.log2(max(wins.shape[-1], 2))))):
        reach = ((reach + reach @ reach) > 0).to(DTYPE)
    return torch.diagonal(reach, dim1=-2, dim2=-1).sum(-1) > 0


def tiers_strengths(theta: torch.Tensor, valid: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    """Consensus tier index per candidate: sort by strength, start a new tier at every gap
    larger than ``tol`` (so exactly tied strengths share a tier).

    Args:
        theta (torch.Tensor): ``(B, K)`` strengths.
        valid (torch.Tensor): ``(B, K)`` bool, real (not padded) candidates.
        tol (float): largest gap that still counts as a tie.

    Returns:
        torch.Tensor: ``(B, K)`` long tier index (0 = best), -1 for padding.
    """
    key = torch.where(valid, theta, -math.inf)
    order = torch.argsort(key, dim=-1, descending=True, stable=True)
    sorted_theta = torch.gather(key, -1, order)
    gaps = sorted_theta[:, :-1] - sorted_theta[:, 1:]
    new_tier = torch.cat([torch.zeros_like(gaps[:, :1], dtype=torch.long),
                          (gaps > tol).long()], dim=-1)
    tier_sorted = new_tier.cumsum(-1)
    tiers = torch.empty_like(tier_sorted).scatter_(-1, order, tier_sorted)
    return torch.where(valid, tiers, -1)


def concordance_slots(ranks: torch.Tensor, decided: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Concordant / discordant pair counts between every two rankings of each group.

    Uses ``#conc = (sum |s_a||s_c| + sum s_a s_c) / 2`` and ``#disc = (sum |s_a||s_c| -
    sum s_a s_c) / 2`` over pairs ``i < j`` (``s`` as in :func:`kendall_tau`).

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        decided (torch.Tensor | None): ``(B, K, K)`` bool, the pairs to count (e.g. those no
            ranking ties, :func:`declared_ties`); all pairs when None.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: two ``(B, A, A)`` float64 tensors.
    """
    s = _signs(ranks)  # (B, A, K, K)
    if decided is not None:
        s = s * decided[:, None].to(s.dtype)
    dot = torch.einsum("baij,bcij->bac", s, s)
    both = torch.einsum("baij,bcij->bac", s.abs(), s.abs())
    return (both + dot) / 2, (both - dot) / 2


def declared_ties(ranks: torch.Tensor, used: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs that some used ranking of their group puts in one tier, and pairs it covers.

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        used (torch.Tensor): ``(B, A)`` bool, rankings that count.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``tied`` and ``covered``, ``(B, K, K)`` bool over
        pairs ``i < j``: tied by at least one used ranking / ranked by at least one.
    """
    real = (ranks >= 0) & used[..., None]  # (B, A, K)
    both = real[..., :, None] & real[..., None, :]  # (B, A, K, K)
    upper = torch.triu(torch.ones(ranks.shape[-1], ranks.shape[-1], dtype=torch.bool,
                                  device=ranks.device), diagonal=1)
    same = ranks[..., :, None] == ranks[..., None, :]
    return (both & same).any(1) & upper, both.any(1) & upper


def tied_pairs_slots(ranks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per ranking: pairs ``i < j`` it puts in one tier, and pairs it ranks at all.

    Args:
        ranks (torch.Tensor): ``(..., K)`` tier indices, ``-1`` for padding.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: two ``(...)`` float64 tensors.
    """
    real = ranks >= 0
    upper = torch.triu(torch.ones(ranks.shape[-1], ranks.shape[-1], dtype=torch.bool,
                                  device=ranks.device), diagonal=1)
    both = real[..., :, None] & real[..., None, :] & upper
    same = ranks[..., :, None] == ranks[..., None, :]
    return (both & same).sum((-1, -2)).to(DTYPE), both.sum((-1, -2)).to(DTYPE)


def consensus_targets(tiers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard pair targets from consensus tiers (the ``hard`` targets of the aggregate stage).

    ``p_ij = 1`` when ``i`` is in a better tier than ``j``, ``0`` when in a worse one, ``1/2``
    within a tier; ``w_ij = 1`` across tiers, ``0`` within a tier and for padding. With these
    the gspo loss is the all-pairs DPO loss of the consensus order.

    Args:
        tiers (torch.Tensor): ``(B, K)`` tier index per candidate (0 = best), ``-1`` for padding.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``p`` and ``w``, ``(B, K, K)`` float64.

    Example:
        >>> p, w = consensus_targets(torch.tensor([[1, 0, 1]]))
        >>> p[0].tolist()
        [[0.5, 0.0, 0.5], [1.0, 0.5, 1.0], [0.5, 0.0, 0.5]]
        >>> w[0].tolist()
        [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    """
    valid = tiers >= 0
    both = valid[:, :, None] & valid[:, None, :]
    above = both & (tiers[:, :, None] < tiers[:, None, :])
    below = above.transpose(1, 2)
    p = torch.where(above, 1.0, torch.where(below, 0.0, 0.5)).to(DTYPE)
    return p, (above | below).to(DTYPE)


def component_labels(wins: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Connected components of each group's comparison graph (an edge joins two candidates
    that some used vote compared): each real candidate's label is the smallest index in its
    component.

    One component means every candidate is linked to every other through comparisons; with
    more, the fit orders the components against each other by the prior alone, not the data.

    Args:
        wins (torch.Tensor): ``(B, K, K)`` win counts.
        valid (torch.Tensor): ``(B, K)`` bool, real (not padded) candidates.

    Returns:
        torch.Tensor: ``(B, K)`` long labels, -1 for padding.
    """
    k = wins.shape[-1]
    eye = torch.eye(k, dtype=torch.bool, device=wins.device)
    pair = valid[:, :, None] & valid[:, None, :]
    reach = (((wins + wins.transpose(-1, -2)) > 0) & pair | (eye & pair)).to(DTYPE)
    for _ in range(max(1, math.ceil(math.log2(max(k, 2))))):
        reach = ((reach + reach @ reach) > 0).to(DTYPE)
    # reach[b, j, i]: j reaches i; the label of i is the smallest such j: the first index of
    # the column's maximum (argmax returns the first), since a real i reaches itself
    return torch.where(valid, reach.argmax(1), -1)


def components(wins: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The number of connected components of each group's comparison graph (see
    :func:`component_labels`); ``(B,)`` long, 0 for a group of no candidates."""
    labels = component_labels(wins, valid)
    return (labels == torch.arange(wins.shape[-1], device=wins.device)).sum(-1)
