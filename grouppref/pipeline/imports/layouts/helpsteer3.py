"""Layout ``helpsteer3``: nvidia/HelpSteer3 (its ``preference`` subset), one pair per row.

The published schema: ``domain`` (general, stem, code, multilingual), ``language``,
``context`` (the conversation so far: a list of ``{role, content}``, user and assistant
turns, the last one the user's), ``response1``, ``response2``, ``overall_preference`` (-3..3:
-3 response 1 is much better, -1 slightly better, 0 about the same, 3 response 2 is much
better) and ``individual_preference``, a list of ``{score, reasoning, feedback1, feedback2}``,
one per annotator, ``score`` on the same scale.

Each annotator's score is one two-candidate ranking (annotator id ``helpsteer3#1``,
``helpsteer3#2``, ... by position in the row, kind ``human``), so agreement and reliability
see the separate judgements; a score of 0 is a tie. The score and the reasoning are kept in
the ranking's ``metadata``. ``overall_preference`` is the dataset's aggregate of those
scores, so it is not a vote of its own beside them; it becomes the ranking (annotator id
``helpsteer3``) only in a row with no usable individual score. Rows with the same context
join one group (the second row's annotators are ``helpsteer3#1#2``, ...). ``domain`` and
``language`` join the prompt's metadata (``--lang`` keeps some languages).

Example row (shortened)::

    {"domain": "general", "language": "english",
     "context": [{"role": "user", "content": "Name a prime."}],
     "response1": "7", "response2": "9", "overall_preference": -2,
     "individual_preference": [{"score": -2, "reasoning": "@Response 1 is correct."},
                               {"score": -3, "reasoning": "9 is not prime."}]}
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from grouppref.pipeline.imports.layouts.build import read_groups
from grouppref.pipeline.imports.layouts.raw_groups import (
    Context,
    Grouper,
    Imported,
    RawGroup,
    Response,
    Vote,
)
from grouppref.pipeline.imports.layouts.transcript import as_turns, not_turns
from grouppref.readers.rows import Row, maybe_json
from grouppref.schemas import Reject

DEFAULTS: dict[str, Any] = {"kind": "human"}
RESPONSES = ("response1", "response2")


def _score(value: Any) -> float | None:
    """A preference score -3..3 as a float, ``None`` when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if -3 <= value <= 3 else None


def _context(row: dict[str, Any], number: int, ctx: Context) -> list[dict[str, str]]:
    given = maybe_json(row.get("context"))
    turns = as_turns(given)
    if turns is None:
        raise ctx.fail(f"context must be a list of {{role, content}} turns, got "
                       f"{not_turns(given)}", number, "context")
    if turns[-1]["role"] != "user":
        raise ctx.fail(f"context must end with a user turn, ends with {turns[-1]['role']!r}",
                       number, "context")
    return turns


def _individual(row: dict[str, Any], number: int, ctx: Context,
                rejects: list[Reject]) -> list[tuple[int, float, dict[str, Any]]]:
    """``(position, score, entry)`` of each usable individual preference; the others are
    part-rejects."""
    items = maybe_json(row.get("individual_preference"))
    if items is None:
        return []
    if not isinstance(items, list):
        rejects.append(ctx.reject(f"individual_preference must be a list of {{score, "
                                  f"reasoning}}, got {type(items).__name__}; not read",
                                  number, "individual_preference"))
        return []
    out = []
    for i, item in enumerate(items):
        score = _score(item.get("score")) if isinstance(item, dict) else None
        if score is None:
            got = item.get("score") if isinstance(item, dict) else item
            rejects.append(ctx.reject(f"an individual preference needs a score from -3 to 3, "
                                      f"got {got!r}; left out", number,
                                      f"individual_preference[{i}].score"))
            continue
        out.append((i + 1, score, item))
    return out


def _vote(group: RawGroup, base: str, score: float, first: int, number: int,
          notes: dict[str, Any]) -> None:
    """``score`` (negative: response 1 is better) as a two-candidate vote."""
    group.votes.append(Vote(annotator=group.next_annotator(base), row=number,
                            scores={first: -score, first + 1: score}, notes=notes))


def _row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
         rejects: list[Reject]) -> None:
    for column in RESPONSES:
        if not isinstance(row.get(column), str):
            what = "missing" if column not in row else f"a {type(row[column]).__name__}"
            raise ctx.fail(f"{column} must be the response text, got {what}", number, column)
    ctx.keep_language(row, number, "language")
    turns = _context(row, number, ctx)
    scores = _individual(row, number, ctx, rejects)
    overall = _score(row.get("overall_preference"))
    if not scores and overall is None:
        raise ctx.fail(f"no preference: overall_preference must be from -3 to 3 (got "
                       f"{row.get('overall_preference')!r}) when individual_preference has no "
                       "score", number, "overall_preference")
    group = grouper.group(ctx.prompt(row, number, messages=turns, extra=("domain", "language")),
                          number)
    group.repeats_expected = True  # a response may recur in another row of the same context
    first = len(group.responses)
    group.responses += [Response(row[c], None, number, c) for c in RESPONSES]
    for position, score, item in scores:
        notes: dict[str, Any] = {"score": score}
        if isinstance(item.get("reasoning"), str):
            notes["reasoning"] = item["reasoning"]
        _vote(group, f"{ctx.annotator}#{position}", score, first, number, notes)
    if not scores:
        _vote(group, ctx.annotator, overall or 0.0, first, number,
              {"overall_preference": overall or 0.0})


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> one group per context with one ranking per annotator's score, and rejects."""
    return read_groups(rows, ctx, _row, merge=True)
