"""``grouppref label serve / stop / users add``: the embedded Argilla server.

``label_app`` is the ``label`` sub-app; ``grouppref.commands.label_data`` adds ``push``,
``pull`` and ``status`` to it (``label_data.register(label_server.label_app)``).
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from grouppref.commands.options import help_of
from grouppref.labeling.server.credentials import CREDENTIALS_FILE, load_credentials
from grouppref.labeling.server.embedded import (
    EmbeddedArgilla,
    ServerConfig,
    create_user,
    default_state_dir,
    running_url,
    stop_state_dir,
)
from grouppref.labeling.server.processes import RUN_FILE

console = Console()
label_app = typer.Typer(name="label", no_args_is_help=True,
                        help="Human labeling in Argilla: a local server, push, pull, status.")
users_app = typer.Typer(name="users", no_args_is_help=True,
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


def serve(
    host: Annotated[str, typer.Option(help=help_of(ServerConfig, "host"))] = "127.0.0.1",
    port: Annotated[int, typer.Option(help=help_of(ServerConfig, "port"))] = 6900,
    database_url: Annotated[str | None, typer.Option(
        help=help_of(ServerConfig, "database_url") + " Also from $GROUPPREF_ARGILLA_DATABASE_URL "
        "(keeps the password out of your shell history).",
        envvar="GROUPPREF_ARGILLA_DATABASE_URL", show_default=False)] = None,
    state_dir: StateDirOpt = None,
    workspace: Annotated[str, typer.Option(help=help_of(ServerConfig, "workspace"))] = "grouppref",
    detach: Annotated[bool, typer.Option(
        "--detach", help="Run in the background; stop with `grouppref label stop`.")] = False,
    show_secrets: ShowSecretsOpt = False,
) -> None:
    """Start a local Argilla (no Docker, no Elasticsearch); Ctrl-C stops everything."""
    config = ServerConfig(host=host, port=port, database_url=database_url, workspace=workspace,
                          state_dir=state_dir or default_state_dir())
    server = EmbeddedArgilla(config)
    console.print("starting Argilla (the first start builds its environment, ~1 min) ...")
    server.start(detach=detach)
    _report(server, show_secrets)
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] bound to {host}: reachable from your network")
    if detach:
        console.print(f"running in the background; stop with `grouppref label stop "
                      f"--state-dir {server.state_dir}`")
        return
    console.print("press Ctrl-C to stop")
    try:
        code = server.wait()
        if not (server.state_dir / RUN_FILE).exists():
            code = 0  # `grouppref label stop` from another terminal
        else:
            console.print(f"[red]a server process exited ({code}); see "
                          f"{server.state_dir / 'logs'}")
    except KeyboardInterrupt:
        code = 0
    finally:
        server.stop()
        console.print("stopped")
    if code:
        raise typer.Exit(1)


def _report(server: EmbeddedArgilla, show_secrets: bool) -> None:
    console.print(f"[green]Argilla[/] at {server.url}  (workspace {server.workspace!r})")
    console.print(f"owner {server.owner_username!r}; credentials in {server.credentials_path}")
    if show_secrets:
        console.print(f"owner password: {server.owner_password}\nowner API key: {server.api_key}",
                      highlight=False)


def stop(state_dir: StateDirOpt = None) -> None:
    """Stop the embedded Argilla running on the state directory."""
    where = state_dir or default_state_dir()
    if stop_state_dir(where):
        console.print(f"stopped the Argilla server of {where}")
    else:
        console.print(f"no Argilla server was running on {where}")


def users_add(
    name: Annotated[str, typer.Argument(help="Username (also the UI login).")],
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
    console.print(f"created {role.value} {username!r} in workspace {workspace!r} at {url}; "
                  f"password and API key in {where / CREDENTIALS_FILE}")
    if show_secrets:
        console.print(f"password: {password}\nAPI key: {api_key}", highlight=False)


label_app.command()(serve)
label_app.command()(stop)
users_app.command("add")(users_add)


def register(app: typer.Typer) -> None:
    """Add the ``label`` sub-app (``serve``, ``stop``, ``users add``) to ``app``."""
    app.add_typer(label_app)
