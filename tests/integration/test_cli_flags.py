"""Every setting of every command is an option (docs/architecture.md, "The CLI"): the test walks
each generated command's config model and asserts that each leaf field has an option (or a
positional argument), or is listed in :data:`NO_FLAG` with the reason it has none. Plus the
options of union-typed fields (``list[str] | Literal["all-linear"]``), in-process and through a
real ``train-rm`` run."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from grouppref.cli import app
from grouppref.commands.options import _model_of, config_command

# command -> dotted field -> why it has no option of its own (still settable by --config/--set)
NO_FLAG: dict[str, dict[str, str]] = {
    "prompts": {
        "mapping.responses": "an import-only column: prompts never reads responses",
        "mapping.response": "an import-only column: prompts never reads responses",
    },
}


def _commands(typer_app: typer.Typer, prefix: str = "") -> list[tuple[str, Any]]:
    found = [(prefix + (c.name or c.callback.__name__), c.callback)
             for c in typer_app.registered_commands]
    for group in typer_app.registered_groups:
        name = group.name if isinstance(group.name, str) else group.typer_instance.info.name
        found += _commands(group.typer_instance, f"{prefix}{name} ")
    return found


GENERATED = [(name, cb.settings) for name, cb in _commands(app) if hasattr(cb, "settings")]


def _without_flag(model: type[BaseModel], flags: dict[str, str], prefix: str = "") -> list[str]:
    """Leaf fields of ``model`` that no option sets (a field whose option sets it whole, e.g. a
    Custom ``--refresh-ranker`` for a list of models, counts with everything below it)."""
    missing = []
    for name, info in model.model_fields.items():
        dotted = prefix + name
        if dotted in flags:
            continue
        nested = _model_of(info.annotation)
        missing += (_without_flag(nested, flags, dotted + ".") if nested is not None
                    else [dotted])
    return missing


def test_every_generated_command_is_walked() -> None:
    names = {name for name, _ in GENERATED}
    assert {"prompts", "generate", "import", "rank", "aggregate", "simulate", "validate",
            "export", "train", "train-rm", "eval", "report", "label serve", "label push",
            "label pull", "label status"} <= names, names
    assert set(NO_FLAG) <= names


@pytest.mark.parametrize("name,settings", GENERATED, ids=[n for n, _ in GENERATED])
def test_every_setting_has_an_option_or_a_reason(name: str, settings: Any) -> None:
    missing = _without_flag(settings.model, settings.flags)
    excused = NO_FLAG.get(name, {})
    assert sorted(set(missing) - set(excused)) == [], (
        f"{name}: give these settings an option (options.py) or a reason in NO_FLAG")
    assert sorted(set(excused) - set(missing)) == [], f"{name}: stale NO_FLAG entries"


@pytest.mark.parametrize("name,settings", GENERATED, ids=[n for n, _ in GENERATED])
def test_the_extras_type_names_each_extra_parameter(name: str, settings: Any) -> None:
    """A command's run function reads its non-setting parameters from a TypedDict (mypy checks
    the keys it reads); its keys are the command's Extra names, no more, no fewer."""
    extras_type = typing.get_type_hints(settings.run)["extras"]
    assert set(extras_type.__annotations__) == set(settings.extras), name


@pytest.mark.parametrize("command", ["train", "train-rm"])
def test_lora_target_is_a_repeatable_option(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    entry = text[text.index("--lora-target "):text.index("--lora-save")]
    assert entry.startswith("--lora-target all-linear|TEXT Module names")
    assert "Repeat for several. [default: all-linear]" in entry


class _Union(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targets: list[str] | Literal["all-linear"] = Field(default="all-linear", description="T.")
    workers: int | Literal["auto"] = Field(default="auto", description="W.")


def _parsed(args: list[str]) -> tuple[int, Any, str]:
    seen: list[_Union] = []
    one = typer.Typer()
    one.command()(config_command(_Union, lambda c, e, f: seen.append(c), name="u", doc="U."))
    one.command(name="other")(lambda: None)  # two commands: typer keeps the name
    result = CliRunner().invoke(one, ["u", *args])
    return result.exit_code, seen[0] if seen else None, f"{result.output}{result.exception!r}"


@pytest.mark.parametrize("args,targets,workers", [
    ([], "all-linear", "auto"),
    (["--targets", "all-linear"], "all-linear", "auto"),
    (["--targets", "q_proj"], ["q_proj"], "auto"),
    (["--targets", "q_proj", "--targets", "v_proj", "--workers", "3"], ["q_proj", "v_proj"], 3),
    (["--set", "targets=[k_proj]", "--workers", "auto"], ["k_proj"], "auto"),
    (["--set", "targets=[k_proj]", "--targets", "o_proj"], ["o_proj"], "auto"),  # option wins
])
def test_union_options_parse_to_the_field(args: list[str], targets: Any, workers: Any) -> None:
    code, config, output = _parsed(args)
    assert code == 0, output
    assert (config.targets, config.workers) == (targets, workers)


def test_a_bad_union_value_is_one_error_naming_the_option() -> None:
    code, config, output = _parsed(["--workers", "many"])
    assert code != 0 and config is None
    assert "ConfigError" in output and "--workers" in output


def test_train_rm_trains_the_modules_given_by_lora_target(tiny_lm_dir: Path,
                                                          tmp_path: Path) -> None:
    """A real train-rm run: the adapter it saves targets exactly the named modules."""
    from tests.support.training import _write_validate, synthetic_groups

    store = _write_validate(tmp_path / "run", synthetic_groups(8, 0))
    result = CliRunner().invoke(app, [
        "train-rm", str(store.root), "--model", str(tiny_lm_dir), "--max-steps", "1",
        "--lora-target", "q_proj", "--lora-target", "v_proj", "--lora-save", "adapter",
        "--held-out-fraction", "0"])
    assert result.exit_code == 0, result.output
    settings = store.require("train_rm").config["train_rm"]
    assert settings["lora"]["target_modules"] == ["q_proj", "v_proj"]
    adapter = json.loads((Path(store.require("train_rm").outputs["model"])
                          / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
