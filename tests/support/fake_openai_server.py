"""A small FAKE OpenAI-compatible server for the retry paths (429, 503, refusals) that a real
server cannot be made to produce on demand. It is named as a fake and used *in addition to*
the real llama.cpp server (tests/support/llama_server.py), never instead of it: every test that
claims server support runs against llama.cpp.

It answers ``GET /v1/models`` (one model, ``fake``) and ``POST /v1/chat/completions`` /
``/v1/completions``: first the statuses queued in ``script`` (429 with ``Retry-After: 0``,
503, ..., or ``SLOW``: no answer for ``SLOW_S`` seconds, for request timeouts), then 200
with a text made from the request's seed and two token log-probs (-0.5, -0.25). A prompt
containing ``TOO LONG`` is refused with 400, as servers refuse prompts longer than their
context.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake"
TOKEN_LOGPROBS = (-0.5, -0.25)
SLOW, SLOW_S = 0, 2.0  # a script entry: answer only after SLOW_S seconds


@dataclass
class FakeState:
    """What the fake will answer next, and what it was asked."""

    script: list[int] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)  # path, headers, body
    lock: threading.Lock = field(default_factory=threading.Lock)


def _answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
    text = f"answer {body.get('seed')}"
    tokens = [{"token": t, "logprob": lp, "top_logprobs": [{"token": t, "logprob": lp}]}
              for t, lp in zip(text.split(" "), TOKEN_LOGPROBS, strict=True)]
    if path.endswith("/chat/completions"):
        choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                  "logprobs": {"content": tokens} if body.get("logprobs") else None}
    else:
        choice = {"text": text, "finish_reason": "stop", "logprobs": {
            "tokens": [t["token"] for t in tokens],
            "token_logprobs": list(TOKEN_LOGPROBS)} if body.get("logprobs") else None}
    return {"choices": [{"index": 0, **choice}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


def _handler(state: FakeState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
                  ) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a request timeout)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": "no such route"}})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            too_long = "TOO LONG" in json.dumps(body)
            with state.lock:
                state.requests.append({"path": self.path, "headers": dict(self.headers),
                                       "body": body})
                status = state.script.pop(0) if state.script and not too_long else 200
            if status == SLOW:
                time.sleep(SLOW_S)
                status = 200
            if too_long:
                self._send(400, {"error": {"message": "prompt is longer than the context"}})
            elif status == 429:
                self._send(429, {"error": {"message": "rate limited"}}, {"Retry-After": "0"})
            elif status != 200:
                self._send(status, {"error": {"message": "overloaded"}})
            else:
                self._send(200, _answer(self.path, body))

    return Handler


@contextmanager
def fake_openai_server(script: list[int] | None = None) -> Iterator[tuple[str, FakeState]]:
    """``(base URL ending in /v1, state)`` of a fake server on a free loopback port."""
    state = FakeState(script=list(script or []))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", state
    finally:
        server.shutdown()
        server.server_close()
