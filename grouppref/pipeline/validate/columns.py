"""Checks of Arrow columns for :mod:`grouppref.pipeline.validate.batch`: masks over rows, checks
of items of list columns charged to their rows, ids as integer codes, JSON and datetime texts
checked once per distinct text. Each check is conservative: ``True`` only where the value
certainly passes the record's own (pydantic) validation."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

# the characters str.isspace() holds true (Py_UNICODE_ISSPACE): a text made only of these is
# blank to NonBlank's ``s.strip()``; tests/unit/test_validate_batch.py checks every code point
SPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
         "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_NOT_SPACE = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in SPACE) + "]"
_ID = r"^[!-~]{1,256}$"
INT64 = 2**63


def as_mask(values: Any) -> np.ndarray:
    """A boolean Arrow array (or numpy array) as numpy, null read as ``False``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, np.ndarray):
        return values.astype(bool, copy=False)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.null_count:  # a call per mask: skipped when there is nothing to fill
        values = pc.fill_null(values, False)
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=bool)


class Verdict:
    """Which of ``n`` rows are still sound; checks on rows or on items (values of a list
    column, each with its row) clear the rows they fail."""

    def __init__(self, n: int) -> None:
        self.ok = np.ones(n, dtype=bool)

    def rows(self, good: Any) -> None:
        self.ok &= as_mask(good)

    def items(self, parents: np.ndarray, good: Any) -> None:
        self.ok[parents[~as_mask(good)]] = False

    def where(self, parents: np.ndarray, bad: np.ndarray) -> None:
        self.ok[parents[bad]] = False


def not_null(arr: pa.Array) -> np.ndarray:
    return as_mask(arr.is_valid())


def null_or(arr: pa.Array, good: Any) -> np.ndarray:
    return ~not_null(arr) | as_mask(good)


def ids_ok(arr: pa.Array) -> Any:
    import pyarrow.compute as pc

    return pc.match_substring_regex(arr, _ID)


def text_ok(arr: pa.Array) -> Any:
    import pyarrow.compute as pc

    return pc.match_substring_regex(arr, _NOT_SPACE)


def is_in(arr: pa.Array, allowed: Sequence[str]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.is_in(arr, value_set=pa.array(allowed, pa.string()))


def between(arr: pa.Array, low: float | None, high: float | None) -> np.ndarray:
    values = arr.to_numpy(zero_copy_only=False).astype(float)
    with np.errstate(invalid="ignore"):
        good = np.isfinite(values)
        if low is not None:
            good &= values >= low
        if high is not None:
            good &= values <= high
    return good & not_null(arr)


def flatten(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The values of a list array and the row (index into ``arr``) of each."""
    import pyarrow.compute as pc

    return pc.list_flatten(arr), np.asarray(pc.list_parent_indices(arr).to_numpy(), np.int64)


def list_lengths(arr: pa.Array) -> np.ndarray:
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(pc.list_value_length(arr), -1).to_numpy(), np.int64)


def distinct_texts(arr: pa.Array, good: Callable[[str], bool]) -> np.ndarray:
    """``good`` of each value of a string array, called once per distinct text (nulls:
    ``False``)."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(arr)
    verdicts = np.array([good(t) for t in encoded.dictionary.to_pylist()] + [False], bool)
    codes = pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy()
    return verdicts[codes]


def scalar(value: object) -> bool:
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return -INT64 <= value < INT64
    return isinstance(value, float) and math.isfinite(value)


def finite_number(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value) and abs(value) < INT64)


def json_object(text: object) -> dict[str, Any] | None:
    """The JSON object ``text`` holds, ``None`` for anything else."""
    if not isinstance(text, str):
        return None
    try:
        value = {} if text == "{}" else json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def scalar_map(text: str) -> bool:
    value = json_object(text)
    return value is not None and all(map(scalar, value.values()))


@cache
def _datetime_adapter() -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(datetime)


def is_datetime(text: str) -> bool:
    from pydantic import ValidationError

    try:
        _datetime_adapter().validate_python(text)
    except ValidationError:
        return False
    return True


class Codes:
    """Integer codes of id strings (equal text, equal code) across several arrays, so that
    ids of one group are compared as ``row * M + code`` keys in numpy."""

    def __init__(self, *arrays: pa.Array) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(pa.concat_arrays([a.cast(pa.string()) for a in arrays]))
        self.size = len(encoded.dictionary) + 1  # the last code: null
        codes = pc.fill_null(encoded.indices, self.size - 1).to_numpy().astype(np.int64)
        bounds = np.cumsum([0] + [len(a) for a in arrays])
        self.codes = [codes[s:e] for s, e in zip(bounds[:-1], bounds[1:], strict=True)]

    def keys(self, which: int, rows: np.ndarray) -> np.ndarray:
        return rows * self.size + self.codes[which]


def repeats(keys: np.ndarray) -> np.ndarray:
    """``True`` for each key that occurs more than once (one sort when none does)."""
    ordered = np.sort(keys)
    if not (ordered[1:] == ordered[:-1]).any():
        return np.zeros(len(keys), dtype=bool)
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return np.asarray(counts[inverse] > 1)


def member(keys: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """``np.isin(keys, ordered)`` for a sorted ``ordered``, by binary search."""
    if not len(ordered):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(ordered, keys), len(ordered) - 1)
    return np.asarray(ordered[at] == keys)
