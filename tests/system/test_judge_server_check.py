"""How the served judge checks its server, against the real llama.cpp server
(tests/support/llama_server.py, the embedded SmolLM2 GGUF): no request is spent on the check (the
first question is sent before the stage and kept), a resumed stage sends a short probe, a
refused first question is told from refused settings, the server's own samplers are switched
off in every mode, and llama-cpp-python's HTTP 500 validation errors are refusals naming the
field (not retried) while other 500s stay retried. Requests are read at the HTTP client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from grouppref.models.served.pool import RequestRefused, ServerError, ServerPool
from grouppref.models.served.protocol import CHAT, validation_problems
from grouppref.models.served.settings import ServerSettings
from grouppref.pipeline.rank.config import STAGE_VERSION, RankConfig
from grouppref.pipeline.rank.stage import run_rank
from grouppref.runs.stage import StageContext
from grouppref.schemas import AnnotatedGroup
from tests.support.factories import imported_run
from tests.support.judges import GROUPS, LLAMA_NEUTRAL, SHORT_RATING, _judge
from tests.support.llama_server import MODEL_ALIAS, posted_bodies
from tests.support.paths import REPO

REPO = REPO
PROBE = "Answer with Yes or No."


def _asked(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def test_first_question_is_the_check_and_every_mode_is_neutral(
        tmp_path: Path, llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pointwise and a rubric judge: no probe; each judge's first question goes out before
    the others (the check) and is not asked again; every request carries llama.cpp's neutral
    values, which each ranking records. 'off' sends none."""
    store = imported_run(tmp_path, GROUPS)
    rubric = _judge(llama_server, mode="rubric", answer_tokens=24,
                    server={"server_params": {"grammar": SHORT_RATING}})
    with posted_bodies(monkeypatch) as bodies:
        stage = run_rank(store, RankConfig(rankers=[_judge(llama_server), rubric]))
    questions = [_asked(b) for b in bodies]
    assert len(bodies) == 8 and len(set(questions)) == 8  # 4 candidates x 2 judges, no probe
    assert PROBE not in questions
    assert "[Response]\n4\n" in questions[0] and "[Response]\n4\n" in questions[1]
    assert "Rate the response" in questions[1]  # the two checks, then the shard
    assert all({k: b.get(k) for k in LLAMA_NEUTRAL} == LLAMA_NEUTRAL for b in bodies)
    [usage] = stage.manifest.stats["servers"]
    assert usage["requests"] == 1 + 8 and usage["refused"] == 0  # one GET /models
    assert stage.counts.partial == 0
    for group in stage.records():
        assert [json.loads(str(r.metadata["server_params"])) for r in group.rankings] == [
            LLAMA_NEUTRAL, {**LLAMA_NEUTRAL, "grammar": SHORT_RATING}]

    with posted_bodies(monkeypatch) as bodies:
        off = run_rank(store, RankConfig(rankers=[_judge(llama_server, neutral_sampling="off")]),
                       StageContext(force=True))
    assert len(bodies) == 4 and not any(set(LLAMA_NEUTRAL) & set(b) for b in bodies)
    assert all("server_params" not in (r.metadata or {}) for g in off.records() for r in g.rankings)


def test_a_resumed_stage_sends_a_short_probe(tmp_path: Path, llama_server: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage killed after its first shard: the resumed run probes (its first group is done)
    and asks only the second group's questions; the rankings equal the whole run's."""
    store = imported_run(tmp_path, GROUPS)
    config = RankConfig(rankers=[_judge(llama_server)], shard_size=1)
    whole = run_rank(store, config)
    records = whole.records()
    partial = store.open_stage("rank", config, input_fingerprint=whole.manifest.input_fingerprint,
                               record_type=AnnotatedGroup, stage_version=STAGE_VERSION,
                               force=True)
    shard = next(partial.pending_shards(records, shard_size=1))
    partial.write_shard(shard, shard.items, [])
    with posted_bodies(monkeypatch) as bodies:
        resumed = run_rank(store, config)
    assert not resumed.cached
    assert [_asked(b) for b in bodies][0] == PROBE and bodies[0]["max_tokens"] == 1
    assert len(bodies) == 1 + 2 and all("France" in _asked(b) for b in bodies[1:])
    for got, want in zip(resumed.records(), records, strict=True):
        [a], [b] = got.rankings, want.rankings
        # the same server resumed vs straight: a reused KV-cache prefix changes its float32 logits in
        # the last bits (tests/system/test_judge_server.py): 1e-5 on log-odds ~1-10
        assert a.scores == pytest.approx(b.scores, abs=1e-5) and a.tiers == b.tiers


def test_a_refused_first_question_is_told_from_refused_settings(
        tmp_path: Path, llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first group is longer than the server's context (2048 tokens): its first question
    is refused, a short probe is answered, so the stage runs; that group is a counted
    part-reject with the server's message, and its refused question is not sent again."""
    long_prompt = "Summarise: " + "word " * 2500
    store = imported_run(tmp_path, [{"prompt": long_prompt, "responses": ["Words.", "Many words."]},
                                 GROUPS[1]])
    with posted_bodies(monkeypatch) as bodies:
        stage = run_rank(store, RankConfig(rankers=[_judge(llama_server)]))
    asked = [_asked(b) for b in bodies]
    assert asked[1] == PROBE and asked.count(PROBE) == 1
    assert len(bodies) == 1 + 1 + 1 + 2  # first (refused), probe, the group's other, group 2
    [usage] = stage.manifest.stats["servers"]
    assert (usage["requests"], usage["refused"], usage["retried"]) == (1 + 5, 2, 0)
    [reject] = stage.rejects()
    assert reject.scope == "part" and reject.row == 1
    assert "the server refused a judge request" in reject.reason
    assert "maximum context length is 2048 tokens" in reject.reason
    assert [len(g.rankings) for g in stage.records()] == [0, 1]


def test_a_setting_the_server_refuses_stops_before_the_stage(
        tmp_path: Path, llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A min_p out of range in server_params, and vLLM's neutral top_k (-1) forced on llama.cpp
    from the CLI: llama-cpp-python refuses them with an HTTP 500 validation error, which is not
    retried: the first question and the probe are the only requests, and the error (one line,
    exit 2) names the field and the setting it comes from."""
    store = imported_run(tmp_path, GROUPS)
    config = RankConfig(rankers=[_judge(llama_server, server={"server_params": {"min_p": 2}})])
    with posted_bodies(monkeypatch) as bodies, pytest.raises(ServerError) as raised:
        run_rank(store, config)
    assert len(bodies) == 2 and _asked(bodies[1]) == PROBE
    message = str(raised.value)
    assert "HTTP 500: request field min_p=2: Input should be less than or equal to 1" in message
    assert "min_p comes from server_params" in message
    assert store.manifest("rank") is None  # stopped before the stage was opened

    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "")}
    cli = subprocess.run([sys.executable, "-m", "grouppref", "rank", str(store.root), "--ranker",
                          f"judge:openai:{MODEL_ALIAS}@{llama_server}", "--neutral-sampling",
                          "vllm"], capture_output=True, text=True, env=env, timeout=600)
    assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert "request field top_k=-1: Input should be greater than or equal to 0" in cli.stderr
    assert "top_k comes from neutral_sampling 'vllm' (vllm server)" in cli.stderr
    assert store.manifest("rank") is None


def test_validation_500_is_refused_and_other_500s_are_retried(llama_server: str) -> None:
    """At the client, against the real server: a body its validation refuses (HTTP 500) is a
    RequestRefused naming the field, sent once; an exception inside the server (HTTP 500 with
    another message: a logit_bias key that is not a token id) is retried once, and refused when
    the second answer is the same (tests/system/test_served_faults.py)."""
    settings = ServerSettings(base_url=llama_server, max_retries=2)
    body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Hi."}],
            "max_tokens": 1}
    with ServerPool({llama_server: settings}, backoff=(0.01, 0.01)) as pool:
        [refused] = pool.post(llama_server, CHAT, [{**body, "min_p": 2, "temperature": "hot"}])
        assert isinstance(refused, RequestRefused) and set(refused.fields) == {"min_p", "temperature"}
        assert "request field temperature='hot': Input should be a valid number" in str(refused)
        [usage] = pool.usage()
        assert (usage.requests, usage.retried, usage.refused, usage.failures) == (
            1, 0, 1, {"500": 1})
        [again] = pool.post(llama_server, CHAT, [{**body, "logit_bias": {"abc": 5}}])
        assert isinstance(again, RequestRefused) and "HTTP 500: invalid literal" in str(again)
        [usage] = pool.usage()
        assert (usage.requests, usage.retried, usage.failures) == (3, 1, {"500": 3})


def test_validation_problems_of_both_forms() -> None:
    """FastAPI's own 422 body (its documented form) and llama-cpp-python's 500 message (as the
    real server sent it, see the test above); any other 500 is not one."""
    fastapi = {"detail": [{"type": "less_than_equal", "loc": ["body", "min_p"],
                           "msg": "Input should be less than or equal to 1", "input": 2}]}
    [problem] = validation_problems(422, json.dumps(fastapi))
    assert (problem.field, problem.value) == ("min_p", 2)
    wizard = {"error": {"message": (
        "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'messages', 0, "
        "'ChatCompletionRequestUserMessage', 'role'), 'msg': \"Input should be 'user'\", "
        "'input': 'wizard', 'ctx': {'expected': \"'user'\"}}\n\n  File \"app.py\", line 376"),
        "type": "internal_server_error"}}
    [problem] = validation_problems(500, json.dumps(wizard))
    assert problem.field == "messages.0.ChatCompletionRequestUserMessage.role"
    assert problem.message == "Input should be 'user'" and problem.value == "wizard"
    fault = {"error": {"message": "llama_decode returned -1", "type": "internal_server_error"}}
    assert validation_problems(500, json.dumps(fault)) == []
    assert validation_problems(500, "Internal Server Error") == []
