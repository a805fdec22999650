"""The SQL search engine's pure helpers (``argilla_plugin/sql_matching.py``), no server.

The module runs inside argilla-server's venv and is loaded here by path, standard library only.
"""

from __future__ import annotations

import importlib.util
import math

import pytest

from grouppref.labeling.server.venv import PLUGIN_DIR

_spec = importlib.util.spec_from_file_location("sql_matching", PLUGIN_DIR / "sql_matching.py")
m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(m)


@pytest.mark.parametrize(("query", "text", "expected"), [
    ("red fox", "The red fox. A red hen.", 3.0),        # tf: red x2 + fox x1
    ("RED", "a red hen", 1.0),                          # case-insensitive
    ("red cat", "a red hen", None),                     # AND: every term must occur
    ("zebra", "Zebras run", None),                      # whole words, no stemming
    ("zebra*", "Zebras run", 1.0),                      # prefix
    ('"red hen"', "a red hen", 1.0),                    # phrase
    ('"hen red"', "a red hen", None),
    ("red -fox", "The red fox", None),                  # negation
    ("red -fox", "The red hen", 1.0),
    ("cat | hen", "a red hen", 1.0),                    # OR
    ("", "anything", 1.0),
])
def test_text_score(query: str, text: str, expected: float | None) -> None:
    assert m.text_score(query, text) == expected


def test_searchable_text_of_chat_and_json() -> None:
    chat = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"}]
    assert m.searchable_text(chat) == "Hi there Hello"
    assert m.searchable_text({"a": "x", "b": 3}) == "x 3"
    assert m.searchable_text(None) == ""


def test_terms_and_range_on_scalars_and_lists() -> None:
    assert m.terms_match("a", ["a", "b"]) and not m.terms_match("c", ["a"])
    assert m.terms_match(["x", "b"], ["b"])                 # any element of a list
    assert m.terms_match(3, ["3"]) and m.terms_match(3.0, ["3"])  # numbers as strings
    assert m.terms_match(True, ["true"])
    assert not m.terms_match(None, ["None"])
    assert m.range_match(5, 5, 5) and not m.range_match(5, 5.5, None)
    assert m.range_match([0.1, 0.9], 0.8, None)              # any element
    assert not m.range_match("abc", 0, None) and not m.range_match(math.nan, None, 1)


def test_sort_ids_missing_last_both_ways_and_stable() -> None:
    values = {"a": 2, "b": None, "c": 1, "d": 2}
    key = [(lambda i: values[i], False)]
    assert m.sort_ids(list("abcd"), key) == ["c", "a", "d", "b"]
    key = [(lambda i: values[i], True)]
    assert m.sort_ids(list("abcd"), key) == ["a", "d", "c", "b"]  # ties keep order; None last
    two = [(lambda i: values[i] or 0, True), (lambda i: i, True)]
    assert m.sort_ids(list("abcd"), two) == ["d", "a", "c", "b"]


def test_sort_value_of_lists_follows_elasticsearch_modes() -> None:
    assert m.sort_value([0.3, 0.1, 0.9], descending=False) == 0.1   # asc: min
    assert m.sort_value([0.3, 0.1, 0.9], descending=True) == 0.9    # desc: max
    assert m.sort_value([], descending=False) is None


def test_user_shuffle_is_stable_and_differs_between_users() -> None:
    ids = [f"r{i}" for i in range(50)]
    order_a = sorted(ids, key=lambda i: m.user_shuffle_key("alice", i))
    assert order_a == sorted(ids, key=lambda i: m.user_shuffle_key("alice", i))
    assert order_a != sorted(ids, key=lambda i: m.user_shuffle_key("bob", i))


def test_cosine() -> None:
    assert m.cosine([1, 0], [0, 1]) == 0.0
    # float64 dot / norms of 2-vectors: a few eps64 (2e-16) from 1
    assert m.cosine([1, 1], [2, 2]) == pytest.approx(1.0, abs=1e-12)
    assert m.cosine([0, 0], [1, 2]) == 0.0
