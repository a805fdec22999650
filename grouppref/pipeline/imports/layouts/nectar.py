"""Layout ``nectar``: berkeley-nest/Nectar rows, one per prompt.

The published schema: ``prompt`` (an Anthropic-style transcript, ``"\\n\\nHuman: ...
\\n\\nAssistant:"``), ``answers``, a list of ``{answer, model, rank}`` (rank 1 = best, a float
in the Parquet file), ``turns``, ``num_responses``, ``source`` and ``good_natured``.

The transcript becomes chat messages (``transcripts``), ``turns``/``num_responses``/
``good_natured`` join the prompt's metadata, and the 7-wise ranking becomes one ranking
(annotator id ``nectar``, kind ``llm_judge``: GPT-4 ranked them). An answer without a rank is
left out of it (a partial ranking); equal ranks are ties.

Example row (shortened)::

    {"prompt": "\\n\\nHuman: Name a prime number.\\n\\nAssistant:",
     "answers": [{"answer": "7", "model": "gpt-4", "rank": 1.0},
                 {"answer": "9", "model": "llama-2-7b-chat", "rank": 2.0}],
     "turns": 1, "num_responses": 2, "good_natured": true}
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from grouppref.pipeline.imports.layouts.build import read_groups
from grouppref.pipeline.imports.layouts.raw_groups import (
    Context,
    Grouper,
    Imported,
    RawGroup,
    Response,
)
from grouppref.pipeline.imports.layouts.transcript import parse_hh
from grouppref.readers.rows import Row
from grouppref.schemas import Reject

ONE_ROW_PER_GROUP = True  # a repeated prompt is a reject: no row merges into another's group
DEFAULTS: dict[str, Any] = {"mapping": {"text": "prompt", "responses": "answers"},
                            "text_key": "answer", "kind": "llm_judge"}
METADATA = ("turns", "num_responses", "good_natured")


def read_row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
             rejects: list[Reject]) -> None:
    """One row's group into ``grouper`` (its rejects into ``rejects``)."""
    column = ctx.mapping.responses
    items = row.get(column) if column else None
    plain = type(items) is list and all(type(a) is dict and ctx.text_key in a for a in items)
    answers = [] if plain else ctx.objects(row, number, "answer", rejects)
    text = row.get(ctx.mapping.text) if ctx.mapping.text else None
    turns = parse_hh(text) if ctx.config.transcripts and isinstance(text, str) else None
    group = grouper.group(ctx.prompt(row, number, messages=turns or None, extra=METADATA),
                          number)
    if plain:
        _plain_answers(items, str(column), number, ctx, group, rejects)  # type: ignore[arg-type]
        return
    rank_key = ctx.config.rank_key
    scores: dict[int, float] | None = None  # the ranking's, made at the first rank
    keys: set[str] = set()
    for where, answer in answers:
        index = ctx.add_response(group, answer, number, where)
        rank = ctx.number(answer.get(rank_key), number, f"{where}.{rank_key}", rejects)
        if rank is not None:  # rank 1 is best: the score is its negative
            if scores is None:
                scores = group.vote(ctx.annotator, number).scores
            scores[index] = -rank
        keys.update(answer)
    ctx.absent([rank_key], keys, keys, number, column or "answers", "--rank-key", rejects)


def _plain_answers(items: list[dict[str, Any]], column: str, number: int, ctx: Context,
                   group: RawGroup, rejects: list[Reject]) -> None:
    """The answers of a row whose every answer is an object with a text: what the general loop
    in :func:`read_row` does with them (:meth:`Context.add_response`, :meth:`Context.number`),
    with the checks those make that such answers pass left out."""
    rank_key, text_key, model_key = ctx.config.rank_key, ctx.text_key, ctx.config.model_key
    responses = group.responses
    scores: dict[int, float] | None = None
    for i, answer in enumerate(items):
        model = answer.get(model_key)
        where = f"{column}[{i}]"
        responses.append(Response(answer[text_key], model if model is None or type(model) is str
                                  else str(model), number, where))
        rank = answer.get(rank_key)
        if type(rank) is not float or not math.isfinite(rank):
            rank = ctx.number(rank, number, f"{where}.{rank_key}", rejects)
        if rank is not None:  # rank 1 is best: the score is its negative
            if scores is None:
                scores = group.vote(ctx.annotator, number).scores
            scores[len(responses) - 1] = -rank
    if not any(rank_key in answer for answer in items):
        keys = {key for answer in items for key in answer}
        ctx.absent([rank_key], keys, keys, number, column, "--rank-key", rejects)


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> groups with one ranking each (partial where an answer has no rank)."""
    return read_groups(rows, ctx, read_row, merge=not ONE_ROW_PER_GROUP)
