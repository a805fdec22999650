"""The rankings of a stage's stored rows encoded column-wise (issue 32): the tensors
:func:`~.parse.encode_rankings` and :func:`~.parse.encode_design` make of the records, made
from the Arrow columns (lists flattened, ids dictionary-encoded) with no loop over rows.

:func:`encode_columns` checks on the way, for all rows at once, what the encoding relies on
and gives ``None`` when a row breaks it (a row a stage wrote wrongly, left to the records'
validation): candidate ids unique in a group and K in range, each ranking of its row's group
and by another annotator than the group's other rankings, naming known candidates at most
once, in non-empty tiers; a null where a record has a value is left to the records too.
Annotators are indexed in order of first appearance (row by row, ranking by ranking), as
:func:`~.parse.collect_groups` indexes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from grouppref.pipeline.aggregate.config import SELECTION_KEY
from grouppref.pipeline.aggregate.parse import selection_code
from grouppref.schemas.records import MAX_K, MIN_K, AnnotatorKind


@dataclass(frozen=True)
class Encoding:
    """The rankings of ``B`` rows as arrays (``A`` ranking slots, ``K`` candidates): ``ranks``
    ``(B, A, K)``, ``ann`` ``(B, A)``, ``valid`` ``(B, K)``, ``design`` ``(B, A)`` as
    :class:`~.parse.Encoded` holds them; ``annotators`` and ``kinds`` in order of first
    appearance; ``marked``: selection marker -> groups with a ranking so marked."""

    ranks: np.ndarray
    ann: np.ndarray
    valid: np.ndarray
    design: np.ndarray
    annotators: list[str]
    kinds: list[AnnotatorKind]
    marked: dict[str, int]


def _lengths(lists: pa.Array) -> np.ndarray:
    """``(n,)`` int64: each list's length (a null list: 0)."""
    return pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(
        np.int64)


def _parents(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(parent, position)``, each ``(sum lengths,)``: the list of every flattened value and
    its position in it."""
    parent = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return parent, np.arange(len(parent)) - starts[parent]


def _repeats(key: np.ndarray) -> bool:
    """Whether any value of ``key`` (``(n,)`` non-negative ints) occurs twice."""
    return bool(len(key)) and int(np.bincount(key).max()) > 1


def candidate_ids(candidates: pa.ChunkedArray) -> pa.ListArray:
    """``(B,)`` ``list<string>``: the candidate ids of each row of a ``candidates`` column
    (``list<struct<candidate_id, ...>>``), in one chunk, without copying the rest (texts)."""
    chunks = []
    for chunk in candidates.chunks:
        offsets = chunk.offsets.to_numpy()
        ids = pc.struct_field(chunk.flatten(), "candidate_id")
        chunks.append(pa.ListArray.from_arrays(pa.array(offsets - offsets[0]), ids,
                                               mask=chunk.is_null()))
    if not chunks:
        return pa.array([], pa.list_(pa.string()))
    return pa.concat_arrays(chunks)


def _candidates(candidates: pa.ListArray, k: int) -> tuple[np.ndarray, pa.Array] | None:
    """``(positions, ids)``: ``(B, k)`` bool, the real candidates of each row, and the
    ``(sum K,)`` candidate ids in row order (``candidates``: :func:`candidate_ids`);
    ``None``: a null, or a K out of range."""
    if candidates.null_count:
        return None
    lengths = _lengths(candidates)
    if len(lengths) and not (MIN_K <= lengths.min() and lengths.max() <= MAX_K):
        return None
    ids = candidates.flatten()
    if ids.null_count:
        return None
    row, pos = _parents(lengths)
    valid = np.zeros((len(lengths), k), dtype=bool)
    valid[row, pos] = True
    return valid, ids


def _marks(metadata: pa.Array, row: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """``(codes, marked)``: the design code of each ranking (``(R,)``, from its metadata's
    ``selection``, as :func:`selection_code` gives it) and how many rows have a ranking marked
    with each string marker (each distinct metadata text is parsed once)."""
    coded = pc.dictionary_encode(metadata)
    texts = coded.dictionary.to_pylist()
    markers = [None if not m or m == "{}" else json.loads(m).get(SELECTION_KEY) for m in texts]
    index = coded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    table = np.array([selection_code(m) for m in markers] + [selection_code(None)], np.int64)
    codes = table[index]  # index -1 (null metadata): the last entry, unmarked
    names = list(dict.fromkeys(m for m in markers if isinstance(m, str)))
    name_of = np.array([names.index(m) if isinstance(m, str) else -1 for m in markers] + [-1],
                       np.int64)[index]
    on = name_of >= 0
    pairs = np.unique(row[on] * max(len(names), 1) + name_of[on])
    counts = np.bincount(pairs % max(len(names), 1), minlength=len(names))
    return codes, {m: int(c) for m, c in zip(names, counts.tolist(), strict=True) if c}


def _tier_entries(tiers: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array] | None:
    """``(ranking, tier, ids)``, each ``(E,)``: every candidate id the ``(R,)`` rankings' tiers
    name, with its ranking and tier index; ``None``: a null or an empty tier."""
    if tiers.null_count:
        return None
    lists = tiers.flatten()
    lengths = _lengths(lists)
    if lists.null_count or (lengths == 0).any():
        return None
    ranking, tier = _parents(_lengths(tiers))
    ids = lists.flatten()
    if ids.null_count:
        return None
    entry = np.repeat(np.arange(len(lengths)), lengths)
    return ranking[entry], tier[entry], ids


def _positions(cand_ids: pa.Array, valid: np.ndarray, row: np.ndarray, ids: pa.Array
               ) -> np.ndarray | None:
    """``(E,)`` the position among its row's candidates of each id ``ids`` (``(E,)``, of rows
    ``row``), matched through one dictionary of every id; ``None``: an id the row does not
    have, or a row whose candidate ids repeat."""
    coded = pc.dictionary_encode(pa.concat_arrays([cand_ids, ids]))
    codes = coded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    table = np.full(valid.shape, -1, dtype=np.int64)
    table[valid] = codes[: len(cand_ids)]  # row-major: each row's candidates in order
    ordered = np.sort(table, axis=1)
    if ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any():
        return None
    hit = table[row] == codes[len(cand_ids):, None]
    if not hit.any(1).all():
        return None
    return hit.argmax(1)


def _annotators(flat: pa.Array, row: np.ndarray
                ) -> tuple[np.ndarray, list[str], list[AnnotatorKind]] | None:
    """``(index, annotators, kinds)``: the annotator index of each of the ``(R,)`` rankings
    ``flat`` (rows ``row``), ids and kinds in order of first appearance; ``None``: a null,
    or an annotator ranking a row twice."""
    ids = pc.struct_field(flat, ["annotator", "id"])
    kinds = pc.struct_field(flat, ["annotator", "kind"])
    if ids.null_count or kinds.null_count:
        return None
    coded = pc.dictionary_encode(ids)  # codes in order of first appearance
    index = coded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(coded.dictionary)
    if _repeats(row * max(n, 1) + index):
        return None
    first = np.unique(index, return_index=True)[1]
    return index, coded.dictionary.to_pylist(), kinds.take(pa.array(first)).to_pylist()


def encode_columns(group_ids: pa.Array, candidates: pa.ListArray, rankings: pa.Array | None,
                   k: int, a: int) -> Encoding | None:
    """The ``(B,)`` rows' rankings encoded (``k``, ``a``: the most candidates and rankings of
    a row), from their ``group_id``, candidate ids (:func:`candidate_ids`) and ``rankings``
    columns (one chunk each; ``rankings`` ``None``: the table has none); ``None`` when a row
    breaks what the encoding relies on (module docstring)."""
    b = len(group_ids)
    made = _candidates(candidates, k)
    if made is None:
        return None
    valid, cand_ids = made
    ranks = np.full((b, a, k), -1, dtype=np.int64)
    ann = np.full((b, a), -1, dtype=np.int64)
    design = np.full((b, a), selection_code(None), dtype=np.int64)
    if rankings is None or len(flat := rankings.flatten()) == 0:
        return Encoding(ranks, ann, valid, design, [], [], {})
    if flat.null_count:
        return None
    row, slot = _parents(_lengths(rankings))
    if not pc.all(pc.equal(pc.struct_field(flat, "group_id"),
                           group_ids.take(pa.array(row)))).as_py():
        return None  # a null group id makes the test null: not True
    who = _annotators(flat, row)
    entries = _tier_entries(pc.struct_field(flat, "tiers"))
    if who is None or entries is None:
        return None
    ranking, tier, ids = entries
    pos = _positions(cand_ids, valid, row[ranking], ids)
    if pos is None or _repeats(ranking * k + pos):
        return None
    ranks[row[ranking], slot[ranking], pos] = tier
    ann[row, slot] = who[0]
    design[row, slot], marked = _marks(pc.struct_field(flat, "metadata"), row)
    return Encoding(ranks, ann, valid, design, who[1], who[2], marked)
