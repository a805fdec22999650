"""The one dispatch from a loss name to what it computes and reads: the policy step
(:func:`grouppref.train.policy.step.group_loss`, s the implicit rewards) calls
:func:`policy_loss`, the reward-model trainer (:func:`grouppref.train.reward_model.model.reward_loss`,
s the reward scores) :func:`score_loss`, so every loss reads its targets from a
:class:`GroupBatch` the same way; :func:`loss_candidates` says which candidates a loss reads.
The names and their tables are in :mod:`grouppref.train.settings.losses` (torch-free), which
the settings validate against.

Shapes: B groups, K candidates (see :mod:`grouppref.train.objective.losses`).
"""

from __future__ import annotations

import torch

from grouppref.errors import ConfigError
from grouppref.train.objective.listwise import infonca_loss, lipo_lambda_loss, nca_loss, soft_targets
from grouppref.train.objective.losses import (
    dpo_loss,
    gspo_loss,
    hard_pair_targets,
    plackett_luce_loss,
    sft_loss,
)
from grouppref.train.settings.losses import SCORE_LOSSES, TARGET_LOSSES
from grouppref.train.tensors.batch import GroupBatch

Tensor = torch.Tensor


def _need(batch: GroupBatch, name: str, loss: str) -> Tensor:
    value = getattr(batch, name)
    if value is None:
        raise ConfigError(f"loss {loss!r} needs GroupBatch.{name}: build the groups with "
                          "tokenize_group / collate_groups from validated groups (TokenizedGroup."
                          f"{name} has one value per candidate)")
    return value.to(device=batch.valid.device)


def score_loss(loss: str, s: Tensor, batch: GroupBatch, *, pair_targets: str = "soft",
               label_smoothing: float = 0.0, robust: bool = False, target_margin: float = 0.0,
               target_temperature: float = 1.0, rho: Tensor | None = None) -> Tensor:
    """Per-group loss (B,) of ``loss`` on rewards ``s`` (B, K) and the targets of ``batch``.

    * ``gspo``: :func:`~grouppref.train.objective.losses.gspo_loss` on ``p_ij, w_ij`` (``pair_targets``
      ``"hard"``: :func:`~grouppref.train.objective.losses.hard_pair_targets` of them);
    * ``plackett_luce``: on ``order``; ``dpo``: best vs worst of ``order``;
    * ``lipo``: :func:`~grouppref.train.objective.listwise.lipo_lambda_loss` on ``labels``;
    * ``nca`` / ``infonca``: on ``q = softmax(strengths / target_temperature)``.

    ``label_smoothing`` / ``robust`` apply to gspo and dpo, ``target_margin`` to gspo, dpo and
    lipo (the settings' validation refuses other combinations; here they are ignored).

    Raises:
        ConfigError: an unknown loss, or a batch without the targets the loss reads.
    """
    valid = batch.valid
    if loss == "gspo":
        p, w = batch.p_ij, batch.w_ij
        if pair_targets == "hard":
            p, w = hard_pair_targets(p, w)
        return gspo_loss(s, p, w, valid, label_smoothing, robust=robust, rho=rho,
                         target_margin=target_margin)
    if loss == "plackett_luce":
        return plackett_luce_loss(s, batch.order, valid, rho=rho)
    if loss == "dpo":
        return dpo_loss(s, batch.order, valid, label_smoothing, robust=robust, rho=rho,
                        target_margin=target_margin)
    if loss == "lipo":
        labels = _need(batch, "labels", loss).to(s.dtype)
        return lipo_lambda_loss(s, labels, valid, target_margin=target_margin, rho=rho)
    if loss in TARGET_LOSSES:
        q = soft_targets(_need(batch, "strengths", loss).to(s.dtype), valid, target_temperature)
        return (nca_loss if loss == "nca" else infonca_loss)(s, q, valid, rho=rho)
    raise ConfigError(f"unknown loss {loss!r} over rewards; one of {', '.join(SCORE_LOSSES)}")


def policy_loss(loss: str, s: Tensor, policy_logps: Tensor, batch: GroupBatch, *,
                pair_targets: str = "soft", label_smoothing: float = 0.0, robust: bool = False,
                target_margin: float = 0.0, target_temperature: float = 1.0,
                rho: Tensor | None = None) -> Tensor:
    """Per-group loss (B,) of the policy's ``loss``: ``sft`` is
    :func:`~grouppref.train.objective.losses.sft_loss` (NLL per token of the consensus best) on
    ``policy_logps`` (B, K), unweighted by ``rho``; every other loss is :func:`score_loss` on the
    implicit rewards ``s`` (B, K).

    Raises:
        ConfigError: an unknown loss, or a batch without the targets the loss reads.
    """
    if loss == "sft":
        return sft_loss(policy_logps, batch.num_tokens, batch.order)
    return score_loss(loss, s, batch, pair_targets=pair_targets, label_smoothing=label_smoothing,
                      robust=robust, target_margin=target_margin,
                      target_temperature=target_temperature, rho=rho)


def loss_candidates(order: list[int], loss: str) -> list[int]:
    """Indices of the candidates ``loss`` reads, given the consensus ``order`` (best first):
    ``sft`` the best, ``dpo`` the best and the worst, every other loss all of them.

    Example:
        >>> loss_candidates([2, 0, 3, 1], "dpo"), loss_candidates([2, 0, 3, 1], "sft")
        ([2, 1], [2])
    """
    if loss == "sft":
        return [order[0]]
    if loss == "dpo":
        return [order[0], order[-1]]
    return list(range(len(order)))
