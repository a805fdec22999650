"""The ``grouppref`` command line: one subcommand per stage, plus ``run``, ``demo`` and ``label``.

Each subcommand lives in ``grouppref/commands/<area>.py`` and is a thin wrapper over the
library; this module only assembles them and turns user errors into one line and exit code 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from grouppref.commands import (
    aggregate,
    core,
    demo,
    export,
    generate,
    label_data,
    label_server,
    rank,
    run,
    train,
)
from grouppref.errors import GroupPrefError

app = typer.Typer(
    name="grouppref",
    help="Group-wise preference data and training: generate, rank, label, aggregate, "
    "validate, export, train (GSPO).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

label_data.register(label_server.label_app)  # push/pull/status join serve/stop/users
for module in (core, generate, rank, aggregate, export, train, label_server, run, demo):
    module.register(app)


def main() -> None:
    """Entry point: run the app; a ``GroupPrefError`` prints one red line and exits with 2."""
    import datasets
    import transformers

    datasets.disable_progress_bars()  # our own progress bars report each stage
    transformers.utils.logging.disable_progress_bar()
    try:
        app()
    except GroupPrefError as e:
        Console(stderr=True).print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
