"""What the FAKE OpenAI-compatible servers of the in-flight tests (tests/integration/test_served_overlap.py,
tests/integration/test_rank_served_overlap.py) and of benchmarks/rank_served.py share: a quiet JSON request
handler that lists its models on ``GET``, serving a handler on a free loopback port, and a
judge's answer made from a hash of the question.

These are FAKES for counting requests in flight, which real servers do not report; every test
that claims server support runs against llama.cpp (tests/support/llama_server.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler answering JSON; ``GET`` lists :attr:`models`. A fake adds ``do_POST``."""

    models: tuple[str, ...] = ()

    def log_message(self, *args: Any) -> None:
        pass

    def read_json(self) -> dict[str, Any]:
        """The request's JSON body."""
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def send_json(self, payload: dict[str, Any]) -> None:
        """``payload`` as a 200 answer."""
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_json({"object": "list",
                        "data": [{"id": m, "object": "model"} for m in self.models]})


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """The base URL (ending in ``/v1``) of ``handler`` served on a free loopback port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def prompt_of(body: dict[str, Any]) -> str:
    """The last message of a chat request, or a completion request's prompt."""
    messages = body.get("messages") or []
    return str(messages[-1]["content"]) if messages else str(body.get("prompt"))


def chat_completion(content: str, logprobs: dict[str, Any] | None,
                    finish_reason: str = "stop") -> dict[str, Any]:
    """A one-choice chat completion answering ``content`` (one usage token per word)."""
    return {"choices": [{"index": 0, "finish_reason": finish_reason, "logprobs": logprobs,
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": len(content.split())}}


def judge_answer(body: dict[str, Any], unratable: str | None = None) -> dict[str, Any]:
    """A judge's answer made from a hash of (model, question), so scores differ between
    candidates: verdict log-probs ("Yes"/"No", "A"/"B") for a one-token question, else
    ``Rating: N`` with a rationale (not a rating when the question is about a response equal
    to ``unratable``)."""
    prompt = prompt_of(body)
    digest = int(hashlib.sha256(f"{body.get('model')}|{prompt}".encode()).hexdigest()[:8], 16)
    if body.get("max_tokens") == 1:
        lp = -0.05 - (digest % 997) / 300
        tops = [{"token": t, "logprob": v} for t, v in
                (("Yes", lp), ("No", -1.0), ("A", lp), ("B", -1.0))]
        return chat_completion("Yes", {"content": [{"token": "Yes", "logprob": lp,
                                                    "top_logprobs": tops}]})
    if unratable is not None and f"[Response]\n{unratable}" in prompt:
        return chat_completion("I cannot rate this.", None)
    return chat_completion(f"Rating: {digest % 10 + 1}\nRationale: fake rationale {digest % 7}.",
                           None)
