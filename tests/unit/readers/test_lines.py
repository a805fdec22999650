"""A JSON Lines file cut into ranges (``split_lines``, its lines counted in threads) and a
range cut into blocks of whole lines (``line_blocks``): every byte once, in order, each block
numbered as the rows of its first line."""

from __future__ import annotations

from pathlib import Path

import pytest

from grouppref.readers.lines import line_blocks, split_lines


@pytest.mark.parametrize("tail", [b"\n", b"", b"\n\n"])
@pytest.mark.parametrize("size", [1, 7, 50, 1 << 20])
def test_blocks_of_whole_lines_cover_each_range_numbered_as_its_rows(
        tmp_path: Path, tail: bytes, size: int) -> None:
    lines = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * (i * 7 % 40)) for i in range(60)]
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"\n".join(lines[:30]) + b"\n\n" + b"\n".join(lines[30:]) + tail)
    data = path.read_bytes()
    ranges = split_lines(path, 3)
    assert [r.first_row for r in ranges] == [
        data[:r.start].count(b"\n") + 1 for r in ranges]
    for part in ranges:
        blocks = list(line_blocks(path, part, size))
        assert b"".join(b.data for b in blocks) == data[part.start:part.end]
        for block in blocks[:-1]:
            assert block.data.endswith(b"\n")  # whole lines
        row = part.first_row
        for block in blocks:
            assert block.first == row
            assert block.lines == len(block.data.split(b"\n")) - block.data.endswith(b"\n")
            row += block.data.count(b"\n")
