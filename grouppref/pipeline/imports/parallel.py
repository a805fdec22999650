"""A large JSON Lines file of a layout of one row per group, imported on several cores, with
the result of the one-process read: the same groups in the same order, the same rejects in the
same order, the same counts and stats (``tests/unit/pipeline/imports/test_parallel.py``).

When: a plain ``.jsonl``/``.ndjson`` file (not compressed, not one JSON list) of a layout in
:data:`~.layouts.ONE_ROW_PER_GROUP`, with ``duplicate_ids`` ``reject_later``, of at least
:data:`~grouppref.readers.lines.RANGE_BYTES` per process; ``workers`` processes (0: one per
core the process may use, at most 8), forked (:mod:`grouppref.runs.processes`; Linux only:
elsewhere the file is read in one process).

How:

1. the file is cut into ranges of whole lines (:func:`~grouppref.readers.lines.split_lines`),
   one per process, and each process reads its range with the layout as the whole file is
   read (its rows keep their numbers), noting each row its grouper sees
   (``Context.seen``); its groups' table goes to an Arrow IPC file, memory-mapped back;
2. in one process, rows of one range depend on rows of another only through the grouper (a
   prompt read again, a prompt id taken for another prompt). So every row the ranges' groupers
   saw is replayed, in file order, through one grouper (:meth:`~.raw_groups.Grouper.replay`)
   and through its range's own; a row whose fate differs (its prompt was first read in an
   earlier range, say) loses what its range made of it and is read again, with the rows that
   decide its fate taken as read at their places (``Context.read_before``), and what that
   read makes of it takes its place (should a row read again meet another fate than in the
   whole file, which a replay checks, the file is read in one process);
3. the ranges' tables are joined in order (a row read again puts its groups back in row
   order), the rejects of reading first and of building after, each in row order, as the
   one-process read gives them.

Memory: each process holds its own range's groups until it writes them; the parent maps the
files, as it would hold the one-process table. Time: the rows read again are read in this
process alone, after their own process built them for nothing. With few of them (prompts
repeated across ranges) that costs nothing to speak of; a file whose later half repeats its
first (8,000 Nectar rows written twice, 83 MB) took 5.6-6.2 s in two processes against
4.5-5.4 s in one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.layouts import ONE_ROW_PER_GROUP, READERS, context, read_range
from grouppref.pipeline.imports.layouts.raw_groups import (
    Context,
    Counts,
    Grouper,
    Imported,
    Seen,
    SeenRows,
    Stop,
)
from grouppref.pipeline.imports.layouts.table import stored_models
from grouppref.readers.lines import LineRange, jsonl_ranges, pick_rows, read_in_parts
from grouppref.readers.rows import Decoding
from grouppref.runs.collector import cycle_collection_paused
from grouppref.runs.stage_run import write_part_file
from grouppref.schemas import Reject

if TYPE_CHECKING:
    import pyarrow as pa


def plan(config: ImportConfig, layout: str, range_bytes: int | None = None
         ) -> list[LineRange] | None:
    """The ranges to read ``config.source`` in, one per process, each of at least
    ``range_bytes`` (:func:`~grouppref.readers.lines.jsonl_ranges`); ``None``: read it in one."""
    if layout not in ONE_ROW_PER_GROUP or config.mapping.duplicate_ids == "reject_all":
        return None
    return jsonl_ranges(str(config.source), config.workers, range_bytes)


@dataclass
class _Part:
    """What one process read from its range (its groups' table in a file of its own)."""

    group_rows: list[int]
    rejects: list[Reject]
    reading: int
    rows: int
    blank: int
    counts: Counts
    seen: SeenRows
    decoding: Decoding


def _read_part(config: ImportConfig, layout: str, stage: str, part: LineRange,
               file: Path) -> _Part:
    source = str(config.source)
    ctx = context(config, layout, source, stage)
    ctx.seen = []
    decoding = Decoding(Path(source))
    with cycle_collection_paused():
        got = read_range(Path(source), part, decoding, ctx)
    write_part_file(got.table, file)
    return _Part(group_rows=got.group_rows, rejects=got.rejects, reading=got.reading,
                 rows=got.rows, blank=got.blank, counts=got.counts, seen=SeenRows.of(ctx.seen),
                 decoding=decoding)


def read_parallel(config: ImportConfig, layout: str, stage: str,
                  ranges: Sequence[LineRange], scratch: Path | None = None) -> Imported | None:
    """``config.source`` read by ``layout``, its ``ranges`` each in a process of its own
    (:func:`~grouppref.readers.lines.read_in_parts`, its files in ``scratch``, a bar of the
    bytes read on stderr); ``None``: the rows could not be put together as one read gives
    them (read the file in one).

    Raises:
        InputFileError: no line of the file decodes as UTF-8.
    """
    source = str(config.source)
    got = read_in_parts(Path(source), ranges, partial(_read_part, config, layout, stage),
                        scratch, progress=stage)
    return _join(context(config, layout, source, stage), [p for p, _ in got],
                 [t for _, t in got])


def _changed(ctx: Context, parts: Sequence[_Part]) -> dict[int, Stop]:
    """The rows whose fate in the whole file differs from their range's: row -> that fate."""
    whole = Grouper(ctx, merge=False).replay(chain.from_iterable(p.seen.tuples()
                                                                 for p in parts))
    out: dict[int, Stop] = {}
    at = len(parts[0].seen)  # the first range's rows meet no earlier row
    for p in parts[1:]:
        alone = Grouper(ctx, merge=False).replay(p.seen.tuples())
        for row, mine, fate in zip(p.seen.rows, alone, whole[at : at + len(p.seen)],
                                   strict=True):
            if mine != fate:
                out[row] = fate
        at += len(p.seen)
    return out


@dataclass
class _Piece:
    """Groups and rejects of some rows, to be put in row order with the others."""

    table: pa.Table
    group_rows: list[int]
    reading: list[Reject]
    building: list[Reject]


def _without(piece: _Piece, rows: set[int]) -> tuple[_Piece, _Piece]:
    """``piece`` without the groups and rejects of ``rows``, and those alone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keep = [r not in rows for r in piece.group_rows]
    mask = pa.array(keep, pa.bool_())
    out = _Piece(piece.table.filter(mask), [r for r in piece.group_rows if r not in rows],
                 [x for x in piece.reading if x.row not in rows],
                 [x for x in piece.building if x.row not in rows])
    gone = _Piece(piece.table.filter(pc.invert(mask)),
                  [r for r in piece.group_rows if r in rows],
                  [x for x in piece.reading if x.row in rows],
                  [x for x in piece.building if x.row in rows])
    return out, gone


def _counts(piece: _Piece) -> Counts:
    """The counts of a piece's groups (but their models), from its columns: what
    :func:`~.layouts.stored.row_stats` counts of their rows."""
    import numpy as np
    import pyarrow.compute as pc

    table = piece.table
    candidates = np.asarray(pc.list_value_length(table.column("candidates")).to_numpy(
        zero_copy_only=False), np.int64)
    rankings = table.column("rankings").combine_chunks()
    flat = pc.list_flatten(rankings)
    tiers = pc.struct_field(flat, "tiers")
    named = np.bincount(np.asarray(pc.list_parent_indices(tiers), np.int64),
                        weights=pc.list_value_length(pc.list_flatten(tiers)).to_numpy(
                            zero_copy_only=False), minlength=len(flat))
    group = np.asarray(pc.list_parent_indices(rankings), np.int64)
    ids = pc.struct_field(pc.struct_field(flat, "annotator"), "id").to_pylist()
    return Counts(candidates=int(candidates.sum()), annotators=Counter(ids),
                  partial=int((named < candidates[group]).sum()),
                  split=sum(n > 1 for n in Counter(piece.group_rows).values()))


def _join(ctx: Context, parts: Sequence[_Part], tables: Sequence[pa.Table]) -> Imported | None:
    """The parts put together as one read of the whole file makes them."""
    import numpy as np
    import pyarrow as pa

    pieces = [_Piece(t, p.group_rows, p.rejects[: p.reading], p.rejects[p.reading :])
              for p, t in zip(parts, tables, strict=True)]
    counts = Counts()
    for p in parts:
        counts.add(p.counts)
    changed = _changed(ctx, parts)
    if changed:
        split = [_without(piece, set(changed)) for piece in pieces]
        pieces = [kept for kept, _ in split]
        for _, gone in split:
            counts.remove(_counts(gone))
        again = _read_again(ctx, changed, {s.row: s for p in parts for s in p.seen})
        if again is None:
            return None
        counts.add(_counts(again))
        pieces.append(again)
    table = pa.concat_tables([p.table for p in pieces])
    group_rows = [r for p in pieces for r in p.group_rows]
    if changed and pieces[-1].group_rows:  # groups read again go back to their rows' places
        order = np.argsort(np.asarray(group_rows, dtype=np.int64), kind="stable")
        table, group_rows = table.take(pa.array(order)), [group_rows[i] for i in order]
    if changed:
        counts.models = stored_models(table)

    def in_order(rejects: list[Reject]) -> list[Reject]:
        return sorted(rejects, key=lambda r: r.row or 0) if changed else rejects

    reading = in_order([r for p in pieces for r in p.reading])
    building = in_order([r for p in pieces for r in p.building])
    read, blank = sum(p.rows for p in parts), sum(p.blank for p in parts)
    return Imported(table=table, group_rows=group_rows, rejects=[*reading, *building],
                    rows=read, blank=blank, stats=counts.stats(ctx, read, blank, table.num_rows),
                    counts=counts, reading=len(reading))


def _read_again(ctx: Context, changed: dict[int, Stop], seen: dict[int, Seen]
                ) -> _Piece | None:
    """The rows ``changed`` read again, as one read of the whole file makes them: after the
    rows that decide their fate (the row whose prompt or id stops them; ``seen``: every row
    the ranges' groupers saw), taken as read before them, their groups and rejects (``None``:
    a row's fate is not the one it has in the whole file)."""
    deciding = sorted({fate[1] for fate in changed.values() if fate is not None} - set(changed))
    again = context(ctx.config, ctx.layout, ctx.source, ctx.stage)
    again.seen, again.read_before = [], [seen[row] for row in deciding]
    got = READERS[ctx.layout](pick_rows(Path(ctx.source), set(changed)), again)
    # the fates the read met: its rows replayed with the deciding rows at their places
    both = sorted([*again.read_before, *again.seen])
    fates = dict(zip([s.row for s in both], Grouper(ctx, merge=False).replay(both),
                     strict=True))
    if any(fates.get(row, fate) != fate for row, fate in changed.items()):
        return None
    return _Piece(got.table, got.group_rows, got.rejects[: got.reading],
                  got.rejects[got.reading :])
