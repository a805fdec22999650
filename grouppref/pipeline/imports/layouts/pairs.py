"""Layout ``pairs``: one preference pair per row: ``prompt`` / ``chosen`` / ``rejected``.

Accepted shapes (TRL's preference formats and HuggingFaceH4/ultrafeedback_binarized):

* standard: ``prompt``, ``chosen`` and ``rejected`` strings;
* conversational: ``prompt`` as chat messages (or a string) and ``chosen`` / ``rejected`` as
  messages: either the reply alone (``[{"role": "assistant", ...}]``) or the whole
  conversation, prompt turns first (ultrafeedback_binarized: ``[{"role": "user", ...},
  {"role": "assistant", ...}]``);
* implicit prompt: no prompt column, ``chosen`` / ``rejected`` whole conversations that share
  everything but the last assistant turn (the shared turns are the prompt), e.g.
  Skywork/Skywork-Reward-Preference-80K-v0.2 (``chosen``, ``rejected``, ``source``).

A ``source`` column with a scalar value joins the prompt's metadata (a prompt's first row's).

Every pair of one prompt joins one group whose rankings are the pairwise comparisons (partial
rankings of two candidates each; annotator id ``pairs``, then ``pairs#2``, ... for a prompt's
later pairs). ``score_chosen`` / ``score_rejected``, when present, are kept with the ranking.

Example rows (ultrafeedback_binarized, shortened)::

    {"prompt": "Name a prime.", "prompt_id": "ab12",
     "chosen": [{"role": "user", "content": "Name a prime."},
                {"role": "assistant", "content": "7"}],
     "rejected": [{"role": "user", "content": "Name a prime."},
                  {"role": "assistant", "content": "9"}],
     "score_chosen": 9.0, "score_rejected": 2.0}
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
    Vote,
)
from grouppref.pipeline.imports.layouts.transcript import as_turns, split_pair
from grouppref.readers.rows import Row, maybe_json
from grouppref.schemas import Prompt, Reject

# ultrafeedback_binarized's `messages` column is the chosen conversation, not the prompt:
# the prompt is the `prompt` column (a string, or chat turns as in TRL's format)
DEFAULTS: dict[str, Any] = {"text_key": "content", "mapping": {"messages": None}}
METADATA = ("source",)  # Skywork-Reward-Preference: the subset a pair comes from


def _reply(value: Any, prompt: Prompt, ctx: Context, number: int, column: str) -> str:
    """The reply in ``value``: a string, or the one assistant turn after the prompt's turns."""
    if isinstance(value, str):
        return value
    turns = as_turns(value)
    if turns is None:
        raise ctx.fail(f"{column} must be a string or chat messages, got a "
                       f"{type(value).__name__}", number, column)
    asked = [m.model_dump() for m in prompt.as_messages()]
    rest = turns[len(asked):] if turns[:len(asked)] == asked else turns
    if len(rest) != 1 or rest[0]["role"] != "assistant":
        raise ctx.fail(f"{column}: expected one assistant reply after the prompt, got "
                       f"{len(rest)} turn(s) ({', '.join(t['role'] for t in rest)})", number,
                       column)
    return rest[0]["content"]


def add_pair(group: RawGroup, chosen: str, rejected: str, number: int, ctx: Context,
             columns: tuple[str, str], shown: tuple[Any, Any] | None = None) -> None:
    """One comparison ``chosen > rejected`` as a two-candidate vote of the group."""
    group.repeats_expected = True  # a prompt's pairs share responses: that links them
    first = len(group.responses)
    group.responses += [Response(chosen, None, number, columns[0]),
                        Response(rejected, None, number, columns[1])]
    kept = None
    if shown is not None and all(isinstance(x, int | float) and not isinstance(x, bool)
                                 and math.isfinite(x) for x in shown):  # else: not kept
        kept = {first: float(shown[0]), first + 1: float(shown[1])}
    group.votes.append(Vote(annotator=group.next_annotator(ctx.annotator),
                            scores={first: 1.0, first + 1: 0.0}, shown=kept, row=number))


def _has_prompt(row: dict[str, Any], ctx: Context) -> bool:
    return any(c and row.get(c) not in (None, "", []) for c in
               (ctx.mapping.text, ctx.mapping.messages))


def _row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
         rejects: list[Reject]) -> None:
    cols = (ctx.config.chosen, ctx.config.rejected)
    for column in cols:
        if row.get(column) is None:
            raise ctx.fail(f"{column!r} is empty (null)" if column in row else
                           f"no {column!r}: the row's columns are {sorted(row)} (see --{column})",
                           number, column)
    chosen, rejected = maybe_json(row[cols[0]]), maybe_json(row[cols[1]])
    if _has_prompt(row, ctx):
        prompt = ctx.prompt(row, number, extra=METADATA)
        good = _reply(chosen, prompt, ctx, number, cols[0])
        bad = _reply(rejected, prompt, ctx, number, cols[1])
    else:
        turns_c, turns_r = as_turns(chosen), as_turns(rejected)
        if turns_c is None or turns_r is None:
            names = [c for c in (ctx.mapping.text, ctx.mapping.messages) if c]
            given = [c for c in names if c in row]
            what = (f"the prompt ({given[0]!r}) is empty" if given else
                    f"no prompt column ({' / '.join(map(repr, names))})")
            raise ctx.fail(f"{what} and {cols[0]} / {cols[1]} are not chat messages: give the prompt "
                           "column (--text-column), or use --layout hh for 'Human: / "
                           "Assistant:' transcripts", number, ctx.mapping.text)
        try:
            turns, good, bad = split_pair(turns_c, turns_r)
        except ValueError as e:
            raise ctx.fail(str(e), number, cols[0]) from e
        prompt = ctx.prompt(row, number, messages=turns, extra=METADATA)
    shown = (row.get(ctx.config.score_chosen), row.get(ctx.config.score_rejected))
    add_pair(grouper.group(prompt, number), good, bad, number, ctx, cols, shown)


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> one group per prompt whose rankings are its pairs, and rejects."""
    return read_groups(rows, ctx, _row, merge=True)
