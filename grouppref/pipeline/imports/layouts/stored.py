"""An imported group's stored form (the row :func:`grouppref.schemas.arrow.to_row` gives for
the :class:`~grouppref.schemas.AnnotatedGroup`; the ``import`` stage writes these rows) and
what must hold to make it from plain values without the pydantic models.

Why: an import builds every group from values it made itself (hashed ids, texts it checked,
tiers it ordered), so the models' validators would only re-prove what is known, at eight model
inits and a ``model_dump`` per group, most of an import's time. :func:`sure_values` checks what
those validators check that the building does not already guarantee (exact types, id
patterns, finite numbers, one ranking per annotator) and says ``False`` when it is not sure;
the caller then builds the models as before, so a value pydantic would refuse is refused by
pydantic, with its own message. The rows themselves are made column by column
(:mod:`.table`); ``tests/integration/test_data_equivalence.py`` and
``tests/unit/pipeline/imports/test_stored_rows.py`` hold them equal to ``to_row``'s.
"""

from __future__ import annotations

import math
import re
import typing
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import TypedDict

from pydantic import TypeAdapter

from grouppref.schemas import MAX_K, MIN_K, ChatMessage, Prompt
from grouppref.schemas.records import AnnotatorKind, Scalar

KINDS = frozenset(typing.get_args(AnnotatorKind))
# printable ASCII without space: a sure match of the Id pattern (^\S+$); anything else is
# left to pydantic
PLAIN_ID = re.compile(r"[!-~]{1,256}")


class SourceRow(TypedDict):
    kind: str
    model: str | None
    params: str | None
    seed: int | None


class CandidateRow(TypedDict):
    candidate_id: str
    text: str
    source: SourceRow
    num_tokens: int | None
    behavior_logp: float | None


class AnnotatorRow(TypedDict):
    id: str
    kind: str
    name: str | None
    version: str | None


class RankingRow(TypedDict):
    annotator: AnnotatorRow
    group_id: str
    tiers: list[list[str]]
    scores: str | None
    metadata: str | None
    created_at: str


class GroupRow(TypedDict):
    """An AnnotatedGroup as stored (``to_row``): dict fields as JSON text, times as ISO text."""

    group_id: str
    prompt: dict[str, object]
    candidates: list[CandidateRow]
    rankings: list[RankingRow]


Notes = dict[str, Scalar]
# a ranking as plain values: annotator id, tiers of candidate ids, scores, notes
PlainRanking = tuple[str, list[list[str]], dict[str, float] | None, Notes | None]


@cache
def time_text(when: datetime) -> str:
    """``when`` as a record's ``created_at`` is stored (pydantic's JSON form)."""
    return str(TypeAdapter(datetime).dump_python(when, mode="json"))


_PROMPT_FIELDS = ("prompt_id", "messages", "text", "reference", "metadata")
# the prompt fields a stored row is made of by hand (:mod:`.table`); another field set (a
# schema change) sends every group through the models
PROMPT_BY_HAND = (tuple(Prompt.model_fields) == _PROMPT_FIELDS
                  and tuple(ChatMessage.model_fields) == ("role", "content"))


def _sure_scores(scores: dict[str, float] | None) -> bool:
    return scores is None or all(type(v) is float and math.isfinite(v) for v in scores.values())


def _sure_notes(notes: Notes | None) -> bool:
    if notes is None:
        return True
    for key, value in notes.items():
        kind = type(value)
        if type(key) is not str or kind not in (str, int, float, bool) or (
                kind is float and not math.isfinite(value)):  # type: ignore[arg-type]
            return False
    return True


def sure_values(candidates: Sequence[tuple[str, str, str | None]],
                rankings: Sequence[PlainRanking], kind: str) -> bool:
    """Whether the models would take a group of these candidates (``(id, text, model)``),
    rankings and annotator kind as they are (a validated prompt and the build's own ids and
    tiers besides): ``False`` where a check here cannot vouch for a value (the models then
    decide, with pydantic's own message)."""
    ids = [c[0] for c in candidates]
    if not MIN_K <= len(ids) <= MAX_K or len(set(ids)) != len(ids) or kind not in KINDS:
        return False
    if any(type(text) is not str or (model is not None and type(model) is not str)
           for _, text, model in candidates):
        return False
    annotators = [r[0] for r in rankings]
    if len(set(annotators)) != len(annotators) or not all(
            type(a) is str and PLAIN_ID.fullmatch(a) for a in annotators):
        return False
    return all(_sure_scores(r[2]) and _sure_notes(r[3]) for r in rankings)


def row_stats(rows: Sequence[GroupRow]) -> tuple[Counter[str], int, int, list[str]]:
    """Rankings per annotator, partial rankings, candidates and models of stored rows."""
    annotators: Counter[str] = Counter(r["annotator"]["id"] for g in rows for r in g["rankings"])
    partial = sum(len({c for t in r["tiers"] for c in t}) < len(g["candidates"])
                  for g in rows for r in g["rankings"])
    candidates = sum(len(g["candidates"]) for g in rows)
    models = sorted({m for g in rows for c in g["candidates"] if (m := c["source"]["model"])})
    return annotators, partial, candidates, models
