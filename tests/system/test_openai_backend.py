"""``generate`` through OpenAI-compatible servers: against a real llama.cpp server
(``python -m llama_cpp.server`` serving the embedded SmolLM2 GGUF, tests/support/llama_server.py) for
generation, checks, keys, log-probs and a server killed mid-stage; against a small fake
(tests/support/fake_openai_server.py, named as such) only for the 429 / 503 / refusal paths."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from grouppref.errors import ConfigError
from grouppref.models.served.pool import ServerError, ServerPool, backoff_delay
from grouppref.models.served.protocol import parse_sample, sample_body
from grouppref.models.served.settings import ServerSettings
from grouppref.pipeline.generate.config import GenerateConfig, ModelShare
from grouppref.pipeline.generate.stage import run_generate
from grouppref.runs.stage_run import read_shard_file
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, CandidateGroup, ChatMessage, Prompt
from grouppref.schemas.reports import ServerUsage
from tests.support.cli import grouppref_here
from tests.support.fake_openai_server import MODEL as FAKE_MODEL
from tests.support.fake_openai_server import SLOW, SLOW_S, TOKEN_LOGPROBS, fake_openai_server
from tests.support.llama_server import MODEL_ALIAS, running_llama_server
from tests.support.paths import REPO

REPO = REPO
# llama.cpp samples with top_k 40, min_p 0.05 and repeat_penalty 1.1 unless told otherwise;
# off, it samples with temperature and top_p alone (as the in-process backend does)
NEUTRAL = {"repeat_penalty": 1.0, "top_k": 0, "min_p": 0.0}
FAST_BACKOFF = (0.01, 0.05)


def _prompts() -> list[Prompt]:
    return [Prompt(prompt_id="chat", messages=[ChatMessage(role="user", content="Say hi.")]),
            Prompt(prompt_id="text", text="The capital of France is")]


def _config(url: str, **extra: object) -> GenerateConfig:
    values: dict[str, object] = {
        "backend": "openai", "models": [ModelShare(name=MODEL_ALIAS)], "k": 2,
        "max_new_tokens": 6, "shard_size": 1, "max_resample": 1,
        "server": {"base_url": url, "server_params": NEUTRAL, "concurrency": 2}, **extra}
    return GenerateConfig.model_validate(values)


def _usage(stage: object) -> ServerUsage:
    [usage] = stage.manifest.stats["servers"]  # type: ignore[attr-defined]
    return ServerUsage.model_validate(usage)


# -- the real server ------------------------------------------------------------------------
def test_chat_and_text_prompts_through_llama_server(tmp_path: Path, llama_server: str) -> None:
    """A chat prompt goes to /chat/completions, a text prompt (--no-chat-template) to
    /completions; behavior_logp is the sum of the token log-probs the server returns for the
    same seeded request, num_tokens their count; usage and requests are in the manifest."""
    config = _config(llama_server, chat_template=False)
    stage = run_generate(RunStore(tmp_path / "run"), config, prompts=_prompts(), show_progress=False)
    groups = {g.prompt.prompt_id: g for g in stage.records()}
    assert set(groups) == {"chat", "text"} and stage.counts.rejected == 0
    prompts = {p.prompt_id: p for p in _prompts()}
    for pid, path in (("chat", "/chat/completions"), ("text", "/completions")):
        for c in groups[pid].candidates:
            params = c.source.params
            assert c.source.model == MODEL_ALIAS and params["backend"] == "openai"
            assert params["finish_reason"] in ("stop", "length") and c.text.strip()
            assert 0 < c.num_tokens <= 6 and c.behavior_logp is not None
            # the same request, sent by hand, returns the same tokens (the server honours
            # seeds): their log-probs sum to behavior_logp
            body = sample_body(MODEL_ALIAS, prompts[pid], path, temperature=1.0, top_p=1.0,
                               max_tokens=6, seed=c.source.seed, stop=[], logprobs=True,
                               server_params=NEUTRAL)
            answer = httpx.post(llama_server + path, json=body, timeout=300).json()
            again = parse_sample(answer, path, want_logprobs=True)
            assert again.text == c.text and again.num_tokens == c.num_tokens
            # the same server answer parsed twice: the same float64 sum of the same JSON numbers,
            # ~eps64; 1e-9 only for the order of the sum
            assert c.behavior_logp == pytest.approx(again.logp, abs=1e-9)
    usage = _usage(stage)
    sampled = stage.manifest.stats["sampled"]
    # GET /models + every sampled candidate: the check's request per endpoint is the first
    # draw there, kept for it
    assert usage.requests == usage.succeeded == 1 + sampled and usage.retried == 0
    assert usage.completion_tokens >= sum(c.num_tokens for g in groups.values()
                                          for c in g.candidates)


def test_mixed_local_and_served_models_in_one_group(tmp_path: Path, llama_server: str,
                                                    tiny_lm_dir: Path) -> None:
    """--model A:1 --model openai:B@URL:1: every group holds a candidate of each."""
    specs = [f"{tiny_lm_dir}:1", f"openai:{MODEL_ALIAS}@{llama_server}:1"]
    config = GenerateConfig(models=[ModelShare.parse(s) for s in specs], max_new_tokens=6,
                            server={"server_params": NEUTRAL}, max_resample=2)
    stage = run_generate(RunStore(tmp_path / "run"), config, prompts=_prompts()[:1],
                         show_progress=False)
    [group] = stage.records()
    assert sorted(c.source.model for c in group.candidates) == sorted([str(tiny_lm_dir),
                                                                      MODEL_ALIAS])
    served = next(c for c in group.candidates if c.source.model == MODEL_ALIAS)
    local = next(c for c in group.candidates if c.source.model != MODEL_ALIAS)
    assert served.source.params["backend"] == "openai" and "backend" not in local.source.params
    assert local.source.params["eos"] in (True, False) and served.behavior_logp is not None


def test_duplicate_served_candidates_are_resampled_then_rejected(tmp_path: Path,
                                                                 llama_server: str) -> None:
    """A llama.cpp grammar forces every answer to the same text: the duplicate slot is sampled
    again max_resample times (new seeds, counted); the group, still below min_k, is rejected
    with the reason."""
    forced = {**NEUTRAL, "grammar": 'root ::= "same"'}
    config = _config(llama_server, max_resample=2,
                     server={"base_url": llama_server, "server_params": forced})
    stage = run_generate(RunStore(tmp_path / "run"), config, prompts=_prompts()[:1],
                         show_progress=False)
    assert stage.records() == [] and stage.counts.rejected == 1
    [reject] = stage.rejects()
    assert reject.reason == ("prompt 'chat': only 1 distinct non-empty candidates after 2 "
                             "re-samples; --min-k is 2")
    assert stage.manifest.stats["resampled"] == 2
    # GET /models + K=2 first samples (the first one sent by the check) + 2 re-samples of slot 1
    assert _usage(stage).requests == 1 + 2 + 2

@pytest.mark.slow  # a `grouppref run` subprocess: two stages, torch imported
def test_run_config_generates_and_judges_through_llama_server(tmp_path: Path,
                                                              llama_server: str) -> None:
    """The same keys in a `grouppref run` config: generate with `backend: openai` and a served
    pointwise judge in `rank`; both stages record their server usage in their manifests."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n{"prompt": "Name a colour."}\n')
    config = tmp_path / "run.yaml"
    config.write_text(f"""run_dir: {tmp_path / "run"}
prompts: {{source: {prompts}}}
generate:
  k: 2
  max_new_tokens: 4
  backend: openai
  models: [{{name: {MODEL_ALIAS}}}]
  server: {{base_url: "{llama_server}", concurrency: 2, server_params: {json.dumps(NEUTRAL)}}}
rank:
  rankers:
    - {{kind: judge, backend: openai, model: {MODEL_ALIAS},
        server: {{base_url: "{llama_server}", concurrency: 2}}}}
""")
    ran = _cli(["run", str(config), "--until", "rank"])
    assert ran.exit_code == 0, ran.output
    store = RunStore(tmp_path / "run")
    groups = store.load_records("generate", CandidateGroup)
    assert len(groups) == 2 and all(c.source.params["backend"] == "openai"
                                    for g in groups for c in g.candidates)
    for stage in ("generate", "rank"):
        [usage] = store.manifest(stage).stats["servers"]
        assert usage["model"] == MODEL_ALIAS and usage["succeeded"] > 0, stage
    ranked = store.load_records("rank", AnnotatedGroup)
    assert all(r.annotator.id == f"judge:{MODEL_ALIAS}" for g in ranked for r in g.rankings)
    assert sum(len(g.rankings) for g in ranked) == 2

@dataclass
class _Ran:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _cli(args: list[str], env: dict[str, str] | None = None) -> _Ran:
    """``grouppref ARGS`` through the real entry point, ``cli.main()``, in this process (one line
    and exit 2 on bad input), under only these environment variables."""
    base = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "")}
    done = grouppref_here(*args, env={**base, **(env or {})})
    return _Ran(done.returncode, done.stdout, done.stderr)


def test_wrong_model_and_unreachable_server_exit_2_before_any_work(tmp_path: Path,
                                                                     llama_server: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n')
    base = ["generate", "--prompts", str(prompts), "--out", str(tmp_path / "run"), "--k", "2",
            "--backend", "openai", "--quiet"]
    wrong = _cli([*base, "--base-url", llama_server, "--model", "no-such-model"])
    assert wrong.exit_code == 2
    assert f"model 'no-such-model' is not served at {llama_server.removeprefix('http://')}; it " \
           f"serves: '{MODEL_ALIAS}'" in wrong.output
    down = _cli([*base, "--base-url", "http://127.0.0.1:9/v1", "--model", MODEL_ALIAS])
    assert down.exit_code == 2 and "cannot reach the server at http://127.0.0.1:9/v1" in down.output
    no_v1 = _cli([*base, "--base-url", llama_server.removesuffix("/v1"), "--model", MODEL_ALIAS])
    assert no_v1.exit_code == 2 and "usually ends in /v1" in no_v1.output
    for result in (wrong, down, no_v1):
        assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "generate").exists()  # nothing was opened


def test_response_without_logprobs_is_an_error_unless_left_empty(tmp_path: Path,
                                                                  llama_server: str) -> None:
    """llama.cpp returns no chat log-probs without top_logprobs (removed here through
    server_params): the probe stops the stage with one line; --no-logprobs leaves
    behavior_logp empty instead."""
    no_top = {**NEUTRAL, "top_logprobs": None}
    config = _config(llama_server, server={"base_url": llama_server, "server_params": no_top})
    with pytest.raises(ServerError, match="without token log-probs.*--no-logprobs"):
        run_generate(RunStore(tmp_path / "a"), config, prompts=_prompts()[:1], show_progress=False)
    assert not (tmp_path / "a" / "generate").exists()
    stage = run_generate(RunStore(tmp_path / "b"), _config(llama_server, logprobs=False),
                         prompts=_prompts()[:1], show_progress=False)
    [group] = stage.records()
    assert all(c.behavior_logp is None and c.num_tokens for c in group.candidates)


def test_api_key_from_env_is_checked_and_never_written(tmp_path: Path) -> None:
    """A server started with --api_key: no key or a wrong key stops with one line (exit 2);
    the right key works, and it appears in no file of the run nor in the output."""
    key = f"sk-test-{random.randrange(10**12)}"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n')
    with running_llama_server(tmp_path / "server.log", api_key=key) as server:
        base = ["generate", "--prompts", str(prompts), "--out", str(tmp_path / "run"), "--k", "2",
                "--max-new-tokens", "4", "--quiet", "--model", f"openai:{MODEL_ALIAS}",
                "--base-url", server.base_url]
        no_key = _cli(base)
        assert no_key.exit_code == 2 and "pass --api-key-env VAR" in no_key.output
        unset = _cli([*base, "--api-key-env", "GROUPPREF_TEST_UNSET_KEY"])
        assert unset.exit_code == 2 and "GROUPPREF_TEST_UNSET_KEY is not set" in unset.output
        wrong = _cli([*base, "--api-key-env", "GROUPPREF_TEST_KEY"],
                     env={"GROUPPREF_TEST_KEY": "wrong-key"})
        assert wrong.exit_code == 2 and "check the key in $GROUPPREF_TEST_KEY" in wrong.output
        ok = _cli([*base, "--api-key-env", "GROUPPREF_TEST_KEY", "--no-logprobs"],
                  env={"GROUPPREF_TEST_KEY": key})
        assert ok.exit_code == 0, ok.output
        assert "requests" in ok.output and key not in ok.output
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in files)
    for path in files:
        assert key.encode() not in path.read_bytes(), path
    manifest = json.loads((tmp_path / "run" / "generate" / "manifest.json").read_text())
    assert "api_key_env" not in json.dumps(manifest["config"])  # a runtime knob: not hashed
    assert key not in repr(ServerSettings(base_url=server.base_url, api_key_env="X"))


@pytest.mark.slow
def test_server_killed_mid_stage_then_rerun(tmp_path: Path) -> None:
    """SIGTERM the server while `generate` runs: the command stops with one line (exit 2),
    finished shards stay; a server restarted on the same port finishes the stage, re-sending
    only the unfinished prompts; the rows equal an uninterrupted run (seeds honoured)."""
    prompts = tmp_path / "p.jsonl"
    texts = ["Say hi.", "Name a colour.", "Name a fruit.", "Say yes.", "Count to two."]
    prompts.write_text("".join(json.dumps({"prompt_id": f"p{i}", "prompt": t}) + "\n"
                               for i, t in enumerate(texts)))

    def command(url: str, out: Path) -> list[str]:
        return [sys.executable, "-m", "grouppref", "generate", "--prompts", str(prompts),
                "--out", str(out), "--k", "2", "--max-new-tokens", "4", "--shard-size", "1",
                "--max-resample", "0", "--concurrency", "1", "--max-retries", "1", "--quiet",
                "--model", f"openai:{MODEL_ALIAS}@{url}", *sum(
                    (["--server-param", f"{k}={v}"] for k, v in NEUTRAL.items()), [])]

    shards = tmp_path / "run" / "generate" / "shards"
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "")}
    with running_llama_server(tmp_path / "s1.log") as server:
        port, url = server.port, server.base_url
        proc = subprocess.Popen(command(url, tmp_path / "run"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        deadline = time.monotonic() + 300
        while not list(shards.glob("shard-00000.arrow")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
    # the server is gone (context exit terminated it) while the command still works
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, stderr
    assert stderr.strip().startswith("error:") and len(stderr.strip().splitlines()) == 1
    assert "run the same command again to resume" in stderr or "cannot reach" in stderr
    done = sorted(p.name for p in shards.glob("shard-*.arrow"))
    assert 1 <= len(done) < len(texts)
    kept = {row["group_id"]: row for p in shards.glob("shard-*.arrow")
            for row in read_shard_file(p).to_pylist()}
    first = json.loads((tmp_path / "run" / "generate" / "manifest.json").read_text())
    first_requests = first["stats"]["servers"][0]["requests"]
    with running_llama_server(tmp_path / "s2.log", port=port):
        again = subprocess.run(command(url, tmp_path / "run"), capture_output=True, text=True,
                               env=env, cwd=tmp_path, timeout=600)
        assert again.returncode == 0, again.stderr
        whole = subprocess.run(command(url, tmp_path / "whole"), capture_output=True, text=True,
                               env=env, cwd=tmp_path, timeout=600)
        assert whole.returncode == 0, whole.stderr
    store = RunStore(tmp_path / "run")
    resumed = {g.group_id: g for g in store.load_records("generate", CandidateGroup)}
    uninterrupted = {g.group_id: g for g in RunStore(tmp_path / "whole").load_records(
        "generate", CandidateGroup)}
    manifest = store.manifest("generate")
    assert manifest.counts.inputs == len(texts) == len(resumed) + manifest.counts.rejected
    for gid, row in kept.items():  # finished shards were kept as they were
        assert [c["text"] for c in row["candidates"]] == [c.text for c in resumed[gid].candidates]
    for gid, group in resumed.items():  # and the whole run is what an uninterrupted one gives
        assert [(c.text, c.behavior_logp) for c in group.candidates] == [
            (c.text, c.behavior_logp) for c in uninterrupted[gid].candidates]
    # the second session asked only for the unfinished prompts: GET /models, one short probe
    # (a resumed stage's first prompts may be done), and K=2 requests per prompt left
    # (max_resample 0: no re-samples)
    second = manifest.stats["servers"][0]["requests"] - first_requests
    assert second == 1 + 1 + 2 * (len(texts) - len(done))


# -- the fake server: retry paths only --------------------------------------------------------
def test_retries_429_and_503_then_succeeds_and_counts_them() -> None:
    with fake_openai_server(script=[429, 503]) as (url, state):
        settings = ServerSettings(base_url=url, max_retries=3)
        with ServerPool({url: settings}, backoff=FAST_BACKOFF) as pool:
            body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "seed": 7, "logprobs": True, "top_logprobs": 1}
            [answer] = pool.post(url, "/chat/completions", [body])
            [usage] = pool.usage()
    assert isinstance(answer, dict)
    sample = parse_sample(answer, "/chat/completions", want_logprobs=True)
    # a float64 sum of the fake's few given numbers: float64, a few operations: approx's default rel
    # 1e-6 is ~1e9 eps64
    assert sample.text == "answer 7" and sample.logp == pytest.approx(sum(TOKEN_LOGPROBS))
    assert (usage.requests, usage.succeeded, usage.retried) == (3, 1, 2)
    assert usage.failures == {"429": 1, "503": 1}
    assert [r["body"]["seed"] for r in state.requests] == [7, 7, 7]


def test_a_request_timeout_is_retried_and_counted() -> None:
    with fake_openai_server(script=[SLOW]) as (url, state):
        settings = ServerSettings(base_url=url, max_retries=2, request_timeout=SLOW_S / 4)
        with ServerPool({url: settings}, backoff=FAST_BACKOFF) as pool:
            [answer] = pool.post(url, "/completions", [{"model": FAKE_MODEL, "prompt": "hi",
                                                        "seed": 3}])
            [usage] = pool.usage()
    assert isinstance(answer, dict) and answer["choices"][0]["text"] == "answer 3"
    assert (usage.requests, usage.succeeded, usage.retried) == (2, 1, 1)
    assert usage.failures == {"timeout": 1} and len(state.requests) == 2

def test_gives_up_after_max_retries_with_one_line() -> None:
    with fake_openai_server(script=[503] * 10) as (url, state):
        settings = ServerSettings(base_url=url, max_retries=2)
        with ServerPool({url: settings}, backoff=FAST_BACKOFF) as pool:
            with pytest.raises(ServerError, match=r"failed 3 times \(last: HTTP 503: overloaded\)"):
                pool.post(url, "/chat/completions", [{"model": FAKE_MODEL, "messages": []}])
    assert len(state.requests) == 3


def test_generate_counts_retries_and_rejects_refused_prompts(tmp_path: Path) -> None:
    """Through the whole stage: 429/503 answers are retried and counted in the manifest; a
    prompt the server refuses (400) is one reject with the server's message; the key goes in
    the Authorization header only."""
    prompts = [Prompt(prompt_id="ok", text="Say hi."), Prompt(prompt_id="long", text="TOO LONG")]
    with fake_openai_server(script=[429, 503]) as (url, state):  # the check meets them
        config = GenerateConfig(backend="openai", models=[ModelShare(name=FAKE_MODEL)], k=2,
                                server={"base_url": url, "max_retries": 3,
                                        "api_key_env": "GROUPPREF_FAKE_KEY"})
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GROUPPREF_FAKE_KEY", "sk-fake")
            stage = run_generate(RunStore(tmp_path / "run"), config, prompts=prompts,
                                 show_progress=False)
    [group] = stage.records()
    assert group.prompt.prompt_id == "ok" and len({c.text for c in group.candidates}) == 2
    [reject] = stage.rejects()
    assert "prompt 'long': the server refused it" in reject.reason
    assert "prompt is longer than the context" in reject.reason
    usage = _usage(stage)
    assert usage.failures == {"429": 1, "503": 1, "400": 2} and usage.refused == 2
    assert usage.retried == 2
    assert {r["headers"].get("Authorization") for r in state.requests} == {"Bearer sk-fake"}
    assert stage.counts.inputs == stage.counts.outputs + stage.counts.rejected
    from grouppref.pipeline.report.stage import section_servers

    table = section_servers(RunStore(tmp_path / "run").manifests())  # the report's server table
    assert "Inference servers" in table and "429: 1, 503: 1" in table and FAKE_MODEL in table


def test_backoff_is_jittered_exponential_and_honours_retry_after() -> None:
    rng = random.Random(0)
    for attempt in range(6):
        cap = min(30.0, 0.5 * 2 ** attempt)
        delays = [backoff_delay(attempt, None, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in delays) and max(delays) > 0.5 * cap
    assert backoff_delay(3, 2.5, rng) == 2.5 and backoff_delay(0, 1e6, rng) == 120.0


@pytest.mark.parametrize(("spec", "name", "count", "url"), [
    ("HuggingFaceTB/SmolLM2-360M-Instruct:2", "HuggingFaceTB/SmolLM2-360M-Instruct", 2, None),
    ("openai:Qwen/Qwen2.5-7B-Instruct@http://gpu:8000/v1:2", "Qwen/Qwen2.5-7B-Instruct", 2,
     "http://gpu:8000/v1"),
    ("openai:B@http://h:8000", "B", None, "http://h:8000"),  # a bare port is no count
    ("openai:B@http://h:8000:3", "B", 3, "http://h:8000"),
    ("openai:llama3:8b", "llama3:8b", None, None),  # Ollama names hold ':'
    ("openai:llama3:8b:4", "llama3:8b", 4, None),
])
def test_model_spec_parse(spec: str, name: str, count: int | None, url: str | None) -> None:
    share = ModelShare.parse(spec)
    assert (share.name, share.count, share.base_url) == (name, count, url)


def test_config_errors_name_the_fix_and_hide_credentials() -> None:
    with pytest.raises(ValueError, match="no server is given: pass --base-url URL"):
        GenerateConfig.model_validate({"models": [{"name": "m", "backend": "openai"}]})
    with pytest.raises(ConfigError, match=r"http://\*\*\*@h/v1") as caught:
        ModelShare.parse("openai:m@http://me:secret@h/v1")
    assert "secret" not in str(caught.value)
    with pytest.raises(ValueError, match="stop strings apply to openai models only"):
        GenerateConfig(stop=["\n"])
    with pytest.raises(ValueError, match="may not set \\['seed'\\]"):
        ServerSettings(server_params={"seed": 1})
    assert math.isfinite(GenerateConfig(models=[ModelShare.parse("openai:m@http://h/v1")]).k)
