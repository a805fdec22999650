"""A prompt a layout derived (Nectar's and hh-rlhf's transcripts, Arena's conversations) made
with its content key computed once.

:func:`~grouppref.readers.prompts.prompt_from_row` names a prompt without an id by a hash of
its content key, on a first model that it then copies with that id; the grouper then needs
the same key again. Here the key is computed first, from the turns (or text) the layout gives,
and the id made from it goes in as the row's own: one model, one key. The result is used only
when the prompt made holds exactly those turns (or that text), so that the key is its
:meth:`~grouppref.schemas.Prompt.content_key`; anything else (a row that names its id, a
value the models would change or refuse) is left to ``prompt_from_row`` as ever.
"""

from __future__ import annotations

from typing import Any

from grouppref.errors import RowError
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.prompts import prompt_from_row
from grouppref.schemas import Prompt, group_id_of
from grouppref.schemas.records import prompt_content_key


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
