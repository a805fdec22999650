"""Reading the aggregate stage's input row by row, salvaging what is valid.

Stored rows are re-validated one piece at a time so that one bad ranking does not cost the
group: the group itself (prompt, candidates) must be valid or the row is rejected; each
ranking is checked on its own (schema, group id, tiers covering the candidates, score keys)
and a bad one becomes a part-reject naming ``rankings[i]``. Duplicate entries of one annotator
for one group: an exact copy is left out (part-reject), differing copies are all left out
(they conflict). A group id seen again in a later row: with the same contents its new
rankings are merged into the first row and the later row is rejected as merged; with other
contents the later row is rejected as conflicting. ``inputs == groups + row rejects``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from grouppref.errors import RowError
from grouppref.schemas import AnnotatedGroup, CandidateGroup, Ranking, Reject, check_tiers, from_row


@dataclass
class ParsedInput:
    """Valid groups (with their 1-based input row numbers), rejects, and the annotators seen."""

    source: str
    inputs: int = 0
    groups: list[AnnotatedGroup] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    annotators: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)


def _validation_reason(e: ValidationError) -> tuple[str, str | None]:
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    return (f"{first['msg']} (in {loc})" if loc else first["msg"]), (loc.split(".")[0] or None)


def _check_ranking(raw: Any, group: CandidateGroup) -> Ranking:
    """One stored ranking, validated against its group; ``ValueError`` says what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected a ranking object, got {type(raw).__name__}")
    ranking = from_row(Ranking, raw)
    if ranking.group_id != group.group_id:
        raise ValueError(f"ranking by {ranking.annotator.id!r} is for group "
                         f"{ranking.group_id!r}, not {group.group_id!r}")
    ids = group.candidate_ids()
    check_tiers(ranking.tiers, ids)
    if ranking.scores is not None and set(ranking.scores) - set(ids):
        raise ValueError(f"scores name unknown candidates {sorted(set(ranking.scores) - set(ids))}")
    return ranking


def _dedupe(rankings: list[tuple[int, Ranking]], part: Any) -> list[Ranking]:
    """Keep one ranking per annotator; copies and conflicting entries become part-rejects."""
    by_annotator: dict[str, list[tuple[int, Ranking]]] = {}
    for i, r in rankings:
        by_annotator.setdefault(r.annotator.id, []).append((i, r))
    kept: list[Ranking] = []
    for aid, entries in by_annotator.items():
        if len(entries) == 1:
            kept.append(entries[0][1])
            continue
        if all(r.tiers == entries[0][1].tiers for _, r in entries):
            kept.append(entries[0][1])
            for i, _ in entries[1:]:
                part(i, f"duplicate entry of annotator {aid!r} (same ranking) left out")
        else:
            for i, _ in entries:
                part(i, f"annotator {aid!r} ranks this group {len(entries)} times with different "
                     "tiers; all its entries left out (keep one per annotator)")
    return kept


def parse_row(row: dict[str, Any], number: int, source: str, stage: str
              ) -> tuple[AnnotatedGroup, list[Reject]]:
    """One input row as a valid AnnotatedGroup plus part-rejects for the rankings left out.

    Raises:
        RowError: the group itself (prompt, candidates) is invalid.
    """
    group_fields = {k: v for k, v in row.items() if k in CandidateGroup.model_fields}
    gid = row.get("group_id") if isinstance(row.get("group_id"), str) else None
    try:
        group = from_row(CandidateGroup, group_fields)
    except ValidationError as e:
        reason, loc = _validation_reason(e)
        raise RowError(reason, field=loc, source=source, row=number, group_id=gid) from e
    except (TypeError, ValueError) as e:  # a field that does not decode (e.g. bad JSON)
        raise RowError(f"cannot decode the group: {e}", source=source, row=number,
                       group_id=gid) from e
    rejects: list[Reject] = []

    def part(i: int, reason: str) -> None:
        rejects.append(Reject(stage=stage, reason=reason, source=source, row=number,
                              group_id=group.group_id, field=f"rankings[{i}]", scope="part"))

    valid: list[tuple[int, Ranking]] = []
    for i, raw in enumerate(row.get("rankings") or []):
        try:
            valid.append((i, _check_ranking(raw, group)))
        except ValidationError as e:
            part(i, _validation_reason(e)[0])
        except (TypeError, ValueError) as e:
            part(i, str(e))
    rankings = _dedupe(valid, part)
    # every piece was validated above (the group, each ranking against it, one per annotator)
    return AnnotatedGroup.model_construct(**dict(group), rankings=rankings), rejects


def _merge(first: AnnotatedGroup, later: AnnotatedGroup, number: int, first_row: int,
           source: str, stage: str) -> tuple[AnnotatedGroup, list[Reject]]:
    known = {r.annotator.id: r for r in first.rankings}
    new, rejects = [], []
    for i, r in enumerate(later.rankings):
        if r.annotator.id in known:
            rejects.append(Reject(stage=stage, source=source, row=number, group_id=later.group_id,
                                  field=f"rankings[{i}]", scope="part",
                                  reason=f"annotator {r.annotator.id!r} already ranks this group "
                                  f"in row {first_row}; this entry left out"))
        else:
            new.append(r)
    merged = first.model_copy(update={"rankings": [*first.rankings, *new]})
    rejects.append(Reject(stage=stage, source=source, row=number, group_id=later.group_id,
                          reason=f"same group as row {first_row}; its {len(new)} new ranking(s) "
                          "were merged into that row"))
    return merged, rejects


def parse_rows(rows: Sequence[dict[str, Any]], source: str, stage: str) -> ParsedInput:
    """Every row parsed (see the module docstring); annotators indexed in order of appearance."""
    out = ParsedInput(source=source, inputs=len(rows))
    where: dict[str, int] = {}  # group id -> index in out.groups
    for number, row in enumerate(rows, start=1):
        try:
            group, rejects = parse_row(row, number, source, stage)
        except RowError as err:
            out.rejects.append(Reject(stage=stage, reason=err.reason, source=source, row=number,
                                      group_id=err.group_id, field=err.field))
            continue
        out.rejects.extend(rejects)
        if group.group_id not in where:
            where[group.group_id] = len(out.groups)
            out.groups.append(group)
            out.rows.append(number)
            continue
        at = where[group.group_id]
        first = out.groups[at]
        if first.model_dump(exclude={"rankings"}) != group.model_dump(exclude={"rankings"}):
            out.rejects.append(Reject(
                stage=stage, source=source, row=number, group_id=group.group_id, field="group_id",
                reason=f"group id already read in row {out.rows[at]} with a different prompt or "
                "candidates (conflicting group contents); give each group one id"))
            continue
        out.groups[at], rejects = _merge(first, group, number, out.rows[at], source, stage)
        out.rejects.extend(rejects)
    for group in out.groups:
        for r in group.rankings:
            if r.annotator.id not in out.index:
                out.index[r.annotator.id] = len(out.annotators)
                out.annotators.append(r.annotator.id)
                out.kinds.append(r.annotator.kind)
    return out


def encode_rankings(parsed: ParsedInput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tensors of all rankings: ``ranks`` (B, A, K) tier index of each candidate (-1: padding),
    ``ann`` (B, A) annotator index of each slot (-1: padding) and ``valid`` (B, K) bool, the
    real candidates (a group without rankings still has them)."""
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
