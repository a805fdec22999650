"""An imported group's stored row made without the models (:mod:`...layouts.stored`) is the
row ``to_row`` gives for the same AnnotatedGroup; values the direct path cannot vouch for go
back to the models, which refuse them with pydantic's message."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from grouppref.pipeline.imports.layouts.build import UNKNOWN_TIME
from grouppref.pipeline.imports.layouts.stored import (
    PlainRanking,
    fast_row,
    prompt_row,
    row_stats,
)
from grouppref.schemas import (
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateSource,
    Prompt,
    Ranking,
    to_row,
)

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


@pytest.mark.parametrize("prompt", [PROMPT, CHAT])
@pytest.mark.parametrize("when", [UNKNOWN_TIME, datetime(2026, 5, 1, 12, 30, 1, 5,
                                                         tzinfo=timezone.utc)])
def test_the_direct_row_is_to_rows(prompt: Prompt, when: datetime) -> None:
    rankings: list[PlainRanking] = [
        ("nectar", [["c-1"], ["c-2", "c-3"]], None, None),
        ("judge#2", [["c-3"], ["c-1"]], {"c-3": 9.5, "c-1": -1.0},
         {"verdict": "model_a", "n": 3, "ok": False, "w": 0.25}),
    ]
    got = fast_row("g-1", prompt, CANDIDATES, rankings, "llm_judge", when)
    assert got == to_row(_models("g-1", prompt, rankings, "llm_judge", when))


@pytest.mark.parametrize("ranking", [
    ("two words", [["c-1"], ["c-2"]], None, None),  # not an id: pydantic says so
    ("", [["c-1"], ["c-2"]], None, None),
    ("a" * 257, [["c-1"], ["c-2"]], None, None),
    ("a", [["c-1"], ["c-2"]], {"c-1": float("inf")}, None),
    ("a", [["c-1"], ["c-2"]], None, {"x": float("nan")}),
    ("a", [["c-1"], ["c-2"]], None, {"x": [1]}),
])
def test_values_pydantic_refuses_are_left_to_it(ranking: PlainRanking) -> None:
    assert fast_row("g-1", PROMPT, CANDIDATES, [ranking], "human", UNKNOWN_TIME) is None
    with pytest.raises(ValidationError):
        _models("g-1", PROMPT, [ranking], "human", UNKNOWN_TIME)


def test_unsure_values_go_to_the_models() -> None:
    twice = [("a", [["c-1"], ["c-2"]], None, None)] * 2
    assert fast_row("g-1", PROMPT, CANDIDATES, twice, "human", UNKNOWN_TIME) is None
    assert fast_row("g-1", PROMPT, CANDIDATES[:1], [], "human", UNKNOWN_TIME) is None
    assert fast_row("g-1", PROMPT, CANDIDATES, [], "robot", UNKNOWN_TIME) is None
    int_score = [("a", [["c-1"], ["c-2"]], {"c-1": 1}, None)]  # pydantic makes it 1.0
    assert fast_row("g-1", PROMPT, CANDIDATES, int_score, "human", UNKNOWN_TIME) is None  # type: ignore[arg-type]
    unicode_id = [("jürgen", [["c-1"], ["c-2"]], None, None)]
    assert fast_row("g-1", PROMPT, CANDIDATES, unicode_id, "human", UNKNOWN_TIME) is None


def test_row_stats() -> None:
    rankings: list[PlainRanking] = [("a", [["c-1"], ["c-2"]], None, None),
                                    ("b", [["c-1", "c-2", "c-3"]], None, None)]
    row = fast_row("g-1", PROMPT, CANDIDATES, rankings, "human", UNKNOWN_TIME)
    assert row is not None
    annotators, partial, candidates, models = row_stats([row, row])
    assert annotators == {"a": 2, "b": 2} and partial == 2 and candidates == 6
    assert models == ["gpt-4", "m"]


@pytest.mark.parametrize("prompt", [
    PROMPT, CHAT, Prompt(prompt_id="p-3", text="Sum?", reference="4",
                         metadata={"z": 1.5, "a": "x", "n": 2, "b": False}),
    Prompt(prompt_id="p-4", messages=[{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi?"}], metadata={})])
def test_prompt_row_is_to_row(prompt: Prompt) -> None:
    assert prompt_row(prompt) == to_row(prompt)
