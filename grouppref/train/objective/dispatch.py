"""One dispatch from a loss name to its function over rewards ``s``: the policy step
(:func:`grouppref.train.policy.step.group_loss`, s the implicit rewards) and the reward-model trainer
(:func:`grouppref.train.reward_model.model.reward_loss`, s the reward scores) both call
:func:`score_loss`, so every loss reads its targets from a :class:`GroupBatch` the same way.

Shapes: B groups, K candidates (see :mod:`grouppref.train.objective.losses`).
"""

from __future__ import annotations

import torch

from grouppref.errors import ConfigError
from grouppref.train.objective.listwise import infonca_loss, lipo_lambda_loss, nca_loss, soft_targets
from grouppref.train.objective.losses import dpo_loss, gspo_loss, hard_pair_targets, plackett_luce_loss
from grouppref.train.tensors.batch import GroupBatch

Tensor = torch.Tensor

SCORE_LOSSES = ("gspo", "plackett_luce", "dpo", "lipo", "nca", "infonca")
MARGIN_LOSSES = ("gspo", "dpo", "lipo")  # the losses with a winner-minus-loser margin (γ)
TARGET_LOSSES = ("nca", "infonca")  # the losses with soft targets softmax(r/α)


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
