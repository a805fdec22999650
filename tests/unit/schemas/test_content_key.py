"""A prompt's content key (written with ``json``'s string encoder) equals ``json.dumps`` of
the prompt's text or turns, for any text."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from grouppref.schemas.records import prompt_content_key

_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ['"', "\\", "\n\t\x00\x1f", "é ß 😀", "\u2028", "</script>"])


@given(_TEXT)
def test_the_key_of_a_text_is_its_json(text: str) -> None:
    assert prompt_content_key(text, None) == json.dumps({"text": text}, ensure_ascii=False)


@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "system", 'a"b']), _TEXT),
                max_size=4))
def test_the_key_of_turns_is_their_json(turns: list[tuple[str, str]]) -> None:
    assert prompt_content_key(None, turns) == json.dumps(
        {"messages": [[role, content] for role, content in turns]}, ensure_ascii=False)
