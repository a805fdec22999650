"""Layout ``hh``: Anthropic/hh-rlhf rows: ``chosen`` and ``rejected`` whole transcripts
(``"\\n\\nHuman: ...\\n\\nAssistant: ..."``) with the prompt implicit in them.

The turns both transcripts share are the prompt (chat messages, ending with the human's
turn); the two last assistant turns are the candidates, ``chosen`` preferred. A transcript
pair that parts before its last turn, or is the same text, is rejected with the reason. Pairs
of one prompt join one group (annotator id ``hh``, then ``hh#2``, ...; kind ``human``).

Example row::

    {"chosen": "\\n\\nHuman: Name a prime.\\n\\nAssistant: 7 is prime.",
     "rejected": "\\n\\nHuman: Name a prime.\\n\\nAssistant: 9."}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grouppref.pipeline.imports.layouts.build import read_groups
from grouppref.pipeline.imports.layouts.pairs import add_pair
from grouppref.pipeline.imports.layouts.raw_groups import Context, Grouper, Imported
from grouppref.pipeline.imports.layouts.transcript import parse_hh, split_pair
from grouppref.readers.rows import Row
from grouppref.schemas import Reject

DEFAULTS: dict[str, Any] = {}


def _turns(row: dict[str, Any], column: str, number: int, ctx: Context) -> list[dict[str, str]]:
    value = row.get(column)
    if not isinstance(value, str):
        raise ctx.fail(f"{column!r} must be a transcript string, got "
                       f"{type(value).__name__} (its columns: {sorted(row)})", number, column)
    turns = parse_hh(value, cue=False)
    if turns is None:
        raise ctx.fail(f"{column!r} is not a 'Human: / Assistant:' transcript", number, column)
    return turns


def _row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
         rejects: list[Reject]) -> None:
    cols = (ctx.config.chosen, ctx.config.rejected)
    chosen, rejected = (_turns(row, c, number, ctx) for c in cols)
    try:
        turns, good, bad = split_pair(chosen, rejected)
    except ValueError as e:
        raise ctx.fail(str(e), number, cols[0]) from e
    prompt = ctx.prompt(row, number, messages=turns)
    add_pair(grouper.group(prompt, number), good, bad, number, ctx, cols)


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> one group per prompt whose rankings are its pairs, and rejects."""
    return read_groups(rows, ctx, _row, merge=True)
