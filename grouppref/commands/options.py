"""CLI options generated from the pydantic config models: one source for names, types,
defaults, choices and help.

:func:`config_command` turns a settings model into a typer command: every scalar field
becomes ``--field-name`` (``bool``: ``--x/--no-x``; ``Literal``: a choice; ``list[str]``:
repeatable; a union such as ``list[str] | Literal["all-linear"]``: repeatable, one literal
value standing for itself), nested models named in ``flatten`` contribute their fields too, and fields that
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from grouppref.config import apply_set, merge_into, read_config_file, validate

M = TypeVar("M", bound=BaseModel)
# a command's parameters that are not settings: a TypedDict whose keys are its Extra names
E = TypeVar("E", bound=Mapping[str, Any])


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


@dataclass(frozen=True)
class CommandSettings:
    """What a generated command exposes (read by tests/integration/test_cli_flags.py): its
    settings model, per dotted field the option (or positional argument) that sets it, the names
    of its :class:`Extra` parameters and the function it runs (whose ``extras`` TypedDict has
    those keys)."""

    model: type[BaseModel]
    flags: dict[str, str]
    extras: tuple[str, ...] = ()
    run: Callable[..., None] | None = None


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


_SCALARS = {str: "TEXT", int: "INTEGER", float: "FLOAT", Path: "PATH"}
Parse = Callable[[Any], Any] | None


def _choices(item: Any) -> tuple[Any, ...] | None:
    return typing.get_args(item) if typing.get_origin(item) is Literal else None


def _list_item(annotation: Any) -> Any | None:
    """The item type of ``list[X]`` / ``set[X]`` / ``tuple[X, ...]``; None for anything else
    (fixed-length tuples need a Custom parser)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin not in (list, tuple, set) or origin is None or not args:
        return None
    if origin is tuple and len(set(args) - {Ellipsis}) != 1:
        return None
    return _unwrap(args[0])[0]


def _option_param(param: str, annotation: Any, option: Any) -> inspect.Parameter:
    return inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[annotation, option])


def _union_option(flag: str, param: str, description: str, args: tuple[Any, ...]
                  ) -> tuple[inspect.Parameter, Parse] | None:
    """A union of scalars (str, int, float, Path, ``Literal``) and at most one list of them,
    e.g. ``list[str] | Literal["all-linear"]``: one option, repeatable when a list is allowed;
    one value that is one of the literal choices is that choice, else the values are the list
    (``--lora-target q_proj --lora-target v_proj``, ``--lora-target all-linear``). The model
    converts the strings (pydantic's lax mode: "3" is an int where an int is allowed)."""
    lists = [item for a in args if (item := _list_item(a)) is not None]
    scalars = [a for a in args if typing.get_origin(a) not in (list, tuple, set)]
    if len(lists) + len(scalars) != len(args) or len(lists) > 1:
        return None
    names: list[str] = []
    for item in [*scalars, *lists]:
        choices = _choices(item)
        if choices is None and item not in _SCALARS:
            return None  # bools, dicts, models: --config / --set only (or a Custom parser)
        for name in [str(c) for c in choices] if choices else [_SCALARS[item]]:
            if name not in names:
                names.append(name)
    literal = {str(c) for a in scalars if (cs := _choices(a)) for c in cs}
    if lists:  # before the "[default: X]" that ends the description
        head, sep, default = description.partition(" [default:")
        description = f"{head} Repeat for several.{sep}{default}"
    option = typer.Option(flag, help=description, show_default=False, metavar="|".join(names))
    if not lists:
        return _option_param(param, str | None, option), None

    def parse(values: list[str]) -> Any:
        return values[0] if len(values) == 1 and values[0] in literal else list(values)

    return _option_param(param, list[str] | None, option), parse


def _scalar_option(flag: str, param: str, description: str, annotation: Any
                   ) -> tuple[inspect.Parameter, Parse] | None:
    """The typer parameter of one scalar, list-of-scalar or union-of-scalar field and the parser
    of what it gets (None: the value as given); None if the field has no option."""
    inner, _ = _unwrap(annotation)
    if typing.get_origin(inner) in (typing.Union, types.UnionType):
        return _union_option(flag, param, description,
                             tuple(a for a in typing.get_args(inner) if a is not type(None)))
    item = _list_item(inner)
    multiple = item is not None
    if not multiple:
        if typing.get_origin(inner) in (list, tuple, set):
            return None  # fixed-length tuples need a Custom parser
        item = inner
    kwargs: dict[str, Any] = {"help": description, "show_default": False}
    if _choices(item) is not None:
        # shown as the metavar, checked by the model: a bad choice is a ConfigError like
        # every other bad value (one line, exit 2, the allowed values named)
        kwargs["metavar"] = "[" + "|".join(str(c) for c in typing.get_args(item)) + "]"
        py: Any = str
    elif item in _SCALARS:
        py = item
    elif item is bool and not multiple:
        option = typer.Option(f"{flag}/--no-{flag.removeprefix('--')}", **kwargs)
        return _option_param(param, bool | None, option), None
    else:
        return None  # dicts, models: --config / --set only (or a Custom parser)
    return _option_param(param, list[py] | None if multiple else py | None,
                         typer.Option(flag, **kwargs)), None


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
        built_option = _scalar_option(flag, param, description, info.annotation)
        if built_option is not None:
            built.params.append(built_option[0])
            built.options[param] = _Option(dotted, param, built_option[1], flag)


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
    model: type[M],
    run: Callable[[M, E, bool], None],
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
    prepare: Callable[[dict[str, Any], E], dict[str, Any]] | None = None,
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
        extras: parameters that are not settings (passed to ``run`` in ``extras``, typed by
            ``run`` as a TypedDict with these names).
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
    common: list[tuple[str, Any, object]] = [  # (parameter, annotation, default)
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
        extra_values = cast(E, {key: kwargs.pop(key) for key in extra_names})
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
    command.settings = CommandSettings(  # type: ignore[attr-defined]
        model, {o.dotted: o.flag or o.dotted.upper() for o in built.options.values()},
        tuple(e.name for e in extras), run)
    command.__doc__ = doc
    command.__name__ = command.__qualname__ = name.replace("-", "_")
    return command
