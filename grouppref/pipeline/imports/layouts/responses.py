"""Layout ``responses``: candidates without rankings, one row per prompt with a list of
responses (strings or ``{text, model}`` objects), or one row per response (rows sharing a
prompt form a group, in file order). The layout of ``generate --import``.

Example rows::

    {"prompt": "What is 2+2?", "responses": ["4", {"text": "Four.", "model": "m-1"}]}
    {"prompt": "Name a colour.", "response": "Red"}
    {"prompt": "Name a colour.", "response": "Blue"}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grouppref.pipeline.imports.layouts.build import read_groups
from grouppref.pipeline.imports.layouts.raw_groups import Context, Grouper, Imported
from grouppref.readers.rows import Row, maybe_json
from grouppref.schemas import Reject

DEFAULTS: dict[str, Any] = {"text_key": "text"}


def _row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
         rejects: list[Reject]) -> None:
    many, one = ctx.mapping.responses, ctx.mapping.response
    if many not in row and one not in row:
        raise ctx.fail(f"no responses: the row has neither {many!r} nor {one!r} (its columns: "
                       f"{sorted(row)})", number, many)
    prompt = ctx.prompt(row, number)
    if many in row:
        values = maybe_json(row[many])
        if not isinstance(values, list):
            raise ctx.fail(f"expected a list of responses, got a {type(values).__name__}",
                           number, many)
        group = grouper.group(prompt, number, merge=False)
        for i, value in enumerate(values):
            ctx.add_response(group, value, number, f"{many}[{i}]")
        return
    ctx.response(row[one], number, one)  # a bad response rejects the row before it opens a group
    ctx.add_response(grouper.group(prompt, number, merge=True), row[one], number, one)


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> candidate groups (no rankings) and rejects."""
    return read_groups(rows, ctx, _row, merge=True)
