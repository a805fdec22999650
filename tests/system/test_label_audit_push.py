"""``label push --select uncertain --audit-share F`` against the session's real embedded Argilla,
end to end through the run store: the records say why each group was sent (metadata
``selection``), pull copies it onto the human rankings, and the aggregate stage judges that
annotator on its audit groups only. No mock anywhere: real server, real run folders.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from grouppref.labeling.client import connect, resolve_credentials
from grouppref.labeling.config import PullConfig
from grouppref.labeling.pull import pull_run
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.stage import read_report, run_aggregate
from grouppref.pipeline.report.config import ReportConfig
from grouppref.pipeline.report.stage import render_report
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup
from grouppref.schemas.label_reports import LabelSelection
from tests.support.labelling import annotator_http, annotator_records, respond, write_stage
from tests.support.paths import REPO
from tests.support.selection import run_groups, selection_rows

ROOT = REPO


@pytest.mark.argilla
def test_audit_groups_are_marked_pulled_and_used_by_the_aggregate(
        argilla_server: Any, tmp_path: Path) -> None:
    groups = run_groups()  # 12 groups; K=4 groups 6, 7, 8 disagree
    store = write_stage(tmp_path / "run", groups)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    pushed = subprocess.run(
        [sys.executable, "-m", "grouppref", "label", "push", str(store.root), "--state-dir",
         str(argilla_server.state_dir), "--dataset", "audit-cli", "--select", "uncertain",
         "--budget", "6", "--audit-share", "0.5", "--uncertainty", "kendall_w", "--seed", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert pushed.returncode == 0, pushed.stderr
    assert "3 of them audit groups drawn at random (--audit-share 0.5, seed 1)" in pushed.stdout
    assert "no audit groups" not in pushed.stderr
    selection = LabelSelection.model_validate_json(
        (store.root / "label" / "selection.json").read_text(encoding="utf-8"))
    roles = {g.group_id: g.role for g in selection.selected}
    assert sorted(roles.values()) == ["audit"] * 3 + ["uncertain"] * 3
    assert selection.audit_share == 0.5
    log = json.loads((store.root / "label" / "push.json").read_text(encoding="utf-8"))
    assert LabelSelection.model_validate(log["selection"]) == selection

    creds = resolve_credentials(state_dir=argilla_server.state_dir)
    with connect(creds) as client:  # the records carry the role in their metadata
        ws = client.workspace_id(creds.workspace)
        seen = {}
        for k in (3, 4):
            ds = client.find_dataset(f"audit-cli-k{k}", ws)
            if ds is not None:
                seen.update({r["external_id"]: r["metadata"]["selection"]
                             for r in client.iter_records(ds["id"], include=())})
    assert seen == roles

    name, _, key = argilla_server.create_user("audit-ann")
    with annotator_http(argilla_server.url, key) as http:
        for ds in http.get("/api/v1/me/datasets").json()["items"]:
            if ds["name"].startswith("audit-cli-k"):
                for record in annotator_records(http, ds["id"]).values():
                    k = len([f for f in record["fields"] if f.startswith("response_")])
                    respond(http, record["id"], [[f"response_{i}"] for i in range(1, k + 1)])
    with connect(creds) as client:
        pull_run(store, PullConfig(dataset="audit-cli", workspace=creds.workspace), client,
                 progress=False)
    pulled = {g.group_id: r for g in RunStore(store.root).load_records("label", AnnotatedGroup)
              for r in g.rankings if r.annotator.kind == "human"}
    assert {gid: r.metadata["selection"] for gid, r in pulled.items()} == roles
    assert {r.annotator.id for r in pulled.values()} == {name}

    run_aggregate(store, AggregateConfig(min_groups_for_reliability=2))
    human = next(a for a in read_report(store).annotators if a.id == name)
    assert human.reliability_groups == "audit" and human.groups == 3
    assert human.votes == sum(6 if g.k == 4 else 3 for g in groups if g.group_id in roles)
    run_aggregate(store, AggregateConfig(min_groups_for_reliability=2, reliability_groups="all"))
    everything = next(a for a in read_report(store).annotators if a.id == name)
    assert everything.reliability_groups == "all" and everything.groups == 6

    shown = selection_rows(render_report(RunStore(store.root), ReportConfig()))
    assert {row["group"]: row["role"] for row in shown} == roles  # why each group was sent
    assert [row["role"] for row in shown] == ["uncertain"] * 3 + ["audit"] * 3

    plain = subprocess.run(  # the default share; too small a budget: the push says so
        [sys.executable, "-m", "grouppref", "label", "push", str(store.root), "--state-dir",
         str(argilla_server.state_dir), "--dataset", "audit-default", "--select", "uncertain",
         "--budget", "6", "--uncertainty", "kendall_w"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert plain.returncode == 0, plain.stderr
    assert "1 of them audit group drawn at random (--audit-share 0.2, seed 0)" in plain.stdout
    assert "note: only 1 audit group in a budget of 6 (--audit-share 0.2); the aggregate " \
           "needs 5 per person" in plain.stderr
    assert "a budget of 25 or more at --audit-share 0.2 gives 5" in plain.stderr
    default = LabelSelection.model_validate_json(
        (store.root / "label" / "selection.json").read_text(encoding="utf-8"))
    assert default.audit_share == 0.2
    assert sorted(g.role for g in default.selected) == ["audit"] + ["uncertain"] * 5
