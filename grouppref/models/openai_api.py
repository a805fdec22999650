"""The OpenAI completions protocol as grouppref speaks it: request bodies for sampling a
candidate, and the parts of an answer it reads (text, token log-probs, the first token's top
log-probs, usage). Pure functions over JSON; the HTTP side is :mod:`grouppref.models.openai`.

Which endpoint: a chat prompt goes to ``/chat/completions`` (the server applies the model's chat
template); a plain-text prompt goes there too as one user turn when ``chat`` is on (as the
in-process backend does with the tokenizer's template), and to ``/completions`` as raw text when
it is off (``--no-chat-template``).

What ``logp`` means: the sum of the log-probs the server returns for the generated tokens, i.e.
whatever distribution that server reports (raw model log-probs for vLLM and llama.cpp, the
temperature-scaled one for SGLang by default, the processed one for TGI: docs/generate.md).
Servers do not return the end-of-sequence token, so unlike the in-process backend ``logp`` and
``num_tokens`` leave it out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grouppref.errors import GroupPrefError
from grouppref.schemas import Prompt

CHAT, TEXT = "/chat/completions", "/completions"


class ServerError(GroupPrefError):
    """A server cannot be used: unreachable, unknown model, refused key, failed after retries,
    or an answer without what was asked for (one line, exit code 2)."""


class RequestRefused(ServerError):
    """The server refused one request (HTTP 400/413/422, e.g. a prompt longer than its
    context): that row is rejected with the server's message; the stage goes on."""


@dataclass(frozen=True)
class ServerSample:
    """One sampled continuation as the server returned it.

    Attributes:
        text (str): the generated text (without the end-of-sequence token).
        num_tokens (int | None): generated tokens (from the returned log-probs, else usage).
        logp (float | None): sum of the returned token log-probs; None when not asked for or
            when a returned value was not finite.
        finish_reason (str | None): ``stop`` (end of sequence or a stop string) or ``length``.
    """

    text: str
    num_tokens: int | None
    logp: float | None
    finish_reason: str | None


# The values that switch off the samplers a server applies, beyond temperature and top_p,
# when a request leaves them out, per server kind (see docs/generate.md):
# - llama.cpp (llama-server and llama-cpp-python's server): top_k 40, min_p 0.05 and (in
#   llama-cpp-python) repeat_penalty 1.1 by default; top_k 0 keeps every token;
# - vLLM and SGLang: the model's generation_config.json (e.g. Qwen's top_k 20, repetition_penalty
#   1.05) when the server reads it (vLLM's default --generation-config auto, SGLang's
#   --sampling-defaults model); top_k -1 keeps every token in both.
NEUTRAL_SAMPLING: dict[str, dict[str, Any]] = {
    "llama.cpp": {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0},
    "vllm": {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
    "sglang": {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
}
SERVER_KINDS = tuple(NEUTRAL_SAMPLING)


def server_kind(entry: dict[str, Any]) -> str | None:
    """The kind of server (a key of :data:`NEUTRAL_SAMPLING`) that listed ``entry`` in its
    ``GET /models``, or None when ``owned_by`` does not say: vLLM writes ``owned_by: "vllm"``,
    SGLang ``"sglang"``, llama.cpp's ``llama-server`` ``"llamacpp"``, and llama-cpp-python's
    server ``"me"`` with a ``permissions`` list (0.3.x). Other servers (TGI, Ollama, hosted APIs)
    are not recognised: nothing is sent for them."""
    owned = entry.get("owned_by")
    if owned == "llamacpp" or (owned == "me" and isinstance(entry.get("permissions"), list)):
        return "llama.cpp"
    return owned if owned in ("vllm", "sglang") else None


def endpoint(prompt: Prompt, chat: bool) -> str:
    """``/chat/completions`` for chat prompts (and text prompts when ``chat``), else
    ``/completions``."""
    return CHAT if prompt.messages is not None or chat else TEXT


def merge_params(body: dict[str, Any], server_params: dict[str, Any]) -> dict[str, Any]:
    """``body`` with ``server_params`` merged last; a ``None`` value removes the field."""
    merged = {**body, **server_params}
    return {k: v for k, v in merged.items() if v is not None}


def sample_body(model: str, prompt: Prompt, path: str, *, temperature: float, top_p: float,
                max_tokens: int, seed: int, stop: list[str], logprobs: bool,
                server_params: dict[str, Any]) -> dict[str, Any]:
    """The request body that samples one candidate for ``prompt`` from ``model``."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
                            "top_p": top_p, "seed": seed, "n": 1}
    if stop:
        body["stop"] = list(stop)
    if path == CHAT:
        body["messages"] = [m.model_dump() for m in prompt.as_messages()]
        if logprobs:  # llama.cpp returns no chat log-probs unless top_logprobs is given
            body.update(logprobs=True, top_logprobs=1)
    else:
        body["prompt"] = prompt.text or prompt.display_text()
        if logprobs:
            body["logprobs"] = 1
    return merge_params(body, server_params)


def _choice(answer: dict[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerError(f"the server's answer has no choices: {str(answer)[:200]}")
    return choices[0]


def answer_text(answer: dict[str, Any], path: str) -> str:
    """The generated text of the first choice ("" when the server returned none)."""
    choice = _choice(answer)
    text = (choice.get("message") or {}).get("content") if path == CHAT else choice.get("text")
    return text if isinstance(text, str) else ""


def token_logprobs(answer: dict[str, Any], path: str) -> list[Any] | None:
    """The log-prob of every generated token, or None when the answer carries none."""
    logprobs = _choice(answer).get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if path == CHAT:
        content = logprobs.get("content")
        return None if content is None else [t.get("logprob") for t in content]
    values = logprobs.get("token_logprobs")
    return values if isinstance(values, list) else None


def parse_sample(answer: dict[str, Any], path: str, want_logprobs: bool) -> ServerSample:
    """The sample in an answer to :func:`sample_body`.

    Raises:
        ServerError: log-probs were asked for and the answer has none (the server ignores
            ``logprobs``, or ``server_params`` removed it): run with ``--no-logprobs`` to leave
            ``behavior_logp`` empty instead.
    """
    choice = _choice(answer)
    values = token_logprobs(answer, path) if want_logprobs else None
    if want_logprobs and values is None:
        raise ServerError(f"the server answered {path} without token log-probs, so "
                          "behavior_logp cannot be computed; use a server that returns them, "
                          "or pass --no-logprobs to leave behavior_logp empty")
    logp = None
    if values is not None and all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        logp = min(math.fsum(values), 0.0)
    usage = answer.get("usage") or {}
    completion_tokens = usage.get("completion_tokens")
    num_tokens = len(values) if values is not None else (
        completion_tokens if isinstance(completion_tokens, int) else None)
    reason = choice.get("finish_reason")
    return ServerSample(text=answer_text(answer, path), num_tokens=num_tokens, logp=logp,
                        finish_reason=reason if isinstance(reason, str) else None)


def first_token_top_logprobs(answer: dict[str, Any], path: str) -> dict[str, float]:
    """The top log-probs at the first generated token: ``{token text: log-prob}`` (the
    chosen token included). Empty when the answer has none.

    Chat answers list ``{"token", "logprob"}`` entries; completions answers map text to log-prob.
    """
    logprobs = _choice(answer).get("logprobs")
    if not isinstance(logprobs, dict):
        return {}
    out: dict[str, float] = {}
    if path == CHAT:
        content = logprobs.get("content") or []
        if content:
            first = content[0]
            for entry in [first, *(first.get("top_logprobs") or [])]:
                if isinstance(entry.get("token"), str) and isinstance(entry.get("logprob"), int | float):
                    out.setdefault(entry["token"], float(entry["logprob"]))
        return out
    tops = logprobs.get("top_logprobs") or []
    if tops and isinstance(tops[0], dict):
        out.update({k: float(v) for k, v in tops[0].items() if isinstance(v, int | float)})
    return out


def usage_tokens(answer: dict[str, Any]) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` from the answer's usage (0 when missing)."""
    usage = answer.get("usage") or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else 0,
            completion if isinstance(completion, int) else 0)


def error_message(status: int, text: str) -> str:
    """The server's own message from an error body (OpenAI ``{"error": {"message"}}``, FastAPI
    ``{"detail"}``, or the raw text), on one line and at most 300 characters."""
    import json

    message = text
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"])
        elif isinstance(err, str):
            message = err
        elif data.get("detail"):
            message = str(data["detail"])
        elif data.get("message"):
            message = str(data["message"])
    message = " ".join(message.split())
    return f"HTTP {status}: {message[:300]}" if message else f"HTTP {status}"
