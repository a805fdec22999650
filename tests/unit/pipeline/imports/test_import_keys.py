"""The keys an import computes per response text (:mod:`...layouts.keys`) stand exactly for
the general functions: equal duplicate keys where ``normalise_text`` forms are equal, ``""``
where that form is empty, and the ids ``make_candidate_id`` gives."""

from __future__ import annotations

import itertools
import random

import pytest

from grouppref.pipeline.imports.layouts.keys import candidate_ids, candidate_ids_of_utf8
from grouppref.schemas import make_candidate_id, normalise_text
from grouppref.schemas.texts import ASCII_SPACE, duplicate_keys

TRICKY = ["Seven.", "seven.", " SEVEN. ", "seven.\n", "se ven.", "seven!", "", " ", "\t\n",
          "\x1c", "a\x1fb", "a b", "A  B", "a\x85b", "a\u00a0b", "a b\u2028", "Straße",
          "STRASSE", "strasse", "\u212a", "k", "K", "İ", "i\u0307", "\x00", "\x7f", "ǅ", "ǆ",
          "ﬃ", "ffi", "Ω", "ω", "Ω", "x" * 600, "X" * 600, "é", "e\u0301"]


def _same(texts: list[str]) -> None:
    keys = duplicate_keys(texts) or list(range(len(texts)))
    norms = [normalise_text(t) for t in texts]
    for (a, ka, na), (b, kb, nb) in itertools.combinations(
            zip(texts, keys, norms, strict=True), 2):
        assert (ka == kb) == (na == nb), (a, b)
    assert [k == "" for k in keys] == [n == "" for n in norms]


def test_the_ascii_whitespace_is_what_str_split_splits_at() -> None:
    assert set(ASCII_SPACE) == {c for c in range(128) if len(f"a{chr(c)}b".split()) == 2}


@pytest.mark.parametrize("size", [2, 3])
def test_duplicate_keys_are_the_normal_forms_equality(size: int) -> None:
    for texts in itertools.combinations(TRICKY, size):
        _same(list(texts))
    _same(TRICKY)


def test_duplicate_keys_of_random_texts() -> None:
    rng = random.Random(7)
    alphabet = ["a", "B", " ", "  ", "\t", "\n", "ß", "SS", "s", "\u212a", "k", "\u00a0", "."]
    for _ in range(3000):
        _same(["".join(rng.choices(alphabet, k=rng.randint(0, 6)))
               for _ in range(rng.randint(1, 9))])


def test_unique_texts_are_keyed_without_their_normal_form() -> None:
    assert duplicate_keys(["one", "three", "fifteen"]) is None
    assert duplicate_keys(["one", "three", "Three"]) == [0, "three", "three"]
    assert duplicate_keys(["one", "", "three"]) == [0, "", 2]


def test_candidate_ids_are_make_candidate_ids() -> None:
    for gid in ("g-0123456789abcdef", "g-1-1of2", "g-ü"):
        assert candidate_ids(gid, TRICKY) == [make_candidate_id(gid, t) for t in TRICKY]


def test_a_lone_surrogate_fails_as_make_candidate_id_fails() -> None:
    with pytest.raises(UnicodeEncodeError):
        make_candidate_id("g-1", "a\ud800")
    with pytest.raises(UnicodeEncodeError):
        candidate_ids("g-1", ["a", "a\ud800"])


def test_ids_of_utf8_bytes_are_the_ids_of_the_texts() -> None:
    texts = list(TRICKY)
    data = "".join(texts).encode("utf-8")
    spans = list(itertools.accumulate((len(t.encode("utf-8")) for t in texts), initial=0))
    assert candidate_ids_of_utf8("g-0123456789abcdef", memoryview(data), spans) == candidate_ids(
        "g-0123456789abcdef", texts) == [make_candidate_id("g-0123456789abcdef", t)
                                          for t in texts]
