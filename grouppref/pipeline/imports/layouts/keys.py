"""The candidate ids an import computes for every response text, with less work than the
general function: :func:`candidate_ids` are :func:`~grouppref.schemas.make_candidate_id` of a
group's texts, the group's part of the hashed text joined once. (Duplicate texts are told apart
by :func:`grouppref.schemas.texts.duplicate_keys`.)

``tests/unit/pipeline/imports/test_import_keys.py`` holds both equal to the functions they
stand for; the ids are also checked once here, on import, and the general function is used
should they ever differ (a changed id scheme).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from hashlib import sha256

from grouppref.schemas import make_candidate_id


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


def candidate_ids_of_utf8(group_id: str, data: memoryview, spans: Sequence[int]
                          ) -> list[str]:
    """:func:`candidate_ids` of texts given as their UTF-8 bytes: ``data[spans[i]:spans[i +
    1]]`` for each ``i`` (a column's buffer: no text made a ``str``)."""

    if not _SAME_IDS:
        return [make_candidate_id(group_id, bytes(data[a:b]).decode("utf-8"))
                for a, b in itertools.pairwise(spans)]
    copy = sha256((group_id + "\x1f").encode("utf-8")).copy
    out = []
    for a, b in itertools.pairwise(spans):
        digest = copy()
        digest.update(data[a:b])
        out.append("c-" + digest.hexdigest()[:16])
    return out
