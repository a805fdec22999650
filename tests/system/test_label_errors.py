"""Careless and hostile inputs to ``label push / pull / status / users add`` (issue 15): each
is one line on stderr and exit code 2, with the advice that fits, or an honest count.

The session's real embedded Argilla (``argilla_server``) and a tiny real HTTP server that is
not Argilla; every input is built here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from grouppref.config import validate
from grouppref.errors import ConfigError
from grouppref.labeling.client import connect, resolve_credentials
from grouppref.labeling.config import LabelRunConfig, PullConfig, PushConfig
from grouppref.labeling.pull import pull_run
from grouppref.labeling.push import push_run
from grouppref.labeling.server.accounts import create_user
from tests.support.cli import grouppref_here as grouppref  # cli.main() in this process
from tests.support.cli import one_line_exit_2
from tests.support.labelling import (
    annotator_http,
    annotator_records,
    make_groups,
    owner_credentials,
    respond,
    write_stage,
)


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path)}


# -- a web server that is not Argilla ---------------------------------------------------------
class _Website(BaseHTTPRequestHandler):
    """Any other web server: an HTML page for ``/``, an HTML 404 page for everything else
    (or, with ``catch_all``, the HTML page for every path, as single-page apps do)."""

    catch_all = False
    PAGE = b"<!DOCTYPE html>\n<html>\n<head><title>Shop</title></head>\n<body>\n<h1>Hi</h1>\n" \
           b"</body>\n</html>\n"

    def do_GET(self) -> None:  # noqa: N802
        found = self.path == "/" or type(self).catch_all
        body = self.PAGE if found else b"<html>\n<body>\n<h1>404 Not Found</h1>\n</body>\n</html>\n"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=[False, True], ids=["html-404", "html-catch-all"])
def website(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Site", (_Website,), {"catch_all": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_url_that_is_not_argilla_is_one_line(website: str, tmp_path: Path,
                                               base_env: dict[str, str]) -> None:
    store = write_stage(tmp_path / "run", make_groups(2))
    for command in ("push", "pull", "status"):
        result = grouppref("label", command, str(store.root), "--api-url", website,
                           env={**base_env, "ARGILLA_API_KEY": "k"})
        line = one_line_exit_2(result)
        assert f"{website} does not answer like an Argilla 2.x server" in line
        assert "<" not in line  # no HTML


# -- which server: --api-url and --state-dir --------------------------------------------------
def test_api_url_with_state_dir_is_an_error(tmp_path: Path, base_env: dict[str, str]) -> None:
    store = write_stage(tmp_path / "run", make_groups(2))
    result = grouppref("label", "push", str(store.root), "--api-url", "http://127.0.0.1:9",
                       "--state-dir", str(tmp_path / "state"), env=base_env)
    assert "both name a server" in one_line_exit_2(result)
    with pytest.raises(ConfigError, match="both name a server"):
        resolve_credentials(api_url="http://127.0.0.1:9", state_dir=tmp_path)
    with pytest.raises(ConfigError, match="api_url and state_dir both name a server"):
        validate(LabelRunConfig, {"api_url": "http://127.0.0.1:9", "state_dir": "x"}, "run")


@pytest.mark.argilla
def test_state_dir_overrides_the_environment(argilla_server: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARGILLA_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ARGILLA_API_KEY", "some-other-key")
    creds = resolve_credentials(state_dir=argilla_server.state_dir)
    assert creds.api_url == argilla_server.url
    assert creds.api_key.get_secret_value() == argilla_server.api_key


# -- keys and names ---------------------------------------------------------------------------
@pytest.mark.argilla
def test_an_annotator_key_is_named_as_such(argilla_server: Any, tmp_path: Path,
                                           base_env: dict[str, str]) -> None:
    store = write_stage(tmp_path / "run", make_groups(2, tag="annkey"))
    name, _, key = argilla_server.create_user("annkey-ann")
    env = {**base_env, "ARGILLA_API_URL": argilla_server.url, "ARGILLA_API_KEY": key}
    for command, action in (("push", "push"), ("pull", "reading the rankings"),
                            ("status", "reading the rankings")):
        line = one_line_exit_2(grouppref("label", command, str(store.root), env=env))
        assert line.endswith(f"this key belongs to an annotator ({name!r}); {action} needs an "
                             "owner or admin key"), line
        assert key not in line
    assert not (store.root / "label").exists()  # nothing written


@pytest.mark.argilla
@pytest.mark.parametrize("bad", ["with space", "a/b", "-dash", "_under", "émile", ""])
def test_users_add_refuses_names_outside_argillas_rule(argilla_server: Any, bad: str,
                                                       base_env: dict[str, str]) -> None:
    result = grouppref("label", "users", "add", "--state-dir", str(argilla_server.state_dir),
                       "--", bad, env=base_env)
    line = one_line_exit_2(result)
    assert f"username {bad!r}: use only letters, digits, '-' and '_'" in line
    assert "Argilla's username rule" in line


@pytest.mark.argilla
def test_users_add_password_and_taken_name_get_the_right_advice(argilla_server: Any,
                                                                base_env: dict[str, str]
                                                                ) -> None:
    state = ["--state-dir", str(argilla_server.state_dir)]
    short = grouppref("label", "users", "add", "pw-ann", "--password-stdin", *state,
                      env=base_env, stdin="short\n")
    line = one_line_exit_2(short)
    assert "the password has 5 characters; Argilla requires 8 to 100" in line
    assert "pick another name" not in line
    ok = grouppref("label", "users", "add", "pw-ann", "--password-stdin", *state, env=base_env,
                   stdin="long enough password\n")
    assert ok.returncode == 0, ok.stderr
    taken = one_line_exit_2(grouppref("label", "users", "add", "pw-ann", *state, env=base_env))
    assert "already has a user 'pw-ann'; pick another name" in taken

    # the server's own 422 (as an Argilla with other limits would send) keeps its reason
    with httpx.Client(base_url=argilla_server.url,
                      headers={"X-Argilla-Api-Key": argilla_server.api_key}) as http:
        refused = http.post("/api/v1/users", json={"first_name": "x", "username": "pw-422",
                                                   "password": "1234567"})
    assert refused.status_code == 422
    from grouppref.labeling.server.accounts import _refusal

    message = str(_refusal("pw-422", argilla_server.url, refused))
    assert "refused the account 'pw-422': password: String should have at least 8" in message
    with pytest.raises(ConfigError, match="Argilla requires 8 to 100"):
        create_user(argilla_server.url, argilla_server.credentials_path, "pw-x", password="x" * 101)


@pytest.mark.argilla
def test_pull_rejects_a_username_that_cannot_be_an_annotator_and_counts_what_it_kept(
        argilla_server: Any, tmp_path: Path, base_env: dict[str, str]) -> None:
    groups = make_groups(2, tag="badname", sizes=(3,))
    store = write_stage(tmp_path / "run", groups)
    config = PushConfig(dataset="badname", workspace=argilla_server.workspace)
    with connect(owner_credentials(argilla_server)) as client:
        report = push_run(store, config, client, progress=False)
        # an account made in Argilla directly (2.8 itself accepts any non-empty name)
        ws = client.workspace_id(argilla_server.workspace)
        bad = client.request("POST", "/api/v1/users", json_body={
            "first_name": "x", "username": "bad name/x", "role": "annotator",
            "password": "long enough password"})
        client.request("POST", f"/api/v1/workspaces/{ws}/users", json_body={"user_id": bad["id"]})
    _, _, good_key = argilla_server.create_user("badname-good")
    dataset_id = report.by_k(3).dataset_id
    for key in (bad["api_key"], good_key):
        with annotator_http(argilla_server.url, key) as http:
            for record in annotator_records(http, dataset_id).values():
                respond(http, record["id"], [["response_2"], ["response_1", "response_3"]])

    with connect(owner_credentials(argilla_server)) as client:
        pulled = pull_run(store, PullConfig(dataset="badname",
                                            workspace=argilla_server.workspace), client,
                          progress=False)
    assert (pulled.new, pulled.stats["submitted"], pulled.stats["rejected_responses"]) == (2, 4, 2)
    assert pulled.stats["human_rankings_by_annotator"] == {"badname-good": 2}
    rejects = pulled.stage.rejects()
    assert len(rejects) == 2
    assert all("response by 'bad name/x': the username cannot be an annotator id" in
               r.reason and "\n" not in r.reason for r in rejects)

    env = {**base_env, "ARGILLA_API_URL": argilla_server.url,
           "ARGILLA_API_KEY": argilla_server.api_key}
    again = grouppref("label", "pull", str(store.root), "--dataset", "badname", "--force",
                      env=env)
    assert again.returncode == 0, again.stderr
    assert "this pull kept 0 new, 0 changed, rejected 2" in again.stdout
