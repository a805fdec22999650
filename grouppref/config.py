"""Reading YAML / TOML config files into validated pydantic settings, with clear errors.

A bad key or value stops before any work with one message per problem naming the dotted key,
what was given and what is allowed, e.g.::

    examples/auto.yaml: rank.rankers.0.kind: got 'reword'; allowed: 'reward', 'rule', ...
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from grouppref.errors import ConfigError, InputFileError

M = TypeVar("M", bound=BaseModel)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a ``.yaml``/``.yml``/``.toml``/``.json`` file.

    Raises:
        InputFileError: the file is missing, of another format, unparsable or not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: config file not found")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml", ".json"):
            data = yaml.safe_load(text)
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise InputFileError(f"{path}: unknown config format {path.suffix!r}; use .yaml or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise InputFileError(f"{path}: cannot parse ({e})".replace("\n", " ")) from e
    if not isinstance(data, dict):
        raise InputFileError(f"{path}: the top level must be a mapping of settings")
    return data


def _allowed(error: dict[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        return f"; allowed: {ctx['expected']}"
    if error["type"] == "extra_forbidden":
        return "; unknown key (check the spelling; see the docs of this section)"
    return ""


def format_validation_error(e: ValidationError, source: str) -> str:
    """One line per problem: ``source: dotted.key: message (got X; allowed: ...)``."""
    lines = []
    for error in e.errors():
        key = ".".join(str(x) for x in error["loc"]) or "(top level)"
        given = error.get("input")
        shown = f"; got {given!r}" if not isinstance(given, dict | list) else ""
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {key}: {message}{shown}{_allowed(error)}")
    return "\n".join(lines)


def load_config(model: type[M], path: str | Path, overrides: dict[str, Any] | None = None) -> M:
    """Validate a config file (plus ``overrides``) as ``model``.

    Raises:
        InputFileError: the file cannot be read.
        ConfigError: a key is unknown or a value is not allowed (every problem is listed).
    """
    data = read_config_file(path)
    data.update(overrides or {})
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path))) from e
