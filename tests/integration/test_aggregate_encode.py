"""The column-wise encoding of a stage's stored rankings
(:func:`~grouppref.pipeline.aggregate.encode.encode_columns`, through
:func:`~grouppref.pipeline.aggregate.stored.stored_input`) gives the tensors, annotators (in
order of first appearance), kinds and selection counts the records path gives
(:func:`collect_groups` + :func:`encode_rankings` / :func:`encode_design`), on a table of many
chunks; and refuses (``None``: the records path validates the rows) every row that breaks what
the encoding relies on."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
import torch

from grouppref.pipeline.aggregate.config import STAGE
from grouppref.pipeline.aggregate.parse import collect_groups, encode_design, encode_rankings
from grouppref.pipeline.aggregate.stored import stored_input
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from grouppref.schemas.arrow import features_for, to_row, to_table
from grouppref.schemas.records import AnnotatorKind
from tests.support.factories import make_group

WHO = ("z", "b", "rm", "y", "a", "x")
SELECTIONS: tuple[dict[str, object] | None, ...] = (
    None, {}, {"selection": "audit"}, {"selection": "uncertain", "n": 1},
    {"selection": "random"}, {"selection": 3}, {"other": "audit"}, {"selection": "weird"})


def _groups(n: int = 40) -> list[AnnotatedGroup]:
    """K from 2 to 7, 0 to 6 rankings by annotators in a rotating order, ties, partial
    rankings, selection markers of every kind."""
    groups = []
    for g in range(n):
        base = make_group(k=2 + g % 6, prompt_text=f"Encode {g}?")
        ids = base.candidate_ids()
        rankings = []
        for r in range(g % 7):
            who = WHO[(g + r) % len(WHO)]
            kind: AnnotatorKind = "reward_model" if who == "rm" else "human"
            order = ids[r % len(ids):] + ids[: r % len(ids)]
            tiers = [[c] for c in order]
            if (g + r) % 4 == 1 and len(tiers) > 2:
                tiers = [tiers[0] + tiers[1], *tiers[2:]]
            if (g + r) % 5 == 2 and len(tiers) > 2:
                tiers = tiers[:-1]
            rankings.append(Ranking(annotator=Annotator(id=who, kind=kind),
                                    group_id=base.group_id, tiers=tiers,
                                    metadata=SELECTIONS[(g + r) % len(SELECTIONS)]))
        groups.append(AnnotatedGroup(**dict(base), rankings=rankings))
    return groups


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    whole = pa.Table.from_pylist(rows, schema=features_for(AnnotatedGroup).arrow_schema)
    return pa.concat_tables([whole.slice(s, 6) for s in range(0, whole.num_rows, 6)])


def test_the_encoding_is_the_records_encoding() -> None:
    groups = _groups()
    parsed = stored_input(_table([to_row(g) for g in groups]), AnnotatedGroup, "rank")
    assert parsed is not None and parsed.encoded is not None
    want = collect_groups(groups, "rank", STAGE)
    for got_t, want_t in zip((*encode_rankings(parsed), encode_design(parsed)),
                             (*encode_rankings(want), encode_design(want)), strict=True):
        assert got_t.dtype == want_t.dtype and torch.equal(got_t, want_t)
    assert (parsed.annotators, parsed.kinds, parsed.index) == \
        (want.annotators, want.kinds, want.index)
    assert parsed.annotators[:3] == ["b", "rm", "y"]  # first seen first, not sorted
    for value in ("audit", "uncertain", "random", "weird", "nothing"):
        assert parsed.groups_marked(value) == want.groups_marked(value)


def test_groups_without_rankings() -> None:
    groups = [g.model_copy(update={"rankings": []}) for g in _groups(8)]
    parsed = stored_input(to_table(groups, AnnotatedGroup), AnnotatedGroup, "rank")
    assert parsed is not None and parsed.annotators == []
    want = collect_groups(groups, "rank", STAGE)
    for got_t, want_t in zip(encode_rankings(parsed), encode_rankings(want), strict=True):
        assert torch.equal(got_t, want_t)


def _ranking0(row: dict[str, Any]) -> dict[str, Any]:
    return row["rankings"][0]  # type: ignore[no-any-return]


BREAKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "a candidate id twice": lambda row: row["candidates"].__setitem__(
        1, {**row["candidates"][1], "candidate_id": row["candidates"][0]["candidate_id"]}),
    "one candidate": lambda row: row.__setitem__("candidates", row["candidates"][:1]),
    "seventeen candidates": lambda row: row.__setitem__("candidates", [
        {**row["candidates"][0], "candidate_id": f"c-{i}"} for i in range(17)]),
    "another group's ranking": lambda row: _ranking0(row).__setitem__("group_id", "g-other"),
    "an annotator twice": lambda row: row["rankings"].append(copy.deepcopy(_ranking0(row))),
    "an empty tier": lambda row: _ranking0(row)["tiers"].append([]),
    "an unknown candidate": lambda row: _ranking0(row)["tiers"].append(["c-nowhere"]),
    "a candidate twice in a ranking": lambda row: _ranking0(row)["tiers"].append(
        [_ranking0(row)["tiers"][0][0]]),
    "a candidate twice in a tier": lambda row: _ranking0(row)["tiers"][0].append(
        _ranking0(row)["tiers"][0][0]),
    "a null tier": lambda row: _ranking0(row)["tiers"].append(None),
    "a null candidate id in a tier": lambda row: _ranking0(row)["tiers"][0].append(None),
    "a null annotator id": lambda row: _ranking0(row)["annotator"].__setitem__("id", None),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_a_row_that_breaks_the_encoding_goes_to_the_records(name: str) -> None:
    rows = [to_row(g) for g in _groups(16)]
    assert stored_input(_table(rows), AnnotatedGroup, "rank") is not None
    BREAKS[name](rows[9])  # 9 % 7 = 2 rankings, K = 5
    assert stored_input(_table(rows), AnnotatedGroup, "rank") is None
