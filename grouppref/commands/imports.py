"""``grouppref import``: preference data made elsewhere (UltraFeedback, Nectar, HelpSteer2,
pairs, HH, OpenAssistant, HelpSteer3, Chatbot Arena, grouppref's own groups, ...) with its
rankings into ``RUN/import``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from grouppref.commands.arguments import OutExtras
from grouppref.commands.options import Extra, config_command, help_of
from grouppref.commands.output import err, print_stage
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore

MAPPING_FLAGS = {"mapping.metadata_columns": "--metadata-column",
                 "mapping.metadata": "--metadata-object-column",
                 "mapping.prompt_id": "--id-column", "mapping.duplicate_ids": "--duplicate-ids"}


def _run(config: ImportConfig, extras: OutExtras, force: bool) -> None:
    from grouppref.pipeline.imports.stage import run_import

    stage = run_import(RunStore(extras["out"]), config, StageContext(force=force))
    s = stage.manifest.stats
    if s.get("layout"):
        annotators = ", ".join(f"{a} ({n})" for a, n in list(s["annotators"].items())[:8])
        more = f", ... {len(s['annotators']) - 8} more" if len(s["annotators"]) > 8 else ""
        err.print(f"import: layout {s['layout']}, {s['rows']} rows read "
                  f"({s['blank_lines']} blank) -> {s['groups']} groups, {s['candidates']} "
                  f"candidates, {s['rankings']} rankings ({s['partial_rankings']} partial"
                  f"{', ' + str(s['groups_split']) + ' groups split' if s['groups_split'] else ''})"
                  f"{'; annotators: ' + annotators + more if annotators else ''}")
    print_stage(stage, name="import")


imports = config_command(
    ImportConfig, _run, name="import", section="import",
    doc="Import preference data with its rankings into RUN/import (docs/import.md): "
    "grouppref's own groups, UltraFeedback, Nectar, HelpSteer2, scored rows, pairs, HH, "
    "OpenAssistant, HelpSteer3, Chatbot Arena.",
    positional={"source": help_of(ImportConfig, "source")},
    extras=[Extra("out", Annotated[Path, typer.Option(
        "--out", help="Run directory to write RUN/import into.", show_default=False)])],
    flatten={"mapping": "{}-column"},
    rename={**MAPPING_FLAGS, "scores": "--score", "langs": "--lang"})


def register(app: typer.Typer) -> None:
    app.command(name="import")(imports)
