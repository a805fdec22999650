"""The OpenAI completions protocol as grouppref speaks it: request bodies for sampling a
candidate, and the parts of an answer it reads (text, token log-probs, the first token's top
log-probs, usage). Pure functions over JSON; the HTTP side is :mod:`grouppref.models.served.pool`.

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

import json
import math
import re
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
    context, or a request its validation refused): that row is rejected with the server's
    message; the stage goes on. ``fields`` names the request fields a validation error
    pointed at (top-level names, e.g. ``top_k``), when the server said."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


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


def neutral_params(mode: str, entry: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The server kind and the values that switch off its own samplers, for a
    ``neutral_sampling`` setting (``auto``: the kind ``entry``, the model's ``GET /models``
    entry, names; a kind forces it; ``off``: none)."""
    kind = server_kind(entry) if mode == "auto" else None if mode == "off" else mode
    return kind, dict(NEUTRAL_SAMPLING.get(kind or "", {}))


def param_origins(mode: str, kind: str | None, server_params: dict[str, Any],
                  own: dict[str, str] | None = None) -> dict[str, str]:
    """Request field -> the setting that puts it in the body, for naming the setting when a
    server refuses a field: ``own`` (a stage's settings, e.g. ``{"top_p": "top_p"}``), then
    the neutral values of ``kind``, then ``server_params`` (the last one wins)."""
    neutral = {k: f"neutral_sampling {mode!r} ({kind} server)" for k in NEUTRAL_SAMPLING.get(
        kind or "", {})}
    return {**(own or {}), **neutral, **dict.fromkeys(server_params, "server_params")}


# the request fields every grouppref request may carry (and the neutral sampler values): any
# other field (server_params such as grammar, json_schema, logit_bias; response_format) is
# "carried", and named when a server stops answering right after requests with it
ORDINARY_FIELDS = frozenset({
    "model", "messages", "prompt", "max_tokens", "temperature", "top_p", "seed", "n", "stop",
    "logprobs", "top_logprobs", "stream", "echo",
    *(k for values in NEUTRAL_SAMPLING.values() for k in values)})


def carried_fields(body: dict[str, Any]) -> tuple[str, ...]:
    """The fields of a request body beyond :data:`ORDINARY_FIELDS`, in body order."""
    return tuple(k for k in body if k not in ORDINARY_FIELDS)


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds or an HTTP date (RFC 9110
    10.2.3); None when absent or unreadable.

    Example:
        >>> retry_after_seconds("2"), retry_after_seconds("Thu, 01 Jan 1970 00:00:00 GMT")
        (2.0, 0.0)
    """
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    import email.utils
    import time

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


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


@dataclass(frozen=True)
class FieldProblem:
    """One request field a server's validation refused: ``field`` (dotted path in the body,
    e.g. ``top_k`` or ``messages.0.role``), the server's ``message`` and the value sent."""

    field: str
    message: str
    value: Any = None


# llama-cpp-python's server (0.3.x) answers a request its pydantic models refuse with HTTP 500,
# {"error": {"message": "1 validation error:\n  {'type': ..., 'loc': ('body', 'top_k'),
# 'msg': ..., 'input': -1, ...}\n\n  File ...", "type": "internal_server_error"}}: one
# Python-repr dict per line. FastAPI's own form (HTTP 422) is {"detail": [{"loc": [...], ...}]}.
_VALIDATION = re.compile(r"^\d+ validation errors?:")
_PROBLEM_LINE = re.compile(r"'loc': \(([^)]*)\), 'msg': (?P<q>['\"])(.*?)(?P=q)(?:, 'input': (.*?))?"
                           r"(?:, 'ctx'|, 'url'|\}$)")


def _problem(loc: Any, message: Any, value: Any) -> FieldProblem | None:
    parts = [str(x) for x in loc] if isinstance(loc, list | tuple) else []
    if len(parts) < 2 or parts[0] != "body":
        return None
    return FieldProblem(".".join(parts[1:]), str(message), value)


def validation_problems(status: int, text: str) -> list[FieldProblem]:
    """The request fields a server's validation refused, from an error body: FastAPI's 422
    ``detail`` list, or llama-cpp-python's HTTP 500 whose message is pydantic's error list
    (see above). Empty for any other answer, e.g. a real fault inside the server.

    Example:
        >>> body = {"error": {"message": "1 validation error:\\n  {'type': 'greater_than_equal', "
        ...         "'loc': ('body', 'top_k'), 'msg': 'Input should be greater than or equal "
        ...         "to 0', 'input': -1, 'ctx': {'ge': 0}}\\n\\n  File ..."}}
        >>> validation_problems(500, json.dumps(body))
        [FieldProblem(field='top_k', message='Input should be greater than or equal to 0', value=-1)]
    """
    try:
        data = json.loads(text)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    if status == 422 and isinstance(data.get("detail"), list):
        found = [_problem(d.get("loc"), d.get("msg"), d.get("input"))
                 for d in data["detail"] if isinstance(d, dict)]
        return [p for p in found if p is not None]
    error = data.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    if status != 500 or not isinstance(message, str) or not _VALIDATION.match(message):
        return []
    out = []
    for line in message.splitlines()[1:]:
        m = _PROBLEM_LINE.search(line.strip())
        if m is None:
            continue
        loc = [part.strip().strip("'\"") for part in m.group(1).split(",") if part.strip()]
        value = _literal(m.group(4)) if m.group(4) is not None else None
        if (problem := _problem(loc, m.group(3), value)) is not None:
            out.append(problem)
    return out


def _literal(text: str) -> Any:
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def refused_fields(status: int, text: str) -> tuple[str, ...] | None:
    """The top-level request fields named by a validation error in this answer (in order,
    once each), or None when it is not one. A llama-cpp-python HTTP 500 that is a validation
    error is a refused request (never retried); any other 500 is a fault worth a retry."""
    problems = validation_problems(status, text)
    if not problems:
        return None
    return tuple(dict.fromkeys(p.field.split(".")[0] for p in problems))


def error_message(status: int, text: str) -> str:
    """The server's own message from an error body (OpenAI ``{"error": {"message"}}``, FastAPI
    ``{"detail"}``, or the raw text), on one line and at most 300 characters. A validation
    error names each refused field with the value sent: ``HTTP 500: request field top_k=-1:
    Input should be greater than or equal to 0``."""
    problems = validation_problems(status, text)
    if problems:
        shown = "; ".join(f"request field {p.field}={p.value!r}: {p.message}"
                          for p in problems[:3])
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return f"HTTP {status}: {shown[:300]}{more}"
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
    if message is text and _HTML.match(text):  # a proxy's or web server's error page
        message = re.sub(r"<(script|style)\b.*?</\1>|<[^>]*>", " ", text, flags=re.S | re.I)
    message = " ".join(message.split())
    return f"HTTP {status}: {message[:300]}" if message else f"HTTP {status}"


_HTML = re.compile(r"\s*<(!doctype\s+html|html|head|body|h1|title)\b", re.I)
