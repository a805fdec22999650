"""Several served judges in one rank stage: one after another (the peer: each judge with its own
connection pool, as before) vs together (:class:`ShardScorer`: one event loop, each server's
own limit), against FAKE servers that answer every request after a fixed delay.

The servers are FAKES (:class:`DelayFake`, served on loopback by tests/support/fake_http.py, the
plumbing the in-flight tests use too): each holds every request for ``--delay`` seconds, then
answers with verdict log-probs (one-token questions) or ``Rating: N`` (rubric questions), made
from a hash of the question (:func:`tests.support.fake_http.judge_answer`), and counts the requests in
flight. They measure what the client overlaps, not a model: with a fixed delay, the wall time
is set by how many requests are in flight at once. Judges: pointwise on server 1, pairwise on
server 2, rubric on server 1 (so server 1 is shared by two judges), each at ``--concurrency``.
Both sides score the same groups; the script checks that their outcomes are equal.

Expected, with G groups of K and concurrency c (waves of c requests, ``delay`` each): one after
another ``(GK/c + GK(K-1)/c + GK/c) * delay``; together ``max(2GK/c, GK(K-1)/c) * delay``.

Example:
    .venv/bin/python benchmarks/rank_served.py --groups 16 --k 4 --concurrency 4 --delay 0.05
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from grouppref.pipeline.rank.rankers import build_ranker
from grouppref.pipeline.rank.settings import JudgeRankerSettings
from grouppref.pipeline.rank.shard_scoring import ShardScorer
from grouppref.schemas import AnnotatedGroup
from tests.support.factories import make_group
from tests.support.fake_http import JsonHandler, judge_answer, serve

MODEL = "fake-judge"


@dataclass
class InFlight:
    """Requests in flight now, the most at once, and the requests seen."""

    now: int = 0
    most: int = 0
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def step(self, by: int) -> None:
        with self.lock:
            self.now += by
            self.requests += by > 0
            self.most = max(self.most, self.now)


@dataclass
class DelayFake:
    """A FAKE OpenAI-compatible server: every request answered after ``delay`` seconds; counted
    in its own tally and in one shared by all the fakes of a run."""

    delay: float
    shared: InFlight
    own: InFlight = field(default_factory=InFlight)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        for tally in (self.own, self.shared):
            tally.step(1)
        time.sleep(self.delay)
        for tally in (self.own, self.shared):
            tally.step(-1)
        return judge_answer(body)


def _handler(fake: DelayFake) -> type[JsonHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms ACK stall
        models = (MODEL,)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.send_json(fake.answer(self.read_json()))

    return Handler


def workload(n: int, k: int) -> list[AnnotatedGroup]:
    return [AnnotatedGroup(**dict(make_group(prompt_text=f"What is {i} + {i}?",
                                             texts=[f"It is {2 * i + j}." for j in range(k)])))
            for i in range(n)]


def judges(url1: str, url2: str, concurrency: int) -> list[JudgeRankerSettings]:
    server = {"concurrency": concurrency}
    return [JudgeRankerSettings(backend="openai", model=MODEL, mode=mode,
                                server={**server, "base_url": url})
            for mode, url in (("pointwise", url1), ("pairwise", url2), ("rubric", url1))]


def one_after_another(settings: list[JudgeRankerSettings], groups: list[AnnotatedGroup]
                      ) -> tuple[float, list[Any]]:
    rankers = [build_ranker(s) for s in settings]
    try:
        for r in rankers:
            r.connect(groups[0])  # own pool: /models and the first question (kept), untimed
        t0 = time.perf_counter()
        out = [r.score(groups) for r in rankers]
        return time.perf_counter() - t0, out
    finally:
        for r in rankers:
            r.close()


def together(settings: list[JudgeRankerSettings], groups: list[AnnotatedGroup]
             ) -> tuple[float, list[Any]]:
    with ShardScorer([build_ranker(s) for s in settings]) as scorer:
        scorer.connect(groups[0])  # shared pool: /models and first questions (kept), untimed
        t0 = time.perf_counter()
        out = scorer.score(groups)
        return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per request")
    args = parser.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    groups = workload(args.groups, args.k)
    rows = []
    for label, run in (("one after another", one_after_another), ("together", together)):
        both = InFlight()
        fakes = [DelayFake(args.delay, both), DelayFake(args.delay, both)]
        with ExitStack() as stack:
            url1, url2 = (stack.enter_context(serve(_handler(f))) for f in fakes)
            seconds, out = run(judges(url1, url2, args.concurrency), groups)
        rows.append((label, seconds, [f.own.most for f in fakes] + [both.most], both.requests,
                     out))
    g, k, c = args.groups, args.k, args.concurrency
    waves = {"one after another": -(-g * k // c) * 2 + -(-g * k * (k - 1) // c),
             "together": max(-(-2 * g * k // c), -(-g * k * (k - 1) // c))}
    print(f"{g} groups, K={k}, concurrency {c} per judge, fake delay {args.delay:g} s/request")
    print(f"{'side':<18} {'wall s':>7} {'expected s':>10} {'most in flight: s1':>18} "
          f"{'s2':>3} {'both':>5} {'requests':>8}")
    for label, seconds, most, requests, _ in rows:
        print(f"{label:<18} {seconds:>7.2f} {waves[label] * args.delay:>10.2f} {most[0]:>18} "
              f"{most[1]:>3} {most[2]:>5} {requests:>8}")
    print(f"speed-up together / one after another: {rows[0][1] / rows[1][1]:.2f}x; "
          f"outcomes equal: {rows[0][4] == rows[1][4]}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
