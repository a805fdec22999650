"""``label push --select`` against the session's real embedded Argilla (``argilla_server``):
exactly the selected groups become records, a selection that leaves out a group size makes no
dataset for it and pull / status still work, the label stage of ``grouppref run`` waits for the
selected groups only, and the selection is recorded (selection.json, push.json, the push
stage's stats) and shown in the HTML report.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from grouppref.labeling.client import connect, resolve_credentials
from grouppref.labeling.config import LabelRunConfig, PullConfig, PushConfig
from grouppref.labeling.pull import label_status, pull_run
from grouppref.labeling.select import select_groups
from grouppref.labeling.stage import WaitingForLabels, run_label
from grouppref.pipeline.report.config import ReportConfig
from grouppref.pipeline.report.stage import render_report
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas.label_reports import LabelSelection
from tests.support.labelling import annotator_http, annotator_records, respond, write_stage
from tests.support.paths import REPO
from tests.support.selection import run_groups

ROOT = REPO


def records_in(client: Any, workspace: str, name: str) -> set[str] | None:
    """External ids of the records of dataset ``name`` (``None``: no such dataset)."""
    ds = client.find_dataset(name, client.workspace_id(workspace))
    if ds is None:
        return None
    return {r["external_id"] for r in client.iter_records(ds["id"], include=())}


@pytest.mark.argilla
def test_cli_push_sends_exactly_the_uncertain_groups_and_pull_follows(
        argilla_server: Any, tmp_path: Path) -> None:
    groups = run_groups()
    store = write_stage(tmp_path / "run", groups)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    pushed = subprocess.run(
        [sys.executable, "-m", "grouppref", "label", "push", str(store.root), "--state-dir",
         str(argilla_server.state_dir), "--dataset", "sel-cli", "--select", "uncertain",
         "--budget", "3", "--uncertainty", "kendall_w", "--audit-share", "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert pushed.returncode == 0, pushed.stderr
    assert "selected 3 of 12 groups: the most uncertain by kendall_w" in pushed.stdout
    assert "note: no audit groups in a budget of 3 (--audit-share 0)" in pushed.stderr
    want = [groups[i].group_id for i in (8, 7, 6)]
    creds = resolve_credentials(state_dir=argilla_server.state_dir)
    with connect(creds) as client:
        assert records_in(client, creds.workspace, "sel-cli-k4") == set(want)
        assert records_in(client, creds.workspace, "sel-cli-k3") is None  # no K=3 group chosen
        status = label_status(store, PullConfig(dataset="sel-cli", workspace=creds.workspace),
                              client)
        assert (status.records, status.pending) == (3, 3)
    selection = LabelSelection.model_validate_json(
        (store.root / "label" / "selection.json").read_text(encoding="utf-8"))
    assert selection.ids == want and selection.budget == 3 and selection.seed == 0
    assert selection.uncertainty == "kendall_w" and selection.groups == 12
    assert selection.dataset == "sel-cli"
    log = json.loads((store.root / "label" / "push.json").read_text(encoding="utf-8"))
    assert LabelSelection.model_validate(log["selection"]) == selection
    assert log["groups"] == 3

    name, _, key = argilla_server.create_user("sel-ann")
    with annotator_http(argilla_server.url, key) as http:
        ds = next(d for d in http.get("/api/v1/me/datasets").json()["items"]
                  if d["name"] == "sel-cli-k4")
        for record in annotator_records(http, ds["id"]).values():
            respond(http, record["id"], [["response_2"], ["response_1"], ["response_3"],
                                         ["response_4"]])
    with connect(creds) as client:
        pulled = pull_run(store, PullConfig(dataset="sel-cli", workspace=creds.workspace),
                          client, progress=False)
    out = list(pulled.stage.records())
    assert len(out) == 12  # every group stays, with its automatic rankings
    humans = {g.group_id for g in out for r in g.rankings if r.annotator.kind == "human"}
    assert humans == set(want)
    assert all(r.annotator.id == name for g in out for r in g.rankings
               if r.annotator.kind == "human")


@pytest.mark.argilla
def test_run_label_waits_for_the_random_selection_and_the_report_shows_it(
        argilla_server: Any, tmp_path: Path) -> None:
    groups = run_groups()
    store = write_stage(tmp_path / "run", groups)
    push = PushConfig(dataset="sel-run", select="random", budget=4, seed=3)
    config = LabelRunConfig(push=push, state_dir=str(argilla_server.state_dir))
    with pytest.raises(WaitingForLabels, match=r"0/4 groups have 1 each, the run needs 4"):
        run_label(store, config)
    expected = select_groups(groups, push, "rank")
    creds = resolve_credentials(state_dir=argilla_server.state_dir)
    sizes = {g.group_id: g.k for g in groups}
    with connect(creds) as client:
        for k in (3, 4):
            sent = {gid for gid in expected.ids if sizes[gid] == k}
            assert records_in(client, creds.workspace, f"sel-run-k{k}") == (sent or None)
    stats = RunStore(store.root).manifest("label/push").stats
    recorded = LabelSelection.model_validate(stats["selection"])
    assert recorded == expected.model_copy(update={"dataset": "sel-run"})
    assert recorded.select == "random" and len(recorded.ids) == 4

    (store.root / "label" / "selection.json").unlink()  # e.g. overwritten by another push
    with pytest.raises(WaitingForLabels, match=r"0/4 groups"):
        run_label(store, config)  # the push is cached; the run's selection is written again
    again = LabelSelection.model_validate_json(
        (store.root / "label" / "selection.json").read_text(encoding="utf-8"))
    assert again == recorded

    html = render_report(RunStore(store.root), ReportConfig())
    assert "Human labeling: which groups people saw" in html
    assert "4 of the 12 groups of the rank stage (Argilla datasets sel-run-k*) went to people, " \
        "drawn at random (seed 3)" in html
    assert all(gid in html for gid in expected.ids)


@pytest.mark.argilla
def test_run_label_says_when_the_audit_groups_fall_short(argilla_server: Any,
                                                          tmp_path: Path) -> None:
    """The run's label stage prints the push's note: an uncertain budget of 3 at the default
    audit share (0.2) draws too few audit groups for the aggregate to judge annotators on."""
    store = write_stage(tmp_path / "run", run_groups())
    push = PushConfig(dataset="sel-note", select="uncertain", budget=3)
    config = LabelRunConfig(push=push, state_dir=str(argilla_server.state_dir))
    shown = io.StringIO()
    with pytest.raises(WaitingForLabels):
        run_label(store, config, StageContext(console=Console(file=shown, width=400)))
    text = shown.getvalue()
    assert "label: note: " in text and "in a budget of 3 (--audit-share 0.2)" in text
    assert "a budget of 25 or more at --audit-share 0.2 gives 5" in text
