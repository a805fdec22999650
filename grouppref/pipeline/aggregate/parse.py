"""The aggregate stage's input collected into :class:`ParsedInput`, and its rankings encoded
as tensors. ``inputs == groups + row rejects``.

Typed groups (a stage of the run, a refresh round) are collected by :func:`collect_groups`;
raw rows (a published or hand-edited dataset) by :func:`parse_rows`, which salvages what is
valid (:mod:`grouppref.readers.groups`: a bad ranking is a part-reject, the group is kept; a
partial ranking is valid).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from grouppref.pipeline.aggregate.config import (
    SELECTION_KEY,
    TARGETED_SELECTIONS,
    UNIFORM_SELECTIONS,
)
from grouppref.readers.groups import GroupRows
from grouppref.schemas import AnnotatedGroup, Reject
from grouppref.schemas.records import AnnotatorKind
from grouppref.stats.reliability import TARGETED, UNIFORM, UNMARKED


@dataclass(frozen=True)
class Encoded:
    """The rankings as tensors (:func:`encode_rankings`, :func:`encode_design`), when the
    reader made them itself (:mod:`grouppref.pipeline.aggregate.stored`)."""

    ranks: torch.Tensor  # (B, A, K)
    ann: torch.Tensor  # (B, A)
    valid: torch.Tensor  # (B, K)
    design: torch.Tensor  # (B, A)
    marked: dict[str, int]  # selection marker -> groups with a ranking so marked


@dataclass
class ParsedInput:
    """Valid groups (with their 1-based input row numbers), rejects, and the annotators seen;
    ``encoded``: the rankings already encoded (else :func:`encode_rankings` reads ``groups``)."""

    source: str
    inputs: int = 0
    groups: Sequence[AnnotatedGroup] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    annotators: list[str] = field(default_factory=list)
    kinds: list[AnnotatorKind] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    encoded: Encoded | None = None

    def groups_marked(self, value: str) -> int:
        """How many groups have a ranking with ``metadata["selection"] == value``."""
        if self.encoded is not None:
            return self.encoded.marked.get(value, 0)
        return sum(any((r.metadata or {}).get(SELECTION_KEY) == value for r in g.rankings)
                   for g in self.groups)


def parse_rows(rows: Sequence[dict[str, Any]], source: str, stage: str) -> ParsedInput:
    """Every row parsed (:class:`~grouppref.readers.groups.GroupRows`: bad rankings left out
    as part-rejects, a repeated group merged or rejected); annotators indexed in order of
    appearance. For rows nobody validated: an imported or hand-edited dataset."""
    collected = GroupRows(source=source, stage=stage)
    for number, row in enumerate(rows, start=1):
        collected.add(row, number)
    return _indexed(collected, len(rows))


def collect_groups(groups: Sequence[AnnotatedGroup], source: str, stage: str) -> ParsedInput:
    """Valid groups (``groups[i]`` is input row ``i + 1``) collected as :func:`parse_rows`
    collects rows: a repeated group id is merged or rejected, nothing else can fail (a valid
    ``AnnotatedGroup`` passes every check a row gets)."""
    collected = GroupRows(source=source, stage=stage)
    for number, group in enumerate(groups, start=1):
        collected.add_group(group, number)
    return _indexed(collected, len(groups))


def _indexed(collected: GroupRows, inputs: int) -> ParsedInput:
    """The collected groups with their annotators indexed in order of appearance."""
    out = ParsedInput(source=collected.source, inputs=inputs, groups=collected.groups,
                      rows=collected.rows, rejects=collected.rejects)
    for group in out.groups:
        for r in group.rankings:
            if r.annotator.id not in out.index:
                out.index[r.annotator.id] = len(out.annotators)
                out.annotators.append(r.annotator.id)
                out.kinds.append(r.annotator.kind)
    return out


def encode_rankings(parsed: ParsedInput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tensors of all rankings: ``ranks`` (B, A, K) tier index of each candidate (-1: padding,
    or a candidate a partial ranking leaves out),
    ``ann`` (B, A) annotator index of each slot (-1: padding) and ``valid`` (B, K) bool, the
    real candidates (a group without rankings still has them)."""
    if parsed.encoded is not None:
        return parsed.encoded.ranks, parsed.encoded.ann, parsed.encoded.valid
    b = len(parsed.groups)
    k = max((g.k for g in parsed.groups), default=2)
    a = max((len(g.rankings) for g in parsed.groups), default=1) or 1
    ranks = np.full((b, a, k), -1, dtype=np.int64)
    ann = np.full((b, a), -1, dtype=np.int64)
    valid = np.zeros((b, k), dtype=bool)
    for gi, group in enumerate(parsed.groups):
        valid[gi, : group.k] = True
        pos = {cid: i for i, cid in enumerate(group.candidate_ids())}
        for ai, r in enumerate(group.rankings):
            ann[gi, ai] = parsed.index[r.annotator.id]
            for t, tier in enumerate(r.tiers):
                for cid in tier:
                    ranks[gi, ai, pos[cid]] = t
    return torch.from_numpy(ranks), torch.from_numpy(ann), torch.from_numpy(valid)


def selection_code(marker: object) -> int:
    """A ranking's ``metadata["selection"]`` as a design code of
    :func:`~grouppref.stats.reliability.reliability_slots` (unknown values: unmarked)."""
    if marker in UNIFORM_SELECTIONS:
        return UNIFORM
    return TARGETED if marker in TARGETED_SELECTIONS else UNMARKED


def encode_design(parsed: ParsedInput) -> torch.Tensor:
    """``(B, A)`` design code of each ranking slot, in the layout of :func:`encode_rankings`
    (padding: unmarked)."""
    if parsed.encoded is not None:
        return parsed.encoded.design
    b = len(parsed.groups)
    a = max((len(g.rankings) for g in parsed.groups), default=1) or 1
    design = np.full((b, a), UNMARKED, dtype=np.int64)
    for gi, group in enumerate(parsed.groups):
        for ai, r in enumerate(group.rankings):
            design[gi, ai] = selection_code((r.metadata or {}).get(SELECTION_KEY))
    return torch.from_numpy(design)
