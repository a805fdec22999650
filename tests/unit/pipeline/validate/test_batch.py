"""The schema check on Arrow batches (grouppref.pipeline.validate.batch) against pydantic, the
schema of record: every row it calls sound is a valid ValidatedGroup; each kind of invalid
value is caught; plain valid rows take the fast path; and the checks after it see the same
facts, so the stage's result is the same with and without it, and with the batches checked
in several processes."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError

from grouppref.pipeline.validate import batches
from grouppref.pipeline.validate.batch import check_sound, row_facts
from grouppref.pipeline.validate.columns import SPACE
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.pipeline.validate.core import GroupFacts
from grouppref.pipeline.validate.stage import check_rows, run_validate
from grouppref.schemas import ValidatedGroup
from grouppref.schemas.arrow import arrow_schema_for, from_stored_row, stored_as, to_row
from tests.support.stage_files import assert_same_stage
from tests.support.validated import make_validated, write_aggregate

Row = dict[str, Any]


def _batch(rows: list[Row]) -> pa.RecordBatch:
    table = pa.Table.from_pylist(rows, schema=arrow_schema_for(ValidatedGroup))
    assert stored_as(table.schema, ValidatedGroup)  # so check_rows takes the batch path
    return table.combine_chunks().to_batches()[0]


def _parses(row: Row) -> bool:
    try:
        from_stored_row(ValidatedGroup, copy.deepcopy(row))
    except (ValidationError, ValueError, TypeError):
        return False
    return True


def _good(i: int = 0, **kwargs: Any) -> Row:
    return to_row(make_validated(f"Question number {i}?", k=4, **kwargs))


def _ids(row: Row) -> list[str]:
    return [c["candidate_id"] for c in row["candidates"]]


def _set(path: str, value: Any) -> Callable[[Row], object]:
    """A change that sets ``path`` (dots; ``[i]`` indexes a list) of a stored row."""
    def change(row: Row) -> None:
        keys: list[Any] = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "")
                .split(".")]
        target: Any = row
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value(row) if callable(value) else value
    return change


def _strengths(row: Row, **changes: Any) -> str:
    values = json.loads(row["strengths"])
    values.update(changes)
    return json.dumps(values)


# each makes a stored row that ValidatedGroup rejects
BROKEN: dict[str, Callable[[Row], object]] = {
    "empty group id": _set("group_id", ""),
    "group id with a space": _set("group_id", "g 1"),
    "no group id": _set("group_id", None),
    "no prompt": _set("prompt", None),
    "prompt id with a space": _set("prompt.prompt_id", "p 1"),
    "blank prompt text": _set("prompt.text", " \u3000\n"),
    "text and messages": _set("prompt.messages", [{"role": "user", "content": "hi"}]),
    "neither text nor messages": _set("prompt.text", None),
    "unknown role": lambda r: r["prompt"].update(text=None, messages=[
        {"role": "bot", "content": "hi"}]),
    "blank chat turn": lambda r: r["prompt"].update(text=None, messages=[
        {"role": "user", "content": "\x1c\x85"}]),
    "no chat turns": lambda r: r["prompt"].update(text=None, messages=[]),
    "metadata value null": _set("prompt.metadata", '{"a": null}'),
    "metadata not json": _set("prompt.metadata", "{nope"),
    "metadata a list": _set("prompt.metadata", "[1]"),
    "metadata NaN": _set("prompt.metadata", '{"a": NaN}'),
    "no metadata": _set("prompt.metadata", None),
    "one candidate": lambda r: r.update(candidates=r["candidates"][:1]),
    "seventeen candidates": lambda r: r.update(candidates=[
        {**r["candidates"][0], "candidate_id": f"c-{i}", "text": f"answer {i}"}
        for i in range(17)]),
    "candidate id twice": _set("candidates[1].candidate_id", lambda r: _ids(r)[0]),
    "texts equal when normalised": lambda r: (
        r["candidates"][0].update(text="Red  car"), r["candidates"][1].update(text="red car\n")),
    "plain texts equal but for a leading space": lambda r: [  # no other two of one length
        c.update(text=t) for c, t in zip(r["candidates"], (" Red sports car", "red sports car", "answer 2",
                                                            "answer three"), strict=False)],
    "plain texts equal but for case": lambda r: (
        r["candidates"][0].update(text="Red car"), r["candidates"][1].update(text="red CAR")),
    "unicode texts equal when case-folded": lambda r: (
        r["candidates"][0].update(text="Straße"), r["candidates"][1].update(text="STRASSE")),
    "blank candidate": _set("candidates[2].text", "\t\u2028"),
    "unknown source kind": _set("candidates[0].source.kind", "robot"),
    "params not scalars": _set("candidates[0].source.params", '{"t": [1]}'),
    "negative tokens": _set("candidates[0].num_tokens", -1),
    "positive log-prob": _set("candidates[0].behavior_logp", 0.5),
    "NaN log-prob": _set("candidates[0].behavior_logp", float("nan")),
    "candidate null": _set("candidates[3]", None),
    "no rankings": _set("rankings", None),
    "ranking of another group": _set("rankings[0].group_id", "g-other"),
    "annotator id with a space": _set("rankings[0].annotator.id", "a b"),
    "unknown annotator kind": _set("rankings[0].annotator.kind", "alien"),
    "no tiers": _set("rankings[0].tiers", []),
    "empty tier": _set("rankings[0].tiers", lambda r: [[], *r["rankings"][0]["tiers"]]),
    "unknown id in a tier": _set("rankings[0].tiers[0]", ["c-unknown"]),
    "id twice in a ranking": _set("rankings[0].tiers", lambda r: [[_ids(r)[0]]] * 2),
    "one id ranked": _set("rankings[0].tiers", lambda r: [[_ids(r)[0]]]),
    "annotator twice": _set("rankings[1].annotator", lambda r: r["rankings"][0]["annotator"]),
    "score of an unknown candidate": _set("rankings[0].scores", '{"c-unknown": 1.0}'),
    "score not a number": _set("rankings[0].scores", lambda r: json.dumps({_ids(r)[0]: "hi"})),
    "score infinite": _set("rankings[0].scores", lambda r: json.dumps({_ids(r)[0]: 1e400})),
    "ranking metadata nested": _set("rankings[0].metadata", '{"a": {"b": 1}}'),
    "created_at not a time": _set("rankings[0].created_at", "yesterday"),
    "no created_at": _set("rankings[0].created_at", None),
    "consensus leaves one out": _set("consensus", lambda r: r["consensus"][:-1]),
    "consensus names one twice": _set("consensus", lambda r: [*r["consensus"],
                                                              r["consensus"][0]]),
    "consensus empty": _set("consensus", []),
    "consensus empty tier": _set("consensus", lambda r: [[], *r["consensus"]]),
    "strengths leave one out": _set("strengths", lambda r: json.dumps(
        {c: 1.0 for c in _ids(r)[:-1]})),
    "strengths name another": _set("strengths", lambda r: _strengths(r, **{"c-other": 1.0})),
    "strength text": _set("strengths", lambda r: _strengths(r, **{_ids(r)[0]: "x"})),
    "strength infinite": _set("strengths", lambda r: _strengths(r, **{_ids(r)[0]: 1e400})),
    "no strengths": _set("strengths", None),
    "strengths a list": _set("strengths", "[]"),
    "p below one half": _set("pairs[0].p", 0.4),
    "p above one": _set("pairs[0].p", 1.1),
    "p NaN": _set("pairs[0].p", float("nan")),
    "p null": _set("pairs[0].p", None),
    "negative weight": _set("pairs[0].weight", -0.1),
    "negative votes": _set("pairs[0].votes_for", -1.0),
    "votes null": _set("pairs[0].votes_against", None),
    "pair with itself": _set("pairs[0].loser", lambda r: r["pairs"][0]["winner"]),
    "pair of an unknown": _set("pairs[0].winner", "c-unknown"),
    "pair twice": lambda r: r["pairs"].append({**r["pairs"][0], "winner": r["pairs"][0]["loser"],
                                               "loser": r["pairs"][0]["winner"]}),
    "no pairs list": _set("pairs", None),
    "no agreement": _set("agreement", None),
    "negative annotators": _set("agreement.num_annotators", -1),
    "kendall w above one": _set("agreement.kendall_w", 1.5),
    "tau below minus one": _set("agreement.mean_tau", -2.0),
    "noise NaN": _set("agreement.noise", float("nan")),
    "no flags list": _set("flags", None),
    "null flag": _set("flags", [None]),
    "unknown split": _set("split", "dev"),
    "unknown consensus kind": _set("consensus_kinds", ["alien"]),
}

# valid rows off the fast path's usual shape: each must parse, sound or not
UNUSUAL: dict[str, Callable[[Row], object]] = {
    "chinese prompt and answer": lambda r: (r["prompt"].update(text="你好吗？"),
                                            r["candidates"][0].update(text="我很好")),
    "texts with newlines and tabs": _set("candidates[0].text", "Line one\n\tline two "),
    "texts equal but for one letter": lambda r: (
        r["candidates"][0].update(text="Red car"), r["candidates"][1].update(text="Red cat")),
    "strength as an integer": _set("strengths", lambda r: _strengths(r, **{_ids(r)[0]: 3})),
    "scores and metadata": lambda r: r["rankings"][0].update(
        scores=json.dumps({_ids(r)[0]: 0.5, _ids(r)[1]: -2}),
        metadata='{"note": "x", "n": 1, "ok": true}'),
    "a unicode id": lambda r: [x.update(group_id="g-ü") for x in [r, *r["rankings"]]],
    "strength true (pydantic reads it as 1.0)": _set("strengths", lambda r: _strengths(
        r, **{_ids(r)[0]: True})),
    "naive created_at": _set("rankings[0].created_at", "2024-05-01T10:00:00"),
    "no optional values": lambda r: r["agreement"].update(kendall_w=None, mean_tau=None,
                                                          noise=None),
    "split and kinds set": lambda r: r.update(split="test", consensus_kinds=["human", "rule"]),
}


def _changed(change: Callable[[Row], object], i: int = 9) -> Row:
    row = _good(i)
    change(row)
    return row


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_invalid_value_makes_its_row_suspect(name: str) -> None:
    row = _changed(BROKEN[name])
    assert not _parses(row), "the change should make an invalid row"
    assert check_sound(_batch([_good(0), row, _good(1)])).tolist() == [True, False, True]


def test_a_row_called_sound_always_parses_and_plain_rows_are_sound() -> None:
    rows = [_good(i) for i in range(3)] + [_good(3, chat=True)]
    rows += [_changed(change, i) for i, change in enumerate(UNUSUAL.values(), start=10)]
    sound = check_sound(_batch(rows)).tolist()
    assert all(_parses(r) for r in rows)
    assert sound[:4] == [True] * 4
    # the slow path is fine for the unicode id, the naive time, the boolean strength
    assert sum(sound) >= len(rows) - 3
    # a batch cut out of a longer one (its arrays start at an offset) checks the same
    assert check_sound(_batch(rows).slice(2)).tolist() == sound[2:]


def test_space_holds_every_character_python_strips() -> None:
    assert set(SPACE) == {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()}


@pytest.mark.parametrize("split_by", ["prompt_content", "prompt_text"])
def test_facts_of_rows_equal_the_facts_of_their_records(split_by: str) -> None:
    records = [make_validated("Plain?", k=3), make_validated("Chat?", chat=True, flags=["x"])]
    facts = row_facts(_batch([to_row(r) for r in records]), [0, 1], split_by)
    assert facts == [GroupFacts.of(r, split_by, repeated=False) for r in records]


@pytest.mark.parametrize("workers", [1, 3])
def test_the_stage_result_is_the_same_with_and_without_the_batch_check(
        workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with the batches (of 4 rows here) checked in 3 processes (:mod:`.batches`)."""
    monkeypatch.setattr(batches, "BATCH_ROWS", 4)
    monkeypatch.setattr(batches, "PARALLEL_ROWS", 1)
    rows = [_good(i) for i in range(4)] + [_changed(c, i) for i, c in
                                            enumerate(BROKEN.values(), start=100)]
    rows += [_changed(c, i) for i, c in enumerate(UNUSUAL.values(), start=500)]
    rows += [_good(0), _good(1, flags=["x"])]  # a duplicate, and a conflict of contents
    table = pa.Table.from_pylist(rows, schema=arrow_schema_for(ValidatedGroup))
    assert stored_as(table.schema, ValidatedGroup)  # so check_rows takes the batch path
    config = ValidateConfig(test_fraction=0.3, min_pairs=1, workers=workers)
    fast, slow = (check_rows(table, config, "rows", batch_check=b) for b in (True, False))
    assert fast.rejects == slow.rejects and fast.info == slow.info
    assert fast.summary() == slow.summary()
    assert len(slow.rejects) >= len(BROKEN)


def test_the_stage_writes_the_same_bytes_with_its_checks_in_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "BATCH_ROWS", 5)
    monkeypatch.setattr(batches, "PARALLEL_ROWS", 1)
    records = [make_validated(f"Question {i}?", k=2 + i % 3, chat=i % 4 == 0,
                              flags=["x"] if i % 5 == 0 else None) for i in range(40)]
    records += records[:3]  # repeated groups: their rows are parsed, not checked in batches
    written = {}
    for workers in (1, 3):
        store = write_aggregate(tmp_path / f"w{workers}" / "run", records)
        run_validate(store, ValidateConfig(test_fraction=0.3, workers=workers, shard_size=7))
        written[workers] = store.stage_dir("validate")
    assert "duplicate_group_id" in (written[1] / "rejects.jsonl").read_text(encoding="utf-8")
    assert_same_stage(written[1], written[3], folders=(b"/w1/", b"/w3/"))
