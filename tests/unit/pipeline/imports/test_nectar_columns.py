"""Nectar read over Arrow columns (:mod:`~grouppref.pipeline.imports.layouts.nectar_columns`)
equals Nectar read row by row (:func:`~grouppref.pipeline.imports.layouts.nectar.read`) on
the same lines: the same stored bytes, groups in the same order with their rows, the same
rejects in the same order, the same counts, stats, decoding counts and grouper notes; in
blocks of one line, of a few lines and of many, so that rows read over columns and rows read
as ever sit side by side in every way."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.layouts import READERS, context, nectar_columns
from grouppref.pipeline.imports.layouts.raw_groups import Imported, Seen
from grouppref.readers.lines import LineRange
from grouppref.readers.rows import Decoding, jsonl_rows
from grouppref.runs.stage_run import write_shard_file
from tests.support.equivalence import hostile_files


def _row(prompt: Any, answers: Any, **more: Any) -> dict[str, Any]:
    return {"prompt": prompt, "answers": answers, "turns": 1, "num_responses": 3,
            "source": ["sharegpt"], "good_natured": True, **more}


def _answers(*texts: Any, ranks: Any = None) -> list[dict[str, Any]]:
    ranks = ranks or [float(i + 1) for i in range(len(texts))]
    return [{"answer": t, "model": f"m{i % 2}", "rank": r}
            for i, (t, r) in enumerate(zip(texts, ranks, strict=True))]


def _good(i: int, rng: random.Random) -> dict[str, Any]:
    """A row the columns read: one to three turns, 2-9 answers, some of one length."""
    words = ("alpha", "beta", "gamma", "delta", "épsilon", "ζeta", "eta")
    turns = "".join(f"\n\nHuman: Question {i}.{t} {rng.choice(words)}\n\nAssistant: Reply {t}."
                    for t in range(rng.randint(0, 2)))
    k = rng.randint(2, 9)
    texts = [f"Answer {i}-{j} {rng.choice(words)}{'x' * rng.randint(0, 3)}" for j in range(k)]
    ranks = rng.sample(range(1, 20), k)
    return _row(f"{turns}\n\nHuman: Q{i}?\n\nAssistant:", _answers(*texts, ranks=ranks),
                turns=rng.choice([1, 2, None]), good_natured=rng.choice([True, False]))


def _edge_lines() -> list[bytes]:
    """Rows each layout check sees, between rows the columns read; some break a block's
    parse or its column types (the whole block read as ever), some only their own row."""
    rng = random.Random(7)
    good = [json.dumps(_good(i, rng)).encode() for i in range(160)]
    edge = [
        _row("\n\nHuman: Tie?\n\nAssistant:", _answers("A.", "B.", "C.", ranks=[1.0, 1.0, 2.0])),
        _row("\n\nHuman: Close?\n\nAssistant:", _answers("A.", "B.", ranks=[1.0, 1.0 + 1e-10])),
        _row("\n\nHuman: Folded twins?\n\nAssistant:", _answers("Same  TEXT.", "same text.", "x")),
        _row("\n\nHuman: Equal counts, not twins?\n\nAssistant:", _answers("abc", "abd", "q")),
        _row("\n\nHuman: Unicode twins?\n\nAssistant:", _answers("Straße", "STRASSE", "ß")),
        _row("\n\nHuman: Blank answer?\n\nAssistant:", _answers("A.", " \t ", "C.")),
        _row("\n\nHuman: Empty answer?\n\nAssistant:", _answers("A.", "", "C.")),
        _row("\n\nHuman: One answer?\n\nAssistant:", _answers("A.")),
        _row("\n\nHuman: Too many?\n\nAssistant:", _answers(*[f"T{i}" for i in range(17)])),
        _row("\n\nHuman: Null rank?\n\nAssistant:", _answers("A.", "B.", ranks=[1.0, None])),
        _row("\n\nHuman: Int ranks?\n\nAssistant:", _answers("A.", "B.", ranks=[2, 1])),
        _row("\n\nHuman: No model?\n\nAssistant:", [{"answer": "A.", "rank": 1.0},
                                                   {"answer": "B.", "rank": 2.0}]),
        _row("\n\nHuman: Null model?\n\nAssistant:", [{"answer": "A.", "model": None,
                                                      "rank": 1.0},
                                                     {"answer": "B.", "model": "", "rank": 2.0}]),
        _row("No transcript at all", _answers("A.", "B.")),
        _row("\n\nHuman:   \n\nAssistant:", _answers("A.", "B.")),
        _row("\n\nHuman: Q?\n\nAssistant: A\n\nHuman:\n\nAssistant:", _answers("A.", "B.")),
        _row("\n\nHuman: Q{i}?\n\nAssistant:", _answers("A.", "B.")),
        _row("\n\nHuman: Q{i}?\n\nAssistant:", _answers("A.", "B.")),  # a repeated prompt
        _row("\n\nHuman: Q3?\n\nAssistant:", _answers("A.", "B.")),  # a good row's prompt
        _row("\n\nHuman: Float metadata?\n\nAssistant:", _answers("A.", "B."), turns=1.5),
        _row("\n\nHuman: String metadata?\n\nAssistant:", _answers("A.", "B."), turns="one"),
        _row("\n\nHuman: Named id?\n\nAssistant:", _answers("A.", "B."), prompt_id="p1"),
        _row("\n\nHuman: Extra answer key?\n\nAssistant:",
             [{"answer": "A.", "rank": 1.0, "why": "x"}, {"answer": "B.", "rank": 2.0}]),
        _row("\n\nHuman: Null prompt?\n\nAssistant:", None),
        {"answers": _answers("A.", "B.")},
        _row(None, _answers("A.", "B.")),
        # texts pyarrow reads as timestamps where a block holds no others: the block is read
        # as ever (a mixed column keeps the texts as written)
        _row("\n\nHuman: Dates?\n\nAssistant:", _answers("2020-01-01 10:00:00",
                                                          "2021-02-02 11:00:00")),
    ]
    raw = [
        b"", b"   ", b"\t\r", b"{not json", b'["a list"]', b'{"prompt": "x\\ud800"}',
        b'{"prompt": "\\n\\nHuman: Dup key?\\n\\nAssistant:", "prompt": "y", "answers": []}',
        b'{"prompt": "\\n\\nHuman: NaN?\\n\\nAssistant:", "answers": [{"answer": "a", "rank": '
        b'NaN}, {"answer": "b", "rank": 1.0}]}',
        b'{"prompt": "\\n\\nHuman: Big?\\n\\nAssistant:", "answers": [{"answer": "a", "rank": '
        b'1e400}, {"answer": "b", "rank": 1.0}]}',
        b"\xff\xfe not utf-8",
        json.dumps(_row("\n\nHuman: CRLF?\n\nAssistant:", _answers("A.", "B."))).encode()
        + b"\r",
        b"\xef\xbb\xbf" + json.dumps(_row("\n\nHuman: BOM inside?\n\nAssistant:",
                                          _answers("A.", "B."))).encode(),
        json.dumps(_row("\n\nHuman: Two on a line?\n\nAssistant:", _answers("A.", "B.")))
        .encode() * 2,
    ]
    lines = [json.dumps(r).encode() for r in edge] + raw
    out: list[bytes] = []
    for i, line in enumerate(lines):
        out.extend([*good[3 * i + 1: 3 * i + 4], line])
    return [b"\xef\xbb\xbf" + good[0], *out, *good[150:], *good[:5]]


def _rows_read(path: Path, config: ImportConfig) -> tuple[Imported, Decoding, list[Seen]]:
    ctx = context(config, "nectar", str(path), "import")
    ctx.seen, decoding = [], Decoding(path)
    with path.open("rb") as fh:
        got = READERS["nectar"](jsonl_rows(fh, path, decoding), ctx)
    return got, decoding, ctx.seen


def _columns_read(path: Path, config: ImportConfig, block: int
                  ) -> tuple[Imported, Decoding, list[Seen]]:
    ctx = context(config, "nectar", str(path), "import")
    assert nectar_columns.applies(ctx)
    ctx.seen, decoding = [], Decoding(path)
    got = nectar_columns.read_range(path, LineRange(0, path.stat().st_size, 1), decoding, ctx,
                                    block)
    return got, decoding, ctx.seen


def _assert_same(a: Imported, b: Imported, tmp_path: Path) -> None:
    assert a.table.equals(b.table)
    write_shard_file(a.table, tmp_path / "a.arrow")
    write_shard_file(b.table, tmp_path / "b.arrow")
    assert (tmp_path / "a.arrow").read_bytes() == (tmp_path / "b.arrow").read_bytes()
    assert a.rejects == b.rejects
    assert (a.group_rows, a.rows, a.blank, a.stats, a.counts, a.reading) == \
        (b.group_rows, b.rows, b.blank, b.stats, b.counts, b.reading)


def _compare(path: Path, config: ImportConfig, block: int, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> int:
    """Both reads of ``path`` held equal; how many rows the columns read."""
    by_columns = 0
    add = nectar_columns._Reader._add

    def counted(self: Any, lane: Any, start: int, end: int, first: int) -> None:
        nonlocal by_columns
        by_columns += max(end - start, 0)
        add(self, lane, start, end, first)

    monkeypatch.setattr(nectar_columns._Reader, "_add", counted)
    rows, rows_decoding, rows_seen = _rows_read(path, config)
    columns, columns_decoding, columns_seen = _columns_read(path, config, block)
    _assert_same(columns, rows, tmp_path)
    assert columns_seen == rows_seen
    assert (columns_decoding.good, columns_decoding.bad, columns_decoding.first) == \
        (rows_decoding.good, rows_decoding.bad, rows_decoding.first)
    return by_columns


@pytest.mark.parametrize("block", [1, 700, 1 << 22])
def test_columns_read_the_edge_rows_as_the_rows_do(
        tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "edge.jsonl"
    path.write_bytes(b"\n".join(_edge_lines()) + b"\n")
    by_columns = _compare(path, ImportConfig(source=str(path), layout="nectar"), block,
                          tmp_path, monkeypatch)
    rows, _, _ = _rows_read(path, ImportConfig(source=str(path), layout="nectar"))
    assert len(rows.rejects) > 30 and rows.table.num_rows > 150
    # a line a block: every row a parse allows; blocks of a few lines: those without a
    # hostile line; one block: a hostile line sends the whole block to the rows
    assert by_columns > rows.table.num_rows * 0.8 if block == 1 else \
        by_columns > 10 if block == 700 else by_columns == 0


@pytest.mark.parametrize("settings", [{}, {"min_k": 3}])
def test_columns_read_the_hostile_nectar_file_as_the_rows_do(
        tmp_path: Path, settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    path = hostile_files(tmp_path)["nectar_hostile"]
    config = ImportConfig(source=str(path), layout="nectar", **settings)
    assert _compare(path, config, 1, tmp_path, monkeypatch) >= 1


def test_a_file_without_a_last_line_end_and_many_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    path = tmp_path / "good.jsonl"
    path.write_bytes(b"\n".join(json.dumps(_good(i, rng)).encode() for i in range(300)))
    config = ImportConfig(source=str(path), layout="nectar")
    assert _compare(path, config, 2000, tmp_path, monkeypatch) == 300


@pytest.mark.parametrize("settings", [{"rank_key": "score"}, {"transcripts": False},
                                      {"text_key": "text"}, {"annotator": "two words"}])
def test_other_settings_read_row_by_row(settings: dict[str, Any]) -> None:
    config = ImportConfig(source="x.jsonl", layout="nectar", **settings)
    assert not nectar_columns.applies(context(config, "nectar", "x.jsonl", "import"))
    assert nectar_columns.applies(context(ImportConfig(source="x.jsonl", layout="nectar"),
                                          "nectar", "x.jsonl", "import"))
