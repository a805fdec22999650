"""Imported groups gathered column by column without the models (:mod:`...layouts.table`) are
the table ``rows_table`` gives for ``to_row`` of the same AnnotatedGroups; values the direct
path cannot vouch for go back to the models, which refuse them with pydantic's message."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from grouppref.pipeline.imports.layouts.build import UNKNOWN_TIME
from grouppref.pipeline.imports.layouts.stored import PlainRanking, sure_values
from grouppref.pipeline.imports.layouts.table import GroupTable
from grouppref.schemas import (
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateSource,
    Prompt,
    Ranking,
    to_row,
)
from grouppref.schemas.arrow import rows_table

PROMPT = Prompt(prompt_id="p-1", text="Name a prime.", metadata={"turns": 1, "good": True})
CHAT = Prompt(prompt_id="p-2", messages=[{"role": "user", "content": "Hi?"}])
CANDIDATES = [("c-1", "Seven.", "gpt-4"), ("c-2", "Nine.", None), ("c-3", "Eleven.", "m")]


def _models(gid: str, prompt: Prompt, rankings: list[PlainRanking], kind: str,
            when: datetime) -> AnnotatedGroup:
    return AnnotatedGroup(group_id=gid, prompt=prompt, candidates=[
        Candidate(candidate_id=c, text=t, source=CandidateSource(kind="import", model=m))
        for c, t, m in CANDIDATES], rankings=[
        Ranking(annotator=Annotator(id=a, kind=kind), group_id=gid, tiers=tiers,  # type: ignore[arg-type]
                scores=scores, metadata=notes, created_at=when)
        for a, tiers, scores, notes in rankings])


PROMPTS = [PROMPT, CHAT, Prompt(prompt_id="p-3", text="Sum?", reference="4",
                               metadata={"z": 1.5, "a": "x", "n": 2, "b": False}),
           Prompt(prompt_id="p-4", messages=[{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hi?"}], metadata={})]
RANKINGS: list[PlainRanking] = [
    ("nectar", [["c-1"], ["c-2", "c-3"]], None, None),
    ("judge#2", [["c-3"], ["c-1"]], {"c-3": 9.5, "c-1": -1.0},
     {"verdict": "model_a", "n": 3, "ok": False, "w": 0.25}),
]


@pytest.mark.parametrize("chunk", [1, 2, 100])
@pytest.mark.parametrize("when", [UNKNOWN_TIME, datetime(2026, 5, 1, 12, 30, 1, 5,
                                                         tzinfo=timezone.utc)])
def test_the_table_is_rows_table_of_to_rows(chunk: int, when: datetime) -> None:
    """Groups of every prompt form, with and without rankings, and one only the models may
    make (two rankings by one annotator) in between: the same table, rows and stats."""
    out, rows = GroupTable(chunk), []
    twice = [RANKINGS[0], RANKINGS[0]]  # sure_values refuses it; the models take it as a reject
    for i, prompt in enumerate(PROMPTS):
        for rankings in (RANKINGS, [], RANKINGS[1:]):
            gid = f"g-{i}-{len(rankings)}"
            assert out.add(gid, prompt, CANDIDATES, rankings, "llm_judge", when)
            rows.append(to_row(_models(gid, prompt, rankings, "llm_judge", when)))
        assert not out.add("g-x", prompt, CANDIDATES, twice, "human", when)
        row = to_row(_models(f"g-{i}-m", prompt, RANKINGS, "human", when))
        out.add_row(row)  # type: ignore[arg-type]
        rows.append(row)
    table = out.table()
    assert table.equals(rows_table(rows, AnnotatedGroup))
    assert table.schema.metadata == rows_table(rows, AnnotatedGroup).schema.metadata
    assert out.candidates == 3 * len(rows)
    assert out.annotators == {"nectar": 8, "judge#2": 12}
    assert out.partial == 12  # judge#2 names 2 of 3 candidates
    assert out.models == {"gpt-4", "m"}


def test_no_group_is_an_empty_table() -> None:
    assert GroupTable(10).table().equals(rows_table([], AnnotatedGroup))


@pytest.mark.parametrize("ranking", [
    ("two words", [["c-1"], ["c-2"]], None, None),  # not an id: pydantic says so
    ("", [["c-1"], ["c-2"]], None, None),
    ("a" * 257, [["c-1"], ["c-2"]], None, None),
    ("a", [["c-1"], ["c-2"]], {"c-1": float("inf")}, None),
    ("a", [["c-1"], ["c-2"]], None, {"x": float("nan")}),
    ("a", [["c-1"], ["c-2"]], None, {"x": [1]}),
])
def test_values_pydantic_refuses_are_left_to_it(ranking: PlainRanking) -> None:
    assert not sure_values(CANDIDATES, [ranking], "human")
    assert not GroupTable(10).add("g-1", PROMPT, CANDIDATES, [ranking], "human", UNKNOWN_TIME)
    with pytest.raises(ValidationError):
        _models("g-1", PROMPT, [ranking], "human", UNKNOWN_TIME)


def test_unsure_values_go_to_the_models() -> None:
    twice = [("a", [["c-1"], ["c-2"]], None, None)] * 2
    assert not sure_values(CANDIDATES, twice, "human")
    assert not sure_values(CANDIDATES[:1], [], "human")
    assert not sure_values(CANDIDATES, [], "robot")
    int_score = [("a", [["c-1"], ["c-2"]], {"c-1": 1}, None)]  # pydantic makes it 1.0
    assert not sure_values(CANDIDATES, int_score, "human")  # type: ignore[arg-type]
    unicode_id = [("jürgen", [["c-1"], ["c-2"]], None, None)]
    assert not sure_values(CANDIDATES, unicode_id, "human")
