"""Group preference losses as pure functions over implicit rewards (docs/train-internals.md).

Shape notation: B groups, K candidates per group (padded to the largest group of the batch;
``valid`` marks the real ones). Every loss returns one value per group, shape (B,), so the
caller chooses the reduction (mean over groups, weighting by group, ...).

How this departs from the papers:

* ``gspo`` is DPO's Bradley-Terry likelihood (Rafailov et al. 2023, eq. 7) summed over all
  pairs of a group with *soft* targets ``p_ij`` and confidences ``w_ij`` from aggregation,
  normalised by the total confidence so a group weighs the same whatever its K.
* ``label_smoothing`` is the conservative-DPO target ``(1 - ε)·p + ε·(1 - p)``; ``robust=True``
  is the unbiased rDPO correction (Chowdhury et al. 2024, eq. 7) applied to the soft target.
* Importance weights ``rho`` (optional everywhere) multiply each pair's (or position's) term
  but not the normaliser, so a group whose data the policy has drifted away from counts less.

The listwise losses from graded labels (LiPO-λ, InfoNCA, NCA) are in
:mod:`grouppref.train.objective.listwise`; :func:`grouppref.train.objective.dispatch.score_loss`
picks a loss by name.
``implicit_rewards(..., reference_free=True)`` and ``target_margin`` give SimPO (Meng et al. 2024).

"GSPO" here is Groupwise Supervised Preference Optimization (offline, no critic, no sampling),
not Group Sequence Policy Optimization.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grouppref.errors import ConfigError

Tensor = torch.Tensor


def implicit_rewards(policy_logps: Tensor, ref_logps: Tensor | None, beta: float,
                     num_tokens: Tensor | None = None, length_normalise: bool = False,
                     reference_free: bool = False) -> Tensor:
    """Implicit rewards ``s_i = β · (log πθ(y_i|x) − log πref(y_i|x)) [/ n_i]``.

    ``reference_free`` drops the reference: ``s_i = β · log πθ(y_i|x) [/ n_i]``, with
    ``length_normalise`` SimPO's reward (Meng et al. 2024, eq. 4); ``ref_logps`` is ignored.

    Args:
        policy_logps (Tensor): summed response log-probs under the policy, shape (B, K).
        ref_logps (Tensor | None): the same under the reference model, shape (B, K).
        beta (float): β > 0, the strength of the KL anchor to the reference.
        num_tokens (Tensor | None): response lengths n_i, shape (B, K); needed when
            ``length_normalise``.
        length_normalise (bool): divide the log-ratio by n_i (SimPO/IPO-style per-token reward).
        reference_free (bool): no reference term (SimPO).

    Returns:
        Tensor: s, shape (B, K).

    Raises:
        ConfigError: ``ref_logps`` is None without ``reference_free``, ``beta`` is not
            positive, or ``length_normalise`` without ``num_tokens``.
    """
    if ref_logps is None and not reference_free:
        raise ConfigError(
            "reference log-probs are missing: compute them once with the reference model "
            "(group_logps under torch.no_grad) and set TokenizedGroup.ref_logps before training, "
            "or train reference_free (SimPO)"
        )
    if not beta > 0:
        raise ConfigError(f"beta must be > 0, got {beta!r}")
    log_ratio = policy_logps if reference_free or ref_logps is None else policy_logps - ref_logps  # (B, K)
    if length_normalise:
        if num_tokens is None:
            raise ConfigError("length_normalise=True needs num_tokens (GroupBatch.num_tokens)")
        log_ratio = log_ratio / num_tokens.clamp(min=1).to(log_ratio.dtype)
    return beta * log_ratio


def _check_smoothing(label_smoothing: float, robust: bool) -> None:
    if not 0.0 <= label_smoothing < 0.5:
        raise ConfigError(f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    if robust and label_smoothing == 0.0:
        raise ConfigError("robust=True needs label_smoothing > 0 (the assumed label-flip rate)")


def _soft_bce(margin: Tensor, p: Tensor, label_smoothing: float, robust: bool,
              target_margin: float = 0.0) -> Tensor:
    """``ℓ(p) = −p·log σ(Δ − γ) − (1 − p)·log σ(−Δ − γ)`` with cDPO smoothing or the rDPO
    correction; γ is subtracted from the margin of whichever side wins (SimPO's γ; 0: DPO).

    cDPO: ``ℓ((1 − ε)p + ε(1 − p))``. rDPO: ``[(1 − ε)·ℓ(p) − ε·ℓ(1 − p)] / (1 − 2ε)``.
    """
    pos, neg = F.logsigmoid(margin - target_margin), F.logsigmoid(-margin - target_margin)
    if robust:
        eps = label_smoothing
        clean = -p * pos - (1 - p) * neg
        flipped = -(1 - p) * pos - p * neg
        return ((1 - eps) * clean - eps * flipped) / (1 - 2 * eps)
    target = p * (1 - 2 * label_smoothing) + label_smoothing
    return -target * pos - (1 - target) * neg


def _pair_mask(valid: Tensor) -> Tensor:
    """(B, K, K) true for i < j, both valid: each unordered pair once."""
    k = valid.shape[-1]
    upper = torch.ones(k, k, dtype=torch.bool, device=valid.device).triu(diagonal=1)
    return valid[:, :, None] & valid[:, None, :] & upper


def gspo_loss(s: Tensor, p_ij: Tensor, w_ij: Tensor, valid: Tensor, label_smoothing: float = 0.0,
              *, robust: bool = False, rho: Tensor | None = None,
              target_margin: float = 0.0) -> Tensor:
    """Soft Bradley-Terry loss over all pairs of each group (the default).

    ``L = Σ_{i<j} w_ij·ρ_i·ρ_j·[−p_ij·log σ(s_i − s_j − γ) − (1 − p_ij)·log σ(s_j − s_i − γ)] / Σ_{i<j} w_ij``

    γ (``target_margin``, SimPO's target reward margin) is 0 by default.

    Summing ordered pairs instead gives the same value (the (j, i) term equals the (i, j) one
    because p_ji = 1 − p_ij). With K = 2, p = 1, w = 1 this is DPO's sigmoid loss
    ``−log σ(s_w − s_l)``.

    Args:
        s (Tensor): implicit rewards, shape (B, K).
        p_ij (Tensor): P(i ≻ j), shape (B, K, K); only i < j is read.
        w_ij (Tensor): pair confidence ≥ 0, shape (B, K, K), symmetric; 0 where no pair.
        valid (Tensor): bool, shape (B, K), real candidates.
        label_smoothing (float): ε in [0, 0.5): cDPO target smoothing, or the assumed
            flip rate with ``robust``.
        robust (bool): use the unbiased rDPO correction instead of smoothing the target.
        rho (Tensor | None): importance weights ρ, shape (B, K) (see :func:`importance_weights`).
        target_margin (float): γ ≥ 0, subtracted from each winner-minus-loser margin.

    Returns:
        Tensor: per-group loss, shape (B,); 0 for a group whose pairs all have weight 0.

    Example:
        >>> s = torch.tensor([[1.0, 0.0]])
        >>> p = torch.tensor([[[0.5, 1.0], [0.0, 0.5]]])
        >>> w = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
        >>> gspo_loss(s, p, w, torch.tensor([[True, True]]))  # −log σ(1) = 0.3133
        tensor([0.3133])
    """
    _check_smoothing(label_smoothing, robust)
    margin = s[:, :, None] - s[:, None, :]  # (B, K, K): s_i − s_j
    terms = _soft_bce(margin, p_ij, label_smoothing, robust, target_margin)  # (B, K, K)
    w = w_ij * _pair_mask(valid)  # (B, K, K)
    weighted = w if rho is None else w * rho[:, :, None] * rho[:, None, :]
    total = (weighted * terms).sum(dim=(1, 2))
    return total / w.sum(dim=(1, 2)).clamp(min=torch.finfo(s.dtype).tiny)


def hard_pair_targets(p_ij: Tensor, w_ij: Tensor, tol: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Hard targets from soft ones: every pair the aggregation orders counts fully.

    ``p'_ij = 1[p_ij > 1/2]`` and ``w'_ij = 1`` where ``|p_ij − 1/2| > tol`` and ``w_ij > 0``;
    pairs in one consensus tier (``p_ij = 1/2``) and pairs without a preference get
    ``p' = 1/2, w' = 0``. With these, :func:`gspo_loss` is DPO's loss averaged over every
    ordered pair of the group.

    Args:
        p_ij (Tensor): P(i ≻ j), shape (B, K, K).
        w_ij (Tensor): pair confidence, shape (B, K, K).
        tol (float): distance from 1/2 under which a pair counts as a tie.

    Returns:
        tuple[Tensor, Tensor]: ``(p', w')``, each shape (B, K, K).

    Example:
        >>> p = torch.tensor([[[0.5, 0.8], [0.2, 0.5]]]); w = torch.full((1, 2, 2), 0.3)
        >>> hard_pair_targets(p, w)[0][0, 0, 1].item(), hard_pair_targets(p, w)[1][0, 0, 1].item()
        (1.0, 1.0)
    """
    ordered = ((p_ij - 0.5).abs() > tol) & (w_ij > 0)  # (B, K, K)
    half = torch.full_like(p_ij, 0.5)
    return torch.where(ordered, (p_ij > 0.5).to(p_ij.dtype), half), ordered.to(w_ij.dtype)


def plackett_luce_loss(s: Tensor, order: Tensor, valid: Tensor, *, rho: Tensor | None = None) -> Tensor:
    """Plackett-Luce negative log-likelihood of the consensus order τ (listwise).

    ``L = −Σ_{k < n} ρ_τ(k)·[s_τ(k) − logsumexp_{m ≥ k} s_τ(m)]`` over the n valid candidates.

    Ties in the consensus are broken by aggregated strength when ``order`` is built, so the
    loss treats the order as strict. With K = 2 it equals DPO's sigmoid loss. The sum is not
    divided by n (as in the formula), so larger groups weigh more.

    Args:
        s (Tensor): implicit rewards, shape (B, K).
        order (Tensor): long, shape (B, K): candidate indices best first; the valid
            candidates come first, padding slots after them.
        valid (Tensor): bool, shape (B, K).
        rho (Tensor | None): importance weights, shape (B, K), applied to the term of the
            candidate chosen at each position.

    Returns:
        Tensor: per-group loss, shape (B,).
    """
    s_tau = s.gather(1, order)  # (B, K): rewards in consensus order
    valid_tau = valid.gather(1, order)  # (B, K)
    masked = s_tau.masked_fill(~valid_tau, float("-inf"))
    # logsumexp over the suffix m >= k: a reversed cumulative logsumexp.
    suffix = masked.flip(1).logcumsumexp(dim=1).flip(1)  # (B, K)
    terms = torch.where(valid_tau, s_tau - suffix, torch.zeros_like(s_tau))
    if rho is not None:
        terms = terms * rho.gather(1, order)
    return -terms.sum(dim=1)


def best_worst(order: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Indices of the best (``order[:, 0]``) and worst (last valid in ``order``) candidates, (B,)."""
    n = valid.sum(dim=1)  # (B,)
    worst = order.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0]
    return order[:, 0], worst


def dpo_loss(s: Tensor, order: Tensor, valid: Tensor, label_smoothing: float = 0.0,
             *, robust: bool = False, rho: Tensor | None = None,
             target_margin: float = 0.0) -> Tensor:
    """DPO sigmoid loss on the best vs the worst candidate of the consensus.

    ``L = ρ_b·ρ_w·ℓ(1)`` with ``ℓ`` as in :func:`gspo_loss`, Δ = s_best − s_worst: without
    smoothing ``−log σ(Δ)`` (``−log σ(Δ − γ)`` with a target margin γ: SimPO's loss with
    reference-free rewards); cDPO ``−(1 − ε)·log σ(Δ) − ε·log σ(−Δ)``; rDPO
    ``[−(1 − ε)·log σ(Δ) + ε·log σ(−Δ)] / (1 − 2ε)``.

    Args:
        s (Tensor): implicit rewards, shape (B, K).
        order (Tensor): long, shape (B, K), valid candidates first, best first.
        valid (Tensor): bool, shape (B, K).
        label_smoothing (float): ε in [0, 0.5).
        robust (bool): rDPO instead of cDPO.
        rho (Tensor | None): importance weights, shape (B, K).
        target_margin (float): γ ≥ 0.

    Returns:
        Tensor: per-group loss, shape (B,).
    """
    _check_smoothing(label_smoothing, robust)
    best, worst = best_worst(order, valid)
    margin = s.gather(1, best[:, None])[:, 0] - s.gather(1, worst[:, None])[:, 0]  # (B,)
    loss = _soft_bce(margin, torch.ones_like(margin), label_smoothing, robust, target_margin)
    if rho is not None:
        loss = loss * rho.gather(1, best[:, None])[:, 0] * rho.gather(1, worst[:, None])[:, 0]
    return loss


def sft_loss(policy_logps: Tensor, num_tokens: Tensor, order: Tensor) -> Tensor:
    """Per-token negative log-likelihood of the best candidate: ``−log πθ(y_best|x) / n_best``.

    Args:
        policy_logps (Tensor): summed response log-probs, shape (B, K).
        num_tokens (Tensor): response lengths, shape (B, K).
        order (Tensor): long, shape (B, K), best first.

    Returns:
        Tensor: per-group loss, shape (B,).
    """
    best = order[:, :1]  # (B, 1)
    logp = policy_logps.gather(1, best)[:, 0]
    n = num_tokens.gather(1, best)[:, 0].clamp(min=1).to(logp.dtype)
    return -logp / n


def importance_weights(policy_logps: Tensor, behavior_logps: Tensor, num_tokens: Tensor,
                       clip: tuple[float, float] = (0.5, 2.0)) -> Tensor:
    """Clipped, length-normalised importance ratios ``ρ_i = clip(exp((log πθ − log π_b)/n_i))``.

    The ratio is the geometric mean per token of πθ / π_behavior, so its size does not grow
    with length. Unknown behaviour log-probs (NaN) give ρ = 1. The result is detached: the
    weights rescale terms, they are not optimised.

    Args:
        policy_logps (Tensor): summed response log-probs, shape (B, K).
        behavior_logps (Tensor): the same under the generating model, NaN if unknown, (B, K).
        num_tokens (Tensor): response lengths, shape (B, K).
        clip (tuple[float, float]): (low, high), 0 < low ≤ 1 ≤ high.

    Returns:
        Tensor: ρ, shape (B, K), detached.

    Raises:
        ConfigError: ``clip`` is not a valid (low, high) range around 1.
    """
    low, high = clip
    if not 0 < low <= 1 <= high:
        raise ConfigError(f"importance clip must satisfy 0 < low <= 1 <= high, got {clip!r}")
    n = num_tokens.clamp(min=1).to(policy_logps.dtype)
    log_ratio = (policy_logps.detach() - behavior_logps) / n
    rho = log_ratio.exp().clamp(low, high)
    return torch.where(torch.isnan(behavior_logps), torch.ones_like(rho), rho)


def pair_accuracy(s: Tensor, p_ij: Tensor, w_ij: Tensor, valid: Tensor) -> Tensor:
    """Weighted share of decided consensus pairs (p_ij ≠ 0.5, w_ij > 0) that s orders right.

    ``acc = Σ w_ij·1[sign(s_i − s_j) = sign(p_ij − ½)] / Σ w_ij`` over decided pairs; a reward tie
    counts ½. Groups without a decided pair give NaN: reduce with ``nanmean``.

    Args:
        s (Tensor): implicit rewards, shape (B, K).
        p_ij (Tensor): P(i ≻ j), shape (B, K, K).
        w_ij (Tensor): pair confidence, shape (B, K, K).
        valid (Tensor): bool, shape (B, K).

    Returns:
        Tensor: per-group accuracy in [0, 1] or NaN, shape (B,), detached.
    """
    s = s.detach()
    decided = _pair_mask(valid) & (p_ij != 0.5) & (w_ij > 0)  # (B, K, K)
    margin = s[:, :, None] - s[:, None, :]
    agree = (torch.sign(margin) * torch.sign(p_ij - 0.5) + 1) / 2  # 1 right, ½ tie, 0 wrong
    w = w_ij * decided
    return (w * agree).sum(dim=(1, 2)) / w.sum(dim=(1, 2))
