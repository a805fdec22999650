"""Rows from a user's file: JSONL, JSON, CSV, Parquet, a dataset saved with ``save_to_disk``, or
a Hub dataset id.

A file that cannot be used at all (missing, unknown format, empty) raises ``InputFileError``.
A bad row never stops the read: it becomes a ``RowError`` (then a
:class:`~grouppref.schemas.Reject` naming the file, the 1-based row number, the field and the
reason), and reading goes on.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from grouppref.errors import InputFileError, RowError
from grouppref.runs.hashing import fingerprint_file, sha256_text
from grouppref.schemas.records import Reject

T = TypeVar("T")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
FORMATS = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")


@dataclass
class ReadResult(Generic[T]):
    """What a reader got: valid items, rejects (with reasons) and the number of rows read."""

    source: str
    items: list[T]
    rejects: list[Reject] = field(default_factory=list)
    rows: int = 0
    fingerprint: str = ""


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any] | RowError]]:
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                yield number, RowError(f"invalid JSON: {e.msg} at column {e.colno}",
                                       source=str(path), row=number)
                continue
            if not isinstance(value, dict):
                yield number, RowError(f"expected a JSON object, got {type(value).__name__}",
                                       source=str(path), row=number)
                continue
            yield number, value


def _rows_json(path: Path) -> list[Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputFileError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from e
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise InputFileError(f"{path}: expected a JSON list of rows (or an object holding "
                                 "exactly one list)")
        value = lists[0]
    if not isinstance(value, list):
        raise InputFileError(f"{path}: expected a JSON list of rows")
    return value


def _rows_dataset(source: str, split: str) -> list[dict[str, Any]]:
    import datasets

    try:
        if Path(source).exists():
            loaded = datasets.load_from_disk(source)
        else:
            loaded = datasets.load_dataset(source, split=split)
    except (FileNotFoundError, ValueError, OSError, ConnectionError) as e:
        raise InputFileError(f"{source}: cannot load dataset ({e})") from e
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise InputFileError(f"{source}: no split {split!r}; it has {list(loaded)}")
        loaded = loaded[split]
    return list(loaded)


def iter_rows(source: str | Path, split: str = "train") -> Iterator[tuple[int, dict[str, Any] | RowError]]:
    """Yield ``(row_number, row)`` or ``(row_number, RowError)`` for every row of ``source``.

    Raises:
        InputFileError: the source is missing, of an unknown format, or unreadable.
    """
    text = str(source)
    path = Path(text)
    if path.is_dir():
        rows: list[Any] = _rows_dataset(text, split)
    elif not path.exists():
        if HUB_ID.match(text) and not text.endswith(FORMATS):
            rows = _rows_dataset(text, split)
        else:
            raise InputFileError(f"{path}: file not found")
    elif path.suffix in (".jsonl", ".ndjson"):
        yield from _iter_jsonl(path)
        return
    elif path.suffix == ".json":
        rows = _rows_json(path)
    elif path.suffix == ".csv":
        try:
            with path.open(encoding="utf-8", newline="") as fh:
                rows = list(csv.DictReader(fh))
        except (UnicodeDecodeError, csv.Error) as e:
            raise InputFileError(f"{path}: cannot read as CSV ({e})") from e
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowInvalid, OSError) as e:
            raise InputFileError(f"{path}: cannot read as Parquet ({e})") from e
    else:
        raise InputFileError(f"{path}: unknown format {path.suffix!r}; use one of "
                             f"{', '.join(FORMATS)} or a saved dataset directory")
    for number, row in enumerate(rows, start=1):
        if isinstance(row, dict):
            yield number, row
        else:
            yield number, RowError(f"expected an object, got {type(row).__name__}",
                                   source=text, row=number)


def source_fingerprint(source: str) -> str:
    path = Path(source)
    return fingerprint_file(path) if path.exists() else sha256_text(f"hub:{source}")


def to_reject(stage: str, err: RowError) -> Reject:
    return Reject(stage=stage, reason=err.reason, source=err.source, row=err.row,
                  group_id=err.group_id, field=err.field)


def validation_reason(e: ValidationError) -> tuple[str, str]:
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    return first["msg"].removeprefix("Value error, "), loc


def maybe_json(value: Any) -> Any:
    """A string that holds a JSON list or object (a CSV cell), parsed; anything else as is."""
    if isinstance(value, str) and value.strip().startswith(("[", "{")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value
