"""``label serve`` given bad input, and after its server was killed (issue 15).

Each bad input is one line and exit code 2 (the real CLI in a subprocess); a bad PostgreSQL
URL is never remembered; a state directory whose server process was killed is cleaned up
(its worker and redis stopped) and started again. Real child processes, a real PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from grouppref.errors import ConfigError
from grouppref.labeling.server.credentials import load_credentials
from grouppref.labeling.server.embedded import EmbeddedArgilla
from grouppref.labeling.server.processes import pid_alive
from grouppref.labeling.server.venv import VENV_ENV, default_venv_dir
from tests.support.cli import grouppref, one_line_exit_2

pytestmark = pytest.mark.argilla


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A clean environment; argilla-server's venv is the one this session already built."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path),
            VENV_ENV: str(default_venv_dir())}


def test_port_out_of_range_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    line = one_line_exit_2(grouppref("label", "serve", "--port", "70000", "--state-dir",
                                     str(tmp_path / "s"), env=env))
    assert "--port" in line and "65535" in line
    with pytest.raises(ConfigError, match="port: Input should be less than or equal to 65535"):
        EmbeddedArgilla(state_dir=tmp_path / "s", port=70000)
    assert not (tmp_path / "s").exists()


def test_state_dir_that_is_a_file_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    file = tmp_path / "state.txt"
    file.write_text("not a directory\n")
    line = one_line_exit_2(grouppref("label", "serve", "--port", "0", "--state-dir", str(file),
                                     env=env))
    assert f"--state-dir {file} is a file; give a directory" in line
    assert file.read_text() == "not a directory\n"
    inside = one_line_exit_2(grouppref("label", "serve", "--port", "0", "--state-dir",
                                       str(file / "sub"), env=env))
    assert "cannot create or use it" in inside


def test_bad_postgresql_url_is_one_line_and_never_remembered(
        env: dict[str, str], tmp_path: Path, argilla_postgres_url: str) -> None:
    parts = urlsplit(argilla_postgres_url)
    wrong = urlunsplit(parts._replace(netloc=parts.netloc.replace(
        f":{parts.password}@", ":wrong-password-42@")))
    state = tmp_path / "state"
    line = one_line_exit_2(grouppref("label", "serve", "--port", "0", "--state-dir", str(state),
                                     "--database-url", wrong, env=env),
                           progress="starting Argilla")
    assert "embedded Argilla: the server failed:" in line
    assert "password authentication failed" in line and "(full log:" in line
    assert "wrong-password-42" not in line and parts.password not in line
    assert load_credentials(state / "credentials.json").database_url is None
    assert not (state / "run.json").exists()
    scheme = one_line_exit_2(grouppref("label", "serve", "--port", "0", "--state-dir",
                                       str(state), "--database-url", "mysql://u:p@h/db", env=env))
    assert "only postgresql://" in scheme and "u:p" not in scheme


def _children(state: Path) -> dict[str, int]:
    return json.loads((state / "run.json").read_text())["pids"]


@pytest.mark.slow
def test_serve_after_the_server_was_killed_cleans_up_and_starts(env: dict[str, str],
                                                                tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = grouppref("label", "serve", "--detach", "--port", "0", "--state-dir", str(state),
                      env=env)
    assert first.returncode == 0, first.stderr
    old = _children(state)
    try:
        os.kill(old["server"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while pid_alive(old["server"], "") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_alive(old["worker"], "") and pid_alive(old["redis"], "")  # left behind

        gone = one_line_exit_2(grouppref("label", "users", "add", "ann", "--state-dir",
                                         str(state), env=env))
        assert "its server process died" in gone

        again = grouppref("label", "serve", "--detach", "--port", "0", "--state-dir",
                          str(state), env=env)
        assert again.returncode == 0, again.stderr
        assert "already runs" not in again.stderr
        assert "had died; stopped what was left of it (redis, worker)" in again.stderr, \
            again.stderr
        assert not pid_alive(old["worker"], "") and not pid_alive(old["redis"], "")
        new = _children(state)
        url = json.loads((state / "run.json").read_text())["url"]
        owner = load_credentials(state / "credentials.json").owner.api_key
        me = httpx.get(f"{url}/api/v1/me", headers={"X-Argilla-Api-Key": owner})
        assert me.status_code == 200 and me.json()["username"] == "owner"
        assert grouppref("label", "users", "add", "ann", "--state-dir", str(state),
                         env=env).returncode == 0
    finally:
        stopped = grouppref("label", "stop", "--state-dir", str(state), env=env)
    assert stopped.returncode == 0
    deadline = time.monotonic() + 30
    while any(pid_alive(p, "") for p in new.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(pid_alive(p, "") for p in new.values())
