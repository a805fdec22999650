"""Reading YAML / TOML config files into validated pydantic settings, with clear errors.

A bad key or value stops before any work with one message per problem naming the dotted key,
what was given and what is allowed, e.g.::

    examples/auto.yaml: rank.rankers.0.kind: got 'reword'; allowed: 'reward', 'rule', ...
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from grouppref.errors import ConfigError, InputFileError

M = TypeVar("M", bound=BaseModel)


UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = {b"\xff\xfe": "UTF-16 little-endian", b"\xfe\xff": "UTF-16 big-endian"}
SAVE_AS_UTF8 = "save it as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8 in > out`)"


def text_problem(head: bytes) -> str | None:
    """Why the bytes at the start of a file show it is not UTF-8 text, or ``None``.

    UTF-8 with or without a byte-order mark passes; a UTF-16/32 byte-order mark, or a NUL byte
    (binary data, or UTF-16/32 text without a mark), does not. Bytes that fail to decode later
    in the file are the reader's to report, line by line.
    """
    for mark, name in _UTF16_BOMS.items():
        if head.startswith(mark):
            return f"the file is {name} text (byte-order mark {mark.hex(' ').upper()}), not UTF-8"
    if b"\x00" in head:
        at = head.index(b"\x00")
        return (f"not a text file: NUL byte at offset {at} (binary data, or UTF-16/32 text "
                "without a byte-order mark)")
    return None


def _undecodable(e: UnicodeDecodeError, data: bytes) -> str:
    """``byte 0xE9 at line 3, column 7`` for a decode error in ``data`` (1-based)."""
    line = data.count(b"\n", 0, e.start) + 1
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    return f"byte 0x{data[e.start]:02X} at line {line}, column {column} is not valid UTF-8"


def read_text(path: Path, what: str = "file") -> str:
    """A whole UTF-8 file as text (a leading BOM dropped).

    Raises:
        InputFileError: the file is not UTF-8 text (binary, UTF-16, a byte that does not
            decode), in one line naming the first bad byte and the fix.
    """
    data = path.read_bytes()
    problem = text_problem(data[:65536])
    if problem is not None:
        raise InputFileError(f"{path}: cannot read this {what}: {problem}; {SAVE_AS_UTF8}")
    try:
        return data.removeprefix(UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as e:
        body = data.removeprefix(UTF8_BOM)
        raise InputFileError(f"{path}: cannot read this {what}: {_undecodable(e, body)}; "
                             f"{SAVE_AS_UTF8}") from e


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a ``.yaml``/``.yml``/``.toml``/``.json`` file (UTF-8, a BOM allowed).

    Raises:
        InputFileError: the file is missing, of another format, not UTF-8 text, unparsable or
            not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: config file not found")
    if path.suffix not in (".yaml", ".yml", ".json", ".toml"):
        raise InputFileError(f"{path}: unknown config format {path.suffix!r}; use .yaml, .toml "
                             "or .json")
    text = read_text(path, "config file")
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise InputFileError(f"{path}: cannot parse ({e})".replace("\n", " ")) from e
    except RecursionError as e:
        raise InputFileError(f"{path}: cannot parse (lists or mappings nested too deeply)") from e
    if not isinstance(data, dict):
        raise InputFileError(f"{path}: the top level must be a mapping of settings")
    return data


def _allowed(error: ErrorDetails) -> str:
    ctx = error.get("ctx") or {}
    if error["type"] == "union_tag_invalid" and "expected_tags" in ctx:
        return f"; allowed: {ctx['expected_tags']}"
    if "expected" in ctx:
        return f"; allowed: {ctx['expected']}"
    if error["type"] == "extra_forbidden":
        return "; unknown key (check the spelling; see the docs of this section)"
    return ""


def _key_path(loc: tuple[Any, ...], data: Any) -> list[str]:
    """The keys of ``loc`` that exist in the input: pydantic adds the tags of tagged unions
    (``rankers.0.rule.checks``), which are no keys of the file."""
    path, node = [], data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part not in node and 0 < i < len(loc) - 1:
            continue  # a union tag, not a key (a missing key is always the last part)
        if i > 0 and isinstance(part, str) and not isinstance(node, dict | list):
            continue  # the member of a union of scalars a value failed (``workers.int``)
        path.append(str(part))
        node = node.get(part) if isinstance(node, dict) else (
            node[part] if isinstance(node, list) and isinstance(part, int)
            and part < len(node) else None)
    return path


def _union_tag(error: ErrorDetails) -> tuple[tuple[Any, ...], str, Any]:
    """Location, message and given value of a problem; a tagged union's tag problem is
    reported at the tag's own key (``rank.rankers.0.kind``), not at the list item."""
    ctx = error.get("ctx") or {}
    tag_key = str(ctx.get("discriminator", "")).strip("'")
    if error["type"] == "union_tag_invalid" and tag_key:
        return (*error["loc"], tag_key), "not an allowed value", ctx.get("tag")
    if error["type"] == "union_tag_not_found" and tag_key:
        return (*error["loc"], tag_key), "Field required", {}  # nothing given
    return error["loc"], error["msg"].removeprefix("Value error, "), error.get("input")


_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s'\"]+@")


def redact_credentials(text: str) -> str:
    """``text`` with the ``user:password@`` part of any URL in it replaced by ``***@``, so that
    an error about a bad URL never prints a password.

    Example:
        >>> redact_credentials("got 'http://me:secret@host/v1'")
        "got 'http://***@host/v1'"
    """
    return _URL_CREDENTIALS.sub("***@", text)


def format_validation_error(e: ValidationError, source: str, data: Any = None,
                            labels: dict[str, str] | None = None) -> str:
    """One line per problem: ``source: dotted.key: message (got X; allowed: ...)``.

    With the validated ``data``, the dotted key leaves out pydantic's union tags; ``labels``
    names keys by the option that set them (``--prior-strength``).
    """
    lines = []
    for error in e.errors():
        loc, message, given = _union_tag(error)
        parts = _key_path(loc, data) if data is not None else [str(x) for x in loc]
        key = ".".join(parts) or "(top level)"
        key = (labels or {}).get(key, key)
        shown = redact_credentials(f"; got {given!r}") if not isinstance(given, dict | list) else ""
        allowed = _allowed(error)
        if allowed and allowed.removeprefix("; allowed: ") in message:
            allowed = ""  # the message lists them already
        where = f"{source}: {key}" if key != "(top level)" else source
        lines.append(f"{where}: {message}{shown}{allowed}")
    return "\n".join(lines)


def validate(model: type[M], data: dict[str, Any], source: str,
             labels: dict[str, str] | None = None) -> M:
    """``data`` validated as ``model``; the one converter from pydantic's errors to ours.

    Raises:
        ConfigError: every problem on its own line, naming the dotted key, what was given
            and what is allowed (``source: rank.rankers.0.kind: ...``).
    """
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, data, labels)) from e


def apply_set(data: dict[str, Any], assignment: str) -> None:
    """Apply ``--set a.b.0.c=VALUE`` (VALUE parsed as YAML) to ``data`` in place.

    Raises:
        ConfigError: not ``KEY=VALUE``, a value that does not parse, or a path through a value.
    """
    key, eq, raw = assignment.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not eq or not parts:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. "
                          "--set rank.rankers.0.model=path/to/model")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {assignment!r}: cannot parse the value as YAML") from e
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {assignment!r}: {'.'.join(parts[:i]) or 'the top'} is "
                                  f"a list of {len(node)}; {part!r} is not an index in it")
            index: int | str = int(part)
        elif isinstance(node, dict):
            index = part
            if not last and not isinstance(node.get(part), dict | list):
                node[part] = {}
        else:
            raise ConfigError(f"--set {assignment!r}: {'.'.join(parts[:i])} is a value, not a "
                              "section")
        if last:
            node[index] = value
        else:
            node = node[index]


def load_config(model: type[M], path: str | Path | None = None, *, sets: list[str] | None = None,
                overrides: dict[str, Any] | None = None) -> M:
    """Settings from a config file (if any), then ``--set`` assignments, then ``overrides``
    (the options given on the command line), validated as ``model``.

    Raises:
        InputFileError: the file cannot be read.
        ConfigError: a key is unknown or a value is not allowed (every problem is listed).
    """
    data = read_config_file(path) if path is not None else {}
    for assignment in sets or []:
        apply_set(data, assignment)
    merge_into(data, overrides or {})
    source = str(path) if path is not None else "options"
    return validate(model, data, source)


def merge_into(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` into ``base`` (in place): nested mappings merge key by key."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_into(base[key], value)
        else:
            base[key] = value
    return base
