"""The ``grouppref`` command line: one subcommand per stage, plus ``run``, ``demo`` and ``label``.

Each subcommand lives in ``grouppref/commands/<area>.py`` and is a thin wrapper over the
library; this module only assembles them and turns user errors into one line and exit code 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from grouppref.commands import (
    aggregate,
    core,
    demo,
    export,
    generate,
    imports,
    label_data,
    label_server,
    rank,
    run,
    sweep,
    train,
    train_rm,
)
from grouppref.errors import GroupPrefError


def _usage_name(self: typer.core.TyperArgument) -> str:
    """``RUN`` rather than typer's ``{RUN}`` for a required argument in the usage line (the
    POSIX convention: brackets only for what may be left out)."""
    name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
    return name + ("..." if self.nargs != 1 else "")


typer.core.TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]

app = typer.Typer(
    name="grouppref",
    help="Group-wise preference data and training: generate, rank, label, aggregate, "
    "validate, export, train (GSPO).",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: never cuts option names, no <bool> metavars
    pretty_exceptions_enable=False,
    add_completion=False,
)

label_data.register(label_server.label_app)  # push/pull/status join serve/stop/users
for module in (core, generate, imports, rank, aggregate, export, train, train_rm, label_server,
               sweep, run, demo):
    module.register(app)


def _quiet_libraries() -> None:
    """Our own progress bars report each stage: silence the libraries' bars (only if the
    command already imported them; ``--help`` imports neither)."""
    import os

    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def main() -> None:
    """Entry point: run the app; a ``GroupPrefError`` prints one red line and exits with 2."""
    from grouppref.runs.stage_run import record_stops

    _quiet_libraries()
    try:
        app()
    except KeyboardInterrupt:
        record_stops("interrupted")
        raise
    except GroupPrefError as e:
        record_stops(f"error: {e}")
        # escape: a message naming "rankings[helpfulness]" must not lose it as rich markup
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(e))}", highlight=False,
                                   soft_wrap=True)
        sys.exit(2)
    except Exception as e:  # a bug: the traceback follows; the manifest says the stage stopped
        record_stops(f"{type(e).__name__}: {e}")
        raise


if __name__ == "__main__":
    main()
