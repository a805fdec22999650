"""Only the candidates a loss reads: ``dpo`` trains on the consensus best and worst of a group,
``sft`` on its best, so the trainer forwards those alone (at K = 8, 4x and 8x less compute per
group than forwarding the whole group, for the same loss and gradients). The other losses read
every candidate. Held-out groups are not trimmed: their metrics compare every pair.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from grouppref.train.objective.dispatch import loss_candidates
from grouppref.train.settings.losses import TRIMMED_LOSSES
from grouppref.train.tensors.batch import TokenizedGroup

T = TypeVar("T")


def trim_for_loss(group: TokenizedGroup, loss: str) -> TokenizedGroup:
    """``group`` reduced to :func:`loss_candidates` (unchanged for the losses that read all):
    pair matrices and per-candidate lists are sub-selected, the order becomes ``0..n-1``."""
    if loss not in TRIMMED_LOSSES:
        return group
    keep = loss_candidates(list(group.order), loss)

    def pick(values: list[T]) -> list[T]:
        return [values[i] for i in keep] if values else values

    return dataclasses.replace(
        group, cand_ids=pick(group.cand_ids),
        p_ij=[[group.p_ij[i][j] for j in keep] for i in keep],
        w_ij=[[group.w_ij[i][j] for j in keep] for i in keep],
        order=list(range(len(keep))),
        ref_logps=None if group.ref_logps is None else pick(group.ref_logps),
        behavior_logps=pick(group.behavior_logps), candidate_ids=pick(group.candidate_ids),
        labels=pick(group.labels), strengths=pick(group.strengths))
