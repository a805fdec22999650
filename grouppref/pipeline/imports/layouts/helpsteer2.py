"""Layout ``helpsteer2``: nvidia/HelpSteer2 rows, one per response.

The published schema: ``prompt``, ``response`` and five integer attributes 0..4
(``helpfulness``, ``correctness``, ``coherence``, ``complexity``, ``verbosity``; higher is
more). Consecutive rows share a prompt; a multi-turn prompt holds the earlier turns joined by
``<extra_id_1>User`` / ``<extra_id_1>Assistant`` markers, read as chat messages
(``transcripts``).

Rows with the same prompt form one group; each attribute named in ``scores`` is one ranking
(annotator id = the attribute, kind ``human``). The default is helpfulness, correctness and
coherence: complexity and verbosity describe depth and length, which the dataset lets a model
steer, not quality (add them with ``--score`` if you want them ranked). Equal scores are ties.

Example rows::

    {"prompt": "c#", "response": "C# is a ...", "helpfulness": 3, "correctness": 4,
     "coherence": 4, "complexity": 2, "verbosity": 1}
    {"prompt": "c#", "response": "C# (C sharp) ...", "helpfulness": 2, ...}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grouppref.pipeline.imports.layouts.build import read_groups
from grouppref.pipeline.imports.layouts.raw_groups import Context, Grouper, Imported
from grouppref.pipeline.imports.layouts.scores import add_scored_row
from grouppref.pipeline.imports.layouts.transcript import parse_helpsteer
from grouppref.readers.rows import Row
from grouppref.schemas import Reject

ATTRIBUTES = ["helpfulness", "correctness", "coherence", "complexity", "verbosity"]
DEFAULTS: dict[str, Any] = {"mapping": {"text": "prompt", "response": "response"},
                            "scores": ATTRIBUTES[:3], "kind": "human"}


def _row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
         rejects: list[Reject]) -> None:
    text = row.get(ctx.mapping.text) if ctx.mapping.text else None
    turns = parse_helpsteer(text) if ctx.config.transcripts and isinstance(text, str) else None
    add_scored_row(row, number, ctx, grouper, rejects, messages=turns)


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> one group per prompt with one ranking per attribute, and rejects."""
    return read_groups(rows, ctx, _row, merge=True)
