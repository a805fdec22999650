"""Words and sentences of a response, as the verifiable-instruction checks count them
(:mod:`grouppref.pipeline.rank.constraints`).

A word is a run of letters, digits or ``_`` (``\\w``), with the inside joints a reader keeps in
one word: an apostrophe (``don't``, ``bee's``, also ``’``), a hyphen (``mother-in-law``), a
decimal or thousands separator between digits (``3.14``, ``1,000``); a dotted abbreviation
of single letters (``a.m.``, ``e.g.``, ``U.S.``) is one word too. IFEval counts ``\\w+`` runs,
two words for ``don't``.

A sentence ends at ``.``, ``!``, ``?`` or an ellipsis (``...``, ``…``), repeated or not, with
any closing quotes, brackets or Markdown emphasis after it, before whitespace or the end of the
text; at a terminator glued to a capitalised word (``buzz.They``); and at a blank line. Not at:

* a title or a Latin abbreviation (``Mr.``, ``Dr.``, ``Mt.``, ``St.``, ``e.g.``, ``i.e.``,
  ``vs.``; :data:`NEVER_ENDS`);
* ``No.``, ``Fig.``, ``p.``, ``ca.`` before a number (:data:`BEFORE_NUMBERS`), nor after the
  number of a numbered list item (``1. Bees fly.`` is one sentence);
* a lowercase dotted abbreviation (``a.m.``) or a suffix (``Inc.``, ``etc.``;
  :data:`ENDS_BEFORE_CAPITAL`) unless a capitalised word follows;
* an initial (``J. K. Rowling``) or an uppercase dotted abbreviation (``U.S.``) unless a
  usual sentence opener follows (``It``, ``The``, ``They``; :data:`OPENERS`, after the regex
  splitter of IFEval's ``instructions_util``);
* an ellipsis, or a terminator inside closing quotes (``"Run!" and``), before a lowercase word.

A piece with no word in it (``...``) is no sentence. IFEval counts NLTK punkt's sentences, which
split after ``Mt.``, ``e.g.``, ``etc.``, ``No. 5`` and list numbers, at ``!!!`` and ``?!``,
and after ``"Run!"`` mid-sentence.
"""

from __future__ import annotations

import re

WORD = re.compile(r"(?<!\w)(?:[^\W\d_]\.){2,}|\d+(?:[.,]\d+)+|\w+(?:['’\-‐]\w+)*")
NEVER_ENDS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "st", "mt", "ft", "sen", "rep", "gov", "gen", "col", "capt",
    "lt", "sgt", "rev", "hon", "pres", "fr", "e.g", "i.e", "cf", "vs", "viz", "approx"})
ENDS_BEFORE_CAPITAL = frozenset({"jr", "sr", "inc", "ltd", "co", "corp", "etc", "al", "ph.d"})
BEFORE_NUMBERS = frozenset({"no", "nos", "nr", "fig", "figs", "vol", "vols", "p", "pp", "ch",
                            "sec", "art", "ca", "op"})
OPENERS = frozenset({
    "the", "it", "he", "she", "they", "we", "i", "this", "that", "these", "those", "but",
    "however", "so", "then", "there", "our", "their", "his", "her", "its", "my", "you", "a",
    "an", "in", "on", "at", "if", "when", "yes", "no"})
_CLOSERS = "\"'”’»)]*_"
_BOUNDARY = re.compile(
    rf"(?P<end>[.!?…]+)(?P<close>[{re.escape(_CLOSERS)}]*)(?:\s+|$)"  # before space or the end
    r"|(?P<glued>[.!?])(?=[A-Z][a-z])"  # glued to a capitalised word: "buzz.They"
    r"|\n[ \t]*\n\s*")  # a blank line
_LAST_TOKEN = re.compile(r"(\S+)$")
_ENUMERATOR = re.compile(r"\(?\d{1,3}[.)]")  # "1." of a numbered list: part of its item
_OPENING = "\"'“‘«([*_"


def words(text: str) -> list[str]:
    """The words of ``text`` (see the module docstring).

    Example:
        >>> words("I don't know, my mother-in-law left at 7 a.m. with 3.5 kg.")
        ['I', "don't", 'know', 'my', 'mother-in-law', 'left', 'at', '7', 'a.m.', 'with', '3.5', 'kg']
    """
    return WORD.findall(text)


def count_words(text: str) -> int:
    """Number of :func:`words`: ``count_words("It's 5 o'clock.") == 3``."""
    return len(words(text))


def first_word(text: str) -> str | None:
    """The first word of ``text`` (leading quotes, bullets and Markdown skipped), or None."""
    m = WORD.search(text)
    return m.group(0) if m else None


def _ends(text: str, m: re.Match[str]) -> bool:
    """Whether the boundary candidate ``m`` ends a sentence."""
    if m.group("end") is None and m.group("glued") is None:
        return True  # a blank line
    end = m.group("end") or m.group("glued")
    rest = text[m.end():].lstrip(_OPENING)
    if not rest:
        return True
    nxt = first_word(rest[:40]) or ""
    upper_next = rest[0].isupper()
    if "…" in end or end.startswith(".."):
        return upper_next  # "Wait... bees can dance?" is one sentence
    if "!" in end or "?" in end:
        return not (m.group("close") and rest[0].islower())  # 'She shouted "Run!" and ...'
    if m.group("close"):
        return True  # 'He said "Stop." Then ...'
    before = _LAST_TOKEN.search(text[:m.start()])
    original = before.group(1).lstrip(_OPENING) if before else ""
    token = original.lower()
    if token in NEVER_ENDS or (token in BEFORE_NUMBERS and rest[0].isdigit()):
        return False
    if token in ENDS_BEFORE_CAPITAL:
        return upper_next
    if re.fullmatch(r"(?:[^\W\d_]\.)+[^\W\d_]", token):  # a.m., U.S. (the last '.' is `end`)
        return upper_next and (not original.isupper() or nxt.lower() in OPENERS)
    if re.fullmatch(r"[^\W\d_]", token) and original.isupper():
        return nxt.lower() in OPENERS  # an initial: "J. K. Rowling", but "vitamin C. It"
    return True


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` (see the module docstring), each stripped.

    Example:
        >>> sentences('Mr. Lee keeps bees in the U.S. They said "Stop." Then... nothing!')
        ['Mr. Lee keeps bees in the U.S.', 'They said "Stop."', 'Then... nothing!']
    """
    out, start = [], 0
    for m in _BOUNDARY.finditer(text):
        if _ends(text, m) and not _ENUMERATOR.fullmatch(text[start:m.end()].strip()):
            out.append(text[start:m.end()].strip())
            start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if re.search(r"\w", s)]


def count_sentences(text: str) -> int:
    """Number of :func:`sentences`.

    Example:
        >>> count_sentences("One. Two! Three"), count_sentences("3.5 apples."), count_sentences("")
        (3, 1, 0)
    """
    return len(sentences(text))
