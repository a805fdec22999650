"""The in-flight FAKE judges (counting requests in flight) and a run of groups to rank."""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from grouppref.models.served.pool import merge_usage
from grouppref.pipeline.rank.config import RankConfig
from grouppref.pipeline.rank.core import rank_group
from grouppref.pipeline.rank.rankers import build_ranker
from grouppref.pipeline.rank.settings import annotator_for
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, from_row
from tests.support.factories import JUDGED_ROWS, imported_run
from tests.support.fake_http import JsonHandler, chat_completion, judge_answer, prompt_of, serve
from tests.support.fake_openai_server import _answer

MODELS = ("fake-a", "fake-b")


IDLE_S = 2.5  # a held request is answered after this long without a new arrival (a loaded CI


# machine once stalled the client > 1 s between two requests of one burst)


GATE_S = 30.0  # the longest a gated request waits for its gate (a guard against a deadlock)


DUPLICATE = "DUPLICATE"  # a prompt holding this gets one text for its first K answers


PROBES = ("Say OK.", "Answer with Yes or No.")  # generate's and the judge's probe: not counted


VERDICTS = (("Yes", -0.4), ("No", -1.2), ("A", -0.6), ("B", -0.9))


@dataclass


class Request:
    """One request as the fake saw it: its prompt, its number among that prompt's requests
    (0-based), and when it arrived and was answered (the fake's event counter)."""

    prompt: str
    nth: int
    start: int
    end: int = -1


@dataclass


class InFlightFake:
    """A FAKE OpenAI-compatible server for in-flight accounting only (see the module docstring).

    Attributes:
        hold (int): answer held requests once this many are in flight.
        k (int): answers per prompt that a ``DUPLICATE`` prompt repeats.
        alone (int): the first this many requests are answered at once (counted, neither held
            nor gated): a check that sends one request by itself before a stage would
            otherwise wait out ``IDLE_S``, or ``GATE_S`` for a gate that the stage opens.
    """

    hold: int
    k: int = 0
    alone: int = 0
    now: int = 0
    max_in_flight: int = 0
    requests: list[Request] = field(default_factory=list)
    _clock: int = 0
    _release: int = 0  # bumped each time ``hold`` requests are in flight: releases them all
    _last_arrival: float = 0.0
    _per_prompt: Counter[str] = field(default_factory=Counter)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    gate: threading.Event | None = None  # when given, held requests also wait for it (GATE_S)

    def arrive(self, prompt: str) -> Request:
        with self._cond:
            self._clock += 1
            self.now += 1
            self.max_in_flight = max(self.max_in_flight, self.now)
            request = Request(prompt, self._per_prompt[prompt], self._clock)
            self._per_prompt[prompt] += 1
            self.requests.append(request)
            self._last_arrival = time.monotonic()
            generation = self._release
            self._cond.notify_all()  # (wait_in_flight)
            if self.now >= self.hold:
                self._release += 1
                self._cond.notify_all()
            if len(self.requests) <= self.alone:
                return request
            while (self._release == generation
                   and time.monotonic() - self._last_arrival < IDLE_S):
                self._cond.wait(timeout=0.05)
            deadline = time.monotonic() + GATE_S
            while self.gate is not None and not self.gate.is_set() and time.monotonic() < deadline:
                self._cond.wait(timeout=0.05)
            return request

    def wait_in_flight(self, timeout: float) -> int:
        """Requests in flight once there is one (or ``timeout`` seconds passed)."""
        with self._cond:
            self._cond.wait_for(lambda: self.now > 0, timeout=timeout)
            return self.now

    def leave(self, request: Request) -> None:
        with self._cond:
            self._clock += 1
            self.now -= 1
            request.end = self._clock

    def answer(self, path: str, body: dict[str, Any], request: Request) -> dict[str, Any]:
        """Generate: the fake's usual seeded text (one text for a DUPLICATE prompt's first K);
        judge (one token asked for): "Yes", with the pointwise and pairwise verdicts among the top
        log-probs."""
        if body.get("max_tokens") == 1:
            tops = [{"token": t, "logprob": lp} for t, lp in VERDICTS]
            return chat_completion("Yes", {"content": [
                {"token": "Yes", "logprob": -0.4, "top_logprobs": tops}]}, "length")
        answer = _answer(path, body)
        if DUPLICATE in request.prompt and request.nth < self.k:
            answer["choices"][0]["message"]["content"] = "the same answer"
        return answer

    def in_flight_together(self, a: Request, b: Request) -> bool:
        return a.start < b.end and b.start < a.end


def _handler(fake: InFlightFake) -> type[JsonHandler]:
    class Handler(JsonHandler):
        models = MODELS

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.read_json()
            if prompt_of(body) in PROBES:  # answered at once, outside the accounting
                self.send_json(fake.answer(self.path, body, Request("", fake.k, 0)))
                return
            request = fake.arrive(prompt_of(body))
            try:
                self.send_json(fake.answer(self.path, body, request))
            finally:
                fake.leave(request)

    return Handler


def serve_fake(fake: InFlightFake) -> AbstractContextManager[str]:
    """The base URL of ``fake`` served on a free loopback port (several servers may share one
    fake: its counts are then across them)."""
    return serve(_handler(fake))


UNRATABLE = "London."  # a rubric answer about this candidate is not a rating (a part-reject)


@dataclass


class VaryingFake(InFlightFake):
    """The in-flight FAKE with answers made from a hash of (model, question), so scores differ
    between candidates: verdict log-probs for one-token questions, ``Rating: N`` for rubric
    questions (not a rating for a question about :data:`UNRATABLE`). A request stops counting
    as in flight when its answer is made, before it is sent, so the count is never more than
    the client has in flight."""

    def answer(self, path: str, body: dict[str, Any], request: Request) -> dict[str, Any]:
        if request.start:  # not a probe (probes are answered outside the accounting)
            InFlightFake.leave(self, request)
        return judge_answer(body, unratable=UNRATABLE)

    def leave(self, request: Request) -> None:
        """Counted in :meth:`answer`."""


def _judge_of(request: Request) -> str:
    if request.prompt.endswith("Answer with A or B."):
        return "pairwise"
    return "rubric" if "Rate the response" in request.prompt else "pointwise"


def _max_overlap(requests: list[Request]) -> int:
    """Most of ``requests`` in flight at once (the fake's event clock)."""
    events = sorted([(r.start, 1) for r in requests] + [(r.end, -1) for r in requests])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _judge(mode: str, model: str, url: str, concurrency: int) -> dict[str, Any]:
    return {"kind": "judge", "backend": "openai", "model": model, "mode": mode,
            "server": {"base_url": url, "concurrency": concurrency}}


@pytest.fixture


def groups_run(tmp_path: Path) -> RunStore:
    """Two hand-written groups of K = 3 in a run (the rankers' input)."""
    return imported_run(tmp_path, JUDGED_ROWS)


def _servers(fake: VaryingFake, n: int, stack: ExitStack) -> list[str]:
    """``n`` loopback servers sharing ``fake`` (its counts are across all of them)."""
    return [stack.enter_context(serve_fake(fake)) for _ in range(n)]


def _one_after_another(store: RunStore, config: RankConfig
                       ) -> tuple[list[AnnotatedGroup], list[tuple[Any, ...]], list[dict[str, Any]]]:
    """The stage's rankings, part-rejects and usage computed as before: each ranker with its
    own connection pool scoring a shard's groups, one ranker after another."""
    keep = AnnotatedGroup.model_fields
    groups = [from_row(AnnotatedGroup, {k: v for k, v in row.items() if k in keep})
              for row in store.load_dataset(config.input_stage)]
    rankers = [build_ranker(s) for s in config.rankers]
    try:
        for ranker in rankers:
            ranker.check()
            ranker.load()
        size = config.shard_size  # the shards' groups are scored together, as in the stage
        shards = [groups[at:at + size] for at in range(0, len(groups), size)]
        outcomes = [[o for shard in shards for o in r.score(shard)] for r in rankers]
    finally:
        for ranker in rankers:
            if hasattr(ranker, "close"):
                ranker.close()
    annotators = [annotator_for(s) for s in config.rankers]
    records, rejects = [], []
    for j, group in enumerate(groups):
        record, part = rank_group(group, [o[j] for o in outcomes], config, annotators, j + 1)
        records.append(record)
        rejects += [(r.row, r.group_id, r.field, r.reason, r.scope) for r in part]
    usage = merge_usage([], [u for r in rankers if hasattr(r, "usage") for u in r.usage()])
    return records, rejects, usage


def _without_times(group: AnnotatedGroup) -> dict[str, Any]:
    """The group as a dict, without its rankings' ``created_at``."""
    row = group.model_dump()
    for ranking in row["rankings"]:
        ranking.pop("created_at")
    return row
