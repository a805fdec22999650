"""Layout ``nectar`` read over Arrow columns: the groups of a JSON Lines file of Nectar rows,
block by block of lines, with the result of :func:`.nectar.read` on the same rows (the same
groups, bytes, rejects, counts and stats; ``tests/unit/pipeline/imports/
test_nectar_columns.py``).

Why: read row by row, every value of a Nectar row passes through Python objects (the row's
dict, the prompt's model, a response and a list entry per answer, the table's lists), five
times pyarrow's own read and write of the file. Here a block of lines is parsed by
``pyarrow.json`` into columns; the answers' texts and models go into the stored table as the
parser left them, the ranks are ordered and the texts' non-space characters counted over whole
columns (numpy), and Python is left with what only it does per group: the transcript's turns,
the content key, the hashed ids.

A row is read so only where it is sure to make a group, and the group :func:`.nectar.read`
makes of it: its prompt a transcript of non-empty turns, 2 (``min_k``) to 16 answers, each
with a text and a finite rank, no two ranks tied (ties within 1e-9 make tiers), no text blank
and no two texts one after folding (:func:`~grouppref.schemas.texts.duplicate_keys`), its
candidate ids distinct, its prompt new to the grouper (:meth:`~.raw_groups.Grouper.claim`).
Any other row is read as ever, alone, in its place (:class:`~.raw_groups.RowReader`), so its
reject is the one it always had; a whole block is read as ever where its parse could differ
from ``json.loads`` of its lines (the parse fails, a blank line, a byte-order mark, a line
that is not one object, a column of another type than Nectar's).

When: the settings are Nectar's own (:func:`applies`); the source is a plain JSON Lines file
(:func:`grouppref.readers.lines.jsonl_file`), in one process or in parts
(:mod:`..parallel`).
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring  # json.dumps's, not ASCII-only
from pathlib import Path
from typing import TYPE_CHECKING

from grouppref.config import UTF8_BOM
from grouppref.pipeline.imports.layouts import nectar
from grouppref.pipeline.imports.layouts.build import TIED, UNKNOWN_TIME, Built
from grouppref.pipeline.imports.layouts.keys import candidate_ids_of_utf8
from grouppref.pipeline.imports.layouts.raw_groups import Context, Imported, RowReader, Seen
from grouppref.pipeline.imports.layouts.stored import (
    KINDS,
    PLAIN_ID,
    PROMPT_BY_HAND,
    time_text,
)
from grouppref.pipeline.imports.layouts.table import (
    candidates_array,
    prompts_array,
    rankings_array,
    stored_models,
    stored_table,
)
from grouppref.pipeline.imports.layouts.transcript import hh_pairs
from grouppref.readers.lines import BLOCK_BYTES, LineBlock, LineRange, line_blocks
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.rows import Decoding, jsonl_rows
from grouppref.schemas import MAX_K
from grouppref.schemas.records import group_id_of, prompt_content_key
from grouppref.schemas.texts import ASCII_SPACE, duplicate_keys, kept_chars

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

_BLANK = re.compile(rb"\n[ \t\r]*\n")  # a line of JSON whitespace (pyarrow skips it)


def applies(ctx: Context) -> bool:
    """Whether the columnar read gives ``ctx``'s result: Nectar's columns, keys and
    transcripts, no row taken as read before (a read again, :mod:`..parallel`)."""
    config = ctx.config
    return (ctx.layout == "nectar" and PROMPT_BY_HAND and config.transcripts
            and ctx.text_key == "answer" and config.rank_key == "rank"
            and config.model_key == "model" and not ctx.read_before
            and ctx.mapping == ColumnMapping(**nectar.DEFAULTS["mapping"])
            and ctx.kind in KINDS and PLAIN_ID.fullmatch(ctx.annotator) is not None)


def _parse(block: LineBlock) -> pa.Table | None:
    """The block's rows as ``pyarrow.json`` reads them, where that is one row per line and
    the values ``json.loads`` gives (``None``: read the lines as ever). pyarrow skips a blank
    line and a byte-order mark that starts its input (elsewhere a mark fails the parse), so
    a block with either is read as ever."""
    import pyarrow as pa
    import pyarrow.json as pj

    data = block.data
    head, last = data[:data.find(b"\n") + 1] or data, data[data.rfind(b"\n") + 1:]
    if data.startswith(UTF8_BOM) or _BLANK.search(data) or not head.strip() or (
            last and not last.strip()):
        return None
    try:
        table = pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(
            use_threads=False, block_size=len(data) + 1))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # not JSON pyarrow reads (an
        return None  # error, or a value it has no conversion for): the rows read as ever
    return table if table.num_rows == block.lines else None


@dataclass
class _Answers:
    """A block's answers, flattened: the row of each, its text, model and rank."""

    row: np.ndarray  # int64, the row (in the block) of each answer
    texts: pa.Array
    models: pa.Array
    ranks: np.ndarray  # float64, NaN where there is none
    count: np.ndarray  # int64 per row: how many answers


_NUMBER = ("int64", "double")


def _answers(table: pa.Table) -> _Answers | None:
    """The block's answers (``None``: a column of another type than Nectar's)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if "answers" not in table.column_names:
        return None
    column = table.column("answers").combine_chunks()
    kind = column.type
    if not pa.types.is_list(kind) or not pa.types.is_struct(kind.value_type):
        return None
    item = kind.value_type
    names = [item.field(i).name for i in range(item.num_fields)]
    if "answer" not in names or "rank" not in names or len(set(names)) != len(names) or (
            item.field("answer").type != pa.string()
            or str(item.field("rank").type) not in _NUMBER
            or ("model" in names and item.field("model").type not in (pa.string(), pa.null()))):
        return None
    flat = pc.list_flatten(column)
    n = len(flat)
    models = pc.struct_field(flat, "model") if "model" in names else pa.nulls(n, pa.string())
    if models.type != pa.string():
        models = pa.nulls(n, pa.string())
    ranks = _floats(pc.struct_field(flat, "rank"))
    # a missing answer object, text or rank: the row is read as ever
    missing = pc.or_(pc.is_null(flat), pc.is_null(pc.struct_field(flat, "answer")))
    row = np.asarray(pc.list_parent_indices(column), np.int64)
    count = np.diff(np.frombuffer(column.buffers()[1], np.int32)[
        column.offset:column.offset + len(column) + 1]).astype(np.int64)
    count[np.asarray(column.is_null(), bool)] = -1
    bad = np.bincount(row[np.asarray(missing, bool)], minlength=len(column)) > 0
    return _Answers(row=row, texts=pc.struct_field(flat, "answer"), models=models,
                    ranks=np.where(bad[row], np.nan, ranks),
                    count=count)


def _floats(values: pa.Array) -> np.ndarray:
    """A numeric column as float64, NaN for a null."""
    import numpy as np
    import pyarrow as pa

    width = {pa.float64(): np.float64, pa.int64(): np.int64}[values.type]
    out = np.frombuffer(values.buffers()[1], width)[values.offset:values.offset + len(values)]
    out = out.astype(np.float64)
    if values.null_count:
        out[np.asarray(values.is_null(), bool)] = np.nan
    return out


# each byte as 1 where it is ASCII whitespace (str.split's), else 0 (for bytes.translate)
_SPACES = bytes(int(c in ASCII_SPACE) for c in range(256))


def _spaces(body: bytes, ends: np.ndarray) -> np.ndarray:
    """How many ASCII whitespace bytes each text (``body[ends[i]:ends[i + 1]]``) holds."""
    import numpy as np

    marked = np.frombuffer(body.translate(_SPACES), np.uint8)
    out = np.zeros(len(ends) - 1, np.int64)
    filled = np.flatnonzero(np.diff(ends) > 0)  # the segments of the others are empty
    if len(filled):
        out[filled] = np.add.reduceat(marked, ends[filled], dtype=np.int32)
    return out


def _kept(texts: pa.Array) -> np.ndarray:
    """:func:`~grouppref.schemas.texts.kept_chars` of every text: its non-space ASCII bytes,
    counted over the column; a text with other bytes counted in Python."""
    import numpy as np

    _, offsets_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[texts.offset:texts.offset + len(texts) + 1]
    start, end = int(offsets[0]), int(offsets[-1])
    body = memoryview(data_buffer)[start:end].tobytes() if data_buffer is not None else b""
    ends = (offsets - start).astype(np.int64)
    counts = np.diff(ends) - _spaces(body, ends)
    if not body.isascii():
        import pyarrow.compute as pc

        wide = np.flatnonzero(~np.asarray(pc.string_is_ascii(texts), bool))
        for i, text in zip(wide.tolist(), texts.take(wide).to_pylist(), strict=True):
            counts[i] = kept_chars(text)
    return counts


@dataclass
class _Lane:
    """The rows of a block read over its columns: their stored rows (``table``, in row
    order), the block's index of each, and each one's content key and prompt id."""

    table: pa.Table
    rows: list[int]
    keys: list[str]
    prompt_ids: list[str]


def _metadata_columns(table: pa.Table) -> dict[str, list[object]] | None:
    """Nectar's metadata columns the block has, as values (``None``: one of another type
    than a JSON int, bool or string, which the models could change or refuse)."""
    import pyarrow as pa

    out: dict[str, list[object]] = {}
    for name in nectar.METADATA:
        if name in table.column_names:
            column = table.column(name)
            if column.type not in (pa.int64(), pa.bool_(), pa.string(), pa.null()):
                return None
            out[name] = column.to_pylist()
    return out


def _sure_rows(table: pa.Table, answers: _Answers, min_k: int) -> np.ndarray:
    """Rows whose columns are sure to make a group so far: a prompt, ``min_k`` to 16
    answers, each with a text and a finite rank, no two ranks within :data:`TIED`."""
    import numpy as np

    row, ranks, count = answers.row, answers.ranks, answers.count
    ok = (count >= min_k) & (count <= MAX_K)
    ok &= ~np.asarray(table.column("prompt").is_null(), bool)
    bad = ~np.isfinite(ranks)
    order = np.lexsort((ranks, row))
    tied = (row[order][1:] == row[order][:-1]) & (np.abs(np.diff(ranks[order])) <= TIED)
    ok[row[bad]] = False
    ok[row[order][1:][tied]] = False
    return ok


def _collide(row: np.ndarray, kept: np.ndarray, ok: np.ndarray) -> set[int]:
    """Rows with two texts of as many non-space characters (they may be one text after
    folding), after leaving out rows with a blank text."""
    import numpy as np

    ok[row[kept == 0]] = False
    order = np.lexsort((kept, row))
    same = (row[order][1:] == row[order][:-1]) & (kept[order][1:] == kept[order][:-1])
    return set(row[order][1:][same].tolist())


def _json_value(value: object) -> str:
    """An int, bool or string as ``json_text`` writes it."""
    if type(value) is bool:
        return "true" if value else "false"
    return str(value) if type(value) is int else encode_basestring(value)  # type: ignore[arg-type]


def _metadata_texts(metadata: dict[str, list[object]], n: int) -> list[str]:
    """``json_text`` of each of the block's ``n`` rows' metadata (ints, bools and strings;
    a null left out), made column by column."""
    columns = [[None if v is None else f'"{name}": {_json_value(v)}' for v in metadata[name]]
               for name in sorted(metadata)]
    if not columns:
        return ["{}"] * n
    return ["{" + ", ".join(p for p in row if p is not None) + "}"
            for row in zip(*columns, strict=True)]


@dataclass
class _Made:
    """What Python makes of the lane's rows, one at a time (:func:`_python_rows`)."""

    rows: list[int]
    keys: list[str]
    prompt_ids: list[str]
    ids: list[str]
    roles: list[str]
    contents: list[str]
    message_offsets: list[int]
    metadata: list[str]


def _utf8(texts: pa.Array) -> tuple[memoryview, list[int]]:
    """A string column's bytes and the offset of each text in them (one more than texts)."""
    import numpy as np

    _, offsets, data = texts.buffers()
    spans = np.frombuffer(offsets, np.int32)[texts.offset:texts.offset + len(texts) + 1]
    return (memoryview(data) if data is not None else memoryview(b"")), spans.tolist()


def _python_rows(ok: np.ndarray, prompts: list[str], texts: pa.Array, kept: np.ndarray,
                 starts: list[int], collide: set[int], metadata: dict[str, list[object]]
                 ) -> _Made:
    """Each ``ok`` row's turns, content key, ids and metadata; a row whose transcript has an
    empty turn (or none), two texts one after folding or two ids alike is no longer ``ok``."""
    import numpy as np

    made = _Made([], [], [], [], [], [], [0], [])
    meta = _metadata_texts(metadata, len(prompts))
    data, spans = _utf8(texts)
    for i in np.flatnonzero(ok).tolist():
        pairs = hh_pairs(prompts[i])
        if not pairs or not all(content for _, content in pairs):
            ok[i] = False
            continue
        first, end = starts[i], starts[i + 1]
        if i in collide:
            keys = duplicate_keys(texts.slice(first, end - first).to_pylist(),
                                  kept[first:end].tolist())
            if keys is not None and ("" in keys or len(set(keys)) != len(keys)):
                ok[i] = False
                continue
        key = prompt_content_key(None, pairs)
        gid = group_id_of(key)
        ids = candidate_ids_of_utf8(gid, data, spans[first:end + 1])
        if len(set(ids)) != len(ids):
            ok[i] = False
            continue
        made.ids.extend(ids)
        for role, content in pairs:
            made.roles.append(role)
            made.contents.append(content)
        made.message_offsets.append(len(made.roles))
        made.metadata.append(meta[i])
        made.rows.append(i)
        made.keys.append(key)
        made.prompt_ids.append("p-" + gid[2:])
    return made


def _lane(table: pa.Table, ctx: Context) -> _Lane | None:
    """The rows of a parsed block that make their groups over columns (``None``: none, the
    block is read as ever)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    mapping = ctx.mapping
    names = table.column_names
    if "prompt" not in names or table.column("prompt").type != pa.string() or any(
            c in names for c in (mapping.prompt_id, mapping.messages, mapping.reference,
                                 mapping.metadata)):
        return None
    answers, metadata = _answers(table), _metadata_columns(table)
    if answers is None or metadata is None:
        return None
    ok = _sure_rows(table, answers, ctx.config.min_k)
    kept = _kept(answers.texts)
    collide = _collide(answers.row, kept, ok)
    starts = np.concatenate([[0], np.cumsum(np.maximum(answers.count, 0))]).tolist()
    made = _python_rows(ok, table.column("prompt").to_pylist(), answers.texts, kept, starts,
                        collide, metadata)
    if not made.rows:
        return None
    n = len(made.rows)
    mask = ok[answers.row]
    place = np.cumsum(ok) - 1  # block row -> its place in the lane
    order = np.lexsort((answers.ranks[mask], place[answers.row[mask]]))
    offsets = pa.array(np.concatenate([[0], np.cumsum(answers.count[ok])]), pa.int32())
    ids = pa.array(made.ids, pa.string())
    group_ids = pa.array(["g-" + p[2:] for p in made.prompt_ids], pa.string())
    none = pa.nulls(n, pa.string())
    selected = None if mask.all() else pa.array(mask)  # all rows: the columns as parsed
    return _Lane(stored_table(
        group_ids,
        prompts_array(pa.array(made.prompt_ids, pa.string()),
                      pa.array(made.message_offsets, pa.int32()),
                      pa.array(made.roles, pa.string()), pa.array(made.contents, pa.string()),
                      None, none, none, pa.array(made.metadata, pa.string())),
        candidates_array(offsets, ids,
                         answers.texts if selected is None else pc.filter(answers.texts, selected),
                         answers.models if selected is None else pc.filter(answers.models,
                                                                           selected)),
        rankings_array(pa.array(np.arange(n + 1), pa.int32()), pa.repeat(ctx.annotator, n),
                       pa.repeat(ctx.kind, n), group_ids, offsets,
                       pa.array(np.arange(len(made.ids) + 1), pa.int32()), ids.take(order),
                       none, none, pa.repeat(time_text(UNKNOWN_TIME), n))),
        made.rows, made.keys, made.prompt_ids)


class _Reader:
    """Blocks of lines read into ``built``: over columns where the block allows, each other
    row by ``reader`` in its place."""

    def __init__(self, path: Path, decoding: Decoding, ctx: Context) -> None:
        self.path, self.decoding, self.ctx = path, decoding, ctx
        self.built = Built(ctx)
        self.reader = RowReader(ctx, nectar.read_row, merge=False, final=self.built.add_raw)

    def lines(self, lines: Iterator[bytes] | list[bytes], first: int) -> None:
        """Lines read as ever, the first numbered ``first``."""
        for number, row in jsonl_rows(lines, self.path, self.decoding, first):
            self.reader.take(number, row)

    def block(self, whole: LineBlock) -> None:
        """A block of whole lines."""
        block, first = whole.data, whole.first
        table = _parse(whole)
        lane = _lane(table, self.ctx) if table is not None else None
        if lane is None:
            self.lines(io.BytesIO(block), first)
            return
        assert table is not None
        lines: list[bytes] = []  # the block's lines (as a file gives them), cut when needed
        grouper, run, at = self.reader.grouper, 0, 0  # lane rows [run, at) not added yet
        for i in range(table.num_rows):
            if at < len(lane.rows) and lane.rows[at] == i:
                self.reader.release()
                key = lane.keys[at]
                at += 1
                if grouper.claim(Seen(first + i, key, lane.prompt_ids[at - 1], key)):
                    continue
                self._add(lane, run, at - 1, first)
            else:
                self._add(lane, run, at, first)
            run = at
            lines = lines or io.BytesIO(block).readlines()
            self.lines([lines[i]], first + i)
        self._add(lane, run, at, first)

    def _add(self, lane: _Lane, start: int, end: int, first: int) -> None:
        """Lane rows ``start`` to ``end`` (claimed) as groups, in their place."""
        if end <= start:
            return
        import pyarrow.compute as pc

        table = lane.table.slice(start, end - start)
        self.built.add_table(table, [first + r for r in lane.rows[start:end]],
                             Counter({self.ctx.annotator: end - start}),
                             int(pc.sum(pc.list_value_length(table.column("candidates")))
                                 .as_py()), stored_models(table))
        self.reader.out.rows += end - start
        self.decoding.good += end - start


def read_range(path: Path, part: LineRange, decoding: Decoding, ctx: Context,
               block_bytes: int = BLOCK_BYTES) -> Imported:
    """The lines ``part`` of the JSON Lines file ``path`` read as :func:`.nectar.read` reads
    their rows (``ctx``: :func:`applies`), their decoding counted in ``decoding``, in blocks of
    about ``block_bytes``."""
    reader = _Reader(path, decoding, ctx)
    for block in line_blocks(path, part, block_bytes):
        reader.block(block)
    return reader.built.imported(reader.reader.collected())
