"""Rows from a user's file: JSONL, JSON, CSV, Parquet, a dataset saved with ``save_to_disk``, or
a Hub dataset id.

A file that cannot be used at all (missing, unknown format, empty, not UTF-8 text: binary,
UTF-16, or not one line that decodes) raises ``InputFileError``: one line, exit code 2. A bad
row never stops the read: it becomes a ``RowError`` (then a
:class:`~grouppref.schemas.Reject` naming the file, the 1-based row number, the field and the
reason), and reading goes on. That includes a line whose bytes are not valid UTF-8 and a blank
line (counted, with the reason "blank line"). A UTF-8 byte-order mark is dropped in every text
format, so a BOM-prefixed CSV header is recognised.

Row numbers: the line number in JSONL (blank lines count), the data row in CSV (the header is
row 0, blank lines count), the list index + 1 in JSON, the row index + 1 in Parquet and datasets;
in a folder of data files, counted across the split's files in order.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import ValidationError

from grouppref.config import SAVE_AS_UTF8, UTF8_BOM, text_problem
from grouppref.errors import InputFileError, RowError
from grouppref.readers.files import COMPRESSIONS, folder_files, format_suffix, open_binary, read_bytes
from grouppref.runs.hashing import fingerprint_file, sha256_text
from grouppref.schemas.records import Reject

T = TypeVar("T")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
FORMATS = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")
# every name a data file may end in, compressed or not (a Hub id never does)
SUFFIXES = FORMATS + tuple(f + c for f in FORMATS if f != ".parquet" for c in COMPRESSIONS)
BLANK = "blank line (skipped)"
Row = dict[str, Any] | RowError


class BlankLine(RowError):
    """A blank line of a JSONL or CSV file: counted as a row and rejected with its reason."""


@dataclass
class ReadResult(Generic[T]):
    """What a reader got: valid items, rejects (with reasons) and the number of rows read."""

    source: str
    items: list[T]
    rejects: list[Reject] = field(default_factory=list)
    rows: int = 0
    blank: int = 0
    fingerprint: str = ""
    item_rows: list[int] = field(default_factory=list)  # the row each item came from

    def require_rows(self) -> None:
        """Raise ``InputFileError`` when the source held no row but blank lines."""
        if self.rows - self.blank == 0:
            extra = f" (only {self.blank} blank line{'s' if self.blank != 1 else ''})" \
                if self.blank else ""
            raise InputFileError(f"{self.source}: no rows{extra}")


class Decoding:
    """Counts the rows of a text file that decode and those that do not: a file none of whose
    rows decodes is not UTF-8 text, and is refused whole (:meth:`check`). Counts of parts of
    one file read apart add up (:meth:`add`)."""

    def __init__(self, path: Path):
        self.path, self.good, self.bad, self.first = path, 0, 0, ""

    def failed(self, reason: str) -> RowError:
        self.bad += 1
        self.first = self.first or reason
        return RowError(f"{reason}; {SAVE_AS_UTF8}", source=str(self.path))

    def add(self, other: Decoding) -> None:
        """Count ``other``'s rows too (a later part of the same file)."""
        self.good, self.bad = self.good + other.good, self.bad + other.bad
        self.first = self.first or other.first

    def check(self) -> None:
        if self.bad and not self.good:
            raise InputFileError(f"{self.path}: not UTF-8 text: none of its {self.bad} rows "
                                 f"decodes ({self.first}); {SAVE_AS_UTF8}")


def _open_text(path: Path) -> bytes:
    """The file's bytes (decompressed) without a UTF-8 BOM, after refusing binary and
    UTF-16/32 files."""
    data = read_bytes(path)
    problem = text_problem(data[:65536])
    if problem is not None:
        raise InputFileError(f"{path}: cannot read: {problem}; {SAVE_AS_UTF8}")
    return data.removeprefix(UTF8_BOM)


class _JsonLimit(json.JSONDecodeError):
    """Valid JSON beyond what Python decodes: no position to name."""

    def __init__(self, msg: str, text: str):
        super().__init__(msg, text, 0)


def _where(e: json.JSONDecodeError, line: bool = False) -> str:
    if isinstance(e, _JsonLimit):
        return ""
    return f" at line {e.lineno}, column {e.colno}" if line else f" at column {e.colno}"


def _json_error(e: json.JSONDecodeError) -> str:
    # json's messages may end in "at" ("Unterminated string starting at"): no doubled word
    return f"invalid JSON: {e.msg.removesuffix(' at')}{_where(e)}"


def _loads(text: str) -> Any:
    """``json.loads`` whose every failure is a ``json.JSONDecodeError`` naming the problem: a
    value nested deeper than Python's recursion limit and an integer longer than its
    4300-digit limit otherwise escape as ``RecursionError`` / ``ValueError``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError as e:
        raise _JsonLimit("lists or objects nested too deeply", text) from e
    except ValueError as e:  # int(): "Exceeds the limit (4300 digits) for integer string ..."
        raise _JsonLimit("a number with more than 4300 digits", text) from e


def check_head(path: Path) -> None:
    """Refuse a binary or UTF-16/32 file from its first 64 KiB (one line, exit code 2)."""
    with open_binary(path) as fh:
        problem = text_problem(fh.read(65536))
    if problem is not None:
        raise InputFileError(f"{path}: cannot read: {problem}; {SAVE_AS_UTF8}")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Row]]:
    """JSONL rows, streamed line by line (``\n`` or ``\r\n``; :func:`jsonl_rows`)."""
    check_head(path)
    decoding = Decoding(path)
    with open_binary(path) as fh:
        yield from jsonl_rows(fh, path, decoding)
    decoding.check()


def jsonl_rows(lines: Iterable[bytes], path: Path, decoding: Decoding, first: int = 1
               ) -> Iterator[tuple[int, Row]]:
    """The rows of JSONL ``lines`` (with their line ends) of ``path``, numbered from ``first``
    (a BOM is dropped from row 1), each line decoded on its own and counted in ``decoding``.

    A line is decoded and parsed with its line end (whitespace to JSON, so the same value and
    no copy of the line without it); only a line that fails is looked at again without it, so
    that the reason names the same position as for the bare line.
    """
    for number, raw in enumerate(lines, start=first):
        if number == 1:
            raw = raw.removeprefix(UTF8_BOM)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            yield number, _undecodable(decoding, _bare(raw), number)
            continue
        if not line or line.isspace():
            yield number, BlankLine(BLANK, source=str(path), row=number)
            continue
        decoding.good += 1
        yield number, _json_row(line, path, number)


def _bare(raw: bytes) -> bytes:
    """A line without its line end."""
    return raw.removesuffix(b"\n").removesuffix(b"\r")


def _undecodable(decoding: Decoding, raw: bytes, number: int) -> RowError:
    """The reject of a line (without its line end) that is not UTF-8."""
    try:
        raw.decode("utf-8")
        reason = "line is not valid UTF-8"  # unreachable: the line with its end did not decode
    except UnicodeDecodeError as e:
        reason = f"line is not valid UTF-8: byte 0x{raw[e.start]:02X} at column {e.start + 1}"
    err = decoding.failed(reason)
    err.row = number
    return err


def _json_row(line: str, path: Path, number: int) -> Row:
    """The object on a line (with or without its line end), or why there is none."""
    try:
        value = _loads(line)
    except json.JSONDecodeError as e:
        bare = line.removesuffix("\n").removesuffix("\r")
        if bare != line:  # the position as in the bare line
            return _json_row(bare, path, number)
        return RowError(_json_error(e), source=str(path), row=number)
    if not isinstance(value, dict):
        return RowError(f"expected a JSON object, got {type(value).__name__}", source=str(path),
                        row=number)
    return value


def _escaped(data: bytes) -> str:
    """Text in which each byte that is not valid UTF-8 is kept as a lone surrogate, so that the
    rows holding one can be rejected one by one (:func:`_bad_bytes`)."""
    return data.decode("utf-8", errors="surrogateescape")


def _bad_bytes(value: Any) -> str | None:
    """The first undecodable byte inside a parsed row, as a reason, or ``None``."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        char = e.object[e.start]
        return f"holds bytes that are not valid UTF-8 (byte 0x{ord(char) - 0xDC00:02X})"
    return None


class _JsonLines(Exception):
    """A ``.json`` file that holds JSON Lines (one object, then more): read it as such."""


def _rows_json(path: Path) -> list[Any]:
    data = _open_text(path)
    try:
        value = _loads(_escaped(data))
    except json.JSONDecodeError as e:
        if e.msg == "Extra data" and data.lstrip().startswith(b"{"):
            raise _JsonLines from e
        raise InputFileError(f"{path}: not valid JSON ({e.msg.removesuffix(' at')}"
                             f"{_where(e, line=True)})") from e
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(lists) != 1:
            columns = value and all(isinstance(v, dict) for v in value.values())
            hint = (" (this is pandas' column-wise JSON: write it with "
                    "`df.to_json(PATH, orient='records', lines=True)`)" if columns else "")
            raise InputFileError(f"{path}: expected a JSON list of rows (or an object holding "
                                 f"exactly one list){hint}")
        value = lists[0]
    if not isinstance(value, list):
        raise InputFileError(f"{path}: expected a JSON list of rows")
    return value


CSV_FIELD_LIMIT = 2**31 - 1  # the csv module's default (128 KiB) refuses a long prompt


def _iter_csv(path: Path, delimiter: str = ",") -> Iterator[tuple[int, Row]]:
    data = _open_text(path)
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        reader = csv.reader(io.StringIO(_escaped(data), newline=""), delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return
        header = [h.strip() for h in header]
        twice = sorted({h for h in header if header.count(h) > 1})
        if twice:
            raise InputFileError(f"{path}: the header names column(s) {twice} more than once; "
                                 "rename them so that each column has its own name")
        for number, cells in enumerate(reader, start=1):
            if not any(c.strip() for c in cells):
                yield number, BlankLine(BLANK, source=str(path), row=number)
            elif len(cells) != len(header):
                yield number, RowError(f"has {len(cells)} fields, the header has {len(header)}",
                                       source=str(path), row=number)
            else:
                yield number, dict(zip(header, cells, strict=True))
    except csv.Error as e:
        kind = "TSV" if delimiter == "\t" else "CSV"
        raise InputFileError(f"{path}: cannot read as {kind} ({e})") from e


def _with_decoding(path: Path, rows: Iterator[tuple[int, Row]]) -> Iterator[tuple[int, Row]]:
    """Rows of a file decoded with :func:`_escaped`: a row holding an undecodable byte is a
    RowError; a file none of whose rows decodes is refused."""
    decoding = Decoding(path)
    for number, row in rows:
        reason = _bad_bytes(row) if isinstance(row, dict) else None
        if reason is not None:
            err = decoding.failed(reason)
            err.row = number
            yield number, err
            continue
        decoding.good += not isinstance(row, BlankLine)
        yield number, row
    decoding.check()


def _rows_dataset(source: str, split: str) -> list[dict[str, Any]]:
    import datasets

    try:
        loaded = datasets.load_dataset(source, split=split)
    except (FileNotFoundError, ValueError, OSError, ConnectionError) as e:
        raise InputFileError(f"{source}: cannot load dataset ({e})") from e
    return list(loaded)


def _no_split(source: str, split: str, have: list[str]) -> InputFileError:
    return InputFileError(f"{source}: no split {split!r}; it has {have} (pick one with --split)")


def _iter_folder(path: Path, split: str) -> Iterator[tuple[int, Row]]:
    """The rows of ``split`` in a ``save_to_disk`` folder, or in a folder of data files (a
    cloned Hub repository, ``export --parquet DIR``: :func:`folder_files`), numbered across
    the split's files in order."""
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        import datasets

        try:
            loaded = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError, OSError) as e:
            raise InputFileError(f"{path}: cannot load dataset ({e})") from e
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise _no_split(str(path), split, list(loaded))
            loaded = loaded[split]
        yield from _numbered(list(loaded), str(path))
        return
    files = folder_files(path)
    if split not in files:
        raise _no_split(str(path), split, list(files))
    offset = 0
    for name in files[split]:
        number = 0
        for number, row in iter_rows(name):
            yield offset + number, row
        offset += number


def _numbered(rows: list[Any], source: str) -> Iterator[tuple[int, Row]]:
    for number, row in enumerate(rows, start=1):
        if isinstance(row, dict):
            yield number, row
        else:
            yield number, RowError(f"expected an object, got {type(row).__name__}",
                                   source=source, row=number)


SourceKind = Literal["folder", "hub", "json", "csv", "parquet"]


def source_kind(source: str | Path) -> SourceKind:
    """What ``source`` is, told from its name and whether it exists, before anything is read.

    Raises:
        InputFileError: a local file that is missing or of an unknown format.
    """
    text = str(source)
    path = Path(text)
    suffix = format_suffix(path)
    if path.is_dir():
        return "folder"
    if not path.exists():
        if HUB_ID.match(text) and not text.endswith(SUFFIXES):
            return "hub"
        raise InputFileError(f"{path}: file not found")
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "json"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix == ".parquet" and path.suffix.lower() == ".parquet":
        return "parquet"
    named = suffix + (path.suffix if path.suffix.lower() in COMPRESSIONS else "")
    raise InputFileError(f"{path}: unknown format {named!r}; use one of "
                         f"{', '.join(FORMATS)} (the text formats may be compressed: "
                         f"{', '.join(COMPRESSIONS)}) or a dataset folder")


def iter_rows(source: str | Path, split: str = "train"
              ) -> Generator[tuple[int, Row], None, None]:
    """Yield ``(row_number, row)`` or ``(row_number, RowError)`` for every row of ``source``.

    Raises:
        InputFileError: the source is missing, of an unknown format, not UTF-8 text or
            unreadable.
    """
    text = str(source)
    path = Path(text)
    kind = source_kind(text)
    if kind == "folder":
        yield from _iter_folder(path, split)
    elif kind == "hub":
        yield from _numbered(_rows_dataset(text, split), text)
    elif kind == "json":
        yield from _iter_json(path, json_lines=format_suffix(path) != ".json")
    elif kind == "csv":
        yield from _with_decoding(path, _iter_csv(path, "\t" if format_suffix(path) == ".tsv"
                                                  else ","))
    else:
        yield from _numbered(_rows_parquet(path), text)


def _iter_json(path: Path, json_lines: bool) -> Iterator[tuple[int, Row]]:
    """JSON Lines or one JSON list, whichever the file holds, as ``datasets`` reads them: a
    ``.json`` file of JSON Lines, or a ``.jsonl`` file holding one JSON list of rows (its
    first character a ``[``), is read for what it is."""
    if json_lines:
        with open_binary(path) as fh:
            head = fh.read(4096).removeprefix(UTF8_BOM).lstrip()
        if head.startswith(b"["):
            try:  # one list of rows, else line by line as named
                rows: list[Any] | None = _rows_json(path)
            except (InputFileError, _JsonLines):
                rows = None
            if rows is not None:
                yield from _with_decoding(path, _numbered(rows, str(path)))
                return
    else:
        try:
            rows = _rows_json(path)
        except _JsonLines:
            pass
        else:
            yield from _with_decoding(path, _numbered(rows, str(path)))
            return
    yield from _iter_jsonl(path)


def _rows_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowInvalid, OSError) as e:
        raise InputFileError(f"{path}: cannot read as Parquet ({e})") from e


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
            return _loads(value)
        except json.JSONDecodeError:
            return value
    return value
