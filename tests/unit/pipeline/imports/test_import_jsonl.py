"""A JSONL file read for an import (:func:`grouppref.readers.rows.iter_rows`): each line read
with its line end gives the row, blank line or reason that the line without it gives (the
reason's column is the bare line's)."""

from __future__ import annotations

import json
from pathlib import Path

from grouppref.errors import RowError
from grouppref.readers.rows import BlankLine, iter_rows

LINES = [b'{"a": 1}', b"", b"  \t", b"\xe3\x80\x80", b'{"a": "\xc3\xa9"}', b'{"a": 1',
         b'{"a": 1} x', b"[1, 2]", b'"text"', b'{"a": "\xe2\x82"}', b'{"a": 1}\xe2\x82',
         b'{"a": "b\r"}', b'{"a": 1}\r', b'{"a": 1,}', b'{"a": NaN}', b"\r"]


def _expected(bare: bytes, number: int) -> object:
    """What the line without its end gives: the row, or its kind and reason."""
    try:
        line = bare.decode("utf-8")
    except UnicodeDecodeError as e:
        return ("error", f"byte 0x{bare[e.start]:02X} at column {e.start + 1}")
    if not line.strip():
        return ("blank", number)
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        return ("error", f"{e.msg.removesuffix(' at')} at column {e.colno}")
    return value if isinstance(value, dict) else ("error", type(value).__name__)


def _got(row: object, number: int) -> object:
    if isinstance(row, BlankLine):
        return ("blank", row.row)
    if isinstance(row, RowError):
        assert row.row == number
        return ("error", row.reason)
    return row


def test_lines_read_with_their_end_are_the_bare_lines(tmp_path: Path) -> None:
    for end in (b"\n", b"\r\n"):
        path = tmp_path / f"rows{len(end)}.jsonl"
        path.write_bytes(b"".join(line + end for line in LINES[:-1]) + LINES[-1])
        got = list(iter_rows(path))
        assert [n for n, _ in got] == list(range(1, len(LINES) + 1))
        for (number, row), bare in zip(got, LINES, strict=True):
            want, have = _expected(bare, number), _got(row, number)
            if isinstance(want, tuple) and want[0] == "error":
                assert isinstance(have, tuple) and have[0] == "error", (bare, have)
                assert want[1] in have[1], (bare, have)
            else:
                assert have == want, bare


def test_a_bom_and_a_last_line_without_its_end(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n{"b": 2')
    rows = list(iter_rows(path))
    assert rows[0] == (1, {"a": 1})
    assert isinstance(rows[1][1], RowError) and "column 8" in rows[1][1].reason
