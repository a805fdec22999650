"""The embedded Argilla and its SQL search engine, through Argilla's REST API and SDK.

One dataset of 12 records (``SPEC`` below) with metadata, suggestions, vectors and responses
from two annotators; every expected answer is computed from ``SPEC`` by plain Python, not by
the engine's code. The server is the session's real one (``argilla_server`` fixture).
"""

from __future__ import annotations

import math
import socket
import stat
import time
import uuid

import argilla as rg
import httpx
import pytest

from grouppref.labeling.server.embedded import EmbeddedArgilla

pytestmark = pytest.mark.argilla

N = 12
TOPICS = ["math", "code", "poetry"]


def spec(i: int) -> dict:
    """Record ``i`` of the test dataset: what we push, and what every expectation reads."""
    prompt = f"prompt {i} about {TOPICS[i % 3]}" + (" with a zebra" if i == 5 else "")
    return {
        "ext": f"r{i:02d}",
        "prompt": prompt,
        "response_1": "Zebras run fast" if i == 7 else f"answer one to {i}",
        "response_2": f"answer two to {i}",
        "topic": TOPICS[i % 3],
        "length": None if i == 11 else i * 10,
        "quality": round(i / 10, 1),
        "label": "good" if i % 2 == 0 else "bad",
        "agent": "ruleA" if i < 6 else "ruleB",
        "score": round(0.05 + i * 0.08, 2),
        "emb": [math.cos(i), math.sin(i), 0.5],
    }


SPECS = [spec(i) for i in range(N)]
# annotator -> {record index: (status, label)}
ANSWERS = {
    "ann_a": {0: ("submitted", "good"), 1: ("submitted", "good"), 2: ("submitted", "bad"),
              3: ("submitted", "bad"), 4: ("discarded", None), 5: ("draft", "good")},
    "ann_b": {0: ("submitted", "bad"), 1: ("submitted", "bad"), 6: ("submitted", "bad")},
}
MIN_SUBMITTED = 2


def stars(user: str, i: int) -> int:
    """The rating ``user`` gives record ``i`` (chosen so every record's average differs)."""
    return i + 1 if user == "ann_a" else i + 4


def exts(indices) -> set[str]:
    return {SPECS[i]["ext"] for i in indices}


class Env:
    """The dataset and the accounts the tests share (built once per module)."""

    def __init__(self, server: EmbeddedArgilla) -> None:
        self.server = server
        self.client = rg.Argilla(api_url=server.url, api_key=server.api_key)
        name = f"search-{uuid.uuid4().hex[:8]}"
        settings = rg.Settings(
            fields=[rg.TextField(name="prompt"), rg.TextField(name="response_1"),
                    rg.TextField(name="response_2")],
            questions=[rg.LabelQuestion(name="label", labels=["good", "bad"]),
                       rg.RankingQuestion(name="ranking", values=["response_1", "response_2"],
                                          required=False),
                       rg.RatingQuestion(name="stars", values=list(range(1, 11)),
                                         required=False)],
            metadata=[rg.TermsMetadataProperty(name="topic"),
                      rg.IntegerMetadataProperty(name="length"),
                      rg.FloatMetadataProperty(name="quality")],
            vectors=[rg.VectorField(name="emb", dimensions=3)],
            distribution=rg.TaskDistribution(min_submitted=MIN_SUBMITTED),
        )
        self.dataset = rg.Dataset(name=name, workspace=server.workspace, settings=settings,
                                  client=self.client).create()
        self.dataset.records.log([self._record(s) for s in SPECS])
        self.id = str(self.dataset.id)
        self.owner = self._http(server.api_key)
        items = self.owner.get(f"/api/v1/datasets/{self.id}/records",
                               params={"limit": 1000}).raise_for_status().json()["items"]
        self.server_id = {r["external_id"]: r["id"] for r in items}
        self.ext_of = {v: k for k, v in self.server_id.items()}
        self.users = {}
        for username, answers in ANSWERS.items():
            name_, _, key = server.create_user(f"{username}-{name}")
            self.users[username] = self._http(key)
            for i, (status, label) in answers.items():
                values = ({"label": {"value": label}, "stars": {"value": stars(username, i)}}
                          if label else {})
                self.users[username].post(
                    f"/api/v1/records/{self.server_id[SPECS[i]['ext']]}/responses",
                    json={"values": values, "status": status}).raise_for_status()

    @staticmethod
    def _record(s: dict) -> rg.Record:
        metadata = {"topic": s["topic"], "quality": s["quality"]}
        if s["length"] is not None:
            metadata["length"] = s["length"]
        return rg.Record(
            id=s["ext"], fields={k: s[k] for k in ("prompt", "response_1", "response_2")},
            metadata=metadata, vectors={"emb": s["emb"]},
            suggestions=[rg.Suggestion("label", s["label"], agent=s["agent"], score=s["score"],
                                       type="model" if s["label"] == "good" else "human")])

    def _http(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.server.url, headers={"X-Argilla-Api-Key": key},
                            timeout=30)

    def search(self, body: dict, user: str | None = None, **params) -> tuple[list[str], int]:
        """External ids of the hits, in order, and the total; as ``user`` through /me."""
        http = self.users[user] if user else self.owner
        path = (f"/api/v1/me/datasets/{self.id}/records/search" if user
                else f"/api/v1/datasets/{self.id}/records/search")
        r = http.post(path, json=body, params={"limit": 1000, **params}).raise_for_status()
        data = r.json()
        return [self.ext_of[item["record"]["id"]] for item in data["items"]], data["total"]


@pytest.fixture(scope="module")
def env(argilla_server: EmbeddedArgilla) -> Env:
    return Env(argilla_server)


def terms(scope: dict, values: list) -> dict:
    return {"filters": {"and": [{"type": "terms", "scope": scope, "values": values}]}}


def rng(scope: dict, ge=None, le=None) -> dict:
    f = {"type": "range", "scope": scope}
    f.update({k: v for k, v in (("ge", ge), ("le", le)) if v is not None})
    return {"filters": {"and": [f]}}


STATUS = {"entity": "response", "property": "status"}


@pytest.mark.parametrize("user", ["ann_a", "ann_b"])
@pytest.mark.parametrize("statuses", [["pending"], ["submitted"], ["discarded"], ["draft"],
                                      ["pending", "draft"], ["submitted", "discarded"]])
def test_response_status_per_user(env: Env, user: str, statuses: list[str]) -> None:
    mine = ANSWERS[user]
    expected = {i for i in range(N) if (mine[i][0] if i in mine else "pending") in statuses}
    found, total = env.search(terms(STATUS, statuses), user=user)
    assert set(found) == exts(expected) and total == len(expected)


@pytest.mark.parametrize("statuses", [["pending"], ["submitted"], ["draft", "discarded"]])
def test_response_status_any_user(env: Env, statuses: list[str]) -> None:
    def record_matches(i: int) -> bool:
        got = {a[i][0] for a in ANSWERS.values() if i in a}
        return (not got and "pending" in statuses) or bool(got & set(statuses))

    expected = {i for i in range(N) if record_matches(i)}
    found, total = env.search(terms(STATUS, statuses))
    assert set(found) == exts(expected) and total == len(expected)


def test_record_status(env: Env) -> None:
    submitted = [sum(1 for a in ANSWERS.values() if a.get(i, ("",))[0] == "submitted")
                 for i in range(N)]
    completed = {i for i in range(N) if submitted[i] >= MIN_SUBMITTED}
    assert completed == {0, 1}
    for status, expected in (("completed", completed), ("pending", set(range(N)) - completed)):
        found, total = env.search(terms({"entity": "record", "property": "status"}, [status]))
        assert set(found) == exts(expected) and total == len(expected)


def test_metadata_terms_and_ranges(env: Env) -> None:
    md = {"entity": "metadata"}
    found, _ = env.search(terms({**md, "metadata_property": "topic"}, ["math", "poetry"]))
    assert set(found) == exts(i for i in range(N) if SPECS[i]["topic"] in ("math", "poetry"))
    found, _ = env.search(rng({**md, "metadata_property": "length"}, ge=30, le=70))
    assert set(found) == exts(i for i in range(N)
                              if SPECS[i]["length"] is not None and 30 <= SPECS[i]["length"] <= 70)
    found, _ = env.search(rng({**md, "metadata_property": "quality"}, ge=0.65))
    assert set(found) == exts(i for i in range(N) if SPECS[i]["quality"] >= 0.65)


def test_suggestion_filters(env: Env) -> None:
    sug = {"entity": "suggestion", "question": "label"}
    found, _ = env.search(terms({**sug, "property": "agent"}, ["ruleB"]))
    assert set(found) == exts(i for i in range(N) if SPECS[i]["agent"] == "ruleB")
    found, _ = env.search(terms({**sug, "property": "value"}, ["good"]))
    assert set(found) == exts(i for i in range(N) if SPECS[i]["label"] == "good")
    found, _ = env.search(rng({**sug, "property": "score"}, ge=0.3, le=0.6))
    assert set(found) == exts(i for i in range(N) if 0.3 <= SPECS[i]["score"] <= 0.6)
    found, _ = env.search(terms({**sug, "property": "type"}, ["human"]))
    assert set(found) == exts(i for i in range(N) if SPECS[i]["label"] == "bad")


def test_response_value_filter_is_per_user(env: Env) -> None:
    scope = {"entity": "response", "question": "label"}
    for user, answers in ANSWERS.items():
        found, _ = env.search(terms(scope, ["good"]), user=user)
        assert set(found) == exts(i for i, (_, label) in answers.items() if label == "good")
    found, _ = env.search(terms(scope, ["bad"]))  # anyone's answer
    assert set(found) == exts({0, 1, 2, 3, 6})


def test_response_rating_range_and_sort(env: Env) -> None:
    scope = {"entity": "response", "question": "stars"}
    for user, answers in ANSWERS.items():
        found, _ = env.search(rng(scope, ge=3, le=6), user=user)
        assert set(found) == exts(i for i, (_, label) in answers.items()
                                  if label and 3 <= stars(user, i) <= 6)
    given: dict[int, list[int]] = {}
    for user, answers in ANSWERS.items():
        for i, (_, label) in answers.items():
            if label:
                given.setdefault(i, []).append(stars(user, i))
    by_avg = sorted(given, key=lambda i: -sum(given[i]) / len(given[i]))
    found, _ = env.search({"sort": [{"scope": scope, "order": "desc"}]})
    assert found[:len(by_avg)] == [SPECS[i]["ext"] for i in by_avg]  # unanswered ones follow
    mine = sorted((i for i, (_, label) in ANSWERS["ann_a"].items() if label),
                  key=lambda i: -stars("ann_a", i))
    found, _ = env.search({"sort": [{"scope": scope, "order": "desc"}]}, user="ann_a")
    assert found[:len(mine)] == [SPECS[i]["ext"] for i in mine]  # only ann_a's own answers


def test_record_property_filters(env: Env) -> None:
    record = {"entity": "record"}
    found, _ = env.search(terms({**record, "property": "external_id"}, ["r01", "r04"]))
    assert set(found) == {"r01", "r04"}
    found, _ = env.search(terms({**record, "property": "id"}, [env.server_id["r07"]]))
    assert found == ["r07"]
    assert env.search(rng({**record, "property": "inserted_at"}, ge="2000-01-01T00:00:00"))[1] == N
    assert env.search(rng({**record, "property": "inserted_at"}, le="2000-01-01T00:00:00"))[1] == 0


def test_combined_filters(env: Env) -> None:
    body = {"filters": {"and": [
        {"type": "terms", "scope": STATUS, "values": ["pending"]},
        {"type": "terms", "scope": {"entity": "metadata", "metadata_property": "topic"},
         "values": ["code"]}]}}
    found, _ = env.search(body, user="ann_a")
    assert set(found) == exts(i for i in range(N)
                              if i not in ANSWERS["ann_a"] and SPECS[i]["topic"] == "code")


def test_text_query(env: Env) -> None:
    assert env.search({"query": {"text": {"q": "zebra"}}})[0] == ["r05"]
    found, _ = env.search({"query": {"text": {"q": "zebra*"}}})
    assert set(found) == {"r05", "r07"}
    assert env.search({"query": {"text": {"q": "zebra*", "field": "prompt"}}})[0] == ["r05"]
    found, total = env.search({"query": {"text": {"q": "about poetry"}}})
    assert set(found) == exts(i for i in range(N) if SPECS[i]["topic"] == "poetry")
    assert total == len(found)
    assert env.search({"query": {"text": {"q": "nowhere-to-be-found"}}}) == ([], 0)


def test_sort_offset_limit(env: Env) -> None:
    body = {"sort": [{"scope": {"entity": "metadata", "metadata_property": "length"},
                      "order": "desc"}]}
    with_length = sorted((i for i in range(N) if SPECS[i]["length"] is not None),
                         key=lambda i: -SPECS[i]["length"])
    expected = [SPECS[i]["ext"] for i in with_length] + ["r11"]  # missing values last
    assert env.search(body)[0] == expected
    pages = [env.search(body, offset=o, limit=5) for o in range(0, N, 5)]
    assert [e for page, _ in pages for e in page] == expected
    assert all(total == N for _, total in pages)
    by_score = {"sort": [{"scope": {"entity": "suggestion", "question": "label",
                                    "property": "score"}, "order": "asc"}]}
    assert env.search(by_score)[0] == [s["ext"] for s in sorted(SPECS, key=lambda s: s["score"])]
    inserted = {"sort": [{"scope": {"entity": "record", "property": "inserted_at"},
                          "order": "desc"}]}
    found, total = env.search(inserted, offset=2, limit=3)
    assert total == N and len(found) == 3


def test_annotator_queue_is_a_stable_per_user_shuffle(env: Env) -> None:
    body = terms(STATUS, ["pending"])
    first, _ = env.search(body, user="ann_b")
    assert env.search(body, user="ann_b")[0] == first
    paged = [e for o in range(0, len(first), 4) for e in env.search(body, "ann_b", offset=o,
                                                                      limit=4)[0]]
    assert paged == first


def test_progress_and_user_metrics(env: Env) -> None:
    progress = env.owner.get(f"/api/v1/datasets/{env.id}/progress").raise_for_status().json()
    assert (progress["total"], progress["completed"], progress["pending"]) == (N, 2, N - 2)
    for user, answers in ANSWERS.items():
        metrics = env.users[user].get(f"/api/v1/me/datasets/{env.id}/metrics").json()
        counts = {s: sum(1 for st, _ in answers.values() if st == s)
                  for s in ("submitted", "discarded", "draft")}
        assert metrics["responses"] == {"total": N, **counts, "pending": N - len(answers)}


def test_metadata_metrics(env: Env) -> None:
    props = env.owner.get(f"/api/v1/me/datasets/{env.id}/metadata-properties").json()["items"]
    by_name = {p["name"]: p["id"] for p in props}

    def metrics(name: str) -> dict:
        return env.owner.get(f"/api/v1/metadata-properties/{by_name[name]}/metrics").json()

    topic = metrics("topic")
    assert topic["total"] == N
    assert {v["term"]: v["count"] for v in topic["values"]} == {t: N // 3 for t in TOPICS}
    lengths = [s["length"] for s in SPECS if s["length"] is not None]
    assert (metrics("length")["min"], metrics("length")["max"]) == (min(lengths), max(lengths))
    quality = metrics("quality")
    # values the test wrote, read back through the server's JSON: approx's rel 1e-6 also absorbs a
    # float32 store there (~6e-8 relative)
    assert quality["min"] == pytest.approx(0.0) and quality["max"] == pytest.approx(1.1)


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_similarity_search(env: Env) -> None:
    q = [1.0, 0.2, 0.5]
    expected = sorted(SPECS, key=lambda s: -_cos(q, s["emb"]))
    body = {"query": {"vector": {"name": "emb", "value": q}}}
    found, _ = env.search(body, limit=5)
    assert found == [s["ext"] for s in expected[:5]]
    least = {"query": {"vector": {"name": "emb", "value": q, "order": "least_similar"}}}
    assert env.search(least, limit=3)[0] == [s["ext"] for s in expected[::-1][:3]]
    like_r03 = {"query": {"vector": {"name": "emb", "record_id": env.server_id["r03"]}},
                **rng({"entity": "metadata", "metadata_property": "length"}, ge=40, le=100)}
    others = [s for s in SPECS if s["length"] is not None and 40 <= s["length"] <= 100]
    want = sorted(others, key=lambda s: -_cos(SPECS[3]["emb"], s["emb"]))
    assert env.search(like_r03)[0] == [s["ext"] for s in want]


def test_sdk_queries(env: Env) -> None:
    ds = env.client.datasets(env.dataset.name, workspace=env.server.workspace)
    math_ids = {r.id for r in ds.records(query=rg.Query(filter=rg.Filter(
        ("metadata.topic", "==", "math"))))}
    assert math_ids == exts(i for i in range(N) if SPECS[i]["topic"] == "math")
    zebra = [r.id for r in ds.records(query=rg.Query(query="zebra"))]
    assert zebra == ["r05"]
    submitted = {r.id for r in ds.records(query=rg.Query(filter=rg.Filter(
        ("response.status", "==", "submitted"))))}
    assert submitted == exts({0, 1, 2, 3, 6})
    assert len(list(ds.records)) == N


def test_annotators_cannot_see_other_workspaces_or_change_settings(env: Env) -> None:
    owner, ann = env.owner, env.users["ann_a"]
    other = owner.post("/api/v1/workspaces", json={"name": f"other-{uuid.uuid4().hex[:6]}"})
    other_ds = owner.post("/api/v1/datasets", json={
        "name": "hidden", "workspace_id": other.raise_for_status().json()["id"]})
    hidden = other_ds.raise_for_status().json()["id"]
    assert ann.get(f"/api/v1/datasets/{hidden}").status_code == 403
    assert ann.post(f"/api/v1/me/datasets/{hidden}/records/search", json={}).status_code == 403
    assert ann.patch(f"/api/v1/datasets/{env.id}", json={"name": "x"}).status_code == 403
    assert ann.patch(f"/api/v1/datasets/{env.id}",
                     json={"distribution": {"strategy": "overlap", "min_submitted": 1}}
                     ).status_code == 403
    assert ann.delete(f"/api/v1/datasets/{env.id}").status_code == 403
    assert ann.post("/api/v1/workspaces", json={"name": "mine"}).status_code == 403
    assert ann.post("/api/v1/users", json={"first_name": "x", "username": "x", "role": "owner",
                                           "password": "12345678"}).status_code == 403
    visible = [d["id"] for d in ann.get("/api/v1/me/datasets").json()["items"]]
    assert env.id in visible and hidden not in visible


def test_no_default_passwords_and_secret_files(env: Env) -> None:
    url = env.server.url
    for username, password in (("argilla", "12345678"), ("owner", "1234"), ("admin", "12345678"),
                               ("owner", "12345678")):
        r = httpx.post(f"{url}/api/v1/token", data={"username": username, "password": password})
        assert r.status_code == 401, (username, password)
    r = httpx.get(f"{url}/api/v1/me", headers={"X-Argilla-Api-Key": "argilla.apikey"})
    assert r.status_code == 401
    login = httpx.post(f"{url}/api/v1/token", data={"username": env.server.owner_username,
                                                     "password": env.server.owner_password})
    assert login.status_code == 201
    mode = stat.S_IMODE(env.server.credentials_path.stat().st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(env.server.state_dir.stat().st_mode) == 0o700


def _non_loopback_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, it only picks a route
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_binds_loopback_only(env: Env) -> None:
    assert env.server.url.startswith("http://127.0.0.1:")
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback address to probe")
    port = int(env.server.url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection((ip, port), timeout=3).close()


def test_worker_recomputes_record_status_when_distribution_changes(env: Env) -> None:
    """Changing ``min_submitted`` enqueues argilla-server's job; our rq worker runs it (with
    the SQL engine loaded) and the records' status follows the new rule."""
    settings = rg.Settings(fields=[rg.TextField(name="prompt")],
                           questions=[rg.LabelQuestion(name="label", labels=["good", "bad"])],
                           distribution=rg.TaskDistribution(min_submitted=2))
    ds = rg.Dataset(name=f"jobs-{uuid.uuid4().hex[:8]}", workspace=env.server.workspace,
                    settings=settings, client=env.client).create()
    ds.records.log([{"prompt": f"p{i}"} for i in range(3)])
    ann = env.users["ann_a"]
    first = ann.post(f"/api/v1/me/datasets/{ds.id}/records/search", json={},
                     params={"limit": 1}).json()["items"][0]["record"]["id"]
    ann.post(f"/api/v1/records/{first}/responses",
             json={"values": {"label": {"value": "good"}}, "status": "submitted"}
             ).raise_for_status()
    progress = f"/api/v1/datasets/{ds.id}/progress"
    assert env.owner.get(progress).json()["completed"] == 0
    env.owner.patch(f"/api/v1/datasets/{ds.id}", json={
        "distribution": {"strategy": "overlap", "min_submitted": 1}}).raise_for_status()
    deadline = time.monotonic() + 120
    while env.owner.get(progress).json()["completed"] != 1 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert env.owner.get(progress).json() | {"users": None} == {
        "total": 3, "completed": 1, "pending": 2, "users": None}
