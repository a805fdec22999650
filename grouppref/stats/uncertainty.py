"""How uncertain the automatic rankings of a group are: the three criteria of active
selection (``label push --select uncertain``), as pure functions over torch tensors.

Shapes as in :mod:`grouppref.stats.bt`: ``B`` groups, ``A`` rankings per group, ``K``
candidates (padded; ``-1`` marks a padded candidate or a candidate a ranking leaves out).
Every function returns one value per group where *larger means less certain*, so the groups
to send to people are the ``N`` largest. Everything is float64.
"""

from __future__ import annotations

import math

import torch

from grouppref.stats.rankstats import kendall_w

DTYPE = torch.float64


def disagreement(ranks: torch.Tensor, included: torch.Tensor) -> torch.Tensor:
    """Disagreement between rankers: ``u = 1 - W``, Kendall's coefficient of concordance W of
    the included rankings (tie-corrected, mid-ranks; partial rankings via the mean pairwise
    Spearman rho, :func:`grouppref.stats.rankstats.kendall_w`).

    ``W = 12 S / (m^2 (n^3 - n) - m sum_a T_a)`` with ``S = sum_i (R_i - m (n + 1) / 2)^2``,
    ``R_i`` the sum of candidate ``i``'s mid-ranks over the ``m`` rankings and ``T_a = sum over
    tie groups of (t^3 - t)``. ``u = 0``: the rankers agree exactly; under random rankings
    ``E[u] = 1 - 1/m``. Where W is undefined (fewer than two rankings, or every ranking puts
    all candidates in one tier) the machines have not told the candidates apart, and ``u = 1``.

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        included (torch.Tensor): ``(B, A)`` bool, the rankings that count.

    Returns:
        torch.Tensor: ``(B,)`` in ``[0, 1]``.
    """
    w = kendall_w(ranks, included)
    return torch.where(torch.isnan(w), 1.0, 1.0 - w).to(DTYPE)


def expected_pair_error(theta: torch.Tensor, cov: torch.Tensor, valid: torch.Tensor
                        ) -> torch.Tensor:
    """Bradley-Terry posterior uncertainty: the expected share of the group's pairs that the
    posterior orders the other way round from the MAP strengths.

    With the Laplace posterior ``theta ~ N(theta_hat, Sigma)`` (``Sigma = H^-1``, the inverse
    Fisher information plus prior precision at the MAP, :func:`bt.covariance_pairwise`), the
    margin of a pair is ``d_ij ~ N(theta_hat_i - theta_hat_j, v_ij)`` with
    ``v_ij = Sigma_ii + Sigma_jj - 2 Sigma_ij``, so the posterior probability that the pair is
    ordered the other way is ``Phi(-|theta_hat_i - theta_hat_j| / sqrt(v_ij))``:

        ``u = (1 / P) sum_{i<j valid} Phi(-|theta_hat_i - theta_hat_j| / sqrt(v_ij))``,

    ``P`` = number of valid pairs. ``u`` lies in ``[0, 0.5]``: 0.5 when every margin is 0
    (a coin flip on every pair), near 0 when margins are wide and well measured.

    Why not the variance alone: with the same rankers on every group, ``v_ij`` mostly measures
    how one-sided the votes are (unanimous votes pin a margin down *least*, since
    ``Var^-1 ~ N p (1 - p)``), so the largest variances would pick the groups the machines
    agree on. The ratio of margin to its standard deviation is what says whether the order
    could be wrong.

    Args:
        theta (torch.Tensor): ``(B, K)`` MAP log-strengths.
        cov (torch.Tensor): ``(B, K, K)`` posterior covariance.
        valid (torch.Tensor): ``(B, K)`` bool, real candidates.

    Returns:
        torch.Tensor: ``(B,)`` in ``[0, 0.5]``; 0.5 for a group with fewer than two candidates.
    """
    diag = torch.diagonal(cov, dim1=-2, dim2=-1)
    var = (diag[..., :, None] + diag[..., None, :] - 2 * cov).clamp(min=1e-300)
    gap = (theta[..., :, None] - theta[..., None, :]).abs()
    flip = 0.5 * torch.erfc(gap / var.sqrt() / math.sqrt(2.0))  # Phi(-z) = erfc(z / sqrt 2) / 2
    k = theta.shape[-1]
    upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=theta.device), diagonal=1)
    pairs = valid[..., :, None] & valid[..., None, :] & upper
    count = pairs.sum((-1, -2)).to(DTYPE)
    mean = torch.where(pairs, flip, 0).sum((-1, -2)) / count.clamp(min=1)
    return torch.where(count > 0, mean, 0.5).to(DTYPE)


def smallest_margin(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A scorer's smallest margin: the smallest gap between adjacent scores once sorted, which
    is the smallest ``|s_i - s_j|`` over the valid pairs ``i != j``.

    Args:
        scores (torch.Tensor): ``(B, K)`` scores (any scale).
        valid (torch.Tensor): ``(B, K)`` bool, candidates with a score.

    Returns:
        torch.Tensor: ``(B,)``, ``>= 0``; ``inf`` where fewer than two candidates have a score.
    """
    s = scores.to(DTYPE)
    gap = (s[..., :, None] - s[..., None, :]).abs()
    k = s.shape[-1]
    off = ~torch.eye(k, dtype=torch.bool, device=s.device)
    pairs = valid[..., :, None] & valid[..., None, :] & off
    return torch.where(pairs, gap, math.inf).amin((-1, -2))


def top_n(uncertainty: torch.Tensor, n: int, generator: torch.Generator | None = None
          ) -> list[int]:
    """Indices of the ``n`` largest values, largest first; equal values in a random order
    drawn from ``generator`` (input order without one), so a budget that cuts through a run of
    ties takes a random sample of it rather than the first rows.

    Raises:
        ValueError: ``n`` outside ``[0, B]`` or a NaN value.
    """
    b = uncertainty.shape[0]
    if not 0 <= n <= b:
        raise ValueError(f"n must be in [0, {b}], got {n}")
    if bool(torch.isnan(uncertainty).any()):
        raise ValueError("uncertainty has NaN values")
    shuffle = torch.randperm(b, generator=generator) if generator is not None else torch.arange(b)
    values = uncertainty[shuffle].tolist()
    order = sorted(range(b), key=lambda i: -values[i])  # stable: ties keep the shuffled order
    return [int(shuffle[i]) for i in order[:n]]
