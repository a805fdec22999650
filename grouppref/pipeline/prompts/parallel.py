"""A large JSON Lines prompt file read on several cores, with the result of the one-process
read (:func:`~grouppref.readers.prompts.read_prompts`): the same prompts in the same order,
the same rejects in the same order, the same counts
(``tests/unit/pipeline/prompts/test_prompts_parallel.py``).

When: a plain ``.jsonl``/``.ndjson`` file large enough for two ranges
(:func:`~grouppref.readers.lines.jsonl_ranges`), no ``limit``, ``duplicate_ids``
``reject_later``; ``workers`` processes (0: one per core, at most 8; Linux only).

How: each process makes the prompts of its range of lines
(:func:`~grouppref.readers.prompts.make_prompts`: a row's prompt depends on that row alone)
and leaves them as an Arrow table in a file; this process then takes them in row order
through one :class:`~grouppref.readers.prompts.OnePerPrompt`, as the one-process read does:
a prompt repeated, or an id taken, in any earlier row is a reject.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from grouppref.errors import RowError
from grouppref.pipeline.prompts.config import STAGE, PromptsConfig
from grouppref.readers.lines import LineRange, jsonl_ranges, range_rows, read_in_parts
from grouppref.readers.prompts import Made, OnePerPrompt, make_prompts
from grouppref.readers.rows import Decoding, ReadResult, to_reject
from grouppref.runs.collector import cycle_collection_paused
from grouppref.runs.stage_run import write_part_file
from grouppref.schemas import Prompt, Reject

if TYPE_CHECKING:
    import pyarrow as pa


def plan(config: PromptsConfig, range_bytes: int | None = None) -> list[LineRange] | None:
    """The ranges to read ``config.source`` in, one per process; ``None``: read it in one."""
    if config.limit is not None or config.mapping.duplicate_ids == "reject_all":
        return None
    return jsonl_ranges(str(config.source), config.workers, range_bytes)


@dataclass
class PromptsRead:
    """The prompts of a file as an Arrow table of ``Prompt`` rows, in row order; the rejects,
    in row order; the rows read (blank lines included) and the blank lines."""

    table: pa.Table
    rejects: list[Reject]
    rows: int
    blank: int


@dataclass
class _Part:
    """One process's range: each prompt made (row, id, content key), in order, with its row
    in the range's table; the rows that made none, as rejects."""

    made: list[tuple[int, str, str]]
    rejects: list[Reject]
    counts: ReadResult[None]
    decoding: Decoding


def _read_part(config: PromptsConfig, part: LineRange, file: Path) -> _Part:

    from grouppref.schemas.arrow import to_table

    source = str(config.source)
    counts: ReadResult[None] = ReadResult(source=source, items=[])
    decoding = Decoding(Path(source))
    prompts: list[Prompt] = []
    made: list[tuple[int, str, str]] = []
    rejects: list[Reject] = []
    with cycle_collection_paused():
        for got in make_prompts(range_rows(Path(source), part, decoding), config.mapping,
                                source, STAGE, counts):
            if isinstance(got, Made):
                prompts.append(got.prompt)
                made.append((got.row, got.prompt.prompt_id, got.content))
            else:
                rejects.append(got)
        table = to_table(prompts, Prompt)
    write_part_file(table, file)
    return _Part(made=made, rejects=rejects, counts=counts, decoding=decoding)


def read_parallel(config: PromptsConfig, ranges: Sequence[LineRange], scratch: Path
                  ) -> PromptsRead:
    """The prompts of ``config.source``, its ``ranges`` each read in a process of its own
    (:func:`~grouppref.readers.lines.read_in_parts`, its files in ``scratch``, a bar of the
    bytes read on stderr).

    Raises:
        InputFileError: no line of the file decodes as UTF-8, or the file holds no rows.
    """
    import pyarrow as pa

    source = str(config.source)
    got = read_in_parts(Path(source), ranges, partial(_read_part, config), scratch,
                        progress="prompts")
    parts = [p for p, _ in got]
    counts: ReadResult[None] = ReadResult(source=source, items=[])
    for p in parts:
        counts.rows, counts.blank = counts.rows + p.counts.rows, counts.blank + p.counts.blank
    counts.require_rows()
    kept, rejects = _in_row_order(config, parts)
    table = pa.concat_tables([t for _, t in got])
    if len(kept) < table.num_rows:
        table = table.take(pa.array(kept, pa.int64()))
    return PromptsRead(table=table, rejects=rejects, rows=counts.rows, blank=counts.blank)


def _in_row_order(config: PromptsConfig, parts: Sequence[_Part]) -> tuple[list[int], list[Reject]]:
    """The prompts the file may hold (their places in the parts' tables, joined) and every
    reject, taking each row's outcome in row order."""
    admitted = OnePerPrompt(config.mapping, str(config.source), STAGE)
    kept: list[int] = []
    rejects: list[Reject] = []
    at = 0
    for p in parts:
        outcomes = heapq.merge(((r.row or 0, i, None) for i, r in enumerate(p.rejects)),
                               ((m[0], i, m) for i, m in enumerate(p.made)))
        for row, i, made in outcomes:
            if made is None:
                rejects.append(p.rejects[i])
                continue
            try:
                admitted.admit(made[1], made[2], row)
            except RowError as err:
                rejects.append(to_reject(STAGE, err))
                continue
            kept.append(at + i)
        at += len(p.made)
    return kept, rejects
