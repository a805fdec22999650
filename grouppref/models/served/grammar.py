"""A syntax check of llama.cpp grammars (GBNF), the ``grammar`` request field of llama.cpp's
servers (``llama-server`` and llama-cpp-python's), before any request carries one.

Why: llama-cpp-python's server (0.3.x) dies (SIGSEGV) on a grammar its parser refuses, and a
client sees only the connection go; llama.cpp's ``llama-server`` answers an error. The check
follows llama.cpp's recursive-descent parser (``llama-grammar.cpp``: ``parse``,
``parse_rule``, ``parse_alternates``, ``parse_sequence``, ``parse_char``, ``parse_space``)
and reports its messages:

- a rule is ``name ::= alternatives`` and ends at a newline (or the end); names are
  ``[a-zA-Z0-9-]+``; outside parentheses a newline ends the rule, so an alternative ``| ...``
  on the next line needs the rule's body in parentheses;
- elements: ``"literal"``, ``[class]`` (``^`` negates, ``a-z`` ranges), a rule name,
  ``( ... )``, ``.``; then ``*``, ``+``, ``?`` or ``{m}``, ``{m,}``, ``{m,n}``;
- escapes in literals and classes: ``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH``, ``\\t``, ``\\r``,
  ``\\n``, ``\\\\``, ``\\"``, ``\\[``, ``\\]``;
- ``#`` starts a comment to the end of the line;
- every referenced rule is defined, and a ``root`` rule exists.

Beyond the parser: ``{m,n}`` with ``m > n`` (llama-cpp-python 0.3.x hangs on it). Newer
llama.cpp token elements (``<...>``, ``!<...>``) are let through: servers that do not know them
refuse them themselves. Not checked: left recursion (llama.cpp refuses it when it builds the
grammar).
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-zA-Z0-9-]+")
_ESCAPES = {"x": 2, "u": 4, "U": 8}
_SIMPLE_ESCAPES = frozenset('trn\\"[]')
_HEX = frozenset("0123456789abcdefABCDEF")


class GrammarError(ValueError):
    """A grammar llama.cpp's parser refuses: the message says what and where."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.defined, self.used = text, set[str](), dict[str, int]()

    def at(self, pos: int, n: int = 1) -> str:
        return self.text[pos : pos + n]

    def fail(self, what: str, pos: int) -> GrammarError:
        line = self.text.count("\n", 0, pos) + 1
        near = self.text[pos : pos + 20].split("\n")[0]
        return GrammarError(f"{what} at line {line}" + (f" near {near!r}" if near else ""))

    def space(self, pos: int, newline_ok: bool) -> int:
        while pos < len(self.text):
            c = self.text[pos]
            if c == "#":
                while pos < len(self.text) and self.text[pos] not in "\r\n":
                    pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> tuple[str, int]:
        m = _WORD.match(self.text, pos)
        if m is None:
            raise self.fail("expecting name", pos)
        return m.group(), m.end()

    def char(self, pos: int) -> int:
        if pos >= len(self.text):
            raise self.fail("unexpected end of input", pos)
        if self.text[pos] != "\\":
            return pos + 1
        kind = self.at(pos + 1)
        if kind in _ESCAPES:
            digits = self.at(pos + 2, _ESCAPES[kind])
            if len(digits) < _ESCAPES[kind] or not set(digits) <= _HEX:
                raise self.fail("expecting hex digits", pos)
            return pos + 2 + _ESCAPES[kind]
        if kind in _SIMPLE_ESCAPES:
            return pos + 2
        raise self.fail("unknown escape", pos)

    def sequence(self, pos: int, nested: bool) -> int:
        items = 0
        while pos < len(self.text):
            c = self.text[pos]
            if c == '"':
                pos += 1
                while self.at(pos) != '"':
                    pos = self.char(pos)
                pos, items = self.space(pos + 1, nested), items + 1
            elif c == "[":
                pos += 1 + (self.at(pos + 1) == "^")
                while self.at(pos) != "]":
                    pos = self.char(pos)
                    if self.at(pos) == "-" and self.at(pos + 1) != "]":
                        pos = self.char(pos + 1)
                pos, items = self.space(pos + 1, nested), items + 1
            elif _WORD.match(c):
                name, end = self.name(pos)
                self.used.setdefault(name, pos)
                pos, items = self.space(end, nested), items + 1
            elif c == "(":
                pos = self.alternates(self.space(pos + 1, True), True)
                if self.at(pos) != ")":
                    raise self.fail("expecting ')'", pos)
                pos, items = self.space(pos + 1, nested), items + 1
            elif c == "." or c == "<" or (c == "!" and self.at(pos + 1) == "<"):
                end = pos + 1 if c == "." else self.text.find(">", pos)
                if end < 0:
                    raise self.fail("expecting '>'", pos)
                pos, items = self.space(end + (c != "."), nested), items + 1
            elif c in "*+?{":
                if not items:
                    raise self.fail("expecting preceding item to */+/?/{", pos)
                pos = self.space(pos + 1, nested) if c != "{" else self.braces(pos, nested)
            else:
                break
        return pos

    def braces(self, pos: int, nested: bool) -> int:
        pos = self.space(pos + 1, nested)
        m = re.compile(r"\d+").match(self.text, pos)
        if m is None:
            raise self.fail("expecting an int", pos)
        low, high, pos = int(m.group()), None, self.space(m.end(), nested)
        if self.at(pos) == ",":
            pos = self.space(pos + 1, nested)
            if (m := re.compile(r"\d+").match(self.text, pos)) is not None:
                high, pos = int(m.group()), self.space(m.end(), nested)
        elif self.at(pos) != "}":
            raise self.fail("expecting ','", pos)
        if self.at(pos) != "}":
            raise self.fail("expecting '}'", pos)
        if high is not None and high < low:
            raise self.fail(f"repetition {{{low},{high}}} has min > max", pos)
        return self.space(pos + 1, nested)

    def alternates(self, pos: int, nested: bool) -> int:
        pos = self.sequence(pos, nested)
        while self.at(pos) == "|":
            pos = self.sequence(self.space(pos + 1, True), nested)
        return pos

    def rule(self, pos: int) -> int:
        name, end = self.name(pos)
        pos = self.space(end, False)
        if self.at(pos, 3) != "::=":
            raise self.fail("expecting ::=", pos)
        pos = self.alternates(self.space(pos + 3, True), False)
        if self.at(pos) == "\r":
            pos += 1 + (self.at(pos + 1) == "\n")
        elif self.at(pos) == "\n":
            pos += 1
        elif pos < len(self.text):
            raise self.fail("expecting newline or end", pos)
        self.defined.add(name)
        return self.space(pos, True)


def check_grammar(text: str) -> None:
    """Raise :class:`GrammarError` when llama.cpp's parser would refuse ``text`` (see the
    module docstring).

    Example:
        >>> check_grammar('root ::= ("yes" | "no")')
        >>> check_grammar('root ::= ("yes" | "no"')
        Traceback (most recent call last):
        ...
        grouppref.models.served.grammar.GrammarError: expecting ')' at line 1
    """
    parser = _Parser(text)
    pos = parser.space(0, True)
    while pos < len(text):
        pos = parser.rule(pos)
    for name, where in parser.used.items():
        if name not in parser.defined:
            raise parser.fail(f"undefined rule {name!r}", where)
    if "root" not in parser.defined:
        raise GrammarError("the grammar has no 'root' rule (the rule generation starts from)")
