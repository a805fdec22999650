"""Pytest fixtures for the embedded Argilla (load with ``pytest_plugins``).

- ``argilla_server``: one real server per test session (SQLite, temporary state dir).
- ``argilla_postgres_url``: Debian's PostgreSQL started in a temporary directory (as the
  ``postgres`` user when the tests run as root, which initdb refuses).
- ``chromium_executable``: Debian's chromium binary for browser tests.

A missing requirement (no chromium, no PostgreSQL binaries) fails the tests that need it with
the install command: ``make test`` installs both first (scripts/setup-test-env.sh), so a
missing one is a broken set-up, never a reason to skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from grouppref.labeling.server.embedded import EmbeddedArgilla
from grouppref.labeling.server.processes import free_port
from tests.support.suite_setup import APT_HINT, missing_requirement


@pytest.fixture(scope="session")
def argilla_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedArgilla]:
    """A started embedded Argilla (SQLite) shared by the whole session."""
    with EmbeddedArgilla(state_dir=tmp_path_factory.mktemp("argilla-sqlite"), port=0) as server:
        yield server


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    """Path of Debian's chromium (never ``playwright install``)."""
    path = shutil.which("chromium")
    if path is None:
        missing_requirement("Debian chromium (browser tests)",
                            f"run `sudo apt-get install -y chromium` ({APT_HINT})")
    return path


def _postgres_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_user(user: pwd.struct_passwd | None):  # noqa: ANN202
    if user is None:
        return None

    def demote() -> None:
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return demote


@pytest.fixture(scope="session")
def argilla_postgres_url() -> Iterator[str]:
    """``postgresql://grouppref:<random>@127.0.0.1:<port>/argilla`` on a throwaway cluster."""
    bindir = _postgres_bindir()
    if bindir is None:
        missing_requirement("the PostgreSQL server (Argilla on PostgreSQL)",
                            f"run `sudo apt-get install -y postgresql` ({APT_HINT})")
    user = None
    if os.geteuid() == 0:  # initdb refuses root: run the cluster as the postgres user
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            user = pwd.getpwnam("nobody")
    root = Path(tempfile.mkdtemp(prefix="grouppref-pg-"))
    password = secrets.token_urlsafe(16)
    (root / "pwfile").write_text(password + "\n")
    if user is not None:
        for path in (root, root / "pwfile"):
            os.chown(path, user.pw_uid, user.pw_gid)
    data, port = root / "data", free_port()
    run = dict(check=True, capture_output=True, text=True, preexec_fn=_as_user(user), cwd=root)
    try:
        subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "grouppref",
                        "--pwfile", str(root / "pwfile"), "-A", "scram-sha-256", "--no-sync",
                        "-E", "UTF8", "--locale", "C"], **run)
        subprocess.run([str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "log"),
                        "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 "
                        "-c fsync=off -c synchronous_commit=off -c max_connections=100",
                        "start"], **run)
    except subprocess.CalledProcessError as e:
        log = (root / "log").read_text() if (root / "log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {e.stderr}\n{log}") from e
    try:
        env = {**os.environ, "PGPASSWORD": password}
        subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port),
                        "-U", "grouppref", "argilla"], check=True, capture_output=True, env=env)
        yield f"postgresql://grouppref:{password}@127.0.0.1:{port}/argilla"
    finally:
        subprocess.run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       capture_output=True, preexec_fn=_as_user(user), cwd=root)
        shutil.rmtree(root, ignore_errors=True)
