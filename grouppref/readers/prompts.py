"""Prompts from a user's file: one :class:`~grouppref.schemas.Prompt` per row, bad rows as rejects.

One id names one prompt: a row whose ``prompt_id`` was already read with a different prompt is
rejected ("duplicate prompt_id ... first seen at row N"), or both rows are, by the mapping's
``duplicate_ids`` (:class:`PromptIds`); a row repeating an earlier prompt is rejected as "same
prompt as row N".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grouppref.errors import RowError
from grouppref.readers.mapping import ColumnMapping, DuplicateIds
from grouppref.readers.rows import (
    BlankLine,
    ReadResult,
    iter_rows,
    maybe_json,
    source_fingerprint,
    to_reject,
    validation_reason,
)
from grouppref.schemas.records import Prompt, Reject, group_id_of, make_group_id


def _present(row: dict[str, Any], column: str | None) -> bool:
    return column is not None and column in row and row[column] is not None


def _scalar_problem(key: str, value: Any) -> str | None:
    """Why a metadata value is not a str/int/float/bool, in words (``None``: it is one)."""
    if value is None:
        return f"metadata {key!r} is null; give a str/int/float/bool value or leave the key out"
    if isinstance(value, float) and not math.isfinite(value):
        return f"metadata {key!r} is {value!r}; metadata numbers must be finite"
    if not isinstance(value, str | int | float | bool):
        return (f"metadata {key!r} is a {type(value).__name__}; metadata values are "
                "str/int/float/bool (put structured data in a JSON string)")
    return None


def _metadata(row: dict[str, Any], mapping: ColumnMapping, fail: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if _present(row, mapping.metadata) and row[mapping.metadata] != "":  # type: ignore[index]
        given = maybe_json(row[mapping.metadata])  # type: ignore[index]
        if not isinstance(given, dict):
            raise fail(f"metadata must be an object, got {type(given).__name__}", mapping.metadata)
        meta.update(given)
    for column in mapping.metadata_columns:
        if column not in row:
            raise fail(f"metadata column {column!r} is not in the row (columns: {sorted(row)})",
                       column)
        meta[column] = row[column]
    for key, value in meta.items():
        if (problem := _scalar_problem(key, value)) is not None:
            raise fail(problem, key if key in mapping.metadata_columns else mapping.metadata)
    return meta


def _prompt_fields(row: dict[str, Any], mapping: ColumnMapping, fail: Any) -> dict[str, Any]:
    """``{"messages": ...}`` or ``{"text": ...}`` from the row's prompt columns."""
    if _present(row, mapping.messages) and row[mapping.messages] not in ("", []):  # type: ignore[index]
        return {"messages": maybe_json(row[mapping.messages])}  # type: ignore[index]
    if _present(row, mapping.text):
        value = row[mapping.text]  # type: ignore[index]
        if isinstance(value, list) and value:  # chat turns in the prompt column (TRL's format)
            return {"messages": value}
        if not isinstance(value, str):
            raise fail(f"column {mapping.text!r} must hold text, got {type(value).__name__}",
                       mapping.text)
        if not value.strip():
            raise fail(f"empty prompt: column {mapping.text!r} is empty", mapping.text)
        return {"text": value}
    given = [c for c in (mapping.messages, mapping.text) if c and c in row]
    if given:
        raise fail(f"empty prompt: column {given[0]!r} is empty", given[0])
    wanted = [c for c in (mapping.messages, mapping.text) if c]
    raise fail(f"no prompt: the row has none of the columns {wanted} (its columns: "
               f"{sorted(row)}; see the column mapping)", " / ".join(wanted) or None)


def prompt_from_row(row: dict[str, Any], mapping: ColumnMapping, source: str, number: int, *,
                    text: str | None = None, messages: list[Any] | None = None) -> Prompt:
    """Build one prompt from a row, or raise ``RowError`` naming the field and the reason.

    ``text`` or ``messages``, when given, are the prompt itself (a layout that derives the
    prompt, e.g. from a transcript); id, reference and metadata still come from the columns.
    """
    def fail(reason: str, field_name: str | None) -> RowError:
        return RowError(reason, field=field_name, source=source, row=number)

    if messages is not None:
        data: dict[str, Any] = {"messages": messages}
    elif text is not None:
        data = {"text": text}
    else:
        data = _prompt_fields(row, mapping, fail)
    if _present(row, mapping.reference) and row[mapping.reference] != "":  # type: ignore[index]
        data["reference"] = str(row[mapping.reference])  # type: ignore[index]
    data["metadata"] = _metadata(row, mapping, fail)
    if _present(row, mapping.prompt_id) and str(row[mapping.prompt_id]).strip():  # type: ignore[index]
        data["prompt_id"] = str(row[mapping.prompt_id]).strip()  # type: ignore[index]
    try:
        if "prompt_id" not in data:
            data["prompt_id"] = "pending"
            probe = Prompt.model_validate(data)
            # the id made from the hash is always a valid one: no second validation
            return probe.model_copy(update={"prompt_id": "p-" + make_group_id(probe)[2:]})
        return Prompt.model_validate(data)
    except ValidationError as e:
        msg, loc = validation_reason(e)
        column = {"messages": mapping.messages, "text": mapping.text, "metadata": mapping.metadata,
                  "reference": mapping.reference, "prompt_id": mapping.prompt_id}
        head = loc.split(".")[0]
        return_field = column.get(head) or loc or None
        raise fail(f"{msg} (in {loc})" if loc else msg, return_field) from e


class PromptIds:
    """One id names one prompt: remembers where each ``prompt_id`` was first read.

    :meth:`check` raises ``RowError`` for a later row whose id is taken by a different prompt;
    with ``reject_all`` the first row goes too (:meth:`retracted`, after the read).
    """

    def __init__(self, policy: DuplicateIds, source: str, stage: str, field: str | None):
        self.policy, self.source, self.stage, self.field = policy, source, stage, field
        self.first: dict[str, tuple[int, str]] = {}  # id -> (row, content key)
        self.clashes: dict[str, list[int]] = {}  # id -> the later rows that reused it

    def check(self, prompt: Prompt, number: int, content: str | None = None) -> None:
        """Raise ``RowError`` when ``prompt``'s id was read first with another prompt
        (``content``: its :meth:`~grouppref.schemas.Prompt.content_key`, when known)."""
        content = prompt.content_key() if content is None else content
        seen = self.first.setdefault(prompt.prompt_id, (number, content))
        if seen[1] == content:
            return
        self.clashes.setdefault(prompt.prompt_id, []).append(number)
        raise RowError(f"duplicate prompt_id {prompt.prompt_id!r} with a different prompt; first "
                       f"seen at row {seen[0]} (give each prompt its own id)", field=self.field,
                       source=self.source, row=number)

    def retracted(self) -> dict[int, Reject]:
        """With ``reject_all``: the first rows of clashing ids, row -> reject."""
        if self.policy != "reject_all":
            return {}
        return {self.first[pid][0]: Reject(
            stage=self.stage, source=self.source, row=self.first[pid][0], field=self.field,
            reason=f"duplicate prompt_id {pid!r}: row(s) {', '.join(map(str, rows))} give the "
            "same id to a different prompt (duplicate_ids: reject_all)")
            for pid, rows in self.clashes.items()}


def read_prompts(source: str | Path, mapping: ColumnMapping | None = None, stage: str = "prompts",
                 split: str = "train", limit: int | None = None) -> ReadResult[Prompt]:
    """Read prompts (the first ``limit`` rows when given); bad rows, repeated prompts and
    reused ids become rejects.

    Raises:
        InputFileError: the source cannot be read at all, or holds no rows.
    """
    mapping = mapping or ColumnMapping()
    text = str(source)
    result: ReadResult[Prompt] = ReadResult(source=text, items=[])
    seen: dict[str, int] = {}
    ids = PromptIds(mapping.duplicate_ids, text, stage, mapping.prompt_id)
    for number, row in iter_rows(source, split):
        if limit is not None and result.rows - result.blank >= limit:
            break
        result.rows += 1
        try:
            if isinstance(row, RowError):
                result.blank += isinstance(row, BlankLine)
                raise row
            prompt = prompt_from_row(row, mapping, text, number)
            content = prompt.content_key()  # once: the same-prompt and the id checks share it
            key = group_id_of(content)
            if key in seen:
                raise RowError(f"same prompt as row {seen[key]}", field=mapping.text,
                               source=text, row=number)
            ids.check(prompt, number, content)
            seen[key] = number
            result.items.append(prompt)
            result.item_rows.append(number)
        except RowError as err:
            result.rejects.append(to_reject(stage, err))
    result.require_rows()
    drop_retracted(result, ids.retracted())
    result.fingerprint = source_fingerprint(text)
    return result


def drop_retracted(result: ReadResult[Any], retracted: dict[int, Reject]) -> None:
    """Move the items read from the rows in ``retracted`` to the rejects."""
    if not retracted:
        return
    keep = [(item, row) for item, row in zip(result.items, result.item_rows, strict=True)
            if row not in retracted]
    result.items = [item for item, _ in keep]
    result.item_rows = [row for _, row in keep]
    result.rejects.extend(retracted.values())
