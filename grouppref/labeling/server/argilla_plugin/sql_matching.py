"""Pure helpers of the SQL search engine: text queries, terms/range matching, sorting.

Runs inside argilla-server's own virtual environment (standard library only), so it can be
tested anywhere. The semantics follow argilla-server's Elasticsearch engine:

- a text query is Elasticsearch's ``simple_query_string`` with ``default_operator=AND``: every
  term must occur as a word (case-insensitive) in the searched field(s); ``term*`` matches a
  prefix, ``"a phrase"`` consecutive words, ``-term`` excludes, ``a | b`` is an OR;
- a terms filter on a multi-valued property (a list) matches when any element matches;
  a range filter likewise (Elasticsearch indexes each element);
- sorting puts records without a value last, in both directions, and keeps earlier order
  (``inserted_at`` then ``id``) among ties; a list value sorts by its minimum ascending and
  its maximum descending (Elasticsearch's default sort mode).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

_WORD = re.compile(r"\w+", re.UNICODE)
_QUERY_TOKEN = re.compile(r'(-?)"([^"]*)"|(\|)|(-?)([^\s"|]+)')


def words(text: str) -> list[str]:
    """Lower-cased word tokens of ``text`` (Elasticsearch's standard analyzer, roughly)."""
    return _WORD.findall(text.lower())


def searchable_text(value: Any) -> str:
    """The text of a record field value: a string, a chat (list of messages) or any JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(searchable_text(v.get("content") if isinstance(v, dict) else v)
                        for v in value)
    if isinstance(value, dict):
        return " ".join(searchable_text(v) for v in value.values())
    return str(value)


def _parse_query(q: str) -> list[list[tuple[bool, list[str], bool]]]:
    """Parse a query into OR-groups of clauses ``(negated, words, prefix)``; groups are ORed."""
    groups: list[list[tuple[bool, list[str], bool]]] = [[]]
    for phrase_neg, phrase, bar, term_neg, term in _QUERY_TOKEN.findall(q):
        if bar:
            groups.append([])
            continue
        negated = bool(phrase_neg or term_neg)
        raw = phrase if phrase else term
        prefix = bool(term) and raw.endswith("*")
        tokens = words(raw)
        if tokens:
            groups[-1].append((negated, tokens, prefix))
    return [g for g in groups if g]


def _clause_hits(doc: list[str], tokens: list[str], prefix: bool) -> int:
    """How often the consecutive ``tokens`` occur in ``doc`` (last token a prefix if asked)."""
    n, hits = len(tokens), 0
    for i in range(len(doc) - n + 1):
        head_ok = doc[i:i + n - 1] == tokens[:-1]
        last = doc[i + n - 1]
        if head_ok and (last.startswith(tokens[-1]) if prefix else last == tokens[-1]):
            hits += 1
    return hits


def text_score(q: str, text: str) -> float | None:
    """Score of ``text`` for the query ``q``: ``None`` when it does not match, else a tf score.

    Example:
        >>> text_score("red fox", "The red fox. A red hen.")
        3.0
        >>> text_score("red -fox", "The red fox.") is None
        True
    """
    groups = _parse_query(q)
    if not groups:
        return 1.0
    doc = words(text)
    best: float | None = None
    for group in groups:
        score, ok = 0.0, True
        for negated, tokens, prefix in group:
            hits = _clause_hits(doc, tokens, prefix)
            if negated and hits or not negated and not hits:
                ok = False
                break
            score += hits
        if ok and (best is None or score > best):
            best = score
    return best


def flat(value: Any) -> list[Any]:
    """A property value as a list of scalars (Elasticsearch indexes list elements one by one)."""
    if value is None:
        return []
    if isinstance(value, list):
        return [v for item in value for v in flat(item)]
    return [value]


def term_text(value: Any) -> str:
    """A value as the keyword Elasticsearch would index (``3.0`` -> ``"3"``, ``True`` ->
    ``"true"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def terms_match(value: Any, values: Iterable[str]) -> bool:
    """Whether ``value`` (or any element of it) equals one of the filter's string ``values``."""
    wanted = {str(v) for v in values}
    return any(term_text(v) in wanted for v in flat(value))


def as_number(value: Any) -> float | None:
    """``value`` as a float, or ``None`` when it is not a finite number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def range_match(value: Any, ge: float | None, le: float | None) -> bool:
    """Whether ``value`` (or any element of it) is a number within ``[ge, le]``."""
    for v in flat(value):
        number = as_number(v)
        if number is None:
            continue
        if (ge is None or number >= ge) and (le is None or number <= le):
            return True
    return False


def sort_value(value: Any, descending: bool) -> Any:
    """The key a (possibly multi-valued) value sorts by; ``None`` when it has no value."""
    items = flat(value)
    if not items:
        return None
    numbers = [n for n in (as_number(v) for v in items) if n is not None]
    if len(numbers) == len(items):
        return max(numbers) if descending else min(numbers)
    texts = [term_text(v) for v in items]
    return max(texts) if descending else min(texts)


def sort_ids(ids: Sequence[Any], keys: Sequence[tuple[Callable[[Any], Any], bool]]) -> list[Any]:
    """Sort ``ids`` by several keys ``(key_of_id, descending)``, missing values last, stably."""
    ordered = list(ids)
    for key_of, descending in reversed(keys):
        present = [(key_of(i), i) for i in ordered]
        missing = [i for k, i in present if k is None]
        kept = [(k, i) for k, i in present if k is not None]
        kept.sort(key=lambda pair: _comparable(pair[0]), reverse=descending)
        ordered = [i for _, i in kept] + missing
    return ordered


def _comparable(key: Any) -> tuple[int, Any]:
    # numbers before strings, so mixed-type metadata never raises TypeError
    return (0, key) if isinstance(key, (int, float)) else (1, str(key))


def user_shuffle_key(user_id: Any, record_id: Any) -> str:
    """A per-user pseudo-random but stable order (Elasticsearch's ``random_score`` seeded by
    the user): each annotator sees the records in a different order, always the same one."""
    return hashlib.sha1(f"{user_id}:{record_id}".encode()).hexdigest()


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors (0 when either is all zeros)."""
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0
