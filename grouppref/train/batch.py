"""The tensor batch of B groups the training step consumes (torch only: no config models, so
the step's math modules, :mod:`grouppref.train.logps` and :mod:`grouppref.train.losses`, import
without pydantic, e.g. in a bare GPU benchmark)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

Tensor = torch.Tensor


@dataclass
class GroupBatch:
    """B groups as tensors; K = most candidates in the batch, P prompt and T response columns."""

    prompt_ids: Tensor  # (B, P) long, left-padded
    prompt_mask: Tensor  # (B, P) long, 1 on real tokens
    cand_ids: Tensor  # (B, K, T) long, right-padded
    cand_mask: Tensor  # (B, K, T) long, 1 on real tokens
    valid: Tensor  # (B, K) bool, real candidates
    p_ij: Tensor  # (B, K, K) float
    w_ij: Tensor  # (B, K, K) float
    order: Tensor  # (B, K) long, valid candidates first, best first
    ref_logps: Tensor | None  # (B, K) float, 0 for invalid
    behavior_logps: Tensor  # (B, K) float, NaN where unknown
    num_tokens: Tensor  # (B, K) long, 0 for invalid
    group_ids: list[str]
    candidate_ids: list[list[str]] = field(default_factory=list)
    # (B, K) float, graded labels ψ: consensus tiers below each candidate (LiPO), 0 for
    # invalid; None when a group lacks them (groups not built by tokenize_group)
    labels: Tensor | None = None
    # (B, K) float, aggregated Bradley-Terry log-strengths (NCA / InfoNCA targets), 0 for invalid
    strengths: Tensor | None = None

    def to(self, device: torch.device | str) -> GroupBatch:
        """The batch with every tensor moved to ``device``."""
        moved = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in vars(self).items()}
        return GroupBatch(**moved)
