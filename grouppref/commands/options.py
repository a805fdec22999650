"""CLI options generated from the pydantic config models: one source for names, types,
defaults, choices and help.

:func:`config_command` turns a settings model into a typer command: every scalar field
becomes ``--field-name`` (``bool``: ``--x/--no-x``; ``Literal``: a choice; ``list[str]``:
repeatable), nested models named in ``flatten`` contribute their fields too, and fields that
need a syntax of their own (a list of rankers, ``KIND=WEIGHT`` maps) get a :class:`Custom`
parser. Every command also takes ``--config FILE`` (a YAML/TOML/JSON file of the same
settings, or of a whole run config holding this stage's section) and ``--set KEY.PATH=VALUE``,
like ``grouppref run``. Precedence: defaults < ``--config`` < ``--set`` < explicit options.
The result is validated once by :func:`grouppref.config.validate`, so every problem is
reported with its dotted key. Options left out are ``None`` and never override anything.

Help shows each field's description, its default (``[default: X]``) and, for choices, the
allowed values. Nothing here imports torch: stage modules are imported inside ``run``.
"""

from __future__ import annotations

import enum
import inspect
import keyword
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from grouppref.config import apply_set, merge_into, read_config_file, validate

Prepare = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
Run = Callable[[Any, dict[str, Any], bool], None]


def help_of(model: type[BaseModel], name: str) -> str:
    """The ``Field(description=...)`` of ``model.name``: the one help string, reused by the CLI."""
    description = model.model_fields[name].description
    if not description:
        raise KeyError(f"{model.__name__}.{name} has no description; add Field(description=...)")
    return description


@dataclass(frozen=True)
class Custom:
    """A field with a command-line syntax of its own (e.g. ``--ranker SPEC``, repeatable).

    ``parse`` turns what the option got (a string, or a list of strings when ``multiple``)
    into the field's value (plain data: it is validated with the rest).
    """

    flag: str
    help: str
    parse: Callable[[Any], Any]
    multiple: bool = False
    metavar: str | None = None


@dataclass(frozen=True)
class Extra:
    """A command parameter that is not a setting (the run directory, ``--out``, ``--quiet``).

    ``annotation`` is a full typer annotation, e.g. ``Annotated[Path, typer.Argument(...)]``.
    """

    name: str
    annotation: Any
    default: Any = inspect.Parameter.empty


@dataclass
class _Option:
    dotted: str
    param: str
    parse: Callable[[Any], Any] | None = None
    flag: str = ""


@dataclass
class _Built:
    params: list[inspect.Parameter] = field(default_factory=list)
    options: dict[str, _Option] = field(default_factory=dict)


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """``(inner type, optional)``: strips ``Annotated`` and ``X | None``."""
    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(annotation))
            if len(args) != 1:
                return annotation, optional
            annotation = args[0]
        else:
            return annotation, optional


def _model_of(annotation: Any) -> type[BaseModel] | None:
    inner, _ = _unwrap(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _default_text(info: Any) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return ""
    value = info.get_default(call_default_factory=True)
    if value is None or value == [] or value == {}:
        return ""
    if isinstance(value, BaseModel):
        return ""
    shown = "yes" if value is True else "no" if value is False else value
    return f" [default: {shown}]"


def _scalar_option(flag: str, param: str, description: str, annotation: Any
                   ) -> inspect.Parameter | None:
    """The typer parameter of one scalar (or list-of-scalar) field; None if it has none."""
    inner, _ = _unwrap(annotation)
    origin = typing.get_origin(inner)
    multiple = origin in (list, tuple, set) and origin is not None
    item = typing.get_args(inner)[0] if multiple and typing.get_args(inner) else inner
    if multiple and origin is tuple and len(set(typing.get_args(inner)) - {Ellipsis}) != 1:
        return None  # fixed-length tuples need a Custom parser
    item, _ = _unwrap(item)
    kwargs: dict[str, Any] = {"help": description, "show_default": False}
    if typing.get_origin(item) is Literal:
        # shown as the metavar, checked by the model: a bad choice is a ConfigError like
        # every other bad value (one line, exit 2, the allowed values named)
        kwargs["metavar"] = "[" + "|".join(str(c) for c in typing.get_args(item)) + "]"
        py: Any = str
    elif item in (str, int, float, Path):
        py = item
    elif item is bool and not multiple:
        flags = [f"{flag}/--no-{flag.removeprefix('--')}"]
        option = typer.Option(*flags, **kwargs)
        return inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None,
                                 annotation=Annotated[bool | None, option])
    else:
        return None  # dicts, models, unions: --config / --set only (or a Custom parser)
    option = typer.Option(flag, **kwargs)
    annotation_out = list[py] | None if multiple else py | None
    return inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[annotation_out, option])


def _plain(value: Any) -> Any:
    """Enum members (a command's own ``Extra`` choices) back to their plain values."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _param_name(dotted: str) -> str:
    name = "o_" + dotted.replace(".", "__")
    return name + "_" if keyword.iskeyword(name) else name


def _walk(model: type[BaseModel], built: _Built, *, prefix: str, template: str,
          flatten: dict[str, str], rename: dict[str, str], exclude: set[str],
          custom: dict[str, Custom], positional: set[str]) -> None:
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        if dotted in exclude or dotted in positional:
            continue
        if dotted in custom:
            c = custom[dotted]
            typ = list[str] | None if c.multiple else str | None
            option = typer.Option(c.flag, help=c.help, show_default=False, metavar=c.metavar)
            param = _param_name(dotted)
            built.params.append(inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY,
                                                  default=None, annotation=Annotated[typ, option]))
            built.options[param] = _Option(dotted, param, c.parse, c.flag)
            continue
        nested = _model_of(info.annotation)
        if nested is not None and dotted in flatten:
            _walk(nested, built, prefix=f"{dotted}.", template=flatten[dotted], flatten=flatten,
                  rename=rename, exclude=exclude, custom=custom, positional=positional)
            continue
        flag = rename.get(dotted) or "--" + template.format(name).replace("_", "-")
        description = (info.description or name.replace("_", " ")) + _default_text(info)
        param = _param_name(dotted)
        built_param = _scalar_option(flag, param, description, info.annotation)
        if built_param is not None:
            built.params.append(built_param)
            built.options[param] = _Option(dotted, param, flag=flag)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    node = data
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value


def _read_section(path: Path, section: str | None, model: type[BaseModel]) -> dict[str, Any]:
    """A config file of this model, or of a whole run whose ``section`` holds it."""
    data = read_config_file(path)
    if section and section not in model.model_fields and isinstance(data.get(section), dict):
        return data[section]
    return data


def config_command(
    model: type[BaseModel],
    run: Run,
    *,
    name: str,
    doc: str,
    section: str | None = None,
    positional: dict[str, str] | None = None,
    extras: list[Extra] | None = None,
    flatten: dict[str, str] | None = None,
    rename: dict[str, str] | None = None,
    exclude: set[str] | None = None,
    custom: dict[str, Custom] | None = None,
    prepare: Prepare | None = None,
    force_help: str | None = "Re-run even when the cache is valid.",
) -> Callable[..., None]:
    """A typer command whose options are ``model``'s fields (see the module docstring).

    Args:
        model: the settings model; the command validates its options into one.
        run: called as ``run(config, extras, force)`` with the validated settings.
        name: the command's name.
        doc: the command's help text.
        section: the key of these settings in a run config (``--config run.yaml`` works).
        positional: fields given as positional arguments, field -> help.
        extras: parameters that are not settings (passed to ``run`` in ``extras``).
        flatten: nested model fields whose own fields become options, field -> flag template
            (``"{}"``: same names; ``"lora-{}"``: prefixed).
        rename: dotted field -> flag, where the field name makes a poor flag.
        exclude: dotted fields left to ``--config`` / ``--set``.
        custom: dotted field -> :class:`Custom` parser.
        prepare: ``prepare(data, extras) -> data`` before validation (e.g. to apply a
            convenience option to every ranker).
        force_help: help of ``--force`` (``None``: the command has no ``--force``).
    """
    positional = positional or {}
    extras = extras or []
    built = _Built()
    for field_name, help_text in positional.items():
        param = _param_name(field_name)
        argument = typer.Argument(help=help_text, show_default=False,
                                  metavar=field_name.upper())
        built.params.append(inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None,
                                              annotation=Annotated[str | None, argument]))
        built.options[param] = _Option(field_name, param)
    for extra in extras:
        built.params.append(inspect.Parameter(extra.name, inspect.Parameter.KEYWORD_ONLY,
                                              default=extra.default, annotation=extra.annotation))
    _walk(model, built, prefix="", template="{}", flatten=flatten or {}, rename=rename or {},
          exclude=exclude or set(), custom=custom or {}, positional=set(positional))
    common = [
        ("config_file", Annotated[Path | None, typer.Option(
            "--config", help="YAML/TOML/JSON file of these settings (or a run config with a "
            f"'{section or model.__name__}' section); options given here override it.",
            show_default=False)], None),
        ("set_", Annotated[list[str] | None, typer.Option(
            "--set", help="Override one setting: KEY.PATH=VALUE (VALUE is YAML), repeatable.",
            show_default=False)], None),
    ]
    if force_help is not None:
        common.append(("force", Annotated[bool, typer.Option("--force", help=force_help)], False))
    for param_name, annotation, default in common:
        built.params.append(inspect.Parameter(param_name, inspect.Parameter.KEYWORD_ONLY,
                                              default=default, annotation=annotation))
    extra_names = {e.name for e in extras}

    def command(**kwargs: Any) -> None:
        extra_values = {key: kwargs.pop(key) for key in extra_names}
        config_file, sets = kwargs.pop("config_file"), kwargs.pop("set_")
        force = bool(kwargs.pop("force", False))
        data = _read_section(config_file, section, model) if config_file else {}
        for assignment in sets or []:
            apply_set(data, assignment)
        given: dict[str, Any] = {}
        labels: dict[str, str] = {}
        for param, value in kwargs.items():
            if value is None or (isinstance(value, list | tuple) and not value):
                continue
            option = built.options[param]
            value = _plain(value)
            if option.flag:
                labels[option.dotted] = option.flag
            _set_dotted(given, option.dotted, option.parse(value) if option.parse else value)
        merge_into(data, given)
        if prepare is not None:
            data = prepare(data, extra_values)
        config = validate(model, data, str(config_file) if config_file else name, labels)
        run(config, extra_values, force)

    command.__signature__ = inspect.Signature(built.params)  # type: ignore[attr-defined]
    command.__doc__ = doc
    command.__name__ = command.__qualname__ = name.replace("-", "_")
    return command
