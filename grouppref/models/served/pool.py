"""A client for OpenAI-compatible inference servers: async httpx, many requests in flight,
retries with backoff, the model checked before any work, and token usage counted.

:class:`ServerPool` is what a stage uses: one event loop (``asyncio.Runner``) and one
``httpx.AsyncClient`` (its connection pool) per server for the whole stage, driven from the
stage's ordinary synchronous code::

    with ServerPool({url: settings}) as pool:
        pool.check_model(url, "Qwen/Qwen2.5-7B-Instruct")      # before any work
        answers = pool.post(url, "/chat/completions", bodies)   # in order; concurrent
        pool.run(gather([pool.request(url, path, b) for b in more]))  # any mix of servers/paths
        job = pool.start(gather([...]))                         # the same, in a thread
        ...                                                     # (e.g. a local model generates)
        answers = job.result()

The check before a stage (:meth:`ServerPool.first_request`) sends the stage's first real
request and keeps its answer: when the stage later sends the same body, :meth:`request`
hands back the kept answer instead of asking again, so the check costs no request beyond
``GET /models``. Only when that first request is refused does a short probe
(:meth:`ServerPool.probe`) tell a refused setting (:class:`ServerError`, naming the setting
the refused field comes from) from a refused prompt (that row is rejected as usual).

Each server's client lets ``concurrency`` requests be in flight (a semaphore and a connection
pool of that size); everything awaited inside one ``run`` shares the event loop, so requests
to several servers, models and paths overlap, and a coroutine may send follow-up requests
(re-samples) while others are still in flight.

Failures:

- 429, 5xx (but 501), a timeout or a dropped connection: retried up to ``max_retries`` times
  after ``uniform(0, min(cap, base * 2**attempt))`` seconds ("full jitter"), or after the
  server's ``Retry-After`` (seconds or an HTTP date) when it sends one; then
  :class:`ServerError` (the stage stops; its finished shards are kept and a re-run resumes).
  When the connection is what failed, the message names the uncommon fields
  (:func:`~grouppref.models.served.protocol.carried_fields`: ``grammar``, ``logit_bias``, ...) that
  the last requests carried: a bad ``grammar`` kills a llama.cpp server.
- 400 / 413 / 422, an HTTP 500 whose body is a request validation error
  (llama-cpp-python's server answers those with 500:
  :func:`~grouppref.models.served.protocol.validation_problems`), and the same HTTP 500 body twice
  for one request (a deterministic error, e.g. a ``logit_bias`` key that is not a token id;
  a 500 with another or no body is retried as a passing fault): that request is refused for
  good; ``post`` returns the :class:`RequestRefused` in its place (naming the refused fields)
  and the caller rejects the row.
- 401 / 403 / 404 and anything else: :class:`ServerError` at once.

The API key is read from its environment variable when the pool opens and lives only in the
clients' ``Authorization`` header; nothing here logs, prints or stores it.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from grouppref.models.served.aio import Background, gather
from grouppref.models.served.client import (
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    Client,
    ServerUnreachable,
    backoff_delay,
)
from grouppref.models.served.protocol import RequestRefused, ServerError, carried_fields
from grouppref.models.served.settings import ServerSettings, read_api_key, server_label
from grouppref.schemas.reports import ServerUsage

__all__ = ["Background", "RequestRefused", "ServerError", "ServerPool", "ServerUnreachable",
           "backoff_delay", "gather", "merge_usage"]

class ServerPool:
    """The servers a stage talks to (see the module docstring).

    Args:
        servers (Mapping[str, ServerSettings]): base URL -> its settings.
        backoff (tuple[float, float]): ``(base, cap)`` seconds of the retry backoff.
        seed (int): seed of the jitter (retries are the only randomness here).

    Raises:
        ConfigError: on entering, when a named ``api_key_env`` variable is not set.
    """

    def __init__(self, servers: Mapping[str, ServerSettings],
                 backoff: tuple[float, float] = (BACKOFF_BASE_S, BACKOFF_CAP_S),
                 seed: int = 0) -> None:
        self._settings = dict(servers)
        self._backoff, self._rng = backoff, random.Random(seed)
        self._clients: dict[str, Client] = {}
        self._runner: asyncio.Runner | None = None
        self._listed: dict[str, dict[str, Any]] = {}  # url -> its GET /models answer
        # answers sent ahead by first_request, by (url, path, body), until the work asks
        self._kept: dict[tuple[str, str, str], list[dict[str, Any] | RequestRefused]] = {}

    def __enter__(self) -> ServerPool:
        keys = {url: read_api_key(s.api_key_env) for url, s in self._settings.items()}
        self._clients = {url: Client(url, s, keys[url], self._rng, self._backoff)
                         for url, s in self._settings.items()}
        self._runner = asyncio.Runner()
        self._runner.__enter__()
        for client in self._clients.values():
            self._runner.run(client.open())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is None:
            return
        for client in self._clients.values():
            self._runner.run(client.close())
        self._runner.__exit__(None, None, None)
        self._runner = None

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        if self._runner is None:
            raise RuntimeError("use the ServerPool as a context manager")
        return self._runner.run(coroutine)

    def check_model(self, url: str, model: str) -> dict[str, Any]:
        """The ``/models`` entry of ``model`` at ``url`` (asked once per server and pool).

        Raises:
            ServerError: unreachable, key refused, not an OpenAI base URL, or the model is not
                served there (the message lists what is).
        """
        client = self._clients[url]
        listed = self._listed.get(url)
        if listed is None:  # once per server and pool (several judges may share a server)
            try:
                listed = self._run(client.send("GET", "/models", None, model, retry_connect=False))
            except RequestRefused as e:
                raise ServerError(str(e)) from e
            self._listed[url] = listed
        entries = listed.get("data")
        if not isinstance(entries, list):
            raise ServerError(f"GET {url}/models did not list models (is {url} an OpenAI "
                              "base URL? it usually ends in /v1)")
        ids = [e.get("id") for e in entries if isinstance(e, dict)]
        if model not in ids:
            shown = ", ".join(repr(i) for i in ids[:10]) + (", ..." if len(ids) > 10 else "")
            raise ServerError(f"model {model!r} is not served at {client.label}; it serves: "
                              f"{shown or 'nothing'}")
        return next(e for e in entries if isinstance(e, dict) and e.get("id") == model)

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` (built from :meth:`request` calls, e.g. a ``TaskGroup`` of many) on
        the pool's event loop and return its result; the stage's synchronous code calls this."""
        return self._run(coroutine)

    def start(self, coroutine: Coroutine[Any, Any, Any]) -> Background:
        """Run ``coroutine`` as :meth:`run` does, but in a background thread, so that the
        caller's thread can work meanwhile (e.g. an in-process model generating while the
        requests are in flight); :meth:`Background.result` waits for it. The pool takes no
        other :meth:`run` or :meth:`start` until then."""
        if self._runner is None:
            raise RuntimeError("use the ServerPool as a context manager")
        return Background(self._runner, coroutine)

    async def request(self, url: str, path: str, body: dict[str, Any]
                      ) -> dict[str, Any] | RequestRefused:
        """One POST with retries, waiting for a free place among the server's ``concurrency``;
        the answer, or the :class:`RequestRefused` of a refused request. To be awaited inside
        :meth:`run`, with as many others as there is work (requests to several servers and
        paths share one event loop; each server's own limit applies).

        Raises:
            ServerError: the request failed for good.
        """
        if self._kept and (kept := self._kept.get(_body_key(url, path, body))):
            return kept.pop(0)  # sent ahead by first_request
        try:
            return await self._clients[url].send("POST", path, body, str(body.get("model")))
        except RequestRefused as refused:
            return refused

    def first_request(self, url: str, path: str, body: dict[str, Any], probe: dict[str, Any],
                      origins: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Send ``body``, the stage's first real request, before the stage starts, and keep
        its answer (or refusal) for the :meth:`request` of the same body that the work sends
        later. Returns the answer that shows the settings work: ``body``'s own, or, when the
        server refused ``body``, the answer to the short ``probe`` (then only that prompt is
        at fault; its refusal is kept and the row is rejected as usual).

        Raises:
            ServerError: the probe is refused too (see :meth:`probe`), or the request failed.
        """
        [answer] = self.post(url, path, [body])
        self._kept.setdefault(_body_key(url, path, body), []).append(answer)
        if isinstance(answer, RequestRefused):
            return self.probe(url, path, probe, origins)
        return answer

    def probe(self, url: str, path: str, body: dict[str, Any],
              origins: Mapping[str, str] | None = None) -> dict[str, Any]:
        """One short request with the stage's settings, which the server must answer.

        Raises:
            ServerError: refused: one line with the server's message and, for each refused
                field found in ``origins`` (top-level body field -> the setting that puts it
                there, e.g. ``{"top_k": "neutral_sampling 'vllm'"}``), that setting.
        """
        [answer] = self.post(url, path, [body])
        if not isinstance(answer, RequestRefused):
            return answer
        named = [f"{f} comes from {origins[f]}" for f in answer.fields if origins and f in origins]
        params = [f for f in carried_fields(body) if (origins or {}).get(f) == "server_params"]
        hint = ("; ".join(named) if named else f"it carried {', '.join(params)} from "
                "server_params: check their values" if params
                else "check the settings and server_params")
        raise ServerError(f"model {body.get('model')!r} at {server_label(url)} refuses "
                          f"grouppref's requests ({answer}); {hint}")

    def post(self, url: str, path: str, bodies: Sequence[dict[str, Any]],
             on_answer: Callable[[int, dict[str, Any] | RequestRefused], None] | None = None
             ) -> list[dict[str, Any] | RequestRefused]:
        """Send every body (at most ``concurrency`` in flight); answers in the bodies' order,
        with a :class:`RequestRefused` in place of a refused one. ``on_answer(i, answer)`` is
        called as each one arrives (progress).

        Raises:
            ServerError: the first request that failed for good (the others are cancelled).
        """
        async def one(i: int, body: dict[str, Any]) -> dict[str, Any] | RequestRefused:
            answer = await self.request(url, path, body)
            if on_answer is not None:
                on_answer(i, answer)
            return answer

        return self._run(gather([one(i, b) for i, b in enumerate(bodies)])) if bodies else []

    def usage(self) -> list[ServerUsage]:
        """This pool's usage per (server, model), in first-use order."""
        return [ServerUsage(server=c.label, model=model, requests=n.requests,
                            succeeded=n.succeeded, retried=n.retried, refused=n.refused,
                            failures=dict(n.failures), prompt_tokens=n.prompt_tokens,
                            completion_tokens=n.completion_tokens,
                            request_seconds=round(n.seconds, 3))
                for c in self._clients.values() for model, n in c.counts.items()]


def _body_key(url: str, path: str, body: dict[str, Any]) -> tuple[str, str, str]:
    return url, path, json.dumps(body, sort_keys=True, separators=(",", ":"))


def merge_usage(before: Sequence[dict[str, Any]], now: Sequence[ServerUsage]) -> list[dict[str, Any]]:
    """Usage of earlier sessions (manifest JSON) plus this session's, per (server, model)."""
    total: dict[tuple[str, str], ServerUsage] = {}
    for item in [*(ServerUsage.model_validate(b) for b in before), *now]:
        key = (item.server, item.model)
        if key not in total:
            total[key] = item.model_copy(deep=True)
            continue
        t = total[key]
        failures = Counter(t.failures) + Counter(item.failures)
        total[key] = t.model_copy(update={
            "requests": t.requests + item.requests, "succeeded": t.succeeded + item.succeeded,
            "retried": t.retried + item.retried, "refused": t.refused + item.refused,
            "failures": dict(failures), "prompt_tokens": t.prompt_tokens + item.prompt_tokens,
            "completion_tokens": t.completion_tokens + item.completion_tokens,
            "request_seconds": round(t.request_seconds + item.request_seconds, 3)})
    return [u.model_dump(mode="json") for u in total.values()]
