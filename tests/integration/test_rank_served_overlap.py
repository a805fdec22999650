"""Several served judges in one rank stage run together: their requests share one event loop
(two servers keep the sum of their limits in flight; judges on one server share its limit),
the in-process rankers run while the requests are in flight, and the stage's output equals
the judges scoring one after another (rankings, part-rejects, usage counts).

The server here is a FAKE (:class:`VaryingFake`, built on tests/support/served_fakes.py's
in-flight fake), used ONLY to count requests in flight across servers, which real servers do
not report. The real llama.cpp judge tests are in tests/system/test_judge_server.py. No wall-clock
threshold: counts and the order of events only.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from grouppref.errors import ConfigError
from grouppref.models.served.settings import ServerSettings
from grouppref.pipeline.rank.config import RankConfig
from grouppref.pipeline.rank.rankers import RuleRanker
from grouppref.pipeline.rank.shard_scoring import shared_server_settings
from grouppref.pipeline.rank.stage import run_rank
from grouppref.runs.store import RunStore
from tests.support.served_fakes import (
    MODELS,
    VaryingFake,
    _judge,
    _judge_of,
    _max_overlap,
    _one_after_another,
    _servers,
    _without_times,
)


@pytest.mark.parametrize(("c1", "c2"), [(3, 5), (2, 2)])
def test_two_servers_keep_the_sum_of_their_limits_in_flight(groups_run: RunStore, c1: int,
                                                            c2: int) -> None:
    # pointwise: 6 questions at concurrency c1; pairwise: 12 at c2. One after another, the
    # fake would see at most max(c1, c2) in flight.
    # each judge's check sends its first question alone, before the stage: answered at once
    fake = VaryingFake(hold=c1 + c2, alone=2)
    with ExitStack() as stack:
        url1, url2 = _servers(fake, 2, stack)
        config = RankConfig(rankers=[_judge("pointwise", MODELS[0], url1, c1),
                                     _judge("pairwise", MODELS[1], url2, c2)])
        stage = run_rank(groups_run, config)
    by = {m: [r for r in fake.requests if _judge_of(r) == m] for m in ("pointwise", "pairwise")}
    assert (len(by["pointwise"]), len(by["pairwise"])) == (6, 12)
    assert fake.max_in_flight == c1 + c2
    assert (_max_overlap(by["pointwise"]), _max_overlap(by["pairwise"])) == (c1, c2)
    assert stage.manifest.counts.outputs == 2 and stage.manifest.counts.partial == 0


def test_judges_on_one_server_share_its_largest_limit(groups_run: RunStore) -> None:
    fake = VaryingFake(hold=4, alone=2)
    with ExitStack() as stack:
        [url] = _servers(fake, 1, stack)
        config = RankConfig(rankers=[_judge("pointwise", MODELS[0], url, 2),
                                     _judge("rubric", MODELS[0], url, 4)])
        stage = run_rank(groups_run, config)
    point = [r for r in fake.requests if _judge_of(r) == "pointwise"]
    rubric = [r for r in fake.requests if _judge_of(r) == "rubric"]
    assert (len(point), len(rubric)) == (6, 6)
    assert fake.max_in_flight == 4  # one limit for the server: the largest of the judges'
    assert any(fake.in_flight_together(a, b) for a in point for b in rubric)
    [usage] = stage.manifest.stats["servers"]  # one (server, model): both judges' requests
    assert usage["requests"] == 1 + 6 + 6  # /models once per server; no probe


def _counts(usage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in u.items() if k != "request_seconds"} for u in usage]


def test_together_equals_one_after_another(groups_run: RunStore, tiny_reward_model_dir: Path
                                           ) -> None:
    """Served judges on two servers (pointwise and pairwise on one, rubric with a part-reject
    on the other), a reward model and a rule ranker; shard size 1 (two shards)."""
    fake = VaryingFake(hold=1)  # answer at once: this test is about the results
    with ExitStack() as stack:
        url1, url2 = _servers(fake, 2, stack)
        rankers = [{"kind": "rule", "checks": [{"check": "length", "target": 6}]},
                   _judge("pointwise", MODELS[0], url1, 2),
                   {"kind": "reward", "model": str(tiny_reward_model_dir)},
                   _judge("rubric", MODELS[1], url2, 3),
                   _judge("pairwise", MODELS[0], url1, 3)]
        config = RankConfig(rankers=rankers, shard_size=1)
        stage = run_rank(groups_run, config)
        records, rejects, usage = _one_after_another(groups_run, config)
    assert [_without_times(g) for g in stage.records()] == [_without_times(g) for g in records]
    got = [(r.row, r.group_id, r.field, r.reason, r.scope) for r in stage.rejects()
           if r.scope == "part"]
    assert got == rejects and len(rejects) == 1 and "is not a rating" in rejects[0][3]
    # one after another, each judge's own pool asks GET /models; the shared pool asks once per
    # server (the pointwise and pairwise judges share url1)
    usage[0] = {**usage[0], "requests": usage[0]["requests"] - 1,
                "succeeded": usage[0]["succeeded"] - 1}
    assert _counts(stage.manifest.stats["servers"]) == _counts(usage)
    assert [u["model"] for u in usage] == [MODELS[0], MODELS[1]]  # in the order of the rankers
    scores = {r.annotator.id: r.scores for r in stage.records()[0].rankings}
    assert len(scores) == 5 and all(len(set(s.values())) > 1 for s in scores.values())


def test_in_process_rankers_run_while_requests_are_in_flight(
        groups_run: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule ranker comes first; it notes how many served requests are in flight when it
    scores (waiting up to 10 s for all five to arrive: the judge's first question was asked
    before the stage, as its check). One ranker after another, none would be."""
    fake = VaryingFake(hold=100)  # held until none arrives for a second
    seen: list[int] = []
    score = RuleRanker.score

    def observed(self: RuleRanker, groups: Any) -> Any:
        deadline = time.monotonic() + 10.0
        while fake.now < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(fake.now)
        return score(self, groups)

    monkeypatch.setattr(RuleRanker, "score", observed)
    with ExitStack() as stack:
        [url] = _servers(fake, 1, stack)
        config = RankConfig(rankers=[{"kind": "rule", "checks": [{"check": "length", "target": 6}]},
                                     _judge("pointwise", MODELS[0], url, 8)])
        stage = run_rank(groups_run, config)
    assert seen == [5]  # one shard; its five questions in flight while the rule ranker scored
    assert stage.manifest.counts.outputs == 2 and stage.manifest.counts.partial == 0


def test_one_server_one_client_and_different_keys_refused(groups_run: RunStore,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    url, other = "http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"
    shared = shared_server_settings([
        ServerSettings(base_url=url, concurrency=2, request_timeout=30, max_retries=1),
        ServerSettings(base_url=other, concurrency=3),
        ServerSettings(base_url=url, concurrency=6, request_timeout=10, max_retries=4)])
    assert list(shared) == [url, other]
    assert (shared[url].concurrency, shared[url].request_timeout, shared[url].max_retries) == (
        6, 30, 4)
    monkeypatch.setenv("KEY_A", "a")
    monkeypatch.setenv("KEY_B", "b")
    a, b = _judge("pointwise", MODELS[0], url, 2), _judge("rubric", MODELS[0], url, 2)
    a["server"]["api_key_env"], b["server"]["api_key_env"] = "KEY_A", "KEY_B"
    with pytest.raises(ConfigError, match=r"127.0.0.1:9/v1 name different api_key_env .*KEY_A"):
        run_rank(groups_run, RankConfig(rankers=[a, b]))
    assert groups_run.manifest("rank") is None  # refused before any request or stage
