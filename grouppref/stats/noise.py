"""The label-noise moment estimator: each annotator's flip rate from pairwise agreement.

Pure function over ``(N, N)`` agreement tensors (N annotators); see
:func:`flip_rates_moment` for the model, the identity it uses and how it departs from the
Dawid-Skene family.
"""

from __future__ import annotations

import math

import torch

DTYPE = torch.float64


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
