"""Nectar rows whose every answer is an object with a text take a shorter loop
(``nectar._plain_answers``); it gives what the general one gives. The general loop is the one
a row takes when its ``answers`` come as JSON text, so each row is read both ways and the
groups, rejects and stats compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.stage import read_import

PROMPT = "\n\nHuman: Name a prime number.\n\nAssistant:"
ANSWERS: list[list[dict[str, Any]]] = [
    [{"answer": "7", "model": "gpt-4", "rank": 1.0}, {"answer": "9", "model": "m", "rank": 2.0}],
    [{"answer": "7", "model": "gpt-4", "rank": 1}, {"answer": "9", "rank": 2}],  # int ranks
    [{"answer": "7", "model": 3, "rank": "1"}, {"answer": "9", "model": None, "rank": " 2 "}],
    [{"answer": "7", "rank": 1.0}, {"answer": "9", "rank": None}, {"answer": "2", "rank": 2.0}],
    [{"answer": "7", "rank": float("nan")}, {"answer": "9", "rank": "N/A"},
     {"answer": "2", "rank": True}],
    [{"answer": "7", "rank": 1.0}, {"answer": "9", "rank": 1.0}, {"answer": "2"}],  # a tie
    [{"answer": "7"}, {"answer": "9"}],  # no answer has a rank
    [{"answer": "7", "score": 1}, {"answer": "9", "extra": [1]}],
    [{"answer": "Seven", "rank": 1.0}, {"answer": " seven ", "rank": 2.0},
     {"answer": "", "rank": 3.0}, {"answer": 5, "rank": 4.0}, {"answer": "9", "rank": 5.0}],
    [{"answer": str(i), "rank": float(i)} for i in range(20)],  # split in two
]


def _read(path: Path, rows: list[dict[str, Any]], **settings: Any) -> tuple[Any, ...]:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    got = read_import(ImportConfig(source=str(path), layout="nectar", **settings))
    stats = {k: v for k, v in got.stats.items() if k != "source"}
    return (got.table.to_pylist(), [r.model_dump() for r in got.rejects], stats,
            got.group_rows, got.rows)


@pytest.mark.parametrize("settings", [{}, {"rank_key": "score"}, {"missing": ["N/A"]},
                                      {"model_key": "answer", "oversize": "reject"}])
def test_plain_answers_read_as_the_general_loop_reads_them(tmp_path: Path,
                                                           settings: dict[str, Any]) -> None:
    rows = [{"prompt": f"{PROMPT} {i}", "answers": answers, "turns": 1, "num_responses":
             len(answers), "good_natured": True} for i, answers in enumerate(ANSWERS)]
    as_text = [{**row, "answers": json.dumps(row["answers"])} for row in rows]
    plain = _read(tmp_path / "plain.jsonl", rows, **settings)
    general = _read(tmp_path / "general.jsonl", as_text, **settings)
    assert plain[0] == general[0] and plain[2:] == general[2:]
    # the rejects name the same rows, fields and reasons; only the file differs
    assert [{**r, "source": ""} for r in plain[1]] == [{**r, "source": ""} for r in general[1]]
    assert plain[1], "the rows hold values that are rejected"
