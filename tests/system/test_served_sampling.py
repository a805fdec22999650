"""Served ``generate`` samples with temperature and top_p alone: the samplers a server applies
by default beyond them (llama.cpp: top_k 40, min_p 0.05, repeat_penalty 1.1) are switched off
in every request, for the servers ``GET /models`` names. Against the real llama.cpp server
(tests/support/llama_server.py); the other servers' ``/models`` entries are written as their sources
publish them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest

from grouppref.models.served.pool import ServerError
from grouppref.models.served.protocol import NEUTRAL_SAMPLING, SERVER_KINDS, server_kind
from grouppref.pipeline.generate.config import GenerateConfig, ModelShare, NeutralSampling
from grouppref.pipeline.generate.stage import run_generate
from grouppref.runs.store import RunStore
from grouppref.schemas import ChatMessage, Prompt
from tests.support.judges import LLAMA_NEUTRAL
from tests.support.llama_server import MODEL_ALIAS, posted_bodies

PROMPTS = [Prompt(prompt_id="chat", messages=[ChatMessage(role="user", content="Say hi.")])]


@pytest.mark.parametrize(("entry", "kind"), [
    # vLLM: vllm/entrypoints/openai/protocol.py ModelCard
    ({"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "created": 1, "owned_by": "vllm",
      "root": "Qwen/Qwen2.5-7B-Instruct", "parent": None, "max_model_len": 32768,
      "permission": []}, "vllm"),
    # SGLang: sglang/srt/entrypoints/openai/protocol.py ModelCard
    ({"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "created": 1, "owned_by": "sglang",
      "root": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 32768}, "sglang"),
    # llama.cpp's llama-server
    ({"id": "model.gguf", "object": "model", "created": 1, "owned_by": "llamacpp",
      "meta": {"n_ctx_train": 8192}}, "llama.cpp"),
    # llama-cpp-python's server (0.3.x)
    ({"id": "smollm2", "object": "model", "owned_by": "me", "permissions": []}, "llama.cpp"),
    # OpenAI, and servers that do not name themselves: nothing is sent
    ({"id": "gpt-4o-mini", "object": "model", "created": 1, "owned_by": "system"}, None),
    ({"id": "me", "object": "model", "owned_by": "me"}, None),
    ({"id": "fake", "object": "model"}, None),
])
def test_server_kind_from_models_entry(entry: dict[str, Any], kind: str | None) -> None:
    assert server_kind(entry) == kind


def test_every_kind_has_a_setting() -> None:
    assert set(get_args(NeutralSampling)) == {"auto", "off", *SERVER_KINDS}


def _config(url: str, **extra: Any) -> GenerateConfig:
    return GenerateConfig(models=[ModelShare.parse(f"openai:{MODEL_ALIAS}@{url}")], k=2,
                          max_new_tokens=4, max_resample=0, **extra)


def _run(tmp_path: Path, name: str, config: GenerateConfig, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[Any, list[dict[str, Any]]]:
    """The stage and the bodies of the POST requests it sent (read at the HTTP client)."""
    with posted_bodies(monkeypatch) as bodies:
        stage = run_generate(RunStore(tmp_path / name), config, prompts=PROMPTS,
                             show_progress=False)
    return stage, bodies


def test_llama_cpp_defaults_are_switched_off_in_every_request(
        tmp_path: Path, llama_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recognised from its /models entry, llama.cpp gets top_k 0, min_p 0, repeat_penalty 1 in
    every request (and accepts them: nothing refused); the candidates record them.
    server_params still win, 'off' sends none."""
    [entry] = httpx.get(f"{llama_server}/models", timeout=30).json()["data"]
    assert server_kind(entry) == "llama.cpp"
    assert NEUTRAL_SAMPLING["llama.cpp"] == LLAMA_NEUTRAL
    stage, bodies = _run(tmp_path, "auto", _config(llama_server), monkeypatch)
    assert len(bodies) == 2  # K = 2 samples, the first sent by the check before the stage
    assert all({k: b.get(k) for k in LLAMA_NEUTRAL} == LLAMA_NEUTRAL for b in bodies)
    [usage] = stage.manifest.stats["servers"]
    assert usage["refused"] == 0 and usage["succeeded"] == usage["requests"] == 1 + len(bodies)
    [group] = stage.records()
    assert len(group.candidates) == 2
    for candidate in group.candidates:
        assert json.loads(str(candidate.source.params["server_params"])) == LLAMA_NEUTRAL

    own = _config(llama_server, server={"server_params": {"top_k": 5, "min_p": None}})
    _, bodies = _run(tmp_path, "own", own, monkeypatch)
    assert all(b["top_k"] == 5 and "min_p" not in b and b["repeat_penalty"] == 1.0
               for b in bodies)
    stage, bodies = _run(tmp_path, "off", _config(llama_server, neutral_sampling="off"),
                         monkeypatch)
    assert bodies and not any(set(LLAMA_NEUTRAL) & set(b) for b in bodies)
    assert all("server_params" not in c.source.params for g in stage.records()
               for c in g.candidates)


def test_llama_cpp_reads_the_values_it_is_sent(tmp_path: Path, llama_server: str) -> None:
    """The fields are read, not ignored: vLLM's neutral top_k (-1) is out of llama.cpp's range,
    and forcing that kind against it stops at the check, before the stage, with the server's
    message, naming the field and the setting it comes from (llama-cpp-python answers a request
    it cannot validate with HTTP 500: a refusal, not retried, with the default max_retries)."""
    config = _config(llama_server, neutral_sampling="vllm")
    with pytest.raises(ServerError, match=r"HTTP 500: request field top_k=-1: .*greater than or "
                       r"equal to 0.*; top_k comes from neutral_sampling 'vllm'"):
        run_generate(RunStore(tmp_path / "run"), config, prompts=PROMPTS, show_progress=False)
    assert not (tmp_path / "run" / "generate").exists()
