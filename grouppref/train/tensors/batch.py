"""A tokenised group and the tensor batch of B groups the training step consumes, and
:func:`collate_groups` between them (torch only: no config models, so the step's math modules,
:mod:`grouppref.train.tensors.logps` and :mod:`grouppref.train.objective.losses`, import without
pydantic, e.g. in a bare GPU benchmark).

Padding: prompts are LEFT-padded, so every prompt ends at column P − 1 and the logit that
predicts a group's first response token sits in the same column for all groups; responses
are RIGHT-padded. :func:`grouppref.train.tensors.logps.group_logps` relies on both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grouppref.errors import ConfigError

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
        moved: dict[str, Any] = {k: v.to(device) if isinstance(v, Tensor) else v
                                 for k, v in vars(self).items()}
        return GroupBatch(**moved)


@dataclass
class TokenizedGroup:
    """One :class:`ValidatedGroup` tokenised. Lists are indexed by candidate (K of them).

    ``p_ij[i][j]`` is P(i ≻ j) (0.5 on the diagonal and for pairs without a preference),
    ``w_ij`` the symmetric confidence (0 where no pair), ``order`` the consensus best first
    (ties broken by strength), ``labels`` and ``strengths`` the listwise losses' targets
    (:func:`list_targets`; empty when not built from a :class:`ValidatedGroup`).
    ``ref_logps`` is filled by the trainer after a reference pass.
    """

    group_id: str
    prompt_ids: list[int]
    cand_ids: list[list[int]]
    p_ij: list[list[float]]
    w_ij: list[list[float]]
    order: list[int]
    ref_logps: list[float] | None
    behavior_logps: list[float | None]
    split: str | None
    candidate_ids: list[str] = field(default_factory=list)
    num_truncated: int = 0  # responses cut to max_response_length
    dropped: dict[str, str] = field(default_factory=dict)  # candidate id -> reason (overflow)
    kinds: tuple[str, ...] = ()  # annotator kinds of the consensus (label source, train/settings/mix.py)
    labels: list[float] = field(default_factory=list)  # ψ: consensus tiers below (LiPO)
    strengths: list[float] = field(default_factory=list)  # aggregated log-strengths (NCA)


def _pad(rows: list[list[int]], width: int, value: int, left: bool) -> list[list[int]]:
    return [[value] * (width - len(r)) + r if left else r + [value] * (width - len(r)) for r in rows]


def _ref_logps(groups: list[TokenizedGroup], k: int) -> Tensor | None:
    missing = [g.group_id for g in groups if g.ref_logps is None]
    if len(missing) == len(groups):
        return None
    if missing:
        raise ConfigError(f"reference log-probs missing for groups {missing[:5]} "
                          f"({len(missing)} of {len(groups)}); compute them for every group")
    return torch.tensor([list(g.ref_logps or []) + [0.0] * (k - len(g.cand_ids)) for g in groups])


def _per_candidate(groups: list[TokenizedGroup], name: str, k: int) -> Tensor | None:
    """A (B, K) tensor of one per-candidate list (0 in padding), None unless every group has it."""
    rows = [getattr(g, name) for g in groups]
    if any(len(r) != len(g.cand_ids) for r, g in zip(rows, groups, strict=True)):
        return None
    return torch.tensor([list(r) + [0.0] * (k - len(r)) for r in rows], dtype=torch.float32)


def collate_groups(groups: list[TokenizedGroup], pad_token_id: int) -> GroupBatch:
    """Pad a list of tokenised groups into one :class:`GroupBatch`.

    Args:
        groups (list[TokenizedGroup]): at least one group.
        pad_token_id (int): id written into padding (masked out everywhere).

    Returns:
        GroupBatch: prompts left-padded, responses right-padded, candidate slots padded to
        the largest K (``valid`` false, ``p_ij`` 0.5, ``w_ij`` 0, ``behavior_logps`` NaN,
        ``labels`` and ``strengths`` 0; each None unless every group carries it).

    Raises:
        ValueError: ``groups`` is empty. ConfigError: only some groups carry ``ref_logps``.
    """
    if not groups:
        raise ValueError("collate_groups needs at least one group")
    b = len(groups)
    k = max(len(g.cand_ids) for g in groups)
    p_len = max(len(g.prompt_ids) for g in groups)
    t_len = max(len(c) for g in groups for c in g.cand_ids)
    prompts = [g.prompt_ids for g in groups]
    cands = [_pad(list(g.cand_ids) + [[]] * (k - len(g.cand_ids)), t_len, pad_token_id, False)
             for g in groups]
    cand_mask = [[[1] * len(c) + [0] * (t_len - len(c)) for c in list(g.cand_ids)
                  + [[]] * (k - len(g.cand_ids))] for g in groups]
    p_ij = torch.full((b, k, k), 0.5)
    w_ij = torch.zeros(b, k, k)
    valid = torch.zeros(b, k, dtype=torch.bool)
    behavior = torch.full((b, k), float("nan"))
    order = torch.zeros(b, k, dtype=torch.long)
    for i, g in enumerate(groups):
        n = len(g.cand_ids)
        p_ij[i, :n, :n] = torch.tensor(g.p_ij)
        w_ij[i, :n, :n] = torch.tensor(g.w_ij)
        valid[i, :n] = True
        behavior[i, :n] = torch.tensor([float("nan") if x is None else x for x in g.behavior_logps])
        order[i] = torch.tensor(list(g.order) + list(range(n, k)))
    return GroupBatch(
        prompt_ids=torch.tensor(_pad(prompts, p_len, pad_token_id, True)),
        prompt_mask=torch.tensor(_pad([[1] * len(p) for p in prompts], p_len, 0, True)),
        cand_ids=torch.tensor(cands), cand_mask=torch.tensor(cand_mask), valid=valid,
        p_ij=p_ij, w_ij=w_ij, order=order, ref_logps=_ref_logps(groups, k),
        behavior_logps=behavior,
        num_tokens=torch.tensor([[len(c) for c in g.cand_ids] + [0] * (k - len(g.cand_ids))
                                 for g in groups]),
        group_ids=[g.group_id for g in groups],
        candidate_ids=[list(g.candidate_ids) for g in groups],
        labels=_per_candidate(groups, "labels", k), strengths=_per_candidate(groups, "strengths", k))
