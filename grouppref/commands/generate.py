"""``grouppref generate``: sample K candidates per prompt, or import candidates made elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from grouppref.commands.arguments import OutExtras
from grouppref.commands.options import Custom, Extra, config_command, help_of
from grouppref.commands.output import print_server_usage, print_stage
from grouppref.config import validate
from grouppref.errors import ConfigError
from grouppref.models.served.settings import ServerSettings, parse_server_param
from grouppref.pipeline.generate.config import GenerateConfig, ModelShare
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore

MODEL_HELP = (help_of(GenerateConfig, "models") + " NAME is a Hub id or local path (in process), "
              "or, as openai:NAME[@URL][:COUNT], a model served by an OpenAI-compatible server "
              "(URL: its base URL, default --base-url). Default: the embedded SmolLM2.")


def _models(specs: list[str]) -> list[dict[str, Any]]:
    return [ModelShare.parse(spec).model_dump(exclude_none=True) for spec in specs]


def _server_params(specs: list[str]) -> dict[str, Any]:
    return dict(parse_server_param(spec) for spec in specs)


class _GenerateExtras(OutExtras):
    import_file: str | None  # --import
    quiet: bool


def _run(config: GenerateConfig, extras: _GenerateExtras, force: bool) -> None:
    store = RunStore(extras["out"])
    if extras["import_file"] is not None:
        # (the settings resolve `models` themselves, so ask whether a model was named)
        if config.source is not None or [m.name for m in config.models] != ["embedded"]:
            raise ConfigError("generate: --import builds groups from a file of responses; "
                              "leave out --prompts and --model")
        from grouppref.pipeline.imports.stage import run_import_candidates

        imported = validate(ImportConfig, {
            "source": extras["import_file"], "split": config.split, "min_k": config.min_k,
            "mapping": config.mapping.model_dump(exclude_unset=True)}, "--import")
        print_stage(run_import_candidates(store, imported, StageContext(force=force)))
        return
    if any(m.backend == "transformers" for m in config.models):  # served only: no transformers
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own bar reports the stage
    from grouppref.pipeline.generate.stage import run_generate

    stage = run_generate(store, config, StageContext(force=force),
                         show_progress=not extras["quiet"])
    print_stage(stage)
    print_server_usage(stage.manifest.stats)


generate = config_command(
    GenerateConfig, _run, name="generate", section="generate",
    doc="Sample K candidates per prompt into RUN/generate (or --import them from a file).",
    extras=[
        Extra("out", Annotated[Path, typer.Option("--out", help="Run directory to write "
                                                  "RUN/generate into.", show_default=False)]),
        Extra("import_file", Annotated[str | None, typer.Option(
            "--import", help="Import candidates made elsewhere instead of sampling (any layout "
            "of `grouppref import`, told from the columns; rankings are not kept: use "
            "`grouppref import` for them): " + help_of(ImportConfig, "source"),
            show_default=False)], None),
        Extra("quiet", Annotated[bool, typer.Option("--quiet", help="No progress bar.")], False),
    ],
    flatten={"mapping": "{}-column", "server": "{}"},
    rename={"source": "--prompts", "mapping.metadata_columns": "--metadata-column",
            "mapping.metadata": "--metadata-object-column",
            "mapping.prompt_id": "--id-column", "mapping.duplicate_ids": "--duplicate-ids"},
    custom={"models": Custom("--model", MODEL_HELP, _models, multiple=True,
                             metavar="[openai:]NAME[@URL][:COUNT]"),
            "server.server_params": Custom(
                "--server-param", help_of(ServerSettings, "server_params") + " One KEY=VALUE "
                "(VALUE is YAML) per option.", _server_params, multiple=True, metavar="KEY=VALUE")})


def register(app: typer.Typer) -> None:
    app.command()(generate)
