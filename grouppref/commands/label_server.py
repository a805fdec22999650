"""``grouppref label serve / stop / users add``: the embedded Argilla server.

``label_app`` is the ``label`` sub-app; ``grouppref.commands.label_data`` adds ``push``,
``pull`` and ``status`` to it (``label_data.register(label_app)``, below, once).
"""

from __future__ import annotations

import enum
import os
import sys
from pathlib import Path
from typing import Annotated, TypedDict

import typer

from grouppref.commands import label_data
from grouppref.commands.options import Extra, config_command, help_of
from grouppref.commands.output import err, out
from grouppref.labeling.server.accounts import create_user
from grouppref.labeling.server.credentials import CREDENTIALS_FILE, load_credentials
from grouppref.labeling.server.embedded import (
    EmbeddedArgilla,
    ServerConfig,
    default_state_dir,
    running_url,
    stop_state_dir,
)
from grouppref.labeling.server.processes import RUN_FILE

DATABASE_ENV = "GROUPPREF_ARGILLA_DATABASE_URL"
label_app = typer.Typer(name="label", no_args_is_help=True, rich_markup_mode=None,
                        help="Human labeling in Argilla: a local server, push, pull, status.")
users_app = typer.Typer(name="users", no_args_is_help=True, rich_markup_mode=None,
                        help="Accounts on the embedded Argilla server.")
label_app.add_typer(users_app)

StateDirOpt = Annotated[Path | None, typer.Option(
    "--state-dir", help=help_of(ServerConfig, "state_dir"), show_default=False)]
ShowSecretsOpt = Annotated[bool, typer.Option(
    "--show-secrets", help="Print passwords and API keys (they are always in the 0600 "
    "credentials file).")]


class RoleChoice(enum.StrEnum):
    annotator = "annotator"
    admin = "admin"
    owner = "owner"


class _ServeExtras(TypedDict):
    detach: bool
    show_secrets: bool


def _serve(config: ServerConfig, extras: _ServeExtras, force: bool) -> None:
    if config.database_url is None and os.environ.get(DATABASE_ENV):
        config = config.model_copy(update={"database_url": os.environ[DATABASE_ENV]})
    server = EmbeddedArgilla(config)
    server.prepare()  # a bad --state-dir or --database-url fails before the progress line
    err.print("starting Argilla (the first start builds its environment, ~1 min) ...")
    server.start(detach=extras["detach"])
    if server.cleaned_up:
        err.print(f"note: the previous server of {server.state_dir} had died; stopped what was "
                  f"left of it ({', '.join(server.cleaned_up)})")
    _report(server, extras["show_secrets"])
    if config.host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"[yellow]warning:[/] bound to {config.host}: reachable from your network")
    if extras["detach"]:
        err.print(f"running in the background; stop with `grouppref label stop "
                  f"--state-dir {server.state_dir}`")
        return
    err.print("press Ctrl-C to stop")
    try:
        code = server.wait()
        if not (server.state_dir / RUN_FILE).exists():
            code = 0  # `grouppref label stop` from another terminal
        else:
            err.print(f"[red]a server process exited ({code}); see {server.state_dir / 'logs'}")
    except KeyboardInterrupt:
        code = 0
    finally:
        server.stop()
        err.print("stopped")
    if code:
        raise typer.Exit(1)


serve = config_command(
    ServerConfig, _serve, name="serve", force_help=None,
    doc="Start a local Argilla (no Docker, no Elasticsearch); Ctrl-C stops everything. The "
    f"database URL may also come from ${DATABASE_ENV} (keeps its password out of your shell "
    "history).",
    extras=[Extra("detach", Annotated[bool, typer.Option(
                "--detach", help="Run in the background; stop with `grouppref label stop`.")],
                  False),
            Extra("show_secrets", ShowSecretsOpt, False)])


def _report(server: EmbeddedArgilla, show_secrets: bool) -> None:
    out.print(f"[green]Argilla[/] at {server.url}  (workspace {server.workspace!r})")
    out.print(f"owner {server.owner_username!r}; credentials in {server.credentials_path}")
    if show_secrets:
        out.print(f"owner password: {server.owner_password}\nowner API key: {server.api_key}",
                      highlight=False)


def stop(state_dir: StateDirOpt = None) -> None:
    """Stop the embedded Argilla running on the state directory."""
    where = state_dir or default_state_dir()
    if stop_state_dir(where):
        out.print(f"stopped the Argilla server of {where}")
    else:
        out.print(f"no Argilla server was running on {where}")


def users_add(
    name: Annotated[str, typer.Argument(help="Username (also the UI login).", metavar="NAME")],
    role: Annotated[RoleChoice, typer.Option(help="Argilla role.")] = RoleChoice.annotator,
    password_stdin: Annotated[bool, typer.Option(
        "--password-stdin", help="Read the password from stdin instead of generating one.")] = False,
    state_dir: StateDirOpt = None,
    show_secrets: ShowSecretsOpt = False,
) -> None:
    """Create an account in the workspace of the running embedded server."""
    where = (state_dir or default_state_dir()).expanduser().resolve()
    url = running_url(where)
    password = sys.stdin.readline().rstrip("\n") if password_stdin else None
    username, password, api_key = create_user(url, where / CREDENTIALS_FILE, name, role.value,
                                              password)
    workspace = load_credentials(where / CREDENTIALS_FILE).workspace
    out.print(f"created {role.value} {username!r} in workspace {workspace!r} at {url}; "
                  f"password and API key in {where / CREDENTIALS_FILE}")
    if show_secrets:
        out.print(f"password: {password}\nAPI key: {api_key}", highlight=False)


label_app.command()(serve)
label_app.command()(stop)
users_app.command("add")(users_add)
label_data.register(label_app)  # push/pull/status join serve/stop/users


def register(app: typer.Typer) -> None:
    """Add the ``label`` sub-app (``serve``, ``stop``, ``users add``, ``push``, ``pull``,
    ``status``) to ``app``."""
    app.add_typer(label_app)
