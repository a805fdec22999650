"""Prompts from a user's file: one :class:`~grouppref.schemas.Prompt` per row, bad rows as rejects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grouppref.errors import InputFileError, RowError
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.rows import (
    ReadResult,
    iter_rows,
    maybe_json,
    source_fingerprint,
    to_reject,
    validation_reason,
)
from grouppref.schemas.records import Prompt, make_group_id


def _present(row: dict[str, Any], column: str | None) -> bool:
    return column is not None and row.get(column) not in (None, "")


def prompt_from_row(row: dict[str, Any], mapping: ColumnMapping, source: str, number: int) -> Prompt:
    """Build one prompt from a row, or raise ``RowError`` naming the field and the reason."""
    def fail(reason: str, field_name: str | None) -> RowError:
        return RowError(reason, field=field_name, source=source, row=number)

    data: dict[str, Any] = {}
    if _present(row, mapping.messages):
        data["messages"] = maybe_json(row[mapping.messages])  # type: ignore[index]
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
        given = maybe_json(row[mapping.metadata])  # type: ignore[index]
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
        msg, loc = validation_reason(e)
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
            result.rejects.append(to_reject(stage, err))
    if result.rows == 0:
        raise InputFileError(f"{text}: no rows")
    result.fingerprint = source_fingerprint(text)
    return result
