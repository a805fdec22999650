"""Chat transcripts written as text, read into turns: Anthropic's ``\\n\\nHuman: ...
\\n\\nAssistant: ...`` (hh-rlhf, Nectar) and HelpSteer2's ``<extra_id_1>User`` /
``<extra_id_1>Assistant`` markers; and the shared prefix of two conversations (a pair whose
prompt is implicit). Pure functions over strings and lists of ``{role, content}``.
"""

from __future__ import annotations

import re
from typing import Any

Turn = dict[str, str]

# a marker after a blank line; a transcript that starts with one is read with a blank line put
# before it: the split of r"(?:^|\n\n)(Human|Assistant):[ \t]?", whose "^" alternative kept the
# regex from searching for the "\n\n" it starts with (a 1.4 kB transcript: 36 us to split it
# so, 8 us for all of hh_pairs)
_HH = re.compile(r"\n\n(Human|Assistant):[ \t]?")
_HELPSTEER = re.compile(r"\n?<extra_id_1>(User|Assistant)\n?")
_ROLE = {"Human": "user", "User": "user", "Assistant": "assistant"}
_USER, _CUE = "\n\nHuman:", "\n\nAssistant:"  # a one-turn prompt's two markers


def _turns(parts: list[str], lead: str) -> list[Turn]:
    """``re.split`` output (text, role, text, role, text, ...) as turns; ``lead`` is the role
    of text before the first marker (empty: such text is not a turn)."""
    turns: list[Turn] = []
    if parts[0].strip() and lead:
        turns.append({"role": lead, "content": parts[0].strip()})
    for marker, content in zip(parts[1::2], parts[2::2], strict=True):
        turns.append({"role": _ROLE[marker], "content": content.strip()})
    return turns


def hh_pairs(text: str, cue: bool = True) -> list[tuple[str, str]] | None:
    """:func:`parse_hh`'s turns as ``(role, content)`` pairs."""
    if cue and text.startswith(_USER) and text.endswith(_CUE) and text.count(_USER) == 1 \
            and text.count(_CUE) == 1:  # one user turn and the cue: the split, without it
        return [("user", text[len(_USER):-len(_CUE)].strip())]
    parts = _HH.split("\n\n" + text if text.startswith(("Human:", "Assistant:")) else text)
    if len(parts) < 3:
        return None
    turns = [(_ROLE[marker], content.strip())
             for marker, content in zip(parts[1::2], parts[2::2], strict=True)]
    if cue and turns and turns[-1][0] == "assistant" and not turns[-1][1]:
        turns.pop()
    return turns


def parse_hh(text: str, cue: bool = True) -> list[Turn] | None:
    """The turns of a ``Human: / Assistant:`` transcript, or ``None`` when ``text`` has no
    such marker. With ``cue``, a last assistant turn with no text (the cue a prompt ends with)
    is dropped.

    Example:
        >>> parse_hh("\\n\\nHuman: Hi\\n\\nAssistant: Hello!")
        [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello!'}]
    """
    pairs = hh_pairs(text, cue)
    return None if pairs is None else [{"role": role, "content": content}
                                       for role, content in pairs]


def parse_helpsteer(text: str) -> list[Turn] | None:
    """HelpSteer2's multi-turn prompt (``{user 1}\\n<extra_id_1>Assistant\\n{assistant 1}
    \\n<extra_id_1>User\\n{user 2}``) as turns; ``None`` for a single-turn prompt."""
    parts = _HELPSTEER.split(text)
    if len(parts) < 3:
        return None
    return _turns(parts, lead="user")


def shared_prefix(a: list[Any], b: list[Any]) -> int:
    """How many leading turns two conversations share (same role and content)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def as_turns(value: Any) -> list[Turn] | None:
    """A list of ``{role, content}`` objects as turns (role and content only), else ``None``."""
    if not isinstance(value, list) or not value:
        return None
    turns = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                or not isinstance(m.get("content"), str):
            return None
        turns.append({"role": m["role"], "content": m["content"]})
    return turns


def not_turns(value: Any) -> str:
    """Why ``value`` is not chat turns (for a reject: "got ..."), given :func:`as_turns`
    returned ``None`` for it."""
    if not isinstance(value, list):
        return "nothing" if value is None else f"a {type(value).__name__}"
    if not value:
        return "an empty list"
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                or not isinstance(m.get("content"), str):
            shown = sorted(m) if isinstance(m, dict) else type(m).__name__
            return f"a list whose item {i} is not {{role, content}} text ({shown})"
    return "a list"


def split_pair(chosen: list[Turn], rejected: list[Turn]) -> tuple[list[Turn], str, str]:
    """``(prompt turns, chosen reply, rejected reply)`` of two conversations that share
    everything but their last assistant turn.

    Raises:
        ValueError: they are the same, one is a prefix of the other, they part before their
            last turn, the prompt does not end with a user turn, or a reply is not one
            assistant turn.
    """
    n = shared_prefix(chosen, rejected)
    if n == len(chosen) == len(rejected):
        raise ValueError("chosen and rejected are the same conversation")
    if n in (len(chosen), len(rejected)):
        raise ValueError("one of chosen / rejected is the start of the other: no reply to "
                         "compare")
    if n == 0:
        raise ValueError("chosen and rejected share no prompt (they differ from the first turn)")
    rest_c, rest_r = chosen[n:], rejected[n:]
    if len(rest_c) != 1 or len(rest_r) != 1:
        raise ValueError(f"chosen and rejected part at turn {n + 1} of {len(chosen)} / "
                         f"{len(rejected)}, before their last turn: only a final assistant "
                         "turn can be a candidate")
    if rest_c[0]["role"] != "assistant" or rest_r[0]["role"] != "assistant":
        raise ValueError("the turns after the shared prompt must be the assistant's replies")
    if chosen[n - 1]["role"] != "user":
        raise ValueError("the shared prompt must end with a user turn")
    return chosen[:n], rest_c[0]["content"], rest_r[0]["content"]
