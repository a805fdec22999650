"""Layout ``groups``: rows in grouppref's own group form (``group_id``, ``prompt``,
``candidates``, optional ``rankings``): an export of another run, or groups written by hand.

Rankings are kept, each checked on its own (:mod:`grouppref.readers.groups`): a bad one is a
part-reject and the group stays; a partial ranking (at least two of the group's candidates)
is valid. A group id read again is merged (same contents) or rejected (other contents); one
prompt id names one prompt.

Example row (shortened)::

    {"group_id": "g-1", "prompt": {"prompt_id": "p-1", "text": "Name a colour."},
     "candidates": [{"candidate_id": "c-1", "text": "Red", "source": {"kind": "import"}},
                    {"candidate_id": "c-2", "text": "Blue", "source": {"kind": "import"}}],
     "rankings": [{"annotator": {"id": "ann-1", "kind": "human"}, "group_id": "g-1",
                   "tiers": [["c-2"], ["c-1"]]}]}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grouppref.errors import RowError
from grouppref.pipeline.imports.layouts.build import finish
from grouppref.pipeline.imports.layouts.raw_groups import Collected, Context, Imported
from grouppref.readers.groups import GroupRows
from grouppref.readers.prompts import PromptIds
from grouppref.readers.rows import BlankLine, Row, to_reject

DEFAULTS: dict[str, Any] = {}


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> the groups they hold (rankings kept), and rejects."""
    out = Collected()
    collected = GroupRows(source=ctx.source, stage=ctx.stage)
    ids = PromptIds(ctx.mapping.duplicate_ids, ctx.source, ctx.stage, "prompt.prompt_id")
    for number, row in rows:
        out.rows += 1
        if isinstance(row, RowError):
            out.blank += isinstance(row, BlankLine)
            out.rejects.append(to_reject(ctx.stage, row))
            continue
        if "candidates" not in row:
            out.rejects.append(ctx.reject(
                f"not a group in grouppref's form (no 'candidates'; its columns: {sorted(row)}); "
                "pick the layout of this data with --layout", number, "candidates", scope="row"))
            continue
        known = len(collected.groups)
        collected.add(row, number)
        if len(collected.groups) > known:  # a new group: its prompt id must be its own
            try:
                ids.check(collected.groups[-1].prompt, number)
            except RowError as err:
                collected.groups.pop()
                collected.rows.pop()
                collected.where = {g.group_id: i for i, g in enumerate(collected.groups)}
                out.rejects.append(to_reject(ctx.stage, err))
    retracted = ids.retracted()
    for group, number in zip(collected.groups, collected.rows, strict=True):
        if number in retracted:
            continue
        if group.k < ctx.config.min_k:
            out.rejects.append(ctx.reject(f"{group.k} candidates; min_k is {ctx.config.min_k}",
                                          number, "candidates", group_id=group.group_id,
                                          scope="row"))
            continue
        out.built.append(group)
        out.built_rows.append(number)
    out.rejects.extend(collected.rejects)
    out.rejects.extend(retracted.values())
    return finish(out, ctx)
