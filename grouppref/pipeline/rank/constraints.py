"""Verifiable instruction constraints (IFEval-style): one pure check per constraint type.

A prompt carries its constraints as a list of ``{"id": ID, "kwargs": {...}}`` (JSON in the
prompt's metadata, see :func:`parse_constraints`); the rule ranker's ``constraints`` check
scores a candidate by the share of its prompt's constraints the candidate meets
(:func:`satisfaction`), and an evaluation counts the same checks.

Ids and keyword arguments follow IFEval (Zhou et al. 2023, arXiv:2311.07911; the
``instruction_id_list`` / ``kwargs`` columns of its published dataset), so IFEval rows can be
scored as they are. tests/unit/pipeline/rank/test_constraints_ifeval.py runs the official
implementation (lm-eval's ``lm_eval/tasks/ifeval``, strict scoring) on an edge-case corpus
(tests/data/ifeval_edge/) and asserts agreement case by case except these departures, all
deliberate (docs/rank.md has the table); where IFEval's verdict is the instruction's plain
meaning we follow it:

* an empty or blank answer meets no constraint (as IFEval's strict scoring; :func:`check`);
* strict checks only (IFEval's "loose" variants, which also try the response without its
  first/last line or without asterisks, are not applied);
* ``change_case:english_*`` use ``str.islower``/``isupper`` as IFEval but run no language
  detector: langdetect misreads short and all-capital English ("BEES MAKE HONEY." is not "en");
* words (:mod:`grouppref.pipeline.rank.text`) keep ``don't``, ``mother-in-law``, ``3.14`` and
  ``a.m.`` whole (IFEval's ``\\w+`` runs split them); sentences are rule-based: not split after
  ``Mt.``, ``e.g.``, ``No. 5``, a list number, an initial, or ``etc.`` or a quoted "Run!" before
  a lowercase word, nor at ``!!!`` or ``?!``; split at ``buzz.They`` and at a blank line
  (IFEval's punkt model does each of these the other way);
* ``keywords:existence`` matches whole words ("bright" is not in "brightness"; IFEval: any
  substring, unescaped regex);
* ``startend:quotation`` and ``end_checker`` take curly double quotes for quotation marks,
  quotes must wrap something, and the end phrase starts at a word boundary;
* ``punctuation:no_comma`` also refuses fullwidth, ideographic and Arabic commas;
* ``detectable_format:json_format`` refuses ``NaN``/``Infinity`` (not JSON, RFC 8259);
* ``length_constraints:nth_paragraph_first_word``: the first word is a word as above ("Yes:",
  "**Yes**", "- Yes", "Yes—" start with "Yes"; "Today's" is not "Today"), and blank lines before the
  first paragraph are not a paragraph;
* additions: ``startend:first_word`` (the first word only, whatever follows: IFEval's closest,
  ``nth_paragraph_first_word``, also counts paragraphs), the relations ``"at most"`` and
  ``"exactly"`` besides IFEval's ``"less than"`` and ``"at least"``, and ``required_keys`` for
  ``detectable_format:json_format`` (the JSON must be an object holding those keys).
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grouppref.errors import GroupPrefError
from grouppref.pipeline.rank.text import count_sentences, count_words, words
from grouppref.pipeline.rank.text import first_word as _first_word

RELATIONS: dict[str, Callable[[int, int], bool]] = {
    "less than": operator.lt, "at least": operator.ge, "at most": operator.le,
    "exactly": operator.eq,
}
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)


class ConstraintError(GroupPrefError):
    """A constraint spec cannot be used: unknown id, missing or unknown keyword argument."""


@dataclass(frozen=True)
class Constraint:
    """One constraint: an IFEval instruction id and its keyword arguments."""

    id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)


# -- helpers -----------------------------------------------------------------------------------
COMMAS = ",\uff0c\u3001\u060c\ufe50\ufe51"  # , and the fullwidth, ideographic, Arabic, small ones
OPEN_QUOTES, CLOSE_QUOTES = '"\u201c\u201e', '"\u201d\u201c'  # " “ „ and " ” “


def _whole(word: str) -> re.Pattern[str]:
    """``word`` as a whole word, case-insensitive: not inside a longer run of ``\\w``."""
    return re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def compare(count: int, relation: str, target: int) -> bool:
    """``count <relation> target`` for one of :data:`RELATIONS`."""
    if relation not in RELATIONS:
        raise ConstraintError(f"relation {relation!r} is not one of {sorted(RELATIONS)}")
    return RELATIONS[relation](count, int(target))


# -- the checks: (text, **kwargs) -> bool ------------------------------------------------------
def english_lowercase(text: str) -> bool:
    """Every cased letter is lowercase, and there is one (``str.islower``, as IFEval): letters
    without case ("日本") are not lowercase letters."""
    return text.islower()


def english_capital(text: str) -> bool:
    """Every cased letter is uppercase, and there is one (``str.isupper``, as IFEval)."""
    return text.isupper()


def capital_word_frequency(text: str, capital_frequency: int, capital_relation: str) -> bool:
    """The number of all-capital words compares with ``capital_frequency``."""
    n = sum(1 for w in words(text) if w.isupper())
    return compare(n, capital_relation, capital_frequency)


def no_comma(text: str) -> bool:
    """No comma anywhere: ``,`` nor a fullwidth, ideographic or Arabic comma (:data:`COMMAS`)."""
    return not any(c in text for c in COMMAS)


def json_format(text: str, required_keys: Sequence[str] = ()) -> bool:
    """The whole response (less a Markdown code fence) parses as JSON (RFC 8259: no ``NaN``
    or ``Infinity``); with ``required_keys`` it must be an object holding every one of them."""
    body = _FENCE.sub("", text.strip()).strip()
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except ValueError:
        return False
    if not required_keys:
        return True
    return isinstance(value, dict) and all(k in value for k in required_keys)


def quotation(text: str) -> bool:
    """The response (stripped) starts and ends with a double quotation mark, straight or curly
    (:data:`OPEN_QUOTES`, :data:`CLOSE_QUOTES`), around something."""
    body = text.strip()
    return (len(body) > 1 and body[0] in OPEN_QUOTES and body[-1] in CLOSE_QUOTES
            and bool(body[1:-1].strip()))


def end_checker(text: str, end_phrase: str) -> bool:
    """The response ends with ``end_phrase`` (case-insensitive; outer double quotes, straight or
    curly, and spaces ignored), the phrase starting at a word boundary ("bathe end." does not
    end with "The end.")."""
    body = text.strip().strip(OPEN_QUOTES + CLOSE_QUOTES).lower()
    phrase = end_phrase.strip().lower()
    if not body.endswith(phrase):
        return False
    before = body[:len(body) - len(phrase)]
    return not (before and phrase and re.match(r"\w", phrase) and re.search(r"\w$", before))


def repeat_prompt(text: str, prompt_to_repeat: str) -> bool:
    """The response starts with ``prompt_to_repeat`` (case-insensitive)."""
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


def keywords_existence(text: str, keywords: Sequence[str]) -> bool:
    """Every keyword occurs as a whole word (case-insensitive): "bright" is in "bright-eyed"
    and "Bright!", not in "brightness"."""
    return all(_whole(k).search(text) for k in keywords)


def forbidden_words(text: str, forbidden_words: Sequence[str]) -> bool:
    """No forbidden word occurs as a whole word (case-insensitive)."""
    return not any(re.search(rf"\b{re.escape(w)}\b", text, re.IGNORECASE)
                   for w in forbidden_words)


def keyword_frequency(text: str, keyword: str, frequency: int, relation: str) -> bool:
    """The number of occurrences of ``keyword`` (case-insensitive) compares with ``frequency``."""
    n = len(re.findall(re.escape(keyword), text, re.IGNORECASE))
    return compare(n, relation, frequency)


def letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    """The number of times ``letter`` occurs (case-insensitive) compares with ``let_frequency``."""
    return compare(text.lower().count(letter.lower()), let_relation, let_frequency)


def number_words(text: str, num_words: int, relation: str) -> bool:
    """The word count (:func:`count_words`) compares with ``num_words``."""
    return compare(count_words(text), relation, num_words)


def number_sentences(text: str, num_sentences: int, relation: str) -> bool:
    """The sentence count (:func:`count_sentences`) compares with ``num_sentences``."""
    return compare(count_sentences(text), relation, num_sentences)


def starts_with_word(text: str, first_word: str) -> bool:
    """The first word (:func:`~grouppref.pipeline.rank.text.first_word`: leading quotes,
    bullets and Markdown skipped; "Yes," "Yes:" "**Yes**" "Yes.Bees" all start with "Yes",
    "Yesterday" "Yes-men" do not) is ``first_word``, case-insensitive."""
    word = _first_word(text)
    return word is not None and word.lower() == first_word.strip().lower()


def nth_paragraph_first_word(text: str, num_paragraphs: int, nth_paragraph: int,
                             first_word: str) -> bool:
    """Exactly ``num_paragraphs`` paragraphs (split on blank lines) and paragraph
    ``nth_paragraph`` (1-based) starts with ``first_word`` (as :func:`starts_with_word`)."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    if len(paragraphs) != num_paragraphs or not 1 <= nth_paragraph <= len(paragraphs):
        return False
    return starts_with_word(paragraphs[nth_paragraph - 1], first_word)


def postscript(text: str, postscript_marker: str) -> bool:
    """A line starts with ``postscript_marker`` ("P.S." also matches "p. s.")."""
    marker = postscript_marker.strip().lower()
    if marker in ("p.s.", "p.p.s", "p.p.s."):
        pattern = r"^\s*p\.\s?p\.\s?s" if marker.startswith("p.p") else r"^\s*p\.\s?s\."
    else:
        pattern = rf"^\s*{re.escape(marker)}"
    return re.search(pattern, text.lower(), re.MULTILINE) is not None


def title(text: str) -> bool:
    """A title in double angle brackets, e.g. ``<<my title>>``."""
    return any(t.strip() for t in re.findall(r"<<([^\n]+?)>>", text))


def number_bullet_lists(text: str, num_bullets: int) -> bool:
    """Exactly ``num_bullets`` Markdown bullet lines (``* item`` or ``- item``)."""
    n = len(re.findall(r"^\s*(?:\*(?!\*)|-)\s*\S.*$", text, re.MULTILINE))
    return n == int(num_bullets)


def number_highlighted_sections(text: str, num_highlights: int) -> bool:
    """At least ``num_highlights`` Markdown highlights (``*text*`` or ``**text**``)."""
    single = [h for h in re.findall(r"(?<!\*)\*([^\n*]+)\*(?!\*)", text) if h.strip()]
    double = [h for h in re.findall(r"\*\*([^\n*]+)\*\*", text) if h.strip()]
    return len(single) + len(double) >= int(num_highlights)


def number_placeholders(text: str, num_placeholders: int) -> bool:
    """At least ``num_placeholders`` square-bracket placeholders such as ``[address]``."""
    return len(re.findall(r"\[[^\[\]\n]*\]", text)) >= int(num_placeholders)


@dataclass(frozen=True)
class ConstraintType:
    """A check and the names of its required and optional keyword arguments."""

    check: Callable[..., bool]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


CONSTRAINTS: dict[str, ConstraintType] = {
    "change_case:english_lowercase": ConstraintType(english_lowercase),
    "change_case:english_capital": ConstraintType(english_capital),
    "change_case:capital_word_frequency": ConstraintType(
        capital_word_frequency, ("capital_frequency", "capital_relation")),
    "punctuation:no_comma": ConstraintType(no_comma),
    "detectable_format:json_format": ConstraintType(json_format, optional=("required_keys",)),
    "detectable_format:title": ConstraintType(title),
    "detectable_format:number_bullet_lists": ConstraintType(number_bullet_lists, ("num_bullets",)),
    "detectable_format:number_highlighted_sections": ConstraintType(
        number_highlighted_sections, ("num_highlights",)),
    "detectable_content:postscript": ConstraintType(postscript, ("postscript_marker",)),
    "detectable_content:number_placeholders": ConstraintType(
        number_placeholders, ("num_placeholders",)),
    "startend:quotation": ConstraintType(quotation),
    "startend:end_checker": ConstraintType(end_checker, ("end_phrase",)),
    "startend:first_word": ConstraintType(starts_with_word, ("first_word",)),
    "combination:repeat_prompt": ConstraintType(repeat_prompt, ("prompt_to_repeat",)),
    "keywords:existence": ConstraintType(keywords_existence, ("keywords",)),
    "keywords:forbidden_words": ConstraintType(forbidden_words, ("forbidden_words",)),
    "keywords:frequency": ConstraintType(keyword_frequency, ("keyword", "frequency", "relation")),
    "keywords:letter_frequency": ConstraintType(
        letter_frequency, ("letter", "let_frequency", "let_relation")),
    "length_constraints:number_words": ConstraintType(number_words, ("num_words", "relation")),
    "length_constraints:number_sentences": ConstraintType(
        number_sentences, ("num_sentences", "relation")),
    "length_constraints:nth_paragraph_first_word": ConstraintType(
        nth_paragraph_first_word, ("num_paragraphs", "nth_paragraph", "first_word")),
}
_RELATION_KWARGS = ("relation", "capital_relation", "let_relation")


# -- specs -------------------------------------------------------------------------------------
def make_constraint(cid: str, kwargs: Mapping[str, Any] | None = None) -> Constraint:
    """A checked :class:`Constraint`: the id is known, required kwargs are present, no unknown
    ones; ``None`` values are dropped (IFEval's dataset lists every kwarg, null when unused).

    Raises:
        ConstraintError: unknown id, missing/unknown kwarg, or an unknown relation.
    """
    kind = CONSTRAINTS.get(cid)
    if kind is None:
        raise ConstraintError(f"unknown constraint id {cid!r}; supported: {', '.join(CONSTRAINTS)}")
    given = {k: v for k, v in (kwargs or {}).items() if v is not None}
    missing = [k for k in kind.required if k not in given]
    unknown = sorted(set(given) - set(kind.required) - set(kind.optional))
    if missing or unknown:
        raise ConstraintError(f"constraint {cid!r}: "
                              + "; ".join(filter(None, [
                                  f"missing kwargs {missing}" if missing else "",
                                  f"unknown kwargs {unknown}" if unknown else ""]))
                              + f" (it takes {list(kind.required + kind.optional) or 'none'})")
    for key in _RELATION_KWARGS:
        if key in given and given[key] not in RELATIONS:
            raise ConstraintError(f"constraint {cid!r}: {key} {given[key]!r} is not one of "
                                  f"{sorted(RELATIONS)}")
    return Constraint(cid, given)


def parse_constraints(spec: str | Sequence[Any] | Mapping[str, Any]) -> list[Constraint]:
    """Constraints from a spec: JSON text or the parsed value, either a list of
    ``{"id": ID, "kwargs": {...}}`` or IFEval's columns
    ``{"instruction_id_list": [ID, ...], "kwargs": [{...}, ...]}``.

    Raises:
        ConstraintError: malformed JSON or shape, or a bad constraint (:func:`make_constraint`).

    Example:
        >>> parse_constraints('[{"id": "punctuation:no_comma"}]')
        [Constraint(id='punctuation:no_comma', kwargs={})]
    """
    value: Any = spec
    if isinstance(spec, str):
        try:
            value = json.loads(spec)
        except ValueError as e:
            raise ConstraintError(f"constraints are not valid JSON: {e}") from e
    if isinstance(value, Mapping) and "instruction_id_list" in value:
        ids, kwargs = value["instruction_id_list"], value.get("kwargs") or []
        if not isinstance(ids, list) or not isinstance(kwargs, list) or (
                kwargs and len(kwargs) != len(ids)):
            raise ConstraintError("instruction_id_list and kwargs must be lists of equal length")
        value = [{"id": i, "kwargs": kwargs[n] if kwargs else {}} for n, i in enumerate(ids)]
    if not isinstance(value, list) or not value:
        raise ConstraintError("constraints must be a non-empty list of {\"id\": ..., "
                              "\"kwargs\": {...}} objects")
    out = []
    for item in value:
        if not isinstance(item, Mapping) or not isinstance(item.get("id"), str) or not isinstance(
                item.get("kwargs") or {}, Mapping) or set(item) - {"id", "kwargs"}:
            raise ConstraintError(f"constraint {item!r}: expected {{\"id\": str, \"kwargs\": "
                                  "{...}}")
        out.append(make_constraint(item["id"], item.get("kwargs")))
    return out


def constraint_met(constraint: Constraint, text: str) -> bool:
    """Whether ``text`` meets ``constraint``. An empty or blank answer meets none (as IFEval's
    strict scoring): an answer that is only an EOS token does not pass "no commas"."""
    if not text.strip():
        return False
    return bool(CONSTRAINTS[constraint.id].check(text, **constraint.kwargs))


def satisfaction(text: str, constraints: Sequence[Constraint]) -> float:
    """Share of ``constraints`` that ``text`` meets, in [0, 1].

    Example:
        >>> satisfaction("hello, world", parse_constraints(
        ...     '[{"id": "change_case:english_lowercase"}, {"id": "punctuation:no_comma"}]'))
        0.5
    """
    if not constraints:
        raise ConstraintError("no constraints to check")
    return sum(constraint_met(c, text) for c in constraints) / len(constraints)
