"""Layout ``scores``: one row per response with one or more score columns, the general case
behind ``ultrafeedback`` and ``helpsteer2``.

Rows with the same prompt (or the same ``group_by`` value) form one group; each score column
named in ``scores`` is one ranking (annotator id = the column; higher is better, or
``lower_is_better``). Equal scores are ties; a missing score (null, NaN, one of ``missing``)
leaves that response out of that ranking (a partial ranking).

Example rows::

    {"prompt": "Name a colour.", "response": "Red", "judge_a": 4, "judge_b": 3}
    {"prompt": "Name a colour.", "response": "Blue", "judge_a": 4, "judge_b": "N/A"}
    {"prompt": "Name a colour.", "response": "Sky", "judge_a": 1, "judge_b": 1}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grouppref.pipeline.imports.layouts.build import read_groups
from grouppref.pipeline.imports.layouts.raw_groups import Context, Grouper, Imported
from grouppref.readers.rows import Row
from grouppref.schemas import Reject

DEFAULTS: dict[str, Any] = {"text_key": "text"}


def add_scored_row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
                   rejects: list[Reject], messages: list[Any] | None = None) -> None:
    """One response row into its group, its score columns into the group's votes."""
    column = ctx.mapping.response
    if column not in row:
        raise ctx.fail(f"no response: the row has no column {column!r} (its columns: "
                       f"{sorted(row)})", number, column)
    missing = [name for name in ctx.scores if name not in row]
    if missing:
        raise ctx.fail(f"no score column {missing[0]!r} (its columns: {sorted(row)}; see "
                       "--score)", number, missing[0])
    key = None
    if ctx.config.group_by is not None:
        if row.get(ctx.config.group_by) is None:
            raise ctx.fail(f"no group: column {ctx.config.group_by!r} is missing or null",
                           number, ctx.config.group_by)
        key = str(row[ctx.config.group_by])
    group = grouper.group(ctx.prompt(row, number, messages=messages), number, key=key)
    index = ctx.add_response(group, row[column], number, column)
    if group.responses[index].model is None and isinstance(row.get(ctx.config.model_key), str):
        group.responses[index].model = row[ctx.config.model_key]  # a model column of the row
    for name in ctx.scores:
        ctx.add_score(group, name, index, row[name], number, name, rejects)


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> groups with one ranking per score column, and rejects."""
    return read_groups(rows, ctx, add_scored_row, merge=True)
