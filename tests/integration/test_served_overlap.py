"""Requests to an inference server overlap: ``generate`` and the served ``judge`` keep
``min(concurrency, requests pending)`` requests in flight, re-samples included.

The server here is a FAKE (:class:`InFlightFake`, a small loopback HTTP server), used ONLY to
count the requests in flight, which a real server does not report; it holds each request until
``hold`` requests are in flight (or none arrived for ``IDLE_S``), so the count is exact rather
than a race. The real llama.cpp server tests are tests/system/test_openai_backend.py and
tests/system/test_judge_server.py. No wall-clock threshold: only counts and the order of events.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from grouppref.models.served.pool import ServerPool, gather
from grouppref.models.served.settings import ServerSettings
from grouppref.pipeline.generate.config import GenerateConfig, ModelShare
from grouppref.pipeline.generate.stage import run_generate
from grouppref.pipeline.rank.config import RankConfig
from grouppref.pipeline.rank.stage import run_rank
from grouppref.runs.store import RunStore
from grouppref.schemas import Prompt
from tests.support.factories import JUDGED_ROWS, imported_run
from tests.support.fake_openai_server import MODEL as FAKE_MODEL
from tests.support.fake_openai_server import SLOW, fake_openai_server
from tests.support.served_fakes import (
    DUPLICATE,
    GATE_S,
    MODELS,
    InFlightFake,
    serve_fake,
)


@contextmanager
def in_flight_fake(hold: int, k: int = 0, gate: threading.Event | None = None, alone: int = 1
                   ) -> Iterator[tuple[str, InFlightFake]]:
    """``(base URL, fake)`` of an :class:`InFlightFake` on a free loopback port; the first
    ``alone`` requests (each test's check, sent before its stage) are answered at once."""
    fake = InFlightFake(hold=hold, k=k, gate=gate, alone=alone)
    with serve_fake(fake) as url:
        yield url, fake


def _generate(tmp_path: Path, url: str, texts: list[str], k: int, concurrency: int,
              models: tuple[str, ...] = MODELS[:1], max_resample: int = 0) -> Any:
    per_model = k // len(models)
    config = GenerateConfig(
        models=[ModelShare.parse(f"openai:{m}@{url}:{per_model}") for m in models],
        server={"concurrency": concurrency}, max_new_tokens=4, max_resample=max_resample)
    prompts = [Prompt(prompt_id=f"p{n}", text=t) for n, t in enumerate(texts)]
    return run_generate(RunStore(tmp_path / "run"), config, prompts=prompts, show_progress=False)


@pytest.mark.parametrize(("n_prompts", "k", "concurrency"), [(3, 4, 4), (1, 3, 4), (2, 4, 8)])
def test_generate_keeps_min_of_concurrency_and_pending_in_flight(
        tmp_path: Path, n_prompts: int, k: int, concurrency: int) -> None:
    # the first draw is sent alone by the check, before the stage: the stage sends the rest
    pending = n_prompts * k - 1
    with in_flight_fake(hold=min(concurrency, pending)) as (url, fake):
        stage = _generate(tmp_path, url, [f"question {n}" for n in range(n_prompts)], k,
                          concurrency)
    assert len(fake.requests) == 1 + pending
    assert fake.max_in_flight == min(concurrency, pending)
    assert stage.manifest.counts.outputs == n_prompts
    assert all(len(g.candidates) == k for g in stage.records())


def test_generate_sends_every_served_model_of_the_mix_together(tmp_path: Path) -> None:
    # two models, 2 slots each, 2 prompts: 8 requests, of which the check sends each model's
    # first; the stage's other 6 go together (a per-model loop would keep 3 in flight)
    with in_flight_fake(hold=6, alone=2) as (url, fake):
        stage = _generate(tmp_path, url, ["one question", "another question"], 4, 8,
                          models=MODELS)
    assert (len(fake.requests), fake.max_in_flight) == (8, 6)
    for group in stage.records():
        assert sorted(c.source.model for c in group.candidates) == ["fake-a", "fake-a",
                                                                    "fake-b", "fake-b"]


def test_resamples_overlap_with_other_prompts_first_requests(tmp_path: Path) -> None:
    # 4 prompts x K=3 = 12 first requests (the check sends prompt 0's first alone, the stage
    # the other 11) at concurrency 4; prompt 0's first 3 answers are one text, so its slots 1
    # and 2 are re-sampled. Without a round barrier the re-samples are sent as soon as prompt
    # 0's answers are in, and are in flight with prompt 3's last slot.
    texts = [f"{DUPLICATE} question", "second question", "third question", "fourth question"]
    with in_flight_fake(hold=4, k=3) as (url, fake):
        stage = _generate(tmp_path, url, texts, 3, 4, max_resample=2)
    resamples = [r for r in fake.requests if r.nth >= 3]
    first = [r for r in fake.requests if r.nth < 3]
    assert len(resamples) == 2 and all(DUPLICATE in r.prompt for r in resamples)
    last_first = max(first, key=lambda r: r.start)
    assert any(fake.in_flight_together(r, last_first) for r in resamples)
    assert fake.max_in_flight == 4
    by_prompt = {g.prompt.text: g for g in stage.records()}
    assert len(by_prompt[texts[0]].candidates) == 3  # re-sampled into 3 distinct candidates
    assert stage.manifest.stats["resampled"] == 2


def test_in_process_model_samples_while_served_requests_are_in_flight(
        tmp_path: Path, tiny_lm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--model LOCAL:2 --model openai:fake-a@URL:2: the in-process batches run while the served
    requests of the same round are in flight. The in-process batch waits (up to GATE_S) for a
    served request to arrive, and the fake holds the served requests until the batch is done:
    sampled one after another, no served request arrives before the batch and none is in
    flight during it."""
    from grouppref.models import sampling

    gate, seen = threading.Event(), []
    real = sampling.sample_batch

    def observed_batch(*args: Any, **kwargs: Any) -> Any:
        seen.append(("batch starts", fake.wait_in_flight(timeout=GATE_S)))
        try:
            return real(*args, **kwargs)
        finally:
            seen.append(("batch ends", fake.now))
            gate.set()

    monkeypatch.setattr(sampling, "sample_batch", observed_batch)
    prompts = [Prompt(prompt_id=f"p{n}", text=f"question {n}") for n in range(2)]
    with in_flight_fake(hold=3, gate=gate) as (url, fake):
        config = GenerateConfig(
            models=[ModelShare.parse(f"{tiny_lm_dir}:2"),
                    ModelShare.parse(f"openai:{MODELS[0]}@{url}:2")],
            server={"concurrency": 4}, max_new_tokens=4, max_resample=0, batch_size=4)
        stage = run_generate(RunStore(tmp_path / "run"), config, prompts=prompts,
                             show_progress=False)
    # one batch of the 2 x 2 local slots, with served requests in flight from start to end
    # (the check sent the first served draw alone, before the stage; the stage the other 3)
    assert [event for event, _ in seen] == ["batch starts", "batch ends"]
    assert all(in_flight >= 1 for _, in_flight in seen), seen
    assert len(fake.requests) == 4 and fake.max_in_flight == 3
    assert stage.manifest.counts.outputs == 2
    for group in stage.records():  # the served draws are the slots' own (seeded) ones
        served = [c for c in group.candidates if c.source.model == MODELS[0]]
        assert len(served) == 2
        assert [c.text for c in served] == [f"answer {c.source.seed}" for c in served]
        assert [c.source.params["attempt"] for c in group.candidates] == [0] * len(group.candidates)


def test_background_requests_can_be_cancelled_and_the_pool_reused() -> None:
    """ServerPool.start runs requests in a thread (the mix above); a failed in-process batch or
    Ctrl-C cancels them: result() raises at once instead of waiting for the slow answer, and
    the pool's event loop serves the next requests."""
    body = {"model": FAKE_MODEL, "prompt": "hi", "seed": 1}
    with fake_openai_server(script=[SLOW]) as (url, state):
        with ServerPool({url: ServerSettings(base_url=url, request_timeout=60)}) as pool:
            job = pool.start(gather([pool.request(url, "/completions", body)]))
            while not state.requests:  # the slow request is in flight
                time.sleep(0.01)
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                job.result()
            [answer] = pool.post(url, "/completions", [body])
    assert isinstance(answer, dict) and answer["choices"][0]["text"] == "answer 1"
    assert len(state.requests) == 2


@pytest.fixture
def groups_run(tmp_path: Path) -> RunStore:
    """Two hand-written groups of K = 3 in a run (the judge's input)."""
    return imported_run(tmp_path, JUDGED_ROWS)


@pytest.mark.parametrize(("mode", "concurrency", "pending"),
                         [("pointwise", 4, 6), ("pointwise", 8, 6), ("pairwise", 4, 12)])
def test_served_judge_keeps_min_of_concurrency_and_pending_in_flight(
        groups_run: RunStore, mode: str, concurrency: int, pending: int) -> None:
    with in_flight_fake(hold=min(concurrency, pending - 1)) as (url, fake):
        judge = {"kind": "judge", "backend": "openai", "model": MODELS[0], "mode": mode,
                 "server": {"base_url": url, "concurrency": concurrency}}
        stage = run_rank(groups_run, RankConfig(rankers=[judge]))
    assert len(fake.requests) == pending
    # the first question is sent alone, before the stage (the check; its answer is kept)
    assert fake.max_in_flight == min(concurrency, pending - 1)
    assert stage.manifest.counts.outputs == 2 and stage.manifest.counts.partial == 0
