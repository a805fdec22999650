"""Prompts from a user's file: one :class:`~grouppref.schemas.Prompt` per row, bad rows as rejects.

One id names one prompt: a row whose ``prompt_id`` was already read with a different prompt is
rejected ("duplicate prompt_id ... first seen at row N"), or both rows are, by the mapping's
``duplicate_ids`` (:class:`PromptIds`); a row repeating an earlier prompt is rejected as "same
prompt as row N".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grouppref.errors import RowError
from grouppref.readers.mapping import ColumnMapping, DuplicateIds
from grouppref.readers.rows import (
    BlankLine,
    ReadResult,
    Row,
    iter_rows,
    maybe_json,
    source_fingerprint,
    to_reject,
    validation_reason,
)
from grouppref.runs.progress import live_count
from grouppref.schemas.records import (
    Prompt,
    Reject,
    group_id_of,
    make_group_id,
    prompt_content_key,
)


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


def _has_chat(row: dict[str, Any], mapping: ColumnMapping) -> bool:
    """The row's messages column holds a chat prompt (not missing, null, ``""`` or ``[]``)."""
    return _present(row, mapping.messages) and row[mapping.messages] not in ("", [])  # type: ignore[index]


def _prompt_fields(row: dict[str, Any], mapping: ColumnMapping, fail: Any) -> dict[str, Any]:
    """``{"messages": ...}`` or ``{"text": ...}`` from the row's prompt columns."""
    if _has_chat(row, mapping):
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


# -- a prompt made with its content key once: a layout's derived prompt, or a prompts file's
# text column. ``prompt_from_row`` names a prompt without an id by a hash of its content key,
# on a first model that it then copies with that id, and the caller then needs the same key
# again. Here the key is computed first, from the turns (or text) given, and the id made from
# it goes in as the row's own: one model, one key. The result is used only when the prompt
# made holds exactly those turns (or that text), so that the key is its ``content_key()``;
# anything else (a row that names its id, a value the models would change or refuse) is left
# to ``prompt_from_row`` as ever.
def _pairs(messages: list[Any]) -> list[tuple[str, str]] | None:
    """``(role, content)`` of turns given as plain ``{role, content}`` text, else ``None``."""
    pairs = []
    for turn in messages:
        if type(turn) is not dict or turn.keys() != {"role", "content"}:
            return None
        role, content = turn["role"], turn["content"]
        if type(role) is not str or type(content) is not str:
            return None
        pairs.append((role, content))
    return pairs


def _id_column(mapping: ColumnMapping) -> str | None:
    """The id column, when no other prompt field is read from a column of that name."""
    column = mapping.prompt_id
    if column is None or column in mapping.metadata_columns or column in (
            mapping.text, mapping.messages, mapping.reference, mapping.metadata):
        return None
    return column


def derived_prompt(row: dict[str, Any], mapping: ColumnMapping, source: str, number: int, *,
                   text: str | None, messages: list[Any] | None) -> tuple[Prompt, str] | None:
    """``prompt_from_row(row, ..., text=text, messages=messages)`` and its content key, or
    ``None`` where that prompt is not surely made so (the caller makes it as ever)."""
    column = _id_column(mapping)
    if column is None or row.get(column) is not None:
        return None
    pairs = None
    if messages is not None:
        pairs = _pairs(messages)
        if pairs is None:
            return None
        key = prompt_content_key(None, pairs)
    elif type(text) is str:
        key = prompt_content_key(text, None)
    else:
        return None
    named = {**row, column: "p-" + group_id_of(key)[2:]}  # make_group_id's hash, as a prompt id
    try:
        prompt = prompt_from_row(named, mapping, source, number, text=text, messages=messages)
    except RowError:
        return None  # made as ever, the error is prompt_from_row's own
    if prompt.turns() != pairs or (pairs is None and prompt.text != text):
        return None
    return prompt, key


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
        self.check_id(prompt.prompt_id, number,
                      prompt.content_key() if content is None else content)

    def check_id(self, prompt_id: str, number: int, content: str) -> None:
        """:meth:`check` of a prompt known by its id and content key."""
        first = self.taken(prompt_id, content)
        if first is None:
            self.first.setdefault(prompt_id, (number, content))
            return
        self.clashes.setdefault(prompt_id, []).append(number)
        raise RowError(f"duplicate prompt_id {prompt_id!r} with a different prompt; first "
                       f"seen at row {first} (give each prompt its own id)", field=self.field,
                       source=self.source, row=number)

    def taken(self, prompt_id: str, content: str) -> int | None:
        """The row that took ``prompt_id`` for another prompt than ``content`` (``None``:
        the id is free, or names this prompt)."""
        seen = self.first.get(prompt_id)
        return None if seen is None or seen[1] == content else seen[0]

    def retracted(self) -> dict[int, Reject]:
        """With ``reject_all``: the first rows of clashing ids, row -> reject."""
        if self.policy != "reject_all":
            return {}
        return {self.first[pid][0]: Reject(
            stage=self.stage, source=self.source, row=self.first[pid][0], field=self.field,
            reason=f"duplicate prompt_id {pid!r}: row(s) {', '.join(map(str, rows))} give the "
            "same id to a different prompt (duplicate_ids: reject_all)")
            for pid, rows in self.clashes.items()}


def _prompt_and_key(row: dict[str, Any], mapping: ColumnMapping, source: str, number: int
                    ) -> tuple[Prompt, str]:
    """``prompt_from_row`` of a prompts file's row and the prompt's content key, made once
    for a text prompt without an id (:func:`derived_prompt`), else from the prompt."""
    value = row.get(mapping.text) if mapping.text else None
    if type(value) is str and not _has_chat(row, mapping):
        made = derived_prompt(row, mapping, source, number, text=value, messages=None)
        if made is not None:
            return made
    prompt = prompt_from_row(row, mapping, source, number)
    return prompt, prompt.content_key()


@dataclass(frozen=True)
class Made:
    """A row's prompt and the prompt's content key."""

    row: int
    prompt: Prompt
    content: str


def make_prompts(rows: Iterable[tuple[int, Row]], mapping: ColumnMapping, source: str,
                 stage: str, counts: ReadResult[Any], limit: int | None = None
                 ) -> Iterator[Made | Reject]:
    """Each row's prompt, or the reject of a row that holds none, in row order (the first
    ``limit`` rows when given); the rows and blank lines read are counted in ``counts``.
    Whether the file may hold the prompt is :class:`OnePerPrompt`'s to say."""
    for number, row in rows:
        if limit is not None and counts.rows - counts.blank >= limit:
            return
        counts.rows += 1
        try:
            if isinstance(row, RowError):
                counts.blank += isinstance(row, BlankLine)
                raise row
            prompt, content = _prompt_and_key(row, mapping, source, number)
        except RowError as err:
            yield to_reject(stage, err)
            continue
        yield Made(number, prompt, content)


class OnePerPrompt:
    """The prompts a file may hold, in row order: one row per prompt (a later row with the same
    prompt is a reject naming the first) and one prompt per id (:class:`PromptIds`)."""

    def __init__(self, mapping: ColumnMapping, source: str, stage: str):
        self.field, self.source = mapping.text, source
        self.seen: dict[str, int] = {}  # group id of each prompt taken -> its row
        self.ids = PromptIds(mapping.duplicate_ids, source, stage, mapping.prompt_id)

    def admit(self, prompt_id: str, content: str, number: int) -> None:
        """Take the prompt of row ``number`` (its id and content key).

        Raises:
            RowError: an earlier row has the same prompt, or its id for another prompt.
        """
        key = group_id_of(content)
        if key in self.seen:
            raise RowError(f"same prompt as row {self.seen[key]}", field=self.field,
                           source=self.source, row=number)
        self.ids.check_id(prompt_id, number, content)
        self.seen[key] = number


def read_prompts(source: str | Path, mapping: ColumnMapping | None = None, stage: str = "prompts",
                 split: str = "train", limit: int | None = None, fingerprint: str | None = None
                 ) -> ReadResult[Prompt]:
    """Read prompts (the first ``limit`` rows when given); bad rows, repeated prompts and
    reused ids become rejects. ``fingerprint``: the source's, when the caller made it
    (:func:`~grouppref.readers.rows.source_fingerprint`; else it is made here).

    Raises:
        InputFileError: the source cannot be read at all, or holds no rows.
    """
    mapping = mapping or ColumnMapping()
    text = str(source)
    result: ReadResult[Prompt] = ReadResult(source=text, items=[])
    admitted = OnePerPrompt(mapping, text, stage)
    with live_count(stage, "rows") as counted:  # on a terminal
        for made in make_prompts(counted(iter_rows(source, split)), mapping, text, stage, result,
                                 limit):
            if isinstance(made, Reject):
                result.rejects.append(made)
                continue
            try:
                admitted.admit(made.prompt.prompt_id, made.content, made.row)
            except RowError as err:
                result.rejects.append(to_reject(stage, err))
                continue
            result.items.append(made.prompt)
            result.item_rows.append(made.row)
    result.require_rows()
    drop_retracted(result, admitted.ids.retracted())
    result.fingerprint = fingerprint or source_fingerprint(text)
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
