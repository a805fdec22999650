"""A prompt made with its content key once (``grouppref.readers.prompts.derived_prompt``) is
the prompt ``prompt_from_row`` makes, and the key its ``content_key()``; where that is not sure,
nothing is made (the caller makes it as ever)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grouppref.errors import RowError
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.prompts import derived_prompt, prompt_from_row

MAPPING = ColumnMapping(metadata_columns=["turns"])
ROW = {"prompt": "ignored", "turns": 2, "metadata": {"k": "v"}, "reference": "ref"}
HI = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
      {"role": "user", "content": "Name a prime, ünïcode ✓ \"quoted\"."}]


@pytest.mark.parametrize(("text", "messages"), [
    (None, HI), (None, HI[:1]), ("Plain text prompt.", None), ("ünï \n code", None),
    ("both", HI)])
def test_the_prompt_and_key_are_prompt_from_rows(text: str | None,
                                                 messages: list[Any] | None) -> None:
    made = derived_prompt(ROW, MAPPING, "f.jsonl", 3, text=text, messages=messages)
    want = prompt_from_row(ROW, MAPPING, "f.jsonl", 3, text=text, messages=messages)
    assert made is not None
    assert made[0] == want
    assert made[1] == want.content_key()


@pytest.mark.parametrize(("row", "mapping", "messages"), [
    ({**ROW, "prompt_id": "mine"}, MAPPING, HI),  # the row names its id
    ({**ROW, "prompt_id": ""}, MAPPING, HI),
    (ROW, ColumnMapping(prompt_id=None), HI),
    (ROW, ColumnMapping(prompt_id="reference"), HI),
    (ROW, ColumnMapping(metadata_columns=["prompt_id"]), HI),
    (ROW, MAPPING, [{"role": "user", "content": "Hi", "name": "x"}]),
    (ROW, MAPPING, [{"role": "user", "content": 3}]),
    (ROW, MAPPING, [["user", "Hi"]]),
    (ROW, MAPPING, [{"role": "human", "content": "Hi"}]),  # the models refuse it
    (ROW, MAPPING, [{"role": "user", "content": "  "}]),
    (ROW, MAPPING, []),
])
def test_nothing_is_made_where_it_is_not_sure(row: dict[str, Any], mapping: ColumnMapping,
                                              messages: list[Any]) -> None:
    assert derived_prompt(row, mapping, "f.jsonl", 3, text=None, messages=messages) is None


def test_a_prompt_the_models_refuse_is_refused_as_ever() -> None:
    bad = [{"role": "user", "content": "  "}]
    assert derived_prompt(ROW, MAPPING, "f.jsonl", 3, text=None, messages=bad) is None
    with pytest.raises(RowError):
        prompt_from_row(ROW, MAPPING, "f.jsonl", 3, messages=bad)


PROMPT_ROWS = [
    {"prompt": "Name a colour."},                                    # made with its key once
    {"prompt": "  Name a fruit. ", "prompt_id": "f-1"},              # the row names its id
    {"prompt": "Name a tree.", "prompt_id": "   "},                  # a blank id is no id
    {"prompt": "Ignored: the chat wins.", "messages": HI},           # a chat prompt
    {"prompt": "Name a bird.", "messages": []},                      # an empty chat: the text
    {"prompt": "   "},                                               # refused, as ever
    {"prompt": 7},                                                   # not text: refused
    {"prompt": "Name a colour.", "metadata": {"n": 2}},              # the same prompt again
]


def test_a_prompts_file_reads_as_row_by_row_prompt_from_row(tmp_path: Path) -> None:
    import json

    from grouppref.readers.prompts import read_prompts

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPT_ROWS), encoding="utf-8")
    got = read_prompts(path)
    want = []
    for number, row in enumerate(PROMPT_ROWS, start=1):
        try:
            want.append((number, prompt_from_row(row, ColumnMapping(), str(path), number)))
        except RowError:
            pass
    assert list(zip(got.item_rows, got.items, strict=True)) == want[:-1]  # the last repeats
    assert [r.row for r in got.rejects] == [6, 7, 8]
    assert "same prompt as row 1" in got.rejects[-1].reason
