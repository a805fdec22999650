"""The parameters many commands share (the run folder, ``--out``, ``--allow-stale``) and the
typed dicts their run functions read them from: a module of their own, so that a command
imports no other command's module (nor the stage registry) for them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypedDict

import typer

RunArg = Annotated[Path, typer.Argument(help="Run directory, e.g. runs/demo.", metavar="RUN",
                                       show_default=False)]
OutOpt = Annotated[Path, typer.Option("--out", help="Run directory to write into.",
                                      show_default=False)]
AllowStale = Annotated[bool, typer.Option(
    "--allow-stale", help="Use a stage's output even when it is stale (an upstream stage "
    "changed after it ran); what is written says so.")]


# A command's parameters that are not settings (its Extras), as its run function reads them
class RunExtras(TypedDict):
    run: Path  # RunArg


class StaleRunExtras(RunExtras):
    allow_stale: bool  # AllowStale


class OutExtras(TypedDict):
    out: Path  # --out
