"""The embedded Argilla's secrets: one JSON file, mode 0600, in a 0700 state directory.

It holds the owner's generated password and API key, every account made with
``grouppref label users add``, and ``auth_secret_key``: argilla-server signs login tokens
with it and would otherwise draw a new one per process, logging everyone out on restart.
Nothing here is ever printed unless the user asks (``--show-secrets``).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grouppref.errors import ConfigError

CREDENTIALS_FILE = "credentials.json"
OWNER_USERNAME = "owner"


class Account(BaseModel):
    """One Argilla account."""

    model_config = ConfigDict(extra="forbid")

    role: str = Field(description="Argilla role: owner, admin or annotator.")
    password: str = Field(description="Password for the web UI.")
    api_key: str = Field(description="API key for the SDK and REST (X-Argilla-Api-Key).")


class Credentials(BaseModel):
    """Everything secret about one embedded server."""

    model_config = ConfigDict(extra="forbid")

    workspace: str = Field(description="The workspace grouppref creates and labels in.")
    auth_secret_key: str = Field(description="Key argilla-server signs login tokens with.")
    database_url: str | None = Field(
        default=None, description="The PostgreSQL URL given on first start (None: SQLite).")
    users: dict[str, Account] = Field(description="Accounts by username; 'owner' always.")

    @property
    def owner(self) -> Account:
        return self.users[OWNER_USERNAME]


def new_password() -> str:
    """A random password (22 URL-safe characters; Argilla requires at least 8)."""
    return secrets.token_urlsafe(16)


def new_credentials(workspace: str, database_url: str | None) -> Credentials:
    """Fresh secrets for a new state directory (no default password anywhere)."""
    owner = Account(role="owner", password=new_password(),
                    api_key=f"gp.{secrets.token_urlsafe(32)}")
    return Credentials(workspace=workspace, auth_secret_key=secrets.token_hex(32),
                       database_url=database_url, users={OWNER_USERNAME: owner})


def load_credentials(path: Path) -> Credentials:
    """Read the credentials file.

    Raises:
        ConfigError: missing, unreadable or not a grouppref credentials file.
    """
    try:
        return Credentials.model_validate_json(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no credentials file; start the server first with "
                          "`grouppref label serve` (or pass the right --state-dir)") from e
    except (OSError, ValidationError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a valid grouppref credentials file ({e}); move it "
                          "away to start over with a new owner") from e


def save_credentials(path: Path, credentials: Credentials) -> None:
    """Write the file atomically with mode 0600 (never readable by others, even briefly)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(credentials.model_dump_json(indent=2) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def load_or_create(path: Path, workspace: str) -> Credentials:
    """The state directory's credentials, created on first start (SQLite until a start with
    a PostgreSQL URL succeeds and :func:`remember_start` stores it)."""
    if not path.exists():
        credentials = new_credentials(workspace, None)
        save_credentials(path, credentials)
        return credentials
    return load_credentials(path)


def remember_start(path: Path, workspace: str, database_url: str | None) -> None:
    """After a successful start: keep its workspace and database, so a restart without
    ``--database-url`` does not silently switch to an empty SQLite file (and a URL that
    failed is never kept)."""
    with locked(path):
        credentials = load_credentials(path)
        if (credentials.workspace, credentials.database_url) != (workspace, database_url):
            credentials.workspace, credentials.database_url = workspace, database_url
            save_credentials(path, credentials)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock for a read-modify-write of the credentials file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
