"""Texts told apart as candidates are: :func:`normalise_text` (case and whitespace folded) and
:func:`duplicate_keys`, which says which texts of a group are one and the same under it while
computing the normal form only for texts that could have a twin. The records' own check of a
group's candidates (``CandidateGroup``), validate's column check and import's build share it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def normalise_text(text: str) -> str:
    """Case-folded text with whitespace collapsed: two candidates equal under it are duplicates."""
    # str.split() splits at exactly the characters re's \s matches (Py_UNICODE_ISSPACE), so
    # this is re.sub(r"\s+", " ", text).strip() without the regex engine
    return " ".join(text.split()).casefold()


# the ASCII characters str.split() splits at (the same as re's \s): a text's non-whitespace
# characters are what its normal form keeps
ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())


def kept_chars(text: str) -> int:
    """How many characters of ``normalise_text(text)`` are not spaces: for ASCII text (which
    case-folds character for character) its own count of non-whitespace characters."""
    if text.isascii():
        return len(text.encode("ascii").translate(None, ASCII_SPACE))
    norm = normalise_text(text)
    return len(norm) - norm.count(" ")


def duplicate_keys(texts: Sequence[str], counts: Sequence[int] | None = None
                   ) -> list[str | int] | None:
    """A key per text: two texts' keys are equal exactly when their
    :func:`~grouppref.schemas.normalise_text` forms are, and the key is ``""`` exactly when
    that form is empty; ``None`` when no two texts are equal and none is empty (most groups).

    The normal form itself is the key of a text that could have a twin: one with no
    non-whitespace character, or as many as another text of ``texts``. Texts whose counts
    differ cannot be equal, so each other text's key is its index, an int no text equals.
    ``counts``: the texts' :func:`kept_chars`, where the caller has them.
    """
    counts = [kept_chars(text) for text in texts] if counts is None else list(counts)
    if len(set(counts)) == len(counts) and 0 not in counts:
        return None
    shared = {c for c, n in Counter(counts).items() if n > 1} | {0}
    return [normalise_text(text) if c in shared else i
            for i, (text, c) in enumerate(zip(texts, counts, strict=True))]
