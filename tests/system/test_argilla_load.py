"""Load: 20 annotators label concurrently, on SQLite and on PostgreSQL.

Each annotator works like the UI: ask for its own queue (records pending for it and not yet
completed), answer the first one, repeat, until it has submitted ``PER_USER`` responses or its
queue is empty. One in four answers goes through a saved draft first, and every annotator
re-posts one answer (which must be refused). Afterwards every (record, annotator) pair the
clients saw accepted is stored exactly once, nothing else is stored, and the progress counts
(dataset, per user, record status) equal those computed from the clients' own logs.
"""

from __future__ import annotations

import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import argilla as rg
import httpx
import pytest

from grouppref.labeling.server.embedded import EmbeddedArgilla

pytestmark = [pytest.mark.argilla, pytest.mark.slow]

USERS = 20
# six answers each: every annotator saves a draft once (one answer in four goes through a draft,
# at the position worker % 4) and re-posts one; the 20 sessions still overlap all along
PER_USER = 6
RECORDS = 48
MIN_SUBMITTED = 3  # 48 x 3 = 144 slots for 20 x 6 = 120 answers: some records complete


def _make_dataset(server: EmbeddedArgilla) -> str:
    client = rg.Argilla(api_url=server.url, api_key=server.api_key)
    settings = rg.Settings(
        fields=[rg.TextField(name="prompt")],
        questions=[rg.LabelQuestion(name="label", labels=["good", "bad"])],
        distribution=rg.TaskDistribution(min_submitted=MIN_SUBMITTED))
    ds = rg.Dataset(name=f"load-{uuid.uuid4().hex[:8]}", workspace=server.workspace,
                    settings=settings, client=client).create()
    ds.records.log([{"prompt": f"prompt {i}"} for i in range(RECORDS)])
    return str(ds.id)


def _annotate(url: str, api_key: str, dataset_id: str, worker: int) -> list[str]:
    """One annotator's session; returns the ids of the records it submitted."""
    done: list[str] = []
    queue = {"filters": {"and": [
        {"type": "terms", "scope": {"entity": "response", "property": "status"},
         "values": ["pending"]},
        {"type": "terms", "scope": {"entity": "record", "property": "status"},
         "values": ["pending"]}]}}
    with httpx.Client(base_url=url, headers={"X-Argilla-Api-Key": api_key}, timeout=120) as http:
        while len(done) < PER_USER:
            page = http.post(f"/api/v1/me/datasets/{dataset_id}/records/search", json=queue,
                             params={"limit": 1}).raise_for_status().json()
            if not page["items"]:
                break
            record_id = page["items"][0]["record"]["id"]
            answer = {"values": {"label": {"value": "good" if worker % 2 else "bad"}},
                      "status": "submitted"}
            if len(done) % 4 == worker % 4:  # a draft first, then submit it
                draft = http.post(f"/api/v1/records/{record_id}/responses",
                                  json={**answer, "status": "draft"}).raise_for_status().json()
                http.put(f"/api/v1/responses/{draft['id']}", json=answer).raise_for_status()
            else:
                http.post(f"/api/v1/records/{record_id}/responses", json=answer).raise_for_status()
            done.append(record_id)
        again = http.post(f"/api/v1/records/{done[0]}/responses",
                          json={"values": {"label": {"value": "good"}}, "status": "submitted"})
        assert again.status_code in (409, 422), again.text
    return done


def _run_load(server: EmbeddedArgilla) -> None:
    dataset_id = _make_dataset(server)
    tag = uuid.uuid4().hex[:6]
    keys = {}
    for n in range(USERS):
        name, _, key = server.create_user(f"load{n:02d}-{tag}")
        keys[name] = key
    with ThreadPoolExecutor(USERS) as pool:
        futures = {name: pool.submit(_annotate, server.url, key, dataset_id, n)
                   for n, (name, key) in enumerate(keys.items())}
        submitted = {name: f.result() for name, f in futures.items()}

    total_sent = sum(len(v) for v in submitted.values())
    assert total_sent == USERS * PER_USER
    owner = httpx.Client(base_url=server.url, headers={"X-Argilla-Api-Key": server.api_key},
                         timeout=60)
    records = owner.get(f"/api/v1/datasets/{dataset_id}/records",
                        params={"include": "responses", "limit": 1000}).raise_for_status().json()
    users = {u["id"]: u["username"] for u in owner.get("/api/v1/users").json()["items"]}
    stored = Counter()
    for record in records["items"]:
        for response in record.get("responses", []):
            assert response["status"] == "submitted"
            stored[(users[response["user_id"]], record["id"])] += 1
    expected = Counter((name, rid) for name, rids in submitted.items() for rid in rids)
    assert stored == expected  # each accepted response stored once, nothing else
    assert max(stored.values()) == 1

    per_record = Counter(rid for _, rid in expected)
    completed = sum(1 for n in per_record.values() if n >= MIN_SUBMITTED)
    assert 0 < completed < RECORDS  # both record statuses are counted
    progress = owner.get(f"/api/v1/datasets/{dataset_id}/progress").json()
    assert (progress["total"], progress["completed"], progress["pending"]) == (
        RECORDS, completed, RECORDS - completed)
    found = owner.post(f"/api/v1/datasets/{dataset_id}/records/search", params={"limit": 1},
                       json={"filters": {"and": [{"type": "terms", "values": ["completed"],
                                                  "scope": {"entity": "record",
                                                            "property": "status"}}]}}).json()
    assert found["total"] == completed
    for name, key in keys.items():
        mine = httpx.get(f"{server.url}/api/v1/me/datasets/{dataset_id}/metrics",
                         headers={"X-Argilla-Api-Key": key}).json()["responses"]
        n = len(submitted[name])
        assert mine == {"total": RECORDS, "submitted": n, "discarded": 0, "draft": 0,
                        "pending": RECORDS - n}


def test_load_sqlite(argilla_server: EmbeddedArgilla) -> None:
    _run_load(argilla_server)


def test_load_postgresql(argilla_postgres_url: str, tmp_path: Path) -> None:
    with EmbeddedArgilla(state_dir=tmp_path / "state", port=0,
                         database_url=argilla_postgres_url) as server:
        _run_load(server)
