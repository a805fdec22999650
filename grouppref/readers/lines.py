"""A plain (uncompressed) JSON Lines file cut into ranges of whole lines, each read on its own
as :func:`~grouppref.readers.rows.iter_rows` reads the whole file: the same rows, the same
row numbers (a range knows the number of its first line), the same rejects. ``import`` and
``prompts`` read a large file's ranges on several cores (:mod:`grouppref.pipeline.imports.
parallel`, :mod:`grouppref.pipeline.prompts.parallel`).

Lines end at ``\\n`` as Python's binary file iteration cuts them (a ``\\r`` before it stays on
the line), so a cut after a ``\\n`` is a cut between two rows.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from collections.abc import Callable, Collection, Iterator, MutableSequence, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from grouppref.config import UTF8_BOM
from grouppref.readers.rows import Decoding, Row, check_head, jsonl_rows
from grouppref.runs.processes import forked_pool, workers_for
from grouppref.runs.progress import REFRESH_PER_SECOND, bytes_progress
from grouppref.runs.stage_run import read_shard_file

if TYPE_CHECKING:
    import pyarrow as pa

BLOCK = 1 << 20  # bytes read at once to count lines
RANGE_BYTES = 16 << 20  # the least a process reads: below, starting it costs more than it saves
SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class LineRange:
    """Whole lines of a file: bytes ``start`` to ``end``, the first of them row ``first_row``."""

    start: int
    end: int
    first_row: int


def split_lines(path: Path, parts: int) -> list[LineRange]:
    """``path`` cut into at most ``parts`` ranges of about equal size, each cut just after a
    line end (fewer ranges where lines are longer than a part)."""
    size = path.stat().st_size
    cuts = [0]
    with path.open("rb") as fh:
        for i in range(1, parts):
            target = max(size * i // parts, cuts[-1] + 1)
            if target >= size:
                break
            fh.seek(target - 1)
            fh.readline()  # to the end of the line holding byte target - 1
            if fh.tell() >= size:
                break
            cuts.append(fh.tell())
        cuts.append(size)
    # the lines of each range counted at once, in threads (reading and counting let the
    # others run): the first row of each range
    with ThreadPoolExecutor(max(1, len(cuts) - 1)) as pool:
        counts = list(pool.map(partial(_line_ends, path), cuts, cuts[1:]))
    ranges, row = [], 1
    for start, end, count in zip(cuts, cuts[1:], counts, strict=False):
        ranges.append(LineRange(start, end, row))
        row += count
    return ranges


def _line_ends(path: Path, start: int, end: int) -> int:
    """How many ``\\n`` bytes ``start`` to ``end`` of ``path`` hold (counted by numpy, which
    lets other threads run)."""
    import numpy as np

    buffer = bytearray(BLOCK)
    count = 0
    with path.open("rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            got = fh.readinto(memoryview(buffer)[:min(BLOCK, left)])
            if not got:
                break
            count += int(np.count_nonzero(np.frombuffer(buffer, np.uint8, got) == 10))
            left -= got
    return count


def _plain_jsonl(path: Path) -> bool:
    """Whether ``path`` is a plain JSON Lines file: ``.jsonl``/``.ndjson``, not compressed,
    not one JSON list.

    Raises:
        InputFileError: the file is binary or UTF-16/32 (:func:`~.rows.check_head`).
    """
    if not path.is_file() or path.suffix.lower() not in SUFFIXES:
        return False
    check_head(path)  # a binary or UTF-16 file is refused as iter_rows refuses it
    with path.open("rb") as fh:  # a .jsonl file holding one JSON list is read as a list
        return not fh.read(4096).removeprefix(UTF8_BOM).lstrip().startswith(b"[")


def jsonl_ranges(source: str, workers: int, range_bytes: int | None = None
                 ) -> list[LineRange] | None:
    """``source`` cut into one range per process (``workers``, 0: one per core; each range of
    at least ``range_bytes``, default :data:`RANGE_BYTES`), when it is a plain JSON Lines file
    (:func:`_plain_jsonl`) large enough for two; else ``None``: read it in one process.

    Raises:
        InputFileError: the file is binary or UTF-16/32 (:func:`~.rows.check_head`).
    """
    range_bytes = RANGE_BYTES if range_bytes is None else range_bytes
    path = Path(source)
    if not path.is_file() or path.suffix.lower() not in SUFFIXES:
        return None
    parts = workers_for(workers, path.stat().st_size // max(range_bytes, 1))
    if parts < 2 or not _plain_jsonl(path):
        return None
    ranges = split_lines(path, parts)
    return ranges if len(ranges) > 1 else None


def jsonl_file(source: str) -> LineRange | None:
    """The whole of ``source`` as one range, when it is a plain JSON Lines file
    (:func:`_plain_jsonl`); else ``None``.

    Raises:
        InputFileError: the file is binary or UTF-16/32 (:func:`~.rows.check_head`).
    """
    path = Path(source)
    return LineRange(0, path.stat().st_size, 1) if _plain_jsonl(path) else None


# what a forked process of read_in_parts reports: the bytes of each range read so far
# (shared memory, one slot per range, each written by its own process), a range's slot
# found by its start
_READ: tuple[MutableSequence[int], dict[int, int]] | None = None
REPORT_BYTES = 1 << 20  # a process reports its progress each time it has read this much more


def _lines(path: Path, part: LineRange) -> Iterator[bytes]:
    report = _reporter(part)
    size = part.end - part.start
    with path.open("rb") as fh:
        fh.seek(part.start)
        left = reported = size
        for raw in fh:
            if left <= 0:
                break
            left -= len(raw)
            yield raw
            if reported - left >= REPORT_BYTES:
                report(size - left)
                reported = left
    report(size)


def _reporter(part: LineRange) -> Callable[[int], None]:
    """What a process of :func:`read_in_parts` calls with the bytes of ``part`` it has read
    so far (nothing outside such a process)."""
    if _READ is None or part.start not in _READ[1]:
        return lambda read: None
    done, slot = _READ[0], _READ[1][part.start]

    def report(read: int) -> None:
        done[slot] = read
    return report


BLOCK_BYTES = 4 << 20  # about the bytes of whole lines :func:`line_blocks` hands on at once


class LineBlock(NamedTuple):
    """Whole lines of a file (each with its ``\\n``, the file's last perhaps without): the
    number of the first, their bytes, how many."""

    first: int
    data: bytes
    lines: int


def line_blocks(path: Path, part: LineRange, size: int = BLOCK_BYTES) -> Iterator[LineBlock]:
    """The lines of ``part`` in blocks of about ``size`` bytes (a longer line makes a longer
    block), numbered as :func:`range_rows` numbers rows."""
    report = _reporter(part)
    total = part.end - part.start
    row, read, tail = part.first_row, 0, b""
    with path.open("rb") as fh:
        fh.seek(part.start)
        while read < total:
            chunk = fh.read(min(size, total - read))
            if not chunk:  # the file is shorter than when it was cut
                break
            read += len(chunk)
            data = tail + chunk
            cut = len(data) if read >= total else data.rfind(b"\n") + 1
            block, tail = data[:cut], data[cut:]
            if block:
                ends = block.count(b"\n")
                yield LineBlock(row, block, ends + (not block.endswith(b"\n")))
                row += ends
                report(read - len(tail))
        if tail:
            yield LineBlock(row, tail, tail.count(b"\n") + (not tail.endswith(b"\n")))
    report(total)


def range_rows(path: Path, part: LineRange, decoding: Decoding) -> Iterator[tuple[int, Row]]:
    """The rows of ``part``, numbered and rejected as :func:`~grouppref.readers.rows.iter_rows`
    numbers and rejects them, their decoding counted in ``decoding`` (the caller checks the
    whole file's counts)."""
    yield from jsonl_rows(_lines(path, part), path, decoding, part.first_row)


def pick_rows(path: Path, numbers: Collection[int]) -> list[tuple[int, Row]]:
    """The rows of ``path`` numbered ``numbers`` (1-based lines), in order, read as
    :func:`range_rows` reads them."""
    decoding = Decoding(path)
    picked: list[tuple[int, Row]] = []
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if number in numbers:
                picked.extend(jsonl_rows([raw], path, decoding, number))
    return picked


class PartRead(Protocol):
    """What a process returns of its range: at least how its lines decoded."""

    decoding: Decoding


P = TypeVar("P", bound=PartRead)


def read_in_parts(path: Path, ranges: Sequence[LineRange], work: Callable[[LineRange, Path], P],
                  scratch: Path | None = None, progress: str | None = None
                  ) -> list[tuple[P, pa.Table]]:
    """``work(range, file)`` of each of ``ranges`` of ``path``, each in a forked process of
    its own that leaves its table in ``file`` (:func:`~grouppref.runs.stage_run.
    write_part_file`; the files in a new folder in ``scratch``, default the system's
    temporary folder, removed before this returns): the results in range order, each with its
    table memory-mapped back. With ``progress`` (a stage's name) a bar on stderr shows the
    bytes the processes have read (each reports after every :data:`REPORT_BYTES`).

    Raises:
        InputFileError: no line of the file decodes as UTF-8 (:meth:`Decoding.check`, on
            the ranges' counts together).
    """
    global _READ
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    if progress is not None:  # each process counts its range's bytes in its own slot
        done = multiprocessing.get_context("fork").Array("q", len(ranges), lock=False)
        _READ = (done, {part.start: i for i, part in enumerate(ranges)})
    try:
        with tempfile.TemporaryDirectory(prefix="grouppref-parts-", dir=scratch) as folder, \
                forked_pool(len(ranges)) as pool:
            futures = [pool.submit(work, part, Path(os.path.join(folder, f"{i}.arrow")))
                       for i, part in enumerate(ranges)]  # the pool forks at the first
            if progress is not None and _READ is not None:
                _follow(futures, _READ[0], sum(p.end - p.start for p in ranges), progress)
            results = [f.result() for f in futures]
            # mapped, the tables stay readable once their files are gone
            tables = [read_shard_file(Path(folder) / f"{i}.arrow") for i in range(len(ranges))]
    finally:
        _READ = None
    decoding = Decoding(path)
    for result in results:
        decoding.add(result.decoding)
    decoding.check()
    return list(zip(results, tables, strict=True))


def _follow(futures: Sequence[Future[Any]], done: Sequence[int], total: int, name: str) -> None:
    """A bar of the bytes ``done`` of ``total`` (:func:`~grouppref.runs.progress.
    bytes_progress`, started after the processes were forked) until every future is done."""
    with bytes_progress() as bar:
        task = bar.add_task(name, total=total)
        pending: Collection[Future[Any]] = futures
        while pending:
            pending = wait(pending, timeout=1 / REFRESH_PER_SECOND).not_done
            bar.update(task, completed=sum(done))
