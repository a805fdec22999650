"""Preference metrics of a model on tokenized groups (the ``eval`` stage, the trainers' held-out
evaluation and the refresh rounds use them).

Two families of numbers, both against the consensus of the aggregated rankings:

* reward metrics (need reference log-probs): the implicit reward
  ``s_i = β · (log πθ(y_i|x) − log πref(y_i|x))`` and

  - ``pair_accuracy``: weighted share of decided consensus pairs that s orders right (ties ½),
  - ``margin``: ``Σ w_ij·(s_i − s_j) / Σ w_ij`` over decided pairs oriented winner − loser,
  - ``reward_best`` / ``reward_worst``: s of the consensus best and worst candidate,
  - ``kl``: a per-token KL estimate to the reference, ``k3 = e^r − 1 − r`` with
    ``r = (log πref − log πθ) / n`` per candidate, averaged over candidates. It is unbiased for
    KL(πθ‖πref) only when the candidates were sampled from πθ; on offline data it measures how
    far the policy has moved on the data.

* likelihood metrics (any model): the same ordering scored by the model's own mean token
  log-prob ``log π(y_i|x) / n_i``: ``logp_pair_accuracy`` and ``logp_margin``. They compare a
  trained model with its starting point, whose implicit rewards are all 0 (accuracy ½).

Every metric is a mean over groups (pair accuracy over groups with a decided pair).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from grouppref.train.engine.distributed import process_state
from grouppref.train.engine.metric_sums import MetricSums
from grouppref.train.objective.losses import best_worst, implicit_rewards, pair_accuracy
from grouppref.train.tensors.batch import GroupBatch, TokenizedGroup, collate_groups
from grouppref.train.tensors.logps import group_logps

Tensor = torch.Tensor


def pair_margin(s: Tensor, p_ij: Tensor, w_ij: Tensor, valid: Tensor) -> Tensor:
    """Confidence-weighted mean margin of the decided pairs, winner minus loser.

    ``m = Σ_{i,j: p_ij > ½} w_ij·(s_i − s_j) / Σ_{i,j: p_ij > ½} w_ij``

    Args:
        s (Tensor): scores, shape (B, K).
        p_ij (Tensor): P(i ≻ j), shape (B, K, K).
        w_ij (Tensor): pair confidence, shape (B, K, K).
        valid (Tensor): bool, shape (B, K).

    Returns:
        Tensor: shape (B,), NaN for a group without a decided pair; detached.
    """
    s = s.detach()
    won = (p_ij > 0.5) & valid[:, :, None] & valid[:, None, :] & (w_ij > 0)  # (B, K, K)
    w = w_ij * won
    margin = s[:, :, None] - s[:, None, :]  # (B, K, K)
    return (w * margin).sum(dim=(1, 2)) / w.sum(dim=(1, 2))


def kl_estimate(policy_logps: Tensor, ref_logps: Tensor, num_tokens: Tensor,
                valid: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(πθ‖πref), averaged over each group's candidates.

    ``r_i = (log πref(y_i|x) − log πθ(y_i|x)) / n_i``, ``k3_i = exp(r_i) − 1 − r_i ≥ 0``.

    Args:
        policy_logps (Tensor): summed log-probs, shape (B, K).
        ref_logps (Tensor): the same under the reference, shape (B, K).
        num_tokens (Tensor): response lengths, shape (B, K).
        valid (Tensor): bool, shape (B, K).

    Returns:
        Tensor: shape (B,), detached.
    """
    r = (ref_logps - policy_logps.detach()) / num_tokens.clamp(min=1)  # (B, K)
    k3 = (r.exp() - 1 - r) * valid
    return k3.sum(dim=1) / valid.sum(dim=1).clamp(min=1)


def reward_metrics(policy_logps: Tensor, batch: GroupBatch, beta: float,
                   length_normalise: bool = False,
                   reference_free: bool = False) -> dict[str, Tensor]:
    """Implicit-reward metrics of one batch, one value per group (see the module docstring);
    with ``reference_free`` of the rewards ``beta * log pi [/ n]``, and no ``kl``.

    Args:
        policy_logps (Tensor): summed log-probs under the policy, shape (B, K).
        batch (GroupBatch): the groups, with ``ref_logps``.
        beta (float): implicit reward scale.
        length_normalise (bool): divide log-ratios by the token count.
        reference_free (bool): rewards without the reference (``batch.ref_logps`` unread).

    Returns:
        dict[str, Tensor]: ``pair_accuracy``, ``margin``, ``reward_best``, ``reward_worst``,
        ``kl`` (not with ``reference_free``), each shape (B,), detached.
    """
    s = implicit_rewards(policy_logps.detach(), batch.ref_logps, beta, batch.num_tokens,
                         length_normalise, reference_free)  # (B, K)
    best, worst = best_worst(batch.order, batch.valid)
    out = {
        "pair_accuracy": pair_accuracy(s, batch.p_ij, batch.w_ij, batch.valid),
        "margin": pair_margin(s, batch.p_ij, batch.w_ij, batch.valid),
        "reward_best": s.gather(1, best[:, None])[:, 0],
        "reward_worst": s.gather(1, worst[:, None])[:, 0],
    }
    if not reference_free and batch.ref_logps is not None:  # the loss raised without them
        out["kl"] = kl_estimate(policy_logps, batch.ref_logps, batch.num_tokens, batch.valid)
    return out


def likelihood_metrics(policy_logps: Tensor, batch: GroupBatch) -> dict[str, Tensor]:
    """Pair accuracy and margin of the model's own mean token log-prob, per group (B,)."""
    own = policy_logps.detach() / batch.num_tokens.clamp(min=1)  # (B, K)
    return {
        "logp_pair_accuracy": pair_accuracy(own, batch.p_ij, batch.w_ij, batch.valid),
        "logp_margin": pair_margin(own, batch.p_ij, batch.w_ij, batch.valid),
    }


def own_share(groups: Sequence[TokenizedGroup], batch_size: int) -> tuple[list[TokenizedGroup], int]:
    """This process's strided share of ``groups``, padded so every process runs the same
    number of batches (a sharded or DDP model needs every rank in every forward pass)."""
    state = process_state()
    own = list(groups[state.process_index::state.num_processes])
    per = math.ceil(len(groups) / state.num_processes)
    real = len(own)
    own += [groups[0]] * (per - real)  # padding, masked out of the metrics
    return own, real


@torch.no_grad()
def evaluate(model: Any, groups: Sequence[TokenizedGroup], *, beta: float,
             length_normalise: bool = False, batch_size: int = 8, pad_token_id: int = 0,
             share_prefix: bool = True, autocast_dtype: torch.dtype | None = None) -> dict[str, float]:
    """Preference metrics of ``model`` on ``groups`` (module docstring lists them).

    Reward metrics are computed when the groups carry ``ref_logps``; likelihood metrics always.
    Under ``accelerate``/``torchrun`` every process scores a share and the means are reduced.

    Args:
        model (Any): a causal LM (plain or wrapped by accelerate) on its device.
        groups (Sequence[TokenizedGroup]): the groups to score.
        beta (float): implicit reward scale.
        length_normalise (bool): divide log-ratios by the token count.
        batch_size (int): groups per forward pass.
        pad_token_id (int): padding id.
        share_prefix (bool): compute each prompt once per group.
        autocast_dtype (torch.dtype | None): autocast dtype of the forward passes.

    Returns:
        dict[str, float]: metric means and ``groups`` (how many were scored); empty when
        ``groups`` is empty.
    """
    if not groups:
        return {}
    with_ref = all(g.ref_logps is not None for g in groups)
    own, real = own_share(groups, batch_size)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums = MetricSums()
    for start in range(0, len(own), batch_size):
        batch = collate_groups(own[start:start + batch_size], pad_token_id).to(device)
        keep = torch.arange(start, start + len(batch.group_ids), device=device) < real
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logps = group_logps(model, batch, share_prefix=share_prefix).float()  # (B, K)
        sums.add(likelihood_metrics(logps, batch), keep)
        if with_ref:
            sums.add(reward_metrics(logps, batch, beta, length_normalise), keep)
    model.train(was_training)
    names = ["logp_pair_accuracy", "logp_margin"]
    if with_ref:
        names += ["pair_accuracy", "margin", "reward_best", "reward_worst", "kl"]
    out = sums.means(names)
    out["groups"] = float(len(groups))
    return out


