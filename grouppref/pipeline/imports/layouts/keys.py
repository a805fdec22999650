"""The two keys an import computes for every response text, once per text and with less work
than the general functions they stand for:

* :func:`duplicate_keys` tell a group's texts that are one and the same under
  :func:`~grouppref.schemas.normalise_text` (case and whitespace folded) while computing that
  normal form only for texts that could have a twin: ASCII text (most text) is first told
  apart by its count of non-whitespace characters, two C calls;
* :func:`candidate_ids` are :func:`~grouppref.schemas.make_candidate_id` of a group's texts,
  the group's part of the hashed text joined once.

``tests/unit/pipeline/imports/test_import_keys.py`` holds both equal to the functions they stand for;
the ids are also checked once here, on import, and the general function is used should they
ever differ (a changed id scheme).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from hashlib import sha256

from grouppref.schemas import make_candidate_id, normalise_text

# the ASCII characters str.split() splits at (the same as re's \s): a text's non-whitespace
# characters are what its normal form keeps
_ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())


def _kept_chars(text: str) -> int:
    """How many characters of ``normalise_text(text)`` are not spaces: for ASCII text (which
    case-folds character for character) its own count of non-whitespace characters."""
    if text.isascii():
        return len(text.encode("ascii").translate(None, _ASCII_SPACE))
    norm = normalise_text(text)
    return len(norm) - norm.count(" ")


def duplicate_keys(texts: Sequence[str]) -> list[str | int] | None:
    """A key per text: two texts' keys are equal exactly when their
    :func:`~grouppref.schemas.normalise_text` forms are, and the key is ``""`` exactly when
    that form is empty; ``None`` when no two texts are equal and none is empty (most groups).

    The normal form itself is the key of a text that could have a twin: one with no
    non-whitespace character, or as many as another text of ``texts``. Texts whose counts
    differ cannot be equal, so each other text's key is its index, an int no text equals.
    """
    counts = [_kept_chars(text) for text in texts]
    if len(set(counts)) == len(counts) and 0 not in counts:
        return None
    shared = {c for c, n in Counter(counts).items() if n > 1} | {0}
    return [normalise_text(text) if c in shared else i
            for i, (text, c) in enumerate(zip(texts, counts, strict=True))]


def _hashed_ids(group_id: str, texts: Sequence[str]) -> list[str]:
    head = group_id + "\x1f"  # make_candidate_id hashes "\x1f".join((group_id, text))
    return ["c-" + sha256((head + text).encode("utf-8")).hexdigest()[:16] for text in texts]


_SAMPLE = ("g-0123456789abcdef", ("Seven.", " a\x1fb ", "ß\u212a\n"))
_SAME_IDS = _hashed_ids(_SAMPLE[0], _SAMPLE[1]) == [make_candidate_id(_SAMPLE[0], t)
                                                     for t in _SAMPLE[1]]


def candidate_ids(group_id: str, texts: Sequence[str]) -> list[str]:
    """``[make_candidate_id(group_id, text) for text in texts]``."""
    if not _SAME_IDS:
        return [make_candidate_id(group_id, text) for text in texts]
    return _hashed_ids(group_id, texts)
