"""Rows in grouppref's own group form (``group_id``, ``prompt``, ``candidates``, ``rankings``)
read piece by piece, salvaging what is valid: the aggregate stage's input, and the ``groups``
import layout.

The group itself (prompt, candidates) must be valid or the row is rejected; each ranking is
checked on its own (schema, group id, tiers naming only the group's candidates, at least two
of them: a partial ranking is valid; score keys) and a bad one becomes a part-reject naming
``rankings[i]``. Duplicate entries of one annotator for one group: an exact copy is left out
(part-reject), differing copies are all left out (they conflict). A group id seen again in a
later row (:class:`GroupRows`): with the same contents its new rankings are merged into the
first row and the later row is rejected as merged; with other contents the later row is
rejected as conflicting.

Rows may be stored records (dict fields as JSON text, as :func:`~grouppref.schemas.to_row`
writes them) or plain JSON (dict fields as objects).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from grouppref.errors import RowError
from grouppref.schemas import AnnotatedGroup, CandidateGroup, Ranking, Reject, check_tiers, from_row


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """``(reason naming the location, top-level field)`` of pydantic's first error."""
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    return (f"{msg} (in {loc})" if loc else msg), (loc.split(".")[0] or None)


def check_ranking(raw: Any, group: CandidateGroup) -> Ranking:
    """One stored ranking, validated against its group; ``ValueError`` says what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected a ranking object, got {type(raw).__name__}")
    ranking = from_row(Ranking, raw)
    if ranking.group_id != group.group_id:
        raise ValueError(f"ranking by {ranking.annotator.id!r} is for group "
                         f"{ranking.group_id!r}, not {group.group_id!r}")
    ids = group.candidate_ids()
    check_tiers(ranking.tiers, ids, complete=False)  # a partial ranking is valid
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


def parse_group_row(row: dict[str, Any], number: int, source: str, stage: str
                    ) -> tuple[AnnotatedGroup, list[Reject]]:
    """One row as a valid AnnotatedGroup plus part-rejects for the rankings left out.

    Raises:
        RowError: the group itself (prompt, candidates) is invalid.
    """
    group_fields = {k: v for k, v in row.items() if k in CandidateGroup.model_fields}
    gid = row.get("group_id") if isinstance(row.get("group_id"), str) else None
    try:
        group = from_row(CandidateGroup, group_fields)
    except ValidationError as e:
        reason, loc = validation_message(e)
        raise RowError(reason, field=loc, source=source, row=number, group_id=gid) from e
    except (TypeError, ValueError) as e:  # a field that does not decode (e.g. bad JSON)
        raise RowError(f"cannot decode the group: {e}", source=source, row=number,
                       group_id=gid) from e
    rejects: list[Reject] = []

    def part(i: int, reason: str) -> None:
        rejects.append(Reject(stage=stage, reason=reason, source=source, row=number,
                              group_id=group.group_id, field=f"rankings[{i}]", scope="part"))

    raw_rankings = row.get("rankings") or []
    if not isinstance(raw_rankings, list):
        raise RowError(f"rankings must be a list, got {type(raw_rankings).__name__}",
                       field="rankings", source=source, row=number, group_id=gid)
    valid: list[tuple[int, Ranking]] = []
    for i, raw in enumerate(raw_rankings):
        try:
            valid.append((i, check_ranking(raw, group)))
        except ValidationError as e:
            part(i, validation_message(e)[0])
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


@dataclass
class GroupRows:
    """Groups collected row by row: a group id read again is merged or rejected (see the
    module docstring); ``groups[i]`` came from row ``rows[i]``."""

    source: str
    stage: str
    groups: list[AnnotatedGroup] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    where: dict[str, int] = field(default_factory=dict)

    def add(self, row: dict[str, Any], number: int) -> None:
        """Parse one row; its problems become rejects."""
        try:
            group, rejects = parse_group_row(row, number, self.source, self.stage)
        except RowError as err:
            self.rejects.append(Reject(stage=self.stage, reason=err.reason, source=self.source,
                                       row=number, group_id=err.group_id, field=err.field))
            return
        self.add_group(group, number, rejects)

    def add_group(self, group: AnnotatedGroup, number: int, rejects: list[Reject] | None = None
                  ) -> None:
        """Collect one valid group read from row ``number`` (``rejects``: the part-rejects
        made reading it); a group id seen before is merged or rejected."""
        self.rejects.extend(rejects or [])
        if group.group_id not in self.where:
            self.where[group.group_id] = len(self.groups)
            self.groups.append(group)
            self.rows.append(number)
            return
        at = self.where[group.group_id]
        first = self.groups[at]
        if first.model_dump(exclude={"rankings"}) != group.model_dump(exclude={"rankings"}):
            self.rejects.append(Reject(
                stage=self.stage, source=self.source, row=number, group_id=group.group_id,
                field="group_id", reason=f"group id already read in row {self.rows[at]} with a "
                "different prompt or candidates (conflicting group contents); give each group "
                "one id"))
            return
        self.groups[at], rejects = _merge(first, group, number, self.rows[at], self.source,
                                          self.stage)
        self.rejects.extend(rejects)
