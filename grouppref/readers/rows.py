"""Input readers: prompts and candidate groups from JSONL, JSON, CSV, Parquet, a dataset saved
with ``save_to_disk``, or a Hub dataset id.

A file that cannot be used at all (missing, unknown format, empty) raises ``InputFileError``.
A bad row never stops the read: it becomes a :class:`~grouppref.schemas.Reject` naming the file,
the 1-based row number, the field and the reason, and reading goes on.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grouppref.errors import InputFileError, RowError
from grouppref.runs.store import fingerprint_file, sha256_text
from grouppref.schemas import (
    MAX_K,
    AnnotatedGroup,
    Candidate,
    CandidateGroup,
    CandidateSource,
    Prompt,
    Reject,
    make_candidate_id,
    make_group_id,
    normalise_text,
)

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
FORMATS = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")


class ColumnMapping(BaseModel):
    """Which input columns hold which prompt fields. A ``None`` column is not read."""

    model_config = ConfigDict(extra="forbid")

    prompt_id: str | None = Field(default="prompt_id", description="Column with the prompt id "
                                  "(a content hash is used when the row has no such column).")
    text: str | None = Field(default="prompt", description="Column with a plain-text prompt.")
    messages: str | None = Field(default="messages", description="Column with chat turns "
                                 "(a list of {role, content}; JSON text in CSV).")
    reference: str | None = Field(default="reference", description="Column with the reference "
                                  "answer (optional).")
    metadata: str | None = Field(default="metadata", description="Column with a metadata object "
                                 "(str/int/float/bool values; JSON text in CSV).")
    metadata_columns: list[str] = Field(default_factory=list,
                                        description="Further columns copied into metadata.")
    responses: str = Field(default="responses", description="Import: column with a list of "
                           "responses (strings or {text, model}) in one-row-per-prompt files.")
    response: str = Field(default="response", description="Import: column with one response in "
                          "one-row-per-response files (rows sharing a prompt form a group).")


@dataclass
class ReadResult(Generic[T]):
    """What a reader got: valid items, rejects (with reasons) and the number of rows read."""

    source: str
    items: list[T]
    rejects: list[Reject] = field(default_factory=list)
    rows: int = 0
    fingerprint: str = ""


# -- rows -------------------------------------------------------------------------------------
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


def _source_fingerprint(source: str) -> str:
    path = Path(source)
    return fingerprint_file(path) if path.exists() else sha256_text(f"hub:{source}")


def _to_reject(stage: str, err: RowError) -> Reject:
    return Reject(stage=stage, reason=err.reason, source=err.source, row=err.row,
                  group_id=err.group_id, field=err.field)


def _validation_reason(e: ValidationError) -> tuple[str, str]:
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    return first["msg"].removeprefix("Value error, "), loc


# -- prompts ----------------------------------------------------------------------------------
def _maybe_json(value: Any) -> Any:
    if isinstance(value, str) and value.strip().startswith(("[", "{")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _present(row: dict[str, Any], column: str | None) -> bool:
    return column is not None and row.get(column) not in (None, "")


def prompt_from_row(row: dict[str, Any], mapping: ColumnMapping, source: str, number: int) -> Prompt:
    """Build one prompt from a row, or raise ``RowError`` naming the field and the reason."""
    def fail(reason: str, field_name: str | None) -> RowError:
        return RowError(reason, field=field_name, source=source, row=number)

    data: dict[str, Any] = {}
    if _present(row, mapping.messages):
        data["messages"] = _maybe_json(row[mapping.messages])  # type: ignore[index]
    elif _present(row, mapping.text):
        data["text"] = row[mapping.text]  # type: ignore[index]
    else:
        wanted = [c for c in (mapping.messages, mapping.text) if c]
        raise fail(f"no prompt: the row has none of the columns {wanted} (see the column "
                   "mapping)", " / ".join(wanted) or None)
    if _present(row, mapping.reference):
        data["reference"] = str(row[mapping.reference])  # type: ignore[index]
    meta: dict[str, Any] = {}
    if _present(row, mapping.metadata):
        given = _maybe_json(row[mapping.metadata])  # type: ignore[index]
        if not isinstance(given, dict):
            raise fail(f"metadata must be an object, got {type(given).__name__}", mapping.metadata)
        meta.update(given)
    for column in mapping.metadata_columns:
        if column not in row:
            raise fail(f"metadata column {column!r} is not in the row (columns: {sorted(row)})",
                       column)
        meta[column] = row[column]
    data["metadata"] = meta
    if _present(row, mapping.prompt_id):
        data["prompt_id"] = str(row[mapping.prompt_id])  # type: ignore[index]
    try:
        if "prompt_id" not in data:
            data["prompt_id"] = "pending"
            probe = Prompt.model_validate(data)
            data["prompt_id"] = "p-" + make_group_id(probe)[2:]
        return Prompt.model_validate(data)
    except ValidationError as e:
        msg, loc = _validation_reason(e)
        column = {"messages": mapping.messages, "text": mapping.text, "metadata": mapping.metadata,
                  "reference": mapping.reference, "prompt_id": mapping.prompt_id}
        head = loc.split(".")[0]
        return_field = column.get(head) or loc or None
        raise fail(f"{msg} (in {loc})" if loc else msg, return_field) from e


def read_prompts(source: str | Path, mapping: ColumnMapping | None = None, stage: str = "prompts",
                 split: str = "train", limit: int | None = None) -> ReadResult[Prompt]:
    """Read prompts (the first ``limit`` rows when given); bad rows and repeated prompts become
    rejects.

    Raises:
        InputFileError: the source cannot be read at all, or holds no rows.
    """
    mapping = mapping or ColumnMapping()
    text = str(source)
    result: ReadResult[Prompt] = ReadResult(source=text, items=[])
    seen: dict[str, int] = {}
    for number, row in iter_rows(source, split):
        if limit is not None and result.rows >= limit:
            break
        result.rows += 1
        try:
            if isinstance(row, RowError):
                raise row
            prompt = prompt_from_row(row, mapping, text, number)
            key = make_group_id(prompt)
            if key in seen:
                raise RowError(f"same prompt as row {seen[key]}", field=mapping.text,
                               source=text, row=number)
            seen[key] = number
            result.items.append(prompt)
        except RowError as err:
            result.rejects.append(_to_reject(stage, err))
    if result.rows == 0:
        raise InputFileError(f"{text}: no rows")
    result.fingerprint = _source_fingerprint(text)
    return result


def record_from_row(model: type[R], row: dict[str, Any], source: str, number: int) -> R:
    """Validate a row in the record's JSON form; a failure names the first bad field."""
    try:
        return model.model_validate(row)
    except ValidationError as e:
        msg, loc = _validation_reason(e)
        raise RowError(msg, field=loc or None, source=source, row=number,
                       group_id=row.get("group_id") if isinstance(row.get("group_id"), str)
                       else None) from e


# -- groups (import) --------------------------------------------------------------------------
def _response(value: Any, source: str, number: int, column: str) -> tuple[str, str | None]:
    value = _maybe_json(value)
    if isinstance(value, str):
        return value, None
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        model = value.get("model")
        return value["text"], str(model) if model is not None else None
    raise RowError("a response must be a string or an object with 'text'", field=column,
                   source=source, row=number)


def build_group(prompt: Prompt, responses: list[tuple[str, str | None]], stage: str,
                source: str, number: int) -> tuple[CandidateGroup, list[Reject]]:
    """A group from imported responses; empty and duplicate ones are part-rejects.

    Raises:
        RowError: fewer than two distinct responses remain, or more than 16.
    """
    group_id = make_group_id(prompt)
    rejects: list[Reject] = []
    candidates: list[Candidate] = []
    seen: set[str] = set()
    for i, (text, model) in enumerate(responses, start=1):
        norm = normalise_text(text)
        reason = "empty response" if not norm else "duplicate response" if norm in seen else None
        if reason:
            rejects.append(Reject(stage=stage, reason=f"{reason} #{i} left out", source=source,
                                  row=number, group_id=group_id, field="responses", scope="part"))
            continue
        seen.add(norm)
        candidates.append(Candidate(
            candidate_id=make_candidate_id(group_id, text), text=text,
            source=CandidateSource(kind="import", model=model),
        ))
    if not 2 <= len(candidates) <= MAX_K:
        raise RowError(f"{len(candidates)} distinct responses; a group needs 2 to {MAX_K}",
                       field="responses", source=source, row=number, group_id=group_id)
    return CandidateGroup(group_id=group_id, prompt=prompt, candidates=candidates), rejects


def read_groups(source: str | Path, mapping: ColumnMapping | None = None, stage: str = "import",
                split: str = "train") -> ReadResult[CandidateGroup]:
    """Read candidate groups from one row per prompt (``responses`` list), one row per response
    (rows with the same prompt form a group, in file order), or rows already in grouppref's
    group form (``group_id``, ``prompt``, ``candidates`` and optional ``rankings``; these are
    returned as ``AnnotatedGroup``).

    Raises:
        InputFileError: the source cannot be read at all, or holds no rows.
    """
    mapping = mapping or ColumnMapping()
    text = str(source)
    result: ReadResult[CandidateGroup] = ReadResult(source=text, items=[])
    pending: dict[str, tuple[Prompt, int, list[tuple[str, str | None]]]] = {}
    for number, row in iter_rows(source, split):
        result.rows += 1
        try:
            if isinstance(row, RowError):
                raise row
            if "candidates" in row:  # a group in grouppref's own (JSON) form, maybe with rankings
                result.items.append(record_from_row(AnnotatedGroup, row, text, number))
                continue
            prompt = prompt_from_row(row, mapping, text, number)
            if mapping.responses in row:
                raw = _maybe_json(row[mapping.responses])
                if not isinstance(raw, list):
                    raise RowError("expected a list of responses", field=mapping.responses,
                                   source=text, row=number)
                responses = [_response(v, text, number, mapping.responses) for v in raw]
                group, rejects = build_group(prompt, responses, stage, text, number)
                result.items.append(group)
                result.rejects.extend(rejects)
            elif mapping.response in row:
                response = _response(row[mapping.response], text, number, mapping.response)
                key = make_group_id(prompt)
                entry = pending.setdefault(key, (prompt, number, []))
                entry[2].append(response)
                result.rows -= 1 if len(entry[2]) > 1 else 0  # one group = one input row
            else:
                raise RowError(f"no responses: the row has neither {mapping.responses!r} nor "
                               f"{mapping.response!r}", field=mapping.responses, source=text,
                               row=number)
        except RowError as err:
            result.rejects.append(_to_reject(stage, err))
    for prompt, number, responses in pending.values():
        try:
            group, rejects = build_group(prompt, responses, stage, text, number)
            result.items.append(group)
            result.rejects.extend(rejects)
        except RowError as err:
            result.rejects.append(_to_reject(stage, err))
    if result.rows == 0:
        raise InputFileError(f"{text}: no rows")
    result.fingerprint = _source_fingerprint(text)
    return result
