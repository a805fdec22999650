"""Listwise losses from graded labels: LiPO-λ and the noise-contrastive InfoNCA / NCA, as pure
functions over implicit rewards (docs/train-internals.md, "Listwise losses").

Shape notation as in :mod:`grouppref.train.objective.losses`: B groups, K candidates per group (padded;
``valid`` marks the real ones). Every loss returns one value per group, shape (B,).

What the labels are here (the papers label with a reward model's scores):

* LiPO-λ reads graded labels ψ: :attr:`GroupBatch.labels <grouppref.train.tensors.batch.GroupBatch>`,
  the number of consensus tiers below a candidate (the worst tier has ψ = 0), so candidates
  tied in the consensus share a label and their pair gets no term. Tiers, not the aggregated
  strengths: LambdaLoss's gain ``2^ψ − 1`` is not shift-invariant, and Bradley-Terry
  strengths are only defined up to a shift (and their scale follows the prior), while tier
  counts mean the same for every group, human or automatic.
* InfoNCA / NCA read explicit rewards r: :attr:`GroupBatch.strengths`, the aggregated
  Bradley-Terry log-strengths θ (P(i ≻ j) = σ(θ_i − θ_j)), turned into soft targets
  ``q = softmax(θ/α)`` by :func:`soft_targets`. With α = 1, q_i is the Bradley-Terry /
  Plackett-Luce probability that candidate i is the best one. The softmax is shift-invariant,
  so the arbitrary offset of θ does not matter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grouppref.errors import ConfigError

Tensor = torch.Tensor


def current_ranks(s: Tensor, valid: Tensor) -> Tensor:
    """1-based rank τ of each valid candidate when its group is sorted by ``s``, best first.

    Equal rewards keep index order (a stable sort), so ranks are distinct; padding slots get
    rank 0. Detached. At the reference (s = 0 everywhere, the first step) the ranks are thus
    the candidates' index order, and LiPO-λ's weights follow it until the rewards separate.

    Args:
        s (Tensor): rewards, shape (B, K).
        valid (Tensor): bool, shape (B, K).

    Returns:
        Tensor: long, shape (B, K).

    Example:
        >>> current_ranks(torch.tensor([[0.1, 0.5, 0.1, 9.0]]), torch.tensor([[1, 1, 1, 0]]).bool())
        tensor([[2, 1, 3, 0]])
    """
    s = s.detach()
    k = s.shape[-1]
    idx = torch.arange(k, device=s.device)
    earlier = idx[None, :] < idx[:, None]  # (K, K): j < i
    # ahead[b, i, j]: j is valid and sorts before i
    ahead = (s[:, None, :] > s[:, :, None]) | ((s[:, None, :] == s[:, :, None]) & earlier)
    ahead = ahead & valid[:, None, :]
    return (1 + ahead.sum(-1)) * valid


def lambda_weights(s: Tensor, labels: Tensor, valid: Tensor) -> Tensor:
    """LambdaLoss weights of the ordered pairs with ψ_i > ψ_j, detached (LiPO eq. for Δ_ij).

    ``Δ_ij = |G_i − G_j| · |1/D(τ_i) − 1/D(τ_j)|``, gain ``G = 2^ψ − 1``, discount
    ``D(τ) = log2(1 + τ)`` of the rank τ under the current rewards (:func:`current_ranks`);
    0 where ψ_i ≤ ψ_j or either candidate is padding.

    Args:
        s (Tensor): rewards, shape (B, K).
        labels (Tensor): graded labels ψ, shape (B, K).
        valid (Tensor): bool, shape (B, K).

    Returns:
        Tensor: Δ, shape (B, K, K).
    """
    tau = current_ranks(s, valid).to(s.dtype)  # (B, K)
    gain = torch.pow(2.0, labels.to(s.dtype)) - 1  # (B, K)
    inv_d = torch.where(valid, 1 / torch.log2(1 + tau.clamp(min=1)), torch.zeros_like(tau))
    delta = (gain[:, :, None] - gain[:, None, :]).abs() * (inv_d[:, :, None] - inv_d[:, None, :]).abs()
    above = (labels[:, :, None] > labels[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    return (delta * above).detach()


def lipo_lambda_loss(s: Tensor, labels: Tensor, valid: Tensor, *, target_margin: float = 0.0,
                     normalise: bool = True, rho: Tensor | None = None) -> Tensor:
    """LiPO-λ (Liu et al. 2024, arXiv 2402.01878): the LambdaLoss-weighted pairwise logistic loss.

    ``L = −Σ_{ψ_i > ψ_j} Δ_ij·ρ_i·ρ_j·log σ(s_i − s_j − γ) [/ Σ_{ψ_i > ψ_j} Δ_ij]`` over the
    ordered pairs of each group, Δ from :func:`lambda_weights` (no gradient through Δ).

    Departures from the paper: labels are consensus tiers (module docstring), not reward-model
    scores; the sum is divided by Σ Δ (``normalise``, the default) so that a group weighs the
    same whatever its K and number of tiers (the raw Σ Δ grows like 2^tiers) and the step size
    matches DPO's: at K = 2 with one tier each, the normalised loss *is* DPO's
    ``−log σ(s_w − s_l)``; unnormalised (as in the paper) it is that times
    ``(2^1 − 1)·(1 − 1/log2 3) ≈ 0.3691``. ``γ`` (``target_margin``, SimPO's margin; 0 in
    the paper) is subtracted from every winner-minus-loser margin. Optional importance
    weights ρ multiply each pair's term, not the normaliser, as in
    :func:`~grouppref.train.objective.losses.gspo_loss`.

    Args:
        s (Tensor): implicit rewards, shape (B, K).
        labels (Tensor): graded labels ψ, shape (B, K) (``GroupBatch.labels``).
        valid (Tensor): bool, shape (B, K).
        target_margin (float): γ ≥ 0.
        normalise (bool): divide by Σ Δ.
        rho (Tensor | None): importance weights, shape (B, K).

    Returns:
        Tensor: per-group loss, shape (B,); 0 for a group whose candidates share one label.

    Example:
        >>> s, psi = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]])
        >>> lipo_lambda_loss(s, psi, torch.tensor([[True, True]]))  # −log σ(1), as DPO
        tensor([0.3133])
    """
    delta = lambda_weights(s, labels, valid)  # (B, K, K)
    margin = s[:, :, None] - s[:, None, :] - target_margin  # (B, K, K)
    weighted = delta if rho is None else delta * rho[:, :, None] * rho[:, None, :]
    total = -(weighted * F.logsigmoid(margin)).sum(dim=(1, 2))
    if not normalise:
        return total
    return total / delta.sum(dim=(1, 2)).clamp(min=torch.finfo(s.dtype).tiny)


def soft_targets(r: Tensor, valid: Tensor, temperature: float = 1.0) -> Tensor:
    """``q = softmax(r/α)`` over each group's valid candidates (0 on padding).

    Args:
        r (Tensor): explicit rewards, shape (B, K) (``GroupBatch.strengths``).
        valid (Tensor): bool, shape (B, K).
        temperature (float): α > 0; small α tends to one-hot on the best candidate.

    Returns:
        Tensor: q, shape (B, K), rows summing to 1.

    Raises:
        ConfigError: ``temperature`` is not positive.

    Example:
        >>> r = torch.tensor([[3.0, 1.0, 5.0]]).log()
        >>> soft_targets(r, torch.tensor([[1, 1, 0]]).bool())
        tensor([[0.7500, 0.2500, 0.0000]])
    """
    if not temperature > 0:
        raise ConfigError(f"target temperature must be > 0, got {temperature!r}")
    logits = (r / temperature).masked_fill(~valid, float("-inf"))
    return logits.softmax(dim=-1)


def _masked_log_softmax(s: Tensor, valid: Tensor) -> Tensor:
    log_p = s.masked_fill(~valid, float("-inf")).log_softmax(dim=-1)
    return torch.where(valid, log_p, torch.zeros_like(log_p))


def infonca_loss(s: Tensor, q: Tensor, valid: Tensor, *, rho: Tensor | None = None) -> Tensor:
    """InfoNCA (Chen et al. 2024, arXiv 2402.05369): cross-entropy of the soft targets q against
    the softmax of the implicit rewards over the group's K responses.

    ``L = −Σ_i q_i·ρ_i·log [exp(s_i) / Σ_j exp(s_j)]`` over the valid candidates, with
    ``q = softmax(r/α)`` (:func:`soft_targets`). Shift-invariant in s, so it also works with
    reference-free rewards. With K = 2 and one-hot q it is DPO's ``−log σ(s_w − s_l)``.

    Departures from the paper: r are aggregated Bradley-Terry strengths, not reward-model
    scores (module docstring); optional importance weights ρ scale each candidate's term.

    Args:
        s (Tensor): implicit rewards, shape (B, K).
        q (Tensor): soft targets, shape (B, K), 0 on padding.
        valid (Tensor): bool, shape (B, K).
        rho (Tensor | None): importance weights, shape (B, K).

    Returns:
        Tensor: per-group loss, shape (B,).

    Example:
        >>> s, q = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]])
        >>> infonca_loss(s, q, torch.tensor([[True, True]]))  # −log σ(1)
        tensor([0.3133])
    """
    terms = q * _masked_log_softmax(s, valid)
    if rho is not None:
        terms = terms * rho
    return -terms.sum(dim=1)


def nca_loss(s: Tensor, q: Tensor, valid: Tensor, *, rho: Tensor | None = None) -> Tensor:
    """NCA (Chen et al. 2024, arXiv 2402.05369): each response classified on its own, pulled up
    by its target weight and pushed down uniformly.

    ``L = −Σ_i q_i·ρ_i·log σ(s_i) − (1/n)·Σ_i ρ_i·log σ(−s_i)`` over the n valid candidates,
    with ``q = softmax(r/α)``. Unlike InfoNCA it reads the absolute rewards, so the reference
    anchors it (s = 0 at the reference); it is refused with ``reference_free``. With K = 2 and
    one-hot q it is TRL's ``loss_type="nca_pair"``:
    ``−log σ(s_w) − ½·log σ(−s_w) − ½·log σ(−s_l)``.

    Departures from the paper: r are aggregated Bradley-Terry strengths (module docstring);
    n counts the group's real candidates (groups of a batch may differ in size); optional
    importance weights ρ scale each candidate's two terms.

    Args:
        s (Tensor): implicit rewards, shape (B, K).
        q (Tensor): soft targets, shape (B, K), 0 on padding.
        valid (Tensor): bool, shape (B, K).
        rho (Tensor | None): importance weights, shape (B, K).

    Returns:
        Tensor: per-group loss, shape (B,).

    Example:
        >>> s, q = torch.zeros(1, 2), torch.tensor([[1.0, 0.0]])
        >>> nca_loss(s, q, torch.tensor([[True, True]]))  # 2·log 2
        tensor([1.3863])
    """
    n = valid.sum(dim=1, keepdim=True).clamp(min=1).to(s.dtype)  # (B, 1)
    pull = q * F.logsigmoid(s)
    push = torch.where(valid, F.logsigmoid(-s), torch.zeros_like(s)) / n
    terms = pull + push
    if rho is not None:
        terms = terms * rho
    return -terms.sum(dim=1)


