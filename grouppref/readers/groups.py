"""Candidate groups from a user's file (``generate --import``): responses made elsewhere, one row
per prompt (a list of responses) or one row per response (rows sharing a prompt form a group).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from grouppref.errors import InputFileError, RowError
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.prompts import prompt_from_row
from grouppref.readers.rows import (
    ReadResult,
    iter_rows,
    maybe_json,
    source_fingerprint,
    to_reject,
    validation_reason,
)
from grouppref.schemas.records import (
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

R = TypeVar("R", bound=BaseModel)


def record_from_row(model: type[R], row: dict[str, Any], source: str, number: int) -> R:
    """Validate a row in the record's JSON form; a failure names the first bad field."""
    try:
        return model.model_validate(row)
    except ValidationError as e:
        msg, loc = validation_reason(e)
        raise RowError(msg, field=loc or None, source=source, row=number,
                       group_id=row.get("group_id") if isinstance(row.get("group_id"), str)
                       else None) from e


def _response(value: Any, source: str, number: int, column: str) -> tuple[str, str | None]:
    value = maybe_json(value)
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
                raw = maybe_json(row[mapping.responses])
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
            result.rejects.append(to_reject(stage, err))
    for prompt, number, responses in pending.values():
        try:
            group, rejects = build_group(prompt, responses, stage, text, number)
            result.items.append(group)
            result.rejects.extend(rejects)
        except RowError as err:
            result.rejects.append(to_reject(stage, err))
    if result.rows == 0:
        raise InputFileError(f"{text}: no rows")
    result.fingerprint = source_fingerprint(text)
    return result
