"""The fresh groups of the refresh rounds: the buffer that keeps them, how a batch takes its
share of them, and the importance weights they and the offline groups get (docs/train.md,
"Refresh").

* :class:`FreshBuffer` keeps the newest ``capacity`` tokenized fresh groups (reference
  log-probs filled), each tagged with the round that sampled it. Every process adds the same
  groups in the same order, so the buffer is the same on every process.
* :meth:`FreshBuffer.draw` picks a micro-batch's fresh groups uniformly without replacement
  with a generator seeded by (seed, epoch, micro-batch, process): a resumed run draws what an
  uninterrupted one drew, and each process of a distributed run draws its own.
* :func:`concat_batches` joins two padded batches into one (the offline batch from the data
  loader and the collated fresh groups); the result equals ``collate_groups`` of the union.
* :class:`RhoStats` accumulates the importance weights the loss applied, per kind of group.

Shapes: B groups, K candidate slots, P prompt columns, T response columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from grouppref.errors import ConfigError
from grouppref.models.sampling import derive_seed
from grouppref.train.engine.metric_sums import reduce_sums
from grouppref.train.objective.losses import importance_weights
from grouppref.train.tensors.batch import GroupBatch, TokenizedGroup, collate_groups

Tensor = torch.Tensor
KINDS = ("offline", "fresh_newest", "fresh_older")


@dataclass(frozen=True)
class FreshGroup:
    """A tokenized fresh group and the round that sampled it."""

    group: TokenizedGroup
    round: int


class FreshBuffer:
    """The newest ``capacity`` fresh groups, oldest first.

    Args:
        capacity (int): most groups kept (B of ``--buffer``).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[FreshGroup] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, groups: Sequence[TokenizedGroup], round_: int) -> None:
        """Append ``groups`` (sampled in round ``round_``) and drop the oldest beyond capacity."""
        self.items.extend(FreshGroup(g, round_) for g in groups)
        del self.items[:max(len(self.items) - self.capacity, 0)]

    def newest_round(self) -> int | None:
        return self.items[-1].round if self.items else None

    def draw(self, n: int, seed: int, *where: int) -> list[FreshGroup]:
        """``min(n, len(self))`` distinct groups, uniformly, from a generator seeded by
        ``(seed, *where)`` (e.g. epoch, micro-batch in the epoch, process index)."""
        n = min(n, len(self.items))
        if n <= 0:
            return []
        gen = torch.Generator().manual_seed(derive_seed(seed, "refresh-draw", *where))
        picks = torch.randperm(len(self.items), generator=gen)[:n].tolist()
        return [self.items[i] for i in picks]


def _pad_to(x: Tensor, dims: dict[int, int], value: float, left: bool = False) -> Tensor:
    """``x`` padded at the end (or, with ``left``, the start) of each dim to the given size."""
    pad: list[int] = []
    for dim in range(x.dim() - 1, -1, -1):  # F.pad lists the last dim first
        extra = dims.get(dim, x.shape[dim]) - x.shape[dim]
        pad += [extra, 0] if left else [0, extra]
    return F.pad(x, pad, value=value)


def _ref_logps(a: GroupBatch, b: GroupBatch, k: int) -> Tensor | None:
    if a.ref_logps is None and b.ref_logps is None:
        return None
    if a.ref_logps is None or b.ref_logps is None:
        raise ConfigError("concat_batches: one batch has reference log-probs and the other "
                          "not; compute them for every group")
    return torch.cat([_pad_to(a.ref_logps, {1: k}, 0.0), _pad_to(b.ref_logps, {1: k}, 0.0)])


def _per_candidate(a: GroupBatch, b: GroupBatch, name: str, k: int) -> Tensor | None:
    """``labels`` / ``strengths`` of both batches, padded with 0; None unless both have them."""
    x, y = getattr(a, name), getattr(b, name)
    if x is None or y is None:
        return None
    return torch.cat([_pad_to(x, {1: k}, 0.0), _pad_to(y, {1: k}, 0.0)])


def _order(x: GroupBatch, k: int) -> Tensor:
    """The consensus order widened to ``k`` slots: padded slots follow in index order, as
    :func:`~grouppref.train.tensors.batch.collate_groups` lays them out. (B, K_x) -> (B, k)."""
    b, kx = x.order.shape
    tail = torch.arange(kx, k, device=x.order.device).expand(b, k - kx)
    return torch.cat([x.order, tail], dim=1)


def concat_batches(a: GroupBatch, b: GroupBatch, pad_token_id: int) -> GroupBatch:
    """One batch holding the groups of ``a`` then those of ``b`` (``b`` moved to ``a``'s device).

    Prompts are left-padded to the wider P, responses right-padded to the longer T, candidate
    slots padded to the larger K (``valid`` false, ``p_ij`` ½, ``w_ij`` 0, ``behavior_logps``
    NaN, ``ref_logps`` and ``num_tokens`` 0): the same tensors as ``collate_groups`` of the
    groups of both.

    Raises:
        ConfigError: only one of the batches carries reference log-probs.
    """
    b = b.to(a.prompt_ids.device)
    k = max(a.valid.shape[1], b.valid.shape[1])
    p = max(a.prompt_ids.shape[1], b.prompt_ids.shape[1])
    t = max(a.cand_ids.shape[2], b.cand_ids.shape[2])

    def both(name: str, dims: dict[int, int], value: float, left: bool = False) -> Tensor:
        return torch.cat([_pad_to(getattr(x, name), dims, value, left) for x in (a, b)])

    return GroupBatch(
        prompt_ids=both("prompt_ids", {1: p}, pad_token_id, left=True),
        prompt_mask=both("prompt_mask", {1: p}, 0, left=True),
        cand_ids=both("cand_ids", {1: k, 2: t}, pad_token_id),
        cand_mask=both("cand_mask", {1: k, 2: t}, 0),
        valid=both("valid", {1: k}, False),
        p_ij=both("p_ij", {1: k, 2: k}, 0.5), w_ij=both("w_ij", {1: k, 2: k}, 0.0),
        order=torch.cat([_order(a, k), _order(b, k)]),
        ref_logps=_ref_logps(a, b, k),
        behavior_logps=both("behavior_logps", {1: k}, math.nan),
        num_tokens=both("num_tokens", {1: k}, 0),
        group_ids=[*a.group_ids, *b.group_ids],
        candidate_ids=[*a.candidate_ids, *b.candidate_ids],
        labels=_per_candidate(a, b, "labels", k), strengths=_per_candidate(a, b, "strengths", k))


def mix_batch(offline: GroupBatch, fresh: Sequence[TokenizedGroup], pad_token_id: int,
              fresh_only: bool) -> GroupBatch:
    """The micro-batch to train on: the offline groups followed by the fresh ones, or (with
    ``fresh_only`` and some fresh groups) the fresh ones alone."""
    if not fresh:
        return offline
    batch = collate_groups(list(fresh), pad_token_id)
    if fresh_only:
        return batch.to(offline.prompt_ids.device)
    return concat_batches(offline, batch, pad_token_id)


@dataclass
class RhoStats:
    """Importance weights applied since the last :meth:`take`, per kind of group (offline,
    fresh from the newest round, fresh from older rounds): candidates with a known behaviour
    log-prob, the sum of their (clipped) weights and how many were clipped."""

    clip: tuple[float, float]
    sums: dict[str, list[float]] = field(default_factory=dict)

    def add(self, policy_logps: Tensor, batch: GroupBatch, kinds: Sequence[str]) -> None:
        """Count one micro-batch; ``kinds[i]`` is the kind of group ``i`` (one of ``KINDS``).

        ``rho = clip(exp((log pi - log pi_b) / n))`` as the loss applies it
        (:func:`~grouppref.train.objective.losses.importance_weights`); clipped = the unclipped ratio
        lies outside the clip range.
        """
        low, high = self.clip
        rho = importance_weights(policy_logps, batch.behavior_logps, batch.num_tokens,
                                 clip=self.clip)  # (B, K)
        n = batch.num_tokens.clamp(min=1).to(rho.dtype)
        raw = ((policy_logps.detach().float() - batch.behavior_logps) / n).exp()  # (B, K)
        known = batch.valid & ~torch.isnan(batch.behavior_logps)  # (B, K)
        clipped = known & ((raw < low) | (raw > high))
        for kind in set(kinds):
            rows = torch.tensor([k == kind for k in kinds], device=rho.device)[:, None] & known
            acc = self.sums.setdefault(kind, [0.0, 0.0, 0.0])
            acc[0] += float(rows.sum())
            acc[1] += float(rho[rows].sum())
            acc[2] += float((clipped & rows).sum())

    def take(self) -> dict[str, dict[str, float]]:
        """Per kind: ``candidates``, ``mean`` weight and share ``clipped``, summed over
        processes (a collective: every process calls it); then starts afresh."""
        flat = reduce_sums([x for kind in KINDS for x in self.sums.get(kind, [0.0] * 3)])
        self.sums = {}
        out = {}
        for i, kind in enumerate(KINDS):
            count, total, clipped = flat[3 * i:3 * i + 3]
            if count:
                out[kind] = {"candidates": count, "mean": total / count,
                             "clipped": clipped / count}
        return out
