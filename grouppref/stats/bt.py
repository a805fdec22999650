"""Batched Bradley-Terry fits and ranking statistics, as pure functions over torch tensors.

Shapes: ``B`` groups, ``A`` rankings (annotator slots) per group, ``K`` candidates per group
(padded to the largest group; padded slots are marked with a rank of ``-1``). Everything is
float64 so that the fits agree with ``choix`` to 1e-6.

How this departs from choix / the papers:

* Ties. A ranking is a list of tiers; a tie is counted as *half a win each way* (the
  Rao-Kupper / Davidson tie models need an extra parameter; half-wins keep the plain BT
  likelihood and are what ``choix`` gives when a tie is entered as two comparisons with the
  data doubled). See :func:`votes_rankings`.
* Prior. :func:`map_pairwise` maximises the BT log-likelihood plus an L2 (Gaussian) prior
  ``-alpha * ||theta||^2``: exactly the penalty of ``choix.opt_pairwise(alpha=...)``, so the
  prior variance of each strength is ``1 / (2 alpha)``. It is *not* ILSR's ``alpha`` (which adds
  ``alpha`` to every rate of the Markov chain); the two differ by up to ~0.9 on groups where
  one candidate wins every vote. The L2 prior makes the fit exist for one-sided wins and
  centres it: at the optimum ``sum_i theta_i = 0``.
* Plackett-Luce. We fit BT on the pairwise votes implied by the tiers rather than a
  Plackett-Luce likelihood: PL has no standard treatment of ties, while half-wins do, and the
  pairwise fit is what the trainer consumes (``p_ij``).
* The fit is a damped Newton method run on all ``B`` groups at once (Cholesky solves of
  ``(B, K, K)`` systems), not one solver call per group.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from grouppref.errors import GroupPrefError

DTYPE = torch.float64


class ConvergenceError(GroupPrefError):
    """A batched fit did not converge within its iteration budget."""


# -- votes ------------------------------------------------------------------------------------
def votes_rankings(ranks: torch.Tensor) -> torch.Tensor:
    """Pairwise votes of every ranking: ``V[b, a, i, j]`` = 1 if ranking ``a`` puts ``i`` above
    ``j``, 0.5 if it ties them, 0 otherwise (and 0 wherever ``i``, ``j`` or the ranking is
    padding).

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` integer tier index of each candidate (0 = best
            tier); ``-1`` marks a padded candidate or a padded / missing ranking.

    Returns:
        torch.Tensor: ``V`` of shape ``(B, A, K, K)``, float64, zero diagonal.
    """
    r = ranks.to(DTYPE)
    valid = ranks >= 0  # (B, A, K)
    both = valid[..., :, None] & valid[..., None, :]  # (B, A, K, K)
    ri, rj = r[..., :, None], r[..., None, :]
    v = (ri < rj).to(DTYPE) + 0.5 * (ri == rj).to(DTYPE)
    eye = torch.eye(ranks.shape[-1], dtype=torch.bool, device=ranks.device)
    return torch.where(both & ~eye, v, torch.zeros((), dtype=DTYPE))


def wins_rankings(ranks: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted win counts ``W[b, i, j] = sum_a weights[b, a] * V[b, a, i, j]``.

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        weights (torch.Tensor): ``(B, A)`` weight of each ranking (0 for padding).

    Returns:
        torch.Tensor: ``(B, K, K)`` float64.
    """
    return torch.einsum("ba,baij->bij", weights.to(DTYPE), votes_rankings(ranks))


# -- Bradley-Terry MAP fit ----------------------------------------------------------------------
def objective_pairwise(theta: torch.Tensor, wins: torch.Tensor, alpha: float) -> torch.Tensor:
    """Negative log-posterior ``f(theta) = sum_ij W_ij log(1 + exp(theta_j - theta_i))
    + alpha * ||theta||^2`` (choix's ``PairwiseFcts.objective``).

    Args:
        theta (torch.Tensor): ``(B, K)`` log-strengths.
        wins (torch.Tensor): ``(B, K, K)`` win counts, ``W_ij`` = votes for ``i`` over ``j``.
        alpha (float): L2 prior strength (> 0).

    Returns:
        torch.Tensor: ``(B,)``.
    """
    d = theta[:, :, None] - theta[:, None, :]  # (B, K, K): theta_i - theta_j
    return (wins * F.softplus(-d)).sum((-1, -2)) + alpha * (theta**2).sum(-1)


def gradient_pairwise(theta: torch.Tensor, wins: torch.Tensor, alpha: float) -> torch.Tensor:
    """``g_i = sum_j (N_ij p_ij - W_ij) + 2 alpha theta_i`` with ``N = W + W^T`` and
    ``p_ij = sigmoid(theta_i - theta_j)``; shape ``(B, K)``."""
    p = probabilities_pairwise(theta)
    n = wins + wins.transpose(-1, -2)
    return (n * p - wins).sum(-1) + 2 * alpha * theta


def hessian_pairwise(theta: torch.Tensor, wins: torch.Tensor, alpha: float) -> torch.Tensor:
    """``H = diag(sum_j c_ij) - c + 2 alpha I`` with ``c_ij = N_ij p_ij (1 - p_ij)``: the
    posterior precision (positive definite for ``alpha > 0``); shape ``(B, K, K)``."""
    p = probabilities_pairwise(theta)
    c = (wins + wins.transpose(-1, -2)) * p * (1 - p)  # (B, K, K)
    eye = torch.eye(theta.shape[-1], dtype=DTYPE, device=theta.device)
    return torch.diag_embed(c.sum(-1)) - c + 2 * alpha * eye


def _newton_step(theta: torch.Tensor, wins: torch.Tensor, alpha: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Newton step ``H^-1 g`` and decrement ``g^T H^-1 g`` (both from one ``p``); ``(B, K)``,
    ``(B,)``."""
    p = probabilities_pairwise(theta)  # (B, K, K)
    n = wins + wins.transpose(-1, -2)
    g = (n * p - wins).sum(-1) + 2 * alpha * theta
    c = n * p * (1 - p)
    hess = torch.diag_embed(c.sum(-1) + 2 * alpha) - c
    chol, _ = torch.linalg.cholesky_ex(hess)
    step = torch.cholesky_solve(g[..., None], chol)[..., 0]
    return step, (g * step).sum(-1)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``None``: leave the setting alone).

    The fits are many tiny (K x K) problems: extra threads barely help, and on a loaded
    machine they cost a lot (measured here: 20,000 groups in 0.15 s on 1 thread, 4.0 s on 2
    threads while other jobs ran)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def map_pairwise(
    wins: torch.Tensor,
    alpha: float = 0.1,
    max_iter: int = 100,
    tol: float = 1e-10,
    threads: int | None = 1,
) -> torch.Tensor:
    """MAP Bradley-Terry log-strengths of ``B`` groups at once (damped Newton).

    Maximises ``sum_ij W_ij log sigmoid(theta_i - theta_j) - alpha ||theta||^2`` per group,
    the objective of ``choix.opt_pairwise(n_items, data, alpha)``. Padded candidates (no
    votes) stay at 0. Each Newton step is halved until the objective does not rise (Armijo),
    which keeps one-sided groups with a tiny ``alpha`` from overshooting.

    Args:
        wins (torch.Tensor): ``(B, K, K)`` non-negative win counts (weighted votes allowed).
        alpha (float): L2 prior strength, must be > 0. Default 0.1 (prior sd ~2.2).
        max_iter (int): Newton iterations allowed.
        tol (float): stop when every group's Newton step is below ``tol`` (max norm).
        threads (int | None): torch intra-op threads during the fit (see :func:`torch_threads`).

    Returns:
        torch.Tensor: ``theta`` of shape ``(B, K)``, float64, each row summing to 0.

    Raises:
        ValueError: ``alpha <= 0`` or negative / non-finite win counts.
        ConvergenceError: some group has not converged after ``max_iter`` steps.

    Example:
        >>> w = torch.tensor([[[0.0, 3.0], [0.0, 0.0]]], dtype=torch.float64)
        >>> map_pairwise(w, alpha=0.1)[0, 0].item() > 0
        True
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 (the prior makes one-sided groups fit), got {alpha}")
    wins = wins.to(DTYPE)
    if not bool(torch.isfinite(wins).all()) or bool((wins < 0).any()):
        raise ValueError("win counts must be finite and >= 0")
    with torch_threads(threads):
        return _newton(wins, alpha, max_iter, tol)


def _newton(wins: torch.Tensor, alpha: float, max_iter: int, tol: float) -> torch.Tensor:
    theta = torch.zeros(wins.shape[:-1], dtype=DTYPE, device=wins.device)
    active = torch.arange(wins.shape[0], device=wins.device)
    th, w = theta, wins
    for _ in range(max_iter):
        step, decrement = _newton_step(th, w, alpha)
        moving = step.abs().amax(-1) >= tol
        if not bool(moving.all()):  # drop converged groups from the work set
            active, th, w = active[moving], th[moving], w[moving]
            step, decrement = step[moving], decrement[moving]
        if active.numel() == 0:
            return theta
        th = th - _armijo(th, w, alpha, step, decrement)[:, None] * step
        theta[active] = th
    raise ConvergenceError(
        f"Bradley-Terry fit: {active.numel()} of {wins.shape[0]} groups not converged after "
        f"{max_iter} Newton steps (largest step {step.abs().max().item():.3g}); raise max_iter "
        "or the prior strength alpha"
    )


def _armijo(theta: torch.Tensor, wins: torch.Tensor, alpha: float, step: torch.Tensor,
            decrement: torch.Tensor, halvings: int = 30) -> torch.Tensor:
    """Step sizes ``t`` (B,) in {1, 1/2, ...} with ``f(theta - t step) <= f(theta) - 1e-4 t
    lambda^2`` (``lambda^2`` = Newton decrement). Groups with ``lambda^2 < 0.01`` take the full
    step unchecked: there Newton converges quadratically (the logistic loss is generalised
    self-concordant), and roundoff would hide the decrease anyway."""
    t = torch.ones_like(decrement)
    pending = decrement >= 1e-2
    if not bool(pending.any()):
        return t
    idx = pending.nonzero()[:, 0]
    th, w, st, dec = theta[idx], wins[idx], step[idx], decrement[idx]
    f0 = objective_pairwise(th, w, alpha)
    ts = torch.ones_like(f0)
    todo = torch.ones_like(f0, dtype=torch.bool)
    for _ in range(halvings):
        f1 = objective_pairwise(th[todo] - ts[todo, None] * st[todo], w[todo], alpha)
        ok = f1 <= f0[todo] - 1e-4 * ts[todo] * dec[todo]
        sub = todo.nonzero()[:, 0]
        ts[sub[~ok]] /= 2
        todo[sub[ok]] = False
        if not bool(todo.any()):
            break
    t[idx] = ts
    return t


def probabilities_pairwise(theta: torch.Tensor) -> torch.Tensor:
    """``p_ij = P(i > j) = sigmoid(theta_i - theta_j)``: ``(B, K)`` -> ``(B, K, K)``."""
    return torch.sigmoid(theta[..., :, None] - theta[..., None, :])


def covariance_pairwise(theta: torch.Tensor, wins: torch.Tensor, alpha: float) -> torch.Tensor:
    """Laplace posterior covariance ``Sigma = H^{-1}`` at the MAP; shape ``(B, K, K)``."""
    return torch.cholesky_inverse(torch.linalg.cholesky(hessian_pairwise(theta, wins, alpha)))


def confidence_pairwise(cov: torch.Tensor, alpha: float) -> torch.Tensor:
    """Confidence ``w_ij = 1 - Var_post(theta_i - theta_j) / Var_prior(theta_i - theta_j)``.

    ``Var_post = Sigma_ii + Sigma_jj - 2 Sigma_ij`` (Laplace) and ``Var_prior = 1 / alpha``
    (two independent ``N(0, 1/(2 alpha))`` strengths). It is the share of the prior's
    uncertainty about the pair's margin that the votes removed: 0 with no votes, towards 1 as
    votes accumulate, lower for one-sided pairs whose margin the data cannot pin down. Since
    ``H >= 2 alpha I``, it lies in ``[0, 1]``.

    Args:
        cov (torch.Tensor): ``(B, K, K)`` posterior covariance.
        alpha (float): the prior strength used in the fit.

    Returns:
        torch.Tensor: ``(B, K, K)``, symmetric, in ``[0, 1]``.
    """
    diag = torch.diagonal(cov, dim1=-2, dim2=-1)
    var = diag[..., :, None] + diag[..., None, :] - 2 * cov
    return (1 - alpha * var).clamp(0.0, 1.0)


# -- ranking statistics ---------------------------------------------------------------------------
def midranks(ranks: torch.Tensor) -> torch.Tensor:
    """1-based mid-ranks of tiered rankings: ``1 + #above + (#tied - 1) / 2``; ``(..., K)`` ->
    ``(..., K)`` float64 (0 where ``ranks`` is -1)."""
    valid = ranks >= 0
    both = valid[..., :, None] & valid[..., None, :]
    above = ((ranks[..., None, :] < ranks[..., :, None]) & both).sum(-1)
    tied = ((ranks[..., None, :] == ranks[..., :, None]) & both).sum(-1)
    return torch.where(valid, 1 + above + (tied - 1) / 2, 0).to(DTYPE)


def kendall_w(ranks: torch.Tensor, included: torch.Tensor) -> torch.Tensor:
    """Kendall's coefficient of concordance W with the tie correction, per group.

    ``W = 12 S / (m^2 (n^3 - n) - m sum_a T_a)``, ``S = sum_i (R_i - m (n + 1) / 2)^2``,
    ``R_i`` = sum of mid-ranks of candidate ``i`` over the ``m`` included rankings,
    ``T_a = sum over tie groups of (t^3 - t)``. Under random rankings ``E[W] = 1 / m``.

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.
        included (torch.Tensor): ``(B, A)`` bool, rankings that take part.

    Returns:
        torch.Tensor: ``(B,)`` in ``[0, 1]``; NaN where ``m < 2`` or every ranking is one tier.
    """
    valid = (ranks >= 0) & included[..., None]  # (B, A, K)
    m = included.sum(-1).to(DTYPE)  # (B,)
    n = (ranks >= 0).any(1).sum(-1).to(DTYPE)  # (B,)
    rr = torch.where(valid, midranks(ranks), 0)
    big_r = rr.sum(1)  # (B, K)
    present = (ranks >= 0).any(1)
    s = torch.where(present, (big_r - (m * (n + 1) / 2)[:, None]) ** 2, 0).sum(-1)
    tie_size = ((ranks[..., None, :] == ranks[..., :, None]) & valid[..., None, :]
                & valid[..., :, None]).sum(-1).to(DTYPE)  # (B, A, K)
    t = torch.where(valid, tie_size**2 - 1, 0).sum((-1, -2))  # sum_a sum_groups (t^3 - t)
    denom = m**2 * (n**3 - n) - m * t
    ok = (m >= 2) & (denom > 0)
    return torch.where(ok, 12 * s / torch.where(ok, denom, 1), math.nan).clamp(max=1.0)


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
    over valid pairs (as ``scipy.stats.kendalltau``); ``(..., K)`` -> ``(...)``, NaN where
    either ranking is all one tier."""
    sa, sb = _signs(ranks_a), _signs(ranks_b)
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


# -- annotator reliability without a consensus ------------------------------------------------------
def concordance_slots(ranks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Concordant / discordant pair counts between every two rankings of each group.

    Uses ``#conc = (sum |s_a||s_c| + sum s_a s_c) / 2`` and ``#disc = (sum |s_a||s_c| -
    sum s_a s_c) / 2`` over pairs ``i < j`` (``s`` as in :func:`kendall_tau`).

    Args:
        ranks (torch.Tensor): ``(B, A, K)`` tier indices, ``-1`` for padding.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: two ``(B, A, A)`` float64 tensors.
    """
    s = _signs(ranks)  # (B, A, K, K)
    dot = torch.einsum("baij,bcij->bac", s, s)
    both = torch.einsum("baij,bcij->bac", s.abs(), s.abs())
    return (both + dot) / 2, (both - dot) / 2


def flip_rates_moment(agree: torch.Tensor, total: torch.Tensor, iters: int = 2000,
                      tol: float = 1e-10) -> torch.Tensor:
    """Each annotator's flip rate from pairwise agreement alone (no consensus needed).

    If annotators flip each pairwise vote independently with rates ``f_a``, two annotators
    agree on a pair with probability ``(1 - f_a)(1 - f_b) + f_a f_b``, so ``c_ab = 2 A_ab - 1
    = q_a q_b`` with ``q_a = 1 - 2 f_a`` (the "triad" identity of Dawid-Skene-style moment
    estimators). We fit ``q`` by weighted least squares ``sum_ab n_ab (c_ab - q_a q_b)^2``
    with damped alternating updates started at ``q = 0.5`` (most annotators better than
    chance fixes the sign). An annotator is identified only with at least two partners.

    Args:
        agree (torch.Tensor): ``(N, N)`` agreeing votes between annotators ``a`` and ``b``.
        total (torch.Tensor): ``(N, N)`` pairs both ranked strictly (0 on the diagonal).
        iters (int): maximum updates.
        tol (float): stop when ``q`` moves less than this.

    Returns:
        torch.Tensor: ``(N,)`` flip rates in ``[0, 1]``; NaN where not identified.
    """
    n = total.to(DTYPE)
    c = torch.where(n > 0, 2 * agree.to(DTYPE) / n.clamp(min=1) - 1, 0)
    q = torch.full((n.shape[0],), 0.5, dtype=DTYPE)
    for _ in range(iters):
        den = (n * q[None, :] ** 2).sum(1)
        upd = torch.where(den > 0, (n * c * q[None, :]).sum(1) / den.clamp(min=1e-300), q)
        new = (0.5 * q + 0.5 * upd).clamp(-1.0, 1.0)
        moved = (new - q).abs().max().item() if q.numel() else 0.0
        q = new
        if moved < tol:
            break
    identified = (n > 0).sum(1) >= 2
    return torch.where(identified, (1 - q) / 2, math.nan)
