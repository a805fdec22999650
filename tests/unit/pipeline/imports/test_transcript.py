"""``parse_hh`` of a one-turn prompt (read without the regex) equals the split of the
transcript at its markers, for transcripts made of marker-like pieces."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from grouppref.pipeline.imports.layouts.transcript import parse_hh

_PIECES = st.sampled_from(["\n\nHuman:", "\n\nAssistant:", "Human:", "\n\n", "\n", " ", "\t",
                           "Hi", "a\n\nb", ":", "Assistant: ", "é"])


def _reference(text: str) -> list[dict[str, str]] | None:
    """The transcript's turns by the split at every marker (what parse_hh means)."""
    parts = re.split(r"(?:^|\n\n)(Human|Assistant):[ \t]?", text)
    if len(parts) < 3:
        return None
    turns = [{"role": "user" if marker == "Human" else "assistant", "content": content.strip()}
             for marker, content in zip(parts[1::2], parts[2::2], strict=True)]
    if turns and turns[-1]["role"] == "assistant" and not turns[-1]["content"]:
        turns.pop()
    return turns


@given(st.lists(_PIECES, max_size=8))
def test_one_turn_prompts_read_as_the_split_reads_them(pieces: list[str]) -> None:
    text = "\n\nHuman:" + "".join(pieces) + "\n\nAssistant:"
    assert parse_hh(text) == _reference(text)


@given(st.lists(_PIECES, max_size=10))
def test_any_transcript_reads_as_the_split_reads_it(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert parse_hh(text) == _reference(text)
