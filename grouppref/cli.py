"""The ``grouppref`` command line: one subcommand per stage, plus ``run``, ``demo`` and ``label``.

Each subcommand lives in ``grouppref/commands/<area>.py`` and is a thin wrapper over the
library; this module only assembles them and turns user errors into one line and exit code 2.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from grouppref.errors import GroupPrefError

if TYPE_CHECKING:
    from collections.abc import Sequence

# the modules of grouppref/commands/, in the order of ``grouppref --help``, and the commands
# each registers (tests/integration/test_cli.py holds these to what each one registers): a
# command's run imports only its own module
COMMANDS: dict[str, tuple[str, ...]] = {
    "core": ("schema", "prompts", "inspect"),
    "generate": ("generate",),
    "imports": ("import",),
    "rank": ("rank",),
    "aggregate": ("aggregate", "simulate"),
    "export": ("validate", "export"),
    "train": ("train", "eval"),
    "train_rm": ("train-rm",),
    "label_server": ("label",),
    "sweep": ("sweep",),
    "run": ("run", "report"),
    "demo": ("demo",),
}


def _usage_name(self: typer.core.TyperArgument) -> str:
    """``RUN`` rather than typer's ``{RUN}`` for a required argument in the usage line (the
    POSIX convention: brackets only for what may be left out)."""
    name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
    return name + ("..." if self.nargs != 1 else "")


typer.core.TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]


def make_app(command: str | None = None) -> typer.Typer:
    """The ``grouppref`` app: every command, or only the module that registers ``command``
    (one of :data:`COMMANDS`'s; another name: every command, so that the help or the error
    names them all)."""
    app = typer.Typer(
        name="grouppref",
        help="Group-wise preference data and training: generate, rank, label, aggregate, "
        "validate, export, train (GSPO).",
        no_args_is_help=True,
        rich_markup_mode=None,  # plain help: never cuts option names, no <bool> metavars
        pretty_exceptions_enable=False,
        add_completion=False,
    )

    @app.callback()
    def _commands() -> None:
        """(A group of commands even when one is registered: typer would run a lone
        command without its name.)"""

    modules = [m for m, names in COMMANDS.items() if command in names] or list(COMMANDS)
    for module in modules:
        importlib.import_module(f"grouppref.commands.{module}").register(app)
    return app


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word after the program (the app's own options
    are only ``--help``)."""
    return argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None


def __getattr__(name: str) -> typer.Typer:
    """``grouppref.cli.app``: the app with every command (for ``typer.testing.CliRunner``)."""
    if name == "app":
        return make_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _interrupted(stop: SystemExit) -> bool:
    """``stop`` is how typer ends a command that a ``KeyboardInterrupt`` stopped (its cause,
    under the ``typer.Exit(130)`` it raises instead)."""
    seen: BaseException | None = stop
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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
    app = make_app(_command_of(sys.argv))
    try:
        app()
    except KeyboardInterrupt:
        record_stops("interrupted")
        raise
    except SystemExit as e:  # typer ends a command that Ctrl-C stops with exit code 130
        if _interrupted(e):
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
