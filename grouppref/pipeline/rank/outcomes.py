"""The outcome of scoring one group, shared by the rankers and the rank stage: scores, a
:class:`Judged` result with the judge's notes, or a :class:`Skip`; the error that skips a
group; and how a ranker turns a flat list of scores back into per-group outcomes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grouppref.errors import GroupPrefError


class RankerInputError(GroupPrefError):
    """A ranker cannot score one group (too long, no reference): that group is skipped."""


@dataclass(frozen=True)
class Skip:
    """A group a ranker did not score, and why."""

    reason: str


@dataclass(frozen=True)
class Judged:
    """Scores of a group's candidates (group order) with what the judge said beyond them (a
    served rubric judge's rating and rationale per candidate), kept in the ranking's metadata."""

    scores: list[float]
    metadata: dict[str, str | int | float | bool]


Outcome = list[float] | Judged | Skip


def finite_scores(scores: list[float]) -> list[float]:
    """``scores`` when every one is finite.

    Raises:
        RankerInputError: a NaN or infinite score (the group is skipped)."""
    if not all(math.isfinite(x) for x in scores):
        raise RankerInputError(f"non-finite scores {scores}")
    return scores


def slot_outcomes(slots: list[Any], scores_of: Callable[[int, int], list[float]]
                  ) -> list[Outcome]:
    """Per group, ``scores_of(offset, count)`` for a slot ``(offset, count)`` of a flat batch,
    or the slot itself when it is a :class:`Skip` (or a Skip when a score is not finite)."""
    out: list[Outcome] = []
    for slot in slots:
        if isinstance(slot, Skip):
            out.append(slot)
            continue
        try:
            out.append(finite_scores(scores_of(*slot)))
        except RankerInputError as e:
            out.append(Skip(str(e)))
    return out


def collect_outcomes(slots: list[Any], values: list[float]) -> list[Outcome]:
    """Per group, its scores ``values[offset : offset + count]`` for a slot ``(offset, count)``,
    or the slot itself when it is a :class:`Skip` (or a Skip when a score is not finite)."""
    return slot_outcomes(slots, lambda offset, count: values[offset : offset + count])
