"""Layout ``arena``: lmsys/chatbot_arena_conversations, one battle per row.

The published schema: ``question_id``, ``model_a``, ``model_b``, ``winner`` (``model_a``,
``model_b``, ``tie`` or ``tie (bothbad)``), ``judge`` (the voter, e.g. ``arena_user_973``),
``conversation_a`` / ``conversation_b`` (lists of ``{role, content}``, user and assistant
turns; the user turns are the same in both), ``turn`` (user turns), ``anony``, ``language``,
``tstamp``, ``openai_moderation`` and ``toxic_chat_tag``.

Battles on the same prompt (the shared turns, not the ``question_id``, which names one
battle) join one group; each battle is one two-candidate ranking by its ``judge`` (kind
``human``; a judge's second vote on a prompt is ``<judge>#2``; a row without a judge is
``arena``). The candidates are the two last assistant turns, with ``model_a`` / ``model_b``
as their models. ``tie`` and ``tie (bothbad)`` are both ties (one tier); the verdict is kept
in the ranking's ``metadata`` (``winner``), so "both bad" stays visible. ``language`` and
``turn`` join the prompt's metadata (``--lang`` keeps some languages).

Multi-turn battles: the prompt is the conversation up to the last user turn only when both
conversations share it. When they part earlier (model A's and model B's first replies
differ, as they almost always do), the vote judges two whole conversations, not two replies
to one prompt: the row is rejected with that reason rather than read as something it is not.

Example row (shortened)::

    {"question_id": "58210e39b3fd4441a2bd4a518bb44c2d", "model_a": "chatglm-6b",
     "model_b": "koala-13b", "winner": "model_b", "judge": "arena_user_973",
     "conversation_a": [{"role": "user", "content": "Name a prime."},
                        {"role": "assistant", "content": "9"}],
     "conversation_b": [{"role": "user", "content": "Name a prime."},
                        {"role": "assistant", "content": "7"}],
     "turn": 1, "anony": true, "language": "English", "tstamp": 1682351591.1322}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grouppref.pipeline.imports.layouts.build import read_groups
from grouppref.pipeline.imports.layouts.raw_groups import (
    Context,
    Grouper,
    Imported,
    Response,
    Vote,
)
from grouppref.pipeline.imports.layouts.transcript import (
    Turn,
    as_turns,
    not_turns,
    shared_prefix,
)
from grouppref.readers.rows import Row, maybe_json
from grouppref.schemas import Reject

DEFAULTS: dict[str, Any] = {"kind": "human"}
SIDES = ("a", "b")
WINNERS: dict[str, tuple[float, float]] = {"model_a": (1.0, 0.0), "model_b": (0.0, 1.0),
                                           "tie": (0.0, 0.0), "tie (bothbad)": (0.0, 0.0)}


def split_battle(a: list[Turn], b: list[Turn]) -> tuple[list[Turn], str, str]:
    """``(prompt turns, reply a, reply b)`` of two conversations that share everything but
    their last assistant turn.

    Raises:
        ValueError: they part before the last turn, or do not end with an assistant reply to
            a user turn.
    """
    n = shared_prefix(a, b)
    if n == len(a) == len(b):
        n -= 1  # the same replies: still a comparison (a tie or a vote between equals)
    if n < len(a) - 1 or n < len(b) - 1:
        raise ValueError(f"conversation_a and conversation_b part at turn {n + 1} of "
                         f"{len(a)} / {len(b)}, before the last reply: the vote judges two "
                         "different conversations, not two replies to one prompt")
    if len(a) != len(b) or n == 0 or a[-1]["role"] != "assistant" \
            or b[-1]["role"] != "assistant" or a[n - 1]["role"] != "user":
        raise ValueError("each conversation must be the shared user turns (and replies) then "
                         "one assistant reply")
    return a[:n], a[-1]["content"], b[-1]["content"]


def _conversations(row: dict[str, Any], number: int, ctx: Context) -> list[list[Turn]]:
    out = []
    for side in SIDES:
        column = f"conversation_{side}"
        given = maybe_json(row.get(column))
        turns = as_turns(given)
        if turns is None:
            raise ctx.fail(f"{column} must be a list of {{role, content}} turns, got "
                           f"{not_turns(given)}", number, column)
        out.append(turns)
    return out


def _row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
         rejects: list[Reject]) -> None:
    winner = row.get("winner")
    if winner not in WINNERS:
        raise ctx.fail(f"winner must be one of {', '.join(map(repr, WINNERS))}, got {winner!r}",
                       number, "winner")
    ctx.keep_language(row, number, "language")
    conv_a, conv_b = _conversations(row, number, ctx)
    try:
        turns, reply_a, reply_b = split_battle(conv_a, conv_b)
    except ValueError as e:
        raise ctx.fail(str(e), number, "conversation_b") from e
    group = grouper.group(ctx.prompt(row, number, messages=turns, extra=("language", "turn")),
                          number)
    group.repeats_expected = True  # a model's reply recurs across battles on one prompt
    first = len(group.responses)
    for side, reply in zip(SIDES, (reply_a, reply_b), strict=True):
        model = row.get(f"model_{side}")
        group.responses.append(Response(reply, model if isinstance(model, str) else None,
                                        number, f"conversation_{side}[{len(conv_a) - 1}]"))
    judge = row.get("judge")
    base = judge if isinstance(judge, str) and judge.strip() else ctx.annotator
    score_a, score_b = WINNERS[winner]
    group.votes.append(Vote(annotator=group.next_annotator(base), row=number,
                            scores={first: score_a, first + 1: score_b},
                            notes={"winner": winner}))


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> one group per prompt whose rankings are its battles, and rejects."""
    return read_groups(rows, ctx, _row, merge=True)
