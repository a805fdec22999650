"""One OpenAI-compatible server as :class:`~grouppref.models.served.pool.ServerPool` talks to it:
an ``httpx.AsyncClient``, a semaphore of ``concurrency``, retries with backoff and the usage
counts (the failure rules are in :mod:`grouppref.models.served.pool`'s docstring)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grouppref.models.served.protocol import (
    RequestRefused,
    ServerError,
    carried_fields,
    error_message,
    refused_fields,
    retry_after_seconds,
    usage_tokens,
)
from grouppref.models.served.settings import ServerSettings, server_label

if TYPE_CHECKING:
    import httpx

REFUSED = frozenset({400, 413, 422})
BACKOFF_BASE_S, BACKOFF_CAP_S, RETRY_AFTER_CAP_S = 0.5, 30.0, 120.0


def backoff_delay(attempt: int, retry_after: float | None, rng: random.Random,
                  base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): the server's ``Retry-After`` when
    given (at most 120 s), else full jitter ``uniform(0, min(cap, base * 2**attempt))``."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), RETRY_AFTER_CAP_S)
    return rng.uniform(0.0, min(cap, base * 2.0 ** attempt))


@dataclass(frozen=True)
class _Failure:
    """One try that failed in a way worth a retry: ``cause`` (a status, ``timeout`` or
    ``connection``), the one-line ``detail``, the server's ``Retry-After`` and the raw body."""

    cause: str
    detail: str
    retry_after: float | None = None
    body: str = ""


@dataclass
class _Counts:
    """Usage of one model on one server (see :class:`ServerUsage`)."""

    requests: int = 0
    succeeded: int = 0
    retried: int = 0
    refused: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


class ServerUnreachable(ServerError):
    """No connection to the server (refused, reset, DNS)."""


class Client:
    """One server: its ``httpx.AsyncClient``, a semaphore of ``concurrency`` and the counts."""

    def __init__(self, url: str, settings: ServerSettings, api_key: str | None,
                 rng: random.Random, backoff: tuple[float, float]) -> None:
        self.url, self.settings, self.label = url, settings, server_label(url)
        self._api_key, self._rng, self._backoff = api_key, rng, backoff
        self.counts: dict[str, _Counts] = {}
        # the uncommon request fields (server_params, structured output) of the last requests
        self.carried: deque[tuple[str, ...]] = deque(maxlen=max(8, 2 * settings.concurrency))
        self.http: httpx.AsyncClient | None = None
        self.gate: asyncio.Semaphore | None = None

    def __repr__(self) -> str:  # never the key
        return f"Client({self.label!r}, concurrency={self.settings.concurrency})"

    async def open(self) -> None:
        import httpx

        n = self.settings.concurrency
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        timeout = httpx.Timeout(self.settings.request_timeout,
                                connect=min(30.0, self.settings.request_timeout))
        self.http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout,
                                      limits=httpx.Limits(max_connections=n,
                                                          max_keepalive_connections=n))
        self.gate = asyncio.Semaphore(n)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    def _fatal(self, status: int, text: str, what: str) -> ServerError:
        message = error_message(status, text)
        if status in (401, 403):
            hint = (f"check the key in ${self.settings.api_key_env}" if self.settings.api_key_env
                    else "this server needs an API key: pass --api-key-env VAR")
            return ServerError(f"{self.label} refused the request ({message}); {hint}")
        if status == 404:
            return ServerError(f"{what} at {self.label}: not found ({message}); is the base URL "
                               "right (it usually ends in /v1) and does the server offer it?")
        return ServerError(f"{what} at {self.label} failed: {message}")

    async def send(self, method: str, path: str, body: dict[str, Any] | None, model: str,
                   retry_connect: bool = True) -> dict[str, Any]:
        """One request with retries; the answer's JSON.

        Raises:
            RequestRefused: HTTP 400/413/422, or the same HTTP 500 body twice for this request
                (a deterministic error, e.g. a ``logit_bias`` key the server cannot read).
            ServerUnreachable: no connection (at once when ``retry_connect`` is off).
            ServerError: anything else that is not retried, or retries used up.
        """
        counts = self.counts.setdefault(model, _Counts())
        what = f"{method} {path} (model {model!r})"
        previous: _Failure | None = None
        for attempt in range(self.settings.max_retries + 1):
            answer = await self._attempt(method, path, body, counts, what)
            if isinstance(answer, dict):
                return answer
            failure = answer
            counts.failures[failure.cause] += 1
            if failure.cause == "connection" and not retry_connect:
                raise ServerUnreachable(f"cannot reach the server at {self.url} "
                                        f"({failure.detail}): is it running, and is the base URL "
                                        "right?")
            if failure.cause == "500" and failure.body and previous == failure:
                counts.refused += 1
                raise RequestRefused(f"{self.label} refused {what}: {failure.detail} (the same "
                                     "HTTP 500 answer twice: an error in the request, not a "
                                     "passing fault)")
            previous = failure
            if attempt < self.settings.max_retries:
                counts.retried += 1
                await asyncio.sleep(backoff_delay(attempt, failure.retry_after, self._rng,
                                                  *self._backoff))
        if failure.cause == "connection":
            raise ServerUnreachable(f"{what} at {self.label} failed {attempt + 1} times (last: "
                                    f"{failure.detail}){self._crash_hint()}; finished shards are "
                                    "kept: run the same command again to resume")
        raise ServerError(f"{what} at {self.label} failed {attempt + 1} times (last: "
                          f"{failure.detail}); finished shards are kept: run the same command "
                          "again to resume")

    def _crash_hint(self) -> str:
        """Which uncommon fields the last requests carried, when any: a bad value in one of
        them (a ``grammar`` that does not parse) kills a llama.cpp server, and the client only
        sees the connection go."""
        fields = list(dict.fromkeys(f for carried in self.carried for f in carried))
        if not fields:
            return ""
        return (f"; the server stopped answering after requests that carried "
                f"{', '.join(fields)}: a bad value there can crash a llama.cpp server (see its "
                "log), check server_params")

    async def _attempt(self, method: str, path: str, body: dict[str, Any] | None,
                       counts: _Counts, what: str
                       ) -> dict[str, Any] | _Failure:
        """One try: the answer, or the :class:`_Failure` of a failure worth a retry."""
        import httpx

        if self.http is None or self.gate is None:
            raise RuntimeError("open() the client first")
        async with self.gate:
            t0 = time.perf_counter()
            counts.requests += 1
            if body is not None:
                self.carried.append(carried_fields(body))
            try:
                response = await self.http.request(method, path.lstrip("/"), json=body)
            except httpx.TimeoutException:
                return _Failure("timeout", f"no answer within {self.settings.request_timeout:g} s")
            except httpx.TransportError as e:
                return _Failure("connection", f"{type(e).__name__}: {e}".rstrip(": "))
            finally:
                counts.seconds += time.perf_counter() - t0
        status = response.status_code
        if status == 200:
            return self._answer(response, counts, what)
        fields = refused_fields(status, response.text)
        if status in REFUSED or fields is not None:  # (llama-cpp-python: validation as 500)
            counts.refused += 1
            counts.failures[str(status)] += 1
            raise RequestRefused(f"{self.label} refused {what}: "
                                 f"{error_message(status, response.text)}", fields or ())
        if status in (408, 425, 429) or (500 <= status < 600 and status != 501):
            return _Failure(str(status), error_message(status, response.text),
                            retry_after_seconds(response.headers.get("retry-after")),
                            response.text)
        counts.failures[str(status)] += 1
        raise self._fatal(status, response.text, what)

    def _answer(self, response: httpx.Response, counts: _Counts, what: str) -> dict[str, Any]:
        try:
            answer = response.json()
        except ValueError as e:
            raise ServerError(f"{what} at {self.label}: the answer is not JSON "
                              f"({' '.join(response.text[:120].split())!r}); is the base URL "
                              "an OpenAI-compatible API (it usually ends in /v1)?") from e
        if not isinstance(answer, dict):
            raise ServerError(f"{what} at {self.label}: the answer is not a JSON object")
        counts.succeeded += 1
        prompt_tokens, completion_tokens = usage_tokens(answer)
        counts.prompt_tokens += prompt_tokens
        counts.completion_tokens += completion_tokens
        return answer
