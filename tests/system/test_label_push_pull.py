"""``label push / pull / status``: the pure mapping, the client's retries, and round trips
through the session's real embedded Argilla (``argilla_server``), with annotators answering
over REST as the UI does.

Groups of different sizes go to one dataset each (``<name>-k<k>``), so annotators never rank an
empty slot. Expected rankings are built here from the orders the annotators were told to
submit; nothing is computed with grouppref's own mapping code.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from grouppref.errors import ConfigError, GroupPrefError
from grouppref.labeling.client import (
    ArgillaClient,
    ArgillaConnectionError,
    ArgillaCredentials,
    ClientSettings,
    connect,
    resolve_credentials,
)
from grouppref.labeling.config import PullConfig, PushConfig, TargetConfig
from grouppref.labeling.dataset import (
    DatasetSpec,
    dataset_payload,
    expected_summary,
    fields_payload,
    pick_suggestion,
    questions_payload,
    ranking_from_response,
    record_payload,
    scaled_scores,
    schema_diff,
    suggestion_agent,
)
from grouppref.labeling.pull import label_status, pull_run
from grouppref.labeling.push import SchemaMismatchError, push_run
from grouppref.labeling.server.processes import free_port
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from tests.support.factories import make_group
from tests.support.labelling import (
    annotator_http,
    annotator_records,
    as_chat,
    make_groups,
    owner_credentials,
    respond,
    write_stage,
)
from tests.support.paths import REPO

ROOT = REPO


def dataset_ids(report: Any) -> dict[int, str]:
    """``k -> dataset id`` of a push report."""
    return {d.k: d.dataset_id for d in report.datasets}


def grouppref_label(*args: str, env: dict[str, str] | None = None
                    ) -> subprocess.CompletedProcess[str]:
    """``grouppref label ...`` in a subprocess through the real ``cli.main`` error handling."""
    code = ("import sys, typer\n"
            "from grouppref import cli\n"
            "from grouppref.commands import label_data\n"
            "app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)\n"
            "label = typer.Typer(name='label')\n"
            "label_data.register(label)\n"
            "app.add_typer(label)\n"
            "cli.app = app\n"
            "sys.argv = ['grouppref', 'label', *sys.argv[1:]]\n"
            "cli.main()\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=env)


# -- the mapping (no server) -----------------------------------------------------------------
def test_settings_have_k_required_responses_and_a_ranking_over_them() -> None:
    spec = DatasetSpec(k=4, min_submitted=3)
    fields = fields_payload(spec)
    assert [f["name"] for f in fields] == ["prompt", "response_1", "response_2", "response_3",
                                           "response_4"]
    assert all(f["required"] for f in fields)  # a record of this dataset has all k responses
    assert [f["settings"]["type"] for f in fields] == ["text"] * 5
    ranking, rationale = questions_payload(spec)
    assert ranking["settings"]["type"] == "ranking" and ranking["required"] is True
    assert [o["value"] for o in ranking["settings"]["options"]] == [f["name"] for f in fields[1:]]
    assert rationale["name"] == "rationale" and rationale["required"] is False
    assert len(questions_payload(DatasetSpec(k=4, rationale=False))) == 1
    chat = fields_payload(DatasetSpec(k=2, chat=True))
    assert chat[0]["settings"] == {"type": "chat", "use_markdown": False}
    assert dataset_payload("d", "w", spec)["metadata"]["k"] == 4


def test_schema_diff_names_every_difference() -> None:
    have = expected_summary(DatasetSpec(k=4, min_submitted=1))
    assert schema_diff(have, have) == []
    diff = schema_diff(expected_summary(DatasetSpec(k=5, min_submitted=2)), have)
    assert any(line.startswith("min_submitted: Argilla has 1, the run needs 2") for line in diff)
    assert any("field 'response_5': missing in Argilla" in line for line in diff)
    assert "question 'ranking': Argilla has (ranking of [response_1, response_2, response_3, " \
        "response_4], required), the run needs (ranking of [response_1, response_2, " \
        "response_3, response_4, response_5], required)" in diff
    no_rationale = expected_summary(DatasetSpec(k=4, rationale=False))
    assert schema_diff(no_rationale, have) == [
        "question 'rationale': in Argilla (text, optional) but not in the run"]
    chat = expected_summary(DatasetSpec(k=4, chat=True))
    assert schema_diff(chat, have) == [
        "field 'prompt': Argilla has (text, required), the run needs (chat, required)"]


def test_record_payload_maps_slots_and_suggests_with_ties_and_scaled_scores() -> None:
    g = make_group(3, texts=["a", "b", "c"])
    a, b, c = g.candidate_ids()
    rm = Ranking(annotator=Annotator(id="rm/x@z", kind="reward_model", version="2"),
                 group_id=g.group_id, tiers=[[c], [a, b]], scores={a: -1.0, b: -1.0, c: 2.0})
    group = AnnotatedGroup(**g.model_dump(), rankings=[rm])
    item = record_payload(group, {"ranking": "q-1"})
    assert item["external_id"] == g.group_id
    assert item["fields"] == {"prompt": "Name a colour.", "response_1": "a", "response_2": "b",
                              "response_3": "c"}
    assert item["metadata"]["candidate_ids"] == {"response_1": a, "response_2": b,
                                                 "response_3": c}
    assert item["metadata"]["k"] == 3 and item["metadata"]["models"] == ["tiny"]
    (s,) = item["suggestions"]
    # c best (rank 1), a and b tied (rank 2); nothing else: the record has three options
    assert s["value"] == [{"value": "response_3", "rank": 1}, {"value": "response_1", "rank": 2},
                          {"value": "response_2", "rank": 2}]
    # (x - min) / (max - min) with min = -1, max = 2: c -> 1, a, b -> 0
    assert s["score"] == [1.0, 0.0, 0.0]
    assert s["agent"] == "rm/x_z:2" and s["question_id"] == "q-1"
    assert "suggestions" not in record_payload(group, {"ranking": "q"}, suggest_from="none")
    # a plain prompt in a chat dataset is one user turn
    assert record_payload(group, {"ranking": "q"}, chat=True)["fields"]["prompt"] == [
        {"role": "user", "content": "Name a colour."}]


def test_chat_prompt_becomes_chat_turns() -> None:
    group = as_chat(AnnotatedGroup(**make_group(2).model_dump()),
                    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"),
                     ("user", "Name a colour.")])
    item = record_payload(group, {"ranking": "q"}, chat=True)
    assert item["fields"]["prompt"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}]


def test_suggestion_is_the_ensemble_else_the_first_automatic_else_the_chosen_one() -> None:
    from grouppref.pipeline.rank.config import EnsembleSettings
    from grouppref.pipeline.rank.core import ensemble_annotator
    from grouppref.pipeline.rank.settings import LengthCheck, RuleRankerSettings

    g = make_group(3)
    a, b, c = g.candidate_ids()
    rules = [RuleRankerSettings(name="short", checks=[LengthCheck(target=3)]),
             RuleRankerSettings(name="long", checks=[LengthCheck(target=30)])]
    ens = ensemble_annotator(EnsembleSettings(weights={"short": 1, "long": 2}, name="combo"),
                             rules)  # the rank stage's own ensemble annotator
    human = Ranking(annotator=Annotator(id="ann", kind="human"), group_id=g.group_id,
                    tiers=[[a], [b], [c]])
    short = Ranking(annotator=Annotator(id="short", kind="rule"), group_id=g.group_id,
                    tiers=[[b], [a], [c]])
    ensemble = Ranking(annotator=ens, group_id=g.group_id, tiers=[[c], [a, b]])
    group = AnnotatedGroup(**g.model_dump(), rankings=[human, short, ensemble])
    assert pick_suggestion(group, None) is ensemble
    item = record_payload(group, {"ranking": "q"})
    assert item["suggestions"][0]["value"] == [  # the ensemble's tie kept as a shared rank
        {"value": "response_3", "rank": 1}, {"value": "response_1", "rank": 2},
        {"value": "response_2", "rank": 2}]
    without = group.model_copy(update={"rankings": [human, short]})
    assert pick_suggestion(without, None) is short  # the first automatic one, never a human
    assert pick_suggestion(group, "short") is short  # chosen by --suggest-from
    assert pick_suggestion(group, "missing") is None


def test_scaled_scores_of_equal_or_missing_scores() -> None:
    g = make_group(2)
    a, b = g.candidate_ids()
    same = Ranking(annotator=Annotator(id="r", kind="rule"), group_id=g.group_id,
                   tiers=[[a, b]], scores={a: 3.0, b: 3.0})
    assert scaled_scores(same, [a, b]) == [0.5, 0.5]
    partial = same.model_copy(update={"scores": {a: 1.0}})
    assert scaled_scores(partial, [a, b]) is None
    assert suggestion_agent(same) == "r"


def test_ranking_from_response_maps_slots_and_keeps_ties() -> None:
    g = AnnotatedGroup(**make_group(3, texts=["a", "b", "c"]).model_dump())
    a, b, c = g.candidate_ids()
    mapping = {"response_1": a, "response_2": b, "response_3": c}
    when = datetime(2026, 1, 2, 3, 4, 5)
    value = [{"value": "response_2", "rank": 1}, {"value": "response_1", "rank": 2},
             {"value": "response_3", "rank": 2}]
    r = ranking_from_response(value, mapping, g, "ann", when)
    assert r.tiers == [[b], [a, c]]
    assert r.annotator == Annotator(id="ann", kind="human", name="argilla")
    assert r.created_at == when.replace(tzinfo=timezone.utc)
    no_ranks = [{"value": "response_3"}, {"value": "response_1"}, {"value": "response_2"}]
    assert ranking_from_response(no_ranks, mapping, g, "ann", when).tiers == [[c], [a], [b]]
    with pytest.raises(ValueError, match="leaves out"):
        ranking_from_response(value[:2], mapping, g, "ann", when)
    with pytest.raises(ValueError, match="'response_4', which this record does not have"):
        ranking_from_response(value + [{"value": "response_4", "rank": 3}], mapping, g, "ann",
                              when)
    with pytest.raises(ValueError, match="other candidates"):
        ranking_from_response(value, {**mapping, "response_3": "c-other"}, g, "ann", when)


# -- the client (a tiny real HTTP server, no mocks) -------------------------------------------
class _Flaky(BaseHTTPRequestHandler):
    """Answers 503 to the first ``fail`` requests, then 200 ``{"username": "u"}``."""

    fail = 2
    seen = 0

    def _answer(self) -> None:
        type(self).seen += 1
        code = 503 if type(self).seen <= type(self).fail else 200
        body = b'{"username": "u", "role": "owner"}' if code == 200 else b'{"detail": "busy"}'
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky_url() -> Iterator[str]:
    _Flaky.seen = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _creds(url: str, key: str = "k") -> ArgillaCredentials:
    return ArgillaCredentials(api_url=url, api_key=SecretStr(key), source="test")


def test_client_retries_idempotent_requests_after_503(flaky_url: str) -> None:
    with connect(_creds(flaky_url), ClientSettings(retries=3, backoff=0.01)) as client:
        assert client.me["username"] == "u"
        assert client.retried == 2 and _Flaky.seen == 3


def test_client_never_resends_a_create_after_503(flaky_url: str) -> None:
    client = ArgillaClient(_creds(flaky_url), ClientSettings(retries=3, backoff=0.01))
    with client, pytest.raises(ArgillaConnectionError, match="answered 503 to POST /x: busy"):
        client.request("POST", "/x", json_body={})
    assert _Flaky.seen == 1


def test_unreachable_server_is_one_line_after_the_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ArgillaConnectionError) as info:
        connect(_creds(url, key="s3cret-key"), ClientSettings(retries=2, backoff=0.01))
    message = str(info.value)
    assert f"cannot reach Argilla at {url}" in message and "after 3 attempt(s)" in message
    assert "\n" not in message and "s3cret-key" not in message


def test_credentials_from_environment_or_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # no embedded server there
    monkeypatch.setenv("ARGILLA_API_URL", "http://example.test:6900/")
    monkeypatch.setenv("ARGILLA_API_KEY", "key-1")
    creds = resolve_credentials()
    assert (creds.api_url, creds.api_key.get_secret_value(), creds.source) == (
        "http://example.test:6900", "key-1", "environment")
    assert "key-1" not in repr(creds)
    monkeypatch.delenv("ARGILLA_API_KEY")
    with pytest.raises(ConfigError, match="set ARGILLA_API_KEY .* start the embedded one"):
        resolve_credentials()
    monkeypatch.delenv("ARGILLA_API_URL")
    with pytest.raises(ConfigError, match="set ARGILLA_API_URL and ARGILLA_API_KEY"):
        resolve_credentials()


def test_cli_unreachable_server_one_line_exit_2(tmp_path: Path) -> None:
    store = write_stage(tmp_path / "run", make_groups(2))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path),
           "ARGILLA_API_URL": f"http://127.0.0.1:{free_port()}", "ARGILLA_API_KEY": "nope"}
    out = grouppref_label("push", str(store.root), "--retries", "0", env=env)
    assert out.returncode == 2, out.stderr
    assert "cannot reach Argilla" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# -- against the real server -----------------------------------------------------------------
def _expected_and_answers(groups: list[AnnotatedGroup], user: str
                          ) -> dict[str, tuple[list[list[str]], list[list[str]]]]:
    """Per group: (slot tiers to submit, expected candidate-id tiers).

    A seeded random order of the group's k slots and, in every third group, two slots tied.
    """
    out = {}
    for n, g in enumerate(groups):
        rng = random.Random(f"{user}/{g.group_id}")
        order = [f"response_{i + 1}" for i in range(g.k)]
        rng.shuffle(order)
        tiers = [[s] for s in order]
        if n % 3 == 0:
            tiers[0:2] = [tiers[0] + tiers[1]]
        ids = {f"response_{i + 1}": c.candidate_id for i, c in enumerate(g.candidates)}
        out[g.group_id] = (tiers, [[ids[s] for s in t] for t in tiers])
    return out


def records_by_group(http: httpx.Client, report: Any) -> dict[str, dict[str, Any]]:
    """``group_id -> record`` over every dataset of a push, as one annotator sees them."""
    return {gid: rec for ds in report.datasets
            for gid, rec in annotator_records(http, ds.dataset_id).items()}


@pytest.mark.argilla
def test_round_trip_20_groups_3_annotators(argilla_server: Any, tmp_path: Path) -> None:
    groups = make_groups(20, tag="rt")
    groups[1] = as_chat(groups[1], [("system", "Answer in one word."), ("user", "Colour?")])
    store = write_stage(tmp_path / "run", groups)
    creds = resolve_credentials(state_dir=argilla_server.state_dir)  # the embedded path
    config = PushConfig(dataset="rt", workspace=creds.workspace, min_submitted=3, batch_size=4)
    with connect(creds, ClientSettings(backoff=0.1)) as client:
        report = push_run(store, config, client, progress=False)
        assert [(d.name, d.k, d.groups, d.created) for d in report.datasets] == [
            ("rt-k2", 2, 5, 5), ("rt-k3", 3, 5, 5), ("rt-k4", 4, 5, 5), ("rt-k5", 5, 5, 5)]
        assert (report.created, report.updated, report.refused) == (20, 0, [])
        for d in report.datasets:  # each dataset ranks exactly k options, chat prompts in all
            questions = client.request("GET", f"/api/v1/datasets/{d.dataset_id}/questions")
            options = questions["items"][0]["settings"]["options"]
            assert [o["value"] for o in options] == [f"response_{i}" for i in range(1, d.k + 1)]
            fields = client.request("GET", f"/api/v1/datasets/{d.dataset_id}/fields")["items"]
            assert fields[0]["settings"]["type"] == "chat"
        users = [argilla_server.create_user(f"rt-ann{i}") for i in (1, 2, 3, 4)]
        expected: dict[tuple[str, str], list[list[str]]] = {}
        for name, _password, key in users[:3]:
            plan = _expected_and_answers(groups, name)
            with annotator_http(argilla_server.url, key) as http:
                records = records_by_group(http, report)
                assert len(records) == 20
                for gid, (tiers, want) in plan.items():
                    respond(http, records[gid]["id"], tiers)
                    expected[(gid, name)] = want
        with annotator_http(argilla_server.url, users[0][2]) as http:
            chat = records_by_group(http, report)[groups[1].group_id]["fields"]["prompt"]
        assert chat == [{"role": "system", "content": "Answer in one word."},
                        {"role": "user", "content": "Colour?"}]
        name4, _, key4 = users[3]
        with annotator_http(argilla_server.url, key4) as http:
            records = records_by_group(http, report)
            respond(http, records[groups[0].group_id]["id"], [["response_1"]], status="draft")
            discarded = respond(http, records[groups[1].group_id]["id"], [], status="discarded")

        first = pull_run(store, PullConfig(dataset="rt", workspace=creds.workspace), client,
                         progress=False)
        out = {g.group_id: g for g in first.stage.records()}
        got = {(gid, r.annotator.id): r.tiers for gid, g in out.items() for r in g.rankings
               if r.annotator.kind == "human"}
        assert got == expected
        assert all(g.rankings[0].annotator.id == "rm-tiny" for g in out.values())
        assert (first.new, first.changed) == (60, 0)
        assert (first.stats["submitted"], first.stats["drafts"], first.stats["discarded"]) == (
            60, 1, 1)
        assert first.stats["datasets"] == ["rt-k2", "rt-k3", "rt-k4", "rt-k5"]
        assert first.stage.manifest.counts.inputs == first.stage.manifest.counts.outputs == 20

        status = label_status(store, TargetConfig(dataset="rt", workspace=creds.workspace),
                              client)
        assert (status.records, status.completed, status.pending) == (20, 20, 0)
        assert status.annotators == {
            **{f"rt-ann{i}": {"submitted": 20, "draft": 0, "discarded": 0} for i in (1, 2, 3)},
            "rt-ann4": {"submitted": 0, "draft": 1, "discarded": 1}}

        again = pull_run(store, PullConfig(dataset="rt", workspace=creds.workspace), client,
                         progress=False)
        assert again.stage.cached and (again.new, again.changed) == (0, 0)

        # rt-ann1 changes one answer, rt-ann4 submits its discarded one; then the owner deletes
        # one of rt-ann2's responses in Argilla: the stage keeps the ranking pulled earlier.
        g0, g1, g2 = groups[0], groups[1], groups[2]
        mine = [x for d in report.datasets for x in client.request(
            "GET", f"/api/v1/datasets/{d.dataset_id}/records",
            params={"include": ["responses"], "limit": 1000})["items"]]
        ann1_id, ann2_id = _user_id(client, "rt-ann1"), _user_id(client, "rt-ann2")
        with annotator_http(argilla_server.url, users[0][2]) as http:
            response = next(r for x in mine if x["external_id"] == g0.group_id
                            for r in x["responses"] if r["user_id"] == ann1_id)
            http.put(f"/api/v1/responses/{response['id']}", json={
                "values": {"ranking": {"value": [{"value": f"response_{5 - i}", "rank": i + 1}
                                                 for i in range(5)]}},
                "status": "submitted"}).raise_for_status()
        with annotator_http(argilla_server.url, key4) as http:
            http.put(f"/api/v1/responses/{discarded['id']}", json={
                "values": {"ranking": {"value": [{"value": f"response_{i}", "rank": i}
                                                 for i in range(1, g1.k + 1)]}},
                "status": "submitted"}).raise_for_status()
        gone = next(r for x in mine if x["external_id"] == g2.group_id for r in x["responses"]
                    if r["user_id"] == ann2_id)
        client.request("DELETE", f"/api/v1/responses/{gone['id']}")

        third = pull_run(store, PullConfig(dataset="rt", workspace=creds.workspace), client,
                         progress=False)
        assert (third.new, third.changed) == (1, 1)
        out = {g.group_id: {r.annotator.id: r.tiers for r in g.rankings}
               for g in third.stage.records()}
        assert out[g0.group_id]["rt-ann1"] == [[c] for c in reversed(g0.candidate_ids())]
        assert out[g1.group_id]["rt-ann4"] == [[c] for c in g1.candidate_ids()]
        assert out[g2.group_id]["rt-ann2"] == expected[(g2.group_id, "rt-ann2")]
        assert third.stats["human_rankings"] == 61


def _user_id(client: ArgillaClient, username: str) -> str:
    return next(u["id"] for u in client.request("GET", "/api/v1/users")["items"]
                if u["username"] == username)


@pytest.mark.argilla
def test_dataset_read_back_by_the_sdk(argilla_server: Any, tmp_path: Path) -> None:
    import argilla as rg

    groups = make_groups(4, tag="sdk", sizes=(3,))
    groups[0] = as_chat(groups[0], [("user", "Hi"), ("assistant", "Hello"), ("user", "Colour?")])
    store = write_stage(tmp_path / "run", groups)
    with connect(owner_credentials(argilla_server)) as client:
        push_run(store, PushConfig(dataset="sdk", workspace=argilla_server.workspace,
                                   min_submitted=2), client, progress=False)
    sdk = rg.Argilla(api_url=argilla_server.url, api_key=argilla_server.api_key)
    ds = sdk.datasets(name="sdk-k3", workspace=argilla_server.workspace)
    assert isinstance(ds.settings.questions["ranking"], rg.RankingQuestion)
    assert ds.settings.questions["ranking"].values == ["response_1", "response_2", "response_3"]
    assert ds.settings.distribution.min_submitted == 2
    assert [f.name for f in ds.settings.fields] == ["prompt", "response_1", "response_2",
                                                    "response_3"]
    assert isinstance(ds.settings.fields["prompt"], rg.ChatField)
    assert all(f.required for f in ds.settings.fields)
    records = {r.id: r for r in ds.records(with_suggestions=True)}
    assert sorted(records) == sorted(g.group_id for g in groups)
    assert all(r.suggestions["ranking"].agent == "rm-tiny:1" for r in records.values())
    chat = records[groups[0].group_id].fields["prompt"]
    assert [(m.role, m.content) for m in chat] == [("user", "Hi"), ("assistant", "Hello"),
                                                         ("user", "Colour?")]
    plain = records[groups[1].group_id].fields["prompt"]  # a plain prompt: one user turn
    assert [(m.role, m.content) for m in plain] == [("user", groups[1].prompt.text)]


class _Interrupted(Exception):
    pass


@pytest.mark.argilla
def test_interrupted_push_rerun_leaves_one_record_per_group(argilla_server: Any,
                                                            tmp_path: Path) -> None:
    groups = make_groups(20, tag="int", sizes=(4,))
    store = write_stage(tmp_path / "run", groups)
    config = PushConfig(dataset="interrupted", workspace=argilla_server.workspace, batch_size=6)

    def stop_after_first_batch(done: int, total: int) -> None:
        if done == 6:
            raise _Interrupted

    with connect(owner_credentials(argilla_server)) as client:
        # a create interrupted before publishing leaves a draft with part of the settings
        ws = client.workspace_id(argilla_server.workspace)
        draft = client.request("POST", "/api/v1/datasets", json_body=dataset_payload(
            "interrupted-k4", ws, DatasetSpec(k=4)))
        client.request("POST", f"/api/v1/datasets/{draft['id']}/fields",
                       json_body=fields_payload(DatasetSpec(k=4))[0])
        with pytest.raises(_Interrupted):
            push_run(store, config, client, progress=False, on_batch=stop_after_first_batch)
        rerun = push_run(store, config, client, progress=False)
        assert (rerun.created, rerun.updated) == (14, 6)
        again = push_run(store, config, client, progress=False)
        assert (again.created, again.updated) == (0, 20)
        records = list(client.iter_records(rerun.by_k(4).dataset_id, include=()))
    assert sorted(r["external_id"] for r in records) == sorted(g.group_id for g in groups)


@pytest.mark.argilla
def test_mismatched_dataset_is_refused_never_changed(argilla_server: Any, tmp_path: Path) -> None:
    base = make_groups(4, tag="mm")  # sizes 5, 3, 4, 2
    store = write_stage(tmp_path / "run", base)
    config = PushConfig(dataset="mismatch", workspace=argilla_server.workspace)
    with connect(owner_credentials(argilla_server)) as client:
        first = push_run(store, config, client, progress=False)
        with pytest.raises(SchemaMismatchError, match="'mismatch-k2' .* min_submitted: Argilla "
                                                      "has 1, the run needs 2"):
            push_run(store, config.model_copy(update={"min_submitted": 2}), client,
                     progress=False)
        chat = as_chat(base[0], [("user", "Colour?")])
        with pytest.raises(SchemaMismatchError, match="field 'prompt': Argilla has \\(text, "
                                                      "required\\), the run needs \\(chat"):
            push_run(write_stage(tmp_path / "chat", [chat]), config, client, progress=False)
        k5 = first.by_k(5).dataset_id
        fields = client.request("GET", f"/api/v1/datasets/{k5}/fields")["items"]
        assert [f["settings"]["type"] for f in fields] == ["text"] * 6  # untouched

        # a group of a new size gets its own dataset
        six = AnnotatedGroup(**make_group(6, prompt_text="six").model_dump())
        report = push_run(write_stage(tmp_path / "six", [six]), config, client, progress=False)
        assert [(d.name, d.created_dataset) for d in report.datasets] == [("mismatch-k6", True)]

        # a group whose record already has a response cannot change its candidates
        _, _, key = argilla_server.create_user("mm-ann")
        with annotator_http(argilla_server.url, key) as http:
            rec = annotator_records(http, first.by_k(3).dataset_id)[base[1].group_id]
            respond(http, rec["id"], [[f"response_{i}"] for i in range(1, 4)])
        other = make_group(3, prompt_text="Prompt mm1: name a colour.", texts=["x", "y", "z"])
        assert other.group_id == base[1].group_id
        changed = write_stage(tmp_path / "changed",
                              [AnnotatedGroup(**other.model_dump()), base[0]])
        report = push_run(changed, config, client, progress=False)
        assert [r.group_id for r in report.refused] == [other.group_id]
        assert (report.created, report.updated) == (0, 1)


@pytest.mark.argilla
def test_cli_push_status_pull_and_wrong_key(argilla_server: Any, tmp_path: Path) -> None:
    store = write_stage(tmp_path / "run", make_groups(3, tag="cli"))  # sizes 5, 3, 4
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    state = ["--state-dir", str(argilla_server.state_dir)]
    pushed = grouppref_label("push", str(store.root), *state, env=env)
    assert pushed.returncode == 0, pushed.stderr
    assert "created dataset 'grouppref-run-k3' (K=3): 1 groups, 1 new" in pushed.stdout
    assert "3 groups from rank -> 3 dataset(s) in workspace" in pushed.stdout
    assert "3 new, 0 updated, 0 refused" in pushed.stdout
    status = grouppref_label("status", str(store.root), *state, env=env)
    assert status.returncode == 0 and "records: 3, completed 0, pending 3" in status.stdout
    pulled = grouppref_label("pull", str(store.root), *state, env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert "label: 3 in, 3 out, 0 rejected" in pulled.stdout

    wrong = {**env, "ARGILLA_API_URL": argilla_server.url, "ARGILLA_API_KEY": "wrong-key-123"}
    out = grouppref_label("status", str(store.root), env=wrong)
    assert out.returncode == 2
    assert "refused the API key" in out.stderr and "wrong-key-123" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_errors_are_grouppref_errors() -> None:
    assert issubclass(ArgillaConnectionError, GroupPrefError)
    assert issubclass(SchemaMismatchError, GroupPrefError)
