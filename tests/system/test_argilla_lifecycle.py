"""``label serve --detach`` / ``users add`` / ``stop``, a restart that keeps every state, and
a foreground server that Ctrl-C stops completely. Two real server starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import argilla as rg
import httpx
import pytest
import typer
from typer.testing import CliRunner

from grouppref.commands import label_server
from grouppref.errors import ConfigError
from grouppref.labeling.server.credentials import load_credentials
from grouppref.labeling.server.embedded import EmbeddedArgilla
from grouppref.labeling.server.processes import pid_alive

pytestmark = [pytest.mark.argilla, pytest.mark.slow]

CLI = ("import typer; from grouppref.commands import label_server; app = typer.Typer(); "
       "label_server.register(app); app()")


def _app() -> typer.Typer:
    app = typer.Typer()
    label_server.register(app)
    return app


def _alive(run: dict) -> list[int]:
    return [pid for pid in run["pids"].values() if pid_alive(pid, "")]


def _first_life(state: Path, runner: CliRunner) -> dict:
    """Start detached, add an annotator, label one record, log in; return what to check."""
    result = runner.invoke(_app(), ["label", "serve", "--detach", "--port", "0",
                                    "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    run = json.loads((state / "run.json").read_text())
    creds = load_credentials(state / "credentials.json")
    assert creds.owner.password not in result.output and creds.owner.api_key not in result.output
    with pytest.raises(ConfigError, match="already runs"):
        EmbeddedArgilla(state_dir=state, port=0).start()

    added = runner.invoke(_app(), ["label", "users", "add", "ann", "--state-dir", str(state)])
    assert added.exit_code == 0, added.output
    ann = load_credentials(state / "credentials.json").users["ann"]
    assert ann.role == "annotator" and ann.password not in added.output
    shown = runner.invoke(_app(), ["label", "users", "add", "ann2", "--show-secrets",
                                   "--state-dir", str(state)])
    assert load_credentials(state / "credentials.json").users["ann2"].password in shown.output

    url = run["url"]
    client = rg.Argilla(api_url=url, api_key=creds.owner.api_key)
    settings = rg.Settings(fields=[rg.TextField(name="prompt")],
                           questions=[rg.LabelQuestion(name="label", labels=["a", "b"])])
    ds = rg.Dataset(name=f"keep-{uuid.uuid4().hex[:6]}", workspace=creds.workspace,
                    settings=settings, client=client).create()
    ds.records.log([{"prompt": "kept?"}])
    ann_http = httpx.Client(base_url=url, headers={"X-Argilla-Api-Key": ann.api_key})
    record = ann_http.post(f"/api/v1/me/datasets/{ds.id}/records/search", json={}).json()
    record_id = record["items"][0]["record"]["id"]
    ann_http.post(f"/api/v1/records/{record_id}/responses",
                  json={"values": {"label": {"value": "b"}}, "status": "submitted"}
                  ).raise_for_status()
    token = httpx.post(f"{url}/api/v1/token", data={"username": "ann", "password": ann.password})
    stopped = runner.invoke(_app(), ["label", "stop", "--state-dir", str(state)])
    assert stopped.exit_code == 0 and "stopped" in stopped.output
    assert not (state / "run.json").exists()
    deadline = time.monotonic() + 30
    while _alive(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(run) == []
    return {"dataset": str(ds.id), "record": record_id, "token": token.json()["access_token"],
            "ann_key": ann.api_key}


def test_detach_stop_restart_and_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "state"
    before = _first_life(state, CliRunner())

    proc = subprocess.Popen([sys.executable, "-c", CLI, "label", "serve", "--port", "0",
                             "--state-dir", str(state)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (state / "run.json").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        run = json.loads((state / "run.json").read_text())
        url = run["url"]
        # the login token from before the restart still works (persisted signing key)
        me = httpx.get(f"{url}/api/v1/me", headers={"Authorization": f"Bearer {before['token']}"})
        assert me.status_code == 200 and me.json()["username"] == "ann"
        ann = httpx.Client(base_url=url, headers={"X-Argilla-Api-Key": before["ann_key"]})
        mine = ann.get(f"/api/v1/me/datasets/{before['dataset']}/metrics").json()["responses"]
        assert mine["submitted"] == 1 and mine["total"] == 1
        records = ann.post(f"/api/v1/me/datasets/{before['dataset']}/records/search",
                           params={"include": "responses"}, json={}).json()["items"]
        assert records[0]["record"]["responses"][0]["values"]["label"]["value"] == "b"
        assert all(pid_alive(pid, "") for pid in run["pids"].values())
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped" in out
    deadline = time.monotonic() + 30
    while _alive(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(run) == []
    assert not (state / "run.json").exists()
