"""The ``judge`` ranker served by an OpenAI-compatible server: pointwise, pairwise and rubric
modes against a real llama.cpp server (tests/support/llama_server.py, the embedded SmolLM2 GGUF), a
judge answer that is not a rating, a wrong model name; and the pure parsing helpers."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest

from grouppref.pipeline.rank.config import RankConfig
from grouppref.pipeline.rank.outcomes import RankerInputError
from grouppref.pipeline.rank.server_judge import parse_rating, verdict_log_odds
from grouppref.pipeline.rank.settings import parse_ranker_spec
from grouppref.pipeline.rank.stage import run_rank
from grouppref.runs.store import RunStore
from grouppref.schemas.reports import ServerUsage
from tests.support.cli import grouppref_here
from tests.support.factories import imported_run
from tests.support.judges import SHORT_RATING
from tests.support.llama_server import MODEL_ALIAS
from tests.support.paths import REPO
from tests.support.served_fakes import _one_after_another

REPO = REPO
GROUPS = [{"prompt": "What is 2 + 2?", "responses": ["4", "2 + 2 = 5.", "It is 4."]},
          {"prompt": "Name the capital of France.", "responses": ["Paris.", "London."]}]
NOT_A_RATING = 'root ::= "I cannot rate this."'  # llama.cpp grammar: the answer is forced


@pytest.fixture
def groups_run(tmp_path: Path) -> RunStore:
    """A run whose generate stage holds two hand-written groups (K = 3 and 2)."""
    return imported_run(tmp_path, GROUPS)


def _judge(url: str, **settings: object) -> dict[str, object]:
    return {"kind": "judge", "backend": "openai", "model": MODEL_ALIAS,
            "server": {"base_url": url, "concurrency": 2}, **settings}


def _usage(stage: object) -> ServerUsage:
    [usage] = stage.manifest.stats["servers"]  # type: ignore[attr-defined]
    return ServerUsage.model_validate(usage)


def test_pointwise_and_pairwise_judges_through_llama_server(groups_run: RunStore,
                                                            llama_server: str) -> None:
    config = RankConfig(rankers=[_judge(llama_server), _judge(llama_server, mode="pairwise")])
    stage = run_rank(groups_run, config)
    assert stage.counts.partial == 0
    for group in stage.records():
        by = {r.annotator.id: r for r in group.rankings}
        assert set(by) == {f"judge:{MODEL_ALIAS}", f"judge:{MODEL_ALIAS}@pairwise"}
        point, pair = by[f"judge:{MODEL_ALIAS}"], by[f"judge:{MODEL_ALIAS}@pairwise"]
        assert all(math.isfinite(s) for s in point.scores.values())
        # pairwise scores are mean debiased log-odds: antisymmetric, so they sum to 0
        # antisymmetric float64 log-odds (~1-10) summed over <= K^2 terms: ~K^2 * eps64 * 10 ~ 1e-13,
        # 1e-9 with room
        assert sum(pair.scores.values()) == pytest.approx(0.0, abs=1e-9)
    usages = {u["model"]: ServerUsage.model_validate(u) for u in stage.manifest.stats["servers"]}
    [usage] = usages.values()  # both judges ask the same model on the same server
    k = [len(g["responses"]) for g in GROUPS]
    # one GET /models for the server, then only the questions: pointwise K, pairwise K(K-1)
    # per group (each judge's first question, sent as the check before the stage, is kept)
    assert usage.requests == usage.succeeded == 1 + sum(k) + sum(n * (n - 1) for n in k)
    assert usage.completion_tokens >= usage.succeeded - 1  # one verdict token per question


def test_rubric_ratings_and_rationales_in_the_ranking(groups_run: RunStore,
                                                      llama_server: str) -> None:
    """json_object (llama.cpp's structured output): a 1-10 rating per candidate; the scores
    are the ratings and the rationales are in the ranking's metadata."""
    judge = _judge(llama_server, mode="rubric", structured_output="json_object",
                   answer_tokens=160)
    stage = run_rank(groups_run, RankConfig(rankers=[judge]))
    assert stage.manifest.stats["rankers"][f"judge:{MODEL_ALIAS}@rubric"]["ranked"] == 2
    for group in stage.records():
        [ranking] = group.rankings
        for cid, score in ranking.scores.items():
            assert ranking.metadata[f"rating:{cid}"] == score and 1 <= score <= 10
            assert isinstance(ranking.metadata[f"rationale:{cid}"], str)
        best = [cid for cid, s in ranking.scores.items() if s == max(ranking.scores.values())]
        assert sorted(ranking.tiers[0]) == sorted(best)  # equal ratings share a tier
    assert _usage(stage).requests == 1 + sum(len(g["responses"]) for g in GROUPS)


def test_a_judge_answer_that_is_not_a_rating_is_a_counted_part_reject(
        groups_run: RunStore, llama_server: str) -> None:
    """The judge is made to answer 'I cannot rate this.' (a llama.cpp grammar): no score is
    guessed; each group keeps no ranking by it and gets a part-reject naming the answer."""
    judge = _judge(llama_server, mode="rubric", answer_tokens=16,
                   server={"base_url": llama_server, "server_params": {"grammar": NOT_A_RATING}})
    stage = run_rank(groups_run, RankConfig(rankers=[judge]))
    assert all(not g.rankings for g in stage.records())
    assert stage.counts.partial == 2 and stage.manifest.stats["skipped"] == 2
    for reject in stage.rejects():
        assert reject.scope == "part" and reject.field == f"rankings[judge:{MODEL_ALIAS}@rubric]"
        assert "is not a rating (no 'Rating: N' line): 'I cannot rate this.'" in reject.reason


@pytest.mark.slow
def test_three_judges_together_equal_one_after_another(groups_run: RunStore,
                                                      llama_server: str) -> None:
    """Pointwise, pairwise and rubric judges on one real server, their requests together (the
    rank stage) and one judge after another (each with its own pool, as before): the same
    rankings (scores to 1e-5: llama.cpp reuses the KV cache of the previous prompt's prefix, and
    the order of requests differs), the same tiers and the same usage counts."""
    rubric = _judge(llama_server, mode="rubric", answer_tokens=24,
                    server={"base_url": llama_server, "concurrency": 2,
                            "server_params": {"grammar": SHORT_RATING}})
    config = RankConfig(rankers=[_judge(llama_server), _judge(llama_server, mode="pairwise"),
                                 rubric])
    stage = run_rank(groups_run, config)
    records, rejects, usage = _one_after_another(groups_run, config)
    assert stage.counts.partial == 0 and rejects == []
    for got, want in zip(stage.records(), records, strict=True):
        pairs = list(zip(got.rankings, want.rankings, strict=True))
        assert [(a.annotator, a.tiers) for a, _ in pairs] == [(b.annotator, b.tiers) for _, b in pairs]
        for a, b in pairs:
            # the same llama.cpp server, requests together vs one after another: it reuses the KV cache
            # of the previous prompt's prefix, so its float32 logits differ in the last bits; log-odds
            # ~1-10: 1e-5 ~ 10 eps32 * 10
            assert a.scores == pytest.approx(b.scores, abs=1e-5)
            assert a.metadata == b.metadata  # the rubric's ratings and rationales
    [got_usage] = stage.manifest.stats["servers"]
    [want_usage] = usage
    # one GET /models for the shared pool, one per judge's own pool one after another
    assert got_usage["requests"] == want_usage["requests"] - 2
    for key in ("retried", "refused", "prompt_tokens", "completion_tokens"):
        assert got_usage[key] == want_usage[key], key


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "")}
    return grouppref_here(*args, env=env)  # cli.main() in this process


def test_cli_served_judge_and_a_wrong_model_name(groups_run: RunStore, llama_server: str) -> None:
    wrong = _cli(["rank", str(groups_run.root), "--ranker", f"judge:openai:nope@{llama_server}"])
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1
    assert "model 'nope' is not served at" in wrong.stderr
    assert not (groups_run.root / "rank").exists()  # checked before the stage was opened
    ok = _cli(["rank", str(groups_run.root), "--ranker", f"judge:openai:{MODEL_ALIAS}@{llama_server}",
               "--concurrency", "2"])
    assert ok.returncode == 0, ok.stderr
    assert f"judge:{MODEL_ALIAS}: 2 ranked, 0 skipped" in ok.stdout
    # GET /models and the 5 questions (the first one, the check, is kept: no probe)
    assert f"{MODEL_ALIAS} at {llama_server.removeprefix('http://')}: 6 requests" in ok.stdout


# -- pure helpers ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("answer", "rating", "rationale"), [
    ("Rating: 7\nRationale: Correct but terse.", 7, "Correct but terse."),
    ("**Rating:** 8/10\n\nRationale: Clear.", 8, "Clear."),
    ("Rating = 10", 10, ""),
    ("The answer is fine.\nrating: 3", 3, "The answer is fine."),
])
def test_parse_rating_text(answer: str, rating: int, rationale: str) -> None:
    assert parse_rating(answer, json_reply=False) == (rating, rationale)


@pytest.mark.parametrize(("answer", "why"), [
    ("I would give it a 7.", "no 'Rating: N' line"),
    ("Rating: 7.5", "is not an integer"),
    ("Rating: 11", "not in 1-10"),
    ("Rating: 0", "not in 1-10"),
    ("Rating: 7\nRating: 8", "2 'Rating:' lines"),
    ("Rating: seven", "is not an integer"),
])
def test_parse_rating_text_never_guesses(answer: str, why: str) -> None:
    with pytest.raises(RankerInputError, match=why):
        parse_rating(answer, json_reply=False)


def test_parse_rating_json() -> None:
    assert parse_rating('{"rating": 9, "rationale": "Good."}', json_reply=True) == (9, "Good.")
    for bad in ('{"rating": 9.0, "rationale": "x"}', '{"rating": true, "rationale": "x"}',
                '{"rating": 9}', '{"rating": 9, "rationale": "cut', "[9]"):
        with pytest.raises(RankerInputError):
            parse_rating(bad, json_reply=True)


def test_verdict_log_odds_sums_variants_and_bounds_missing_ones() -> None:
    lo, bounded = verdict_log_odds({"Yes": -0.5, " yes": -2.0, "No": -1.5}, "yes", "no")
    # float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert lo == pytest.approx(math.log(math.exp(-0.5) + math.exp(-2.0)) + 1.5)
    assert not bounded
    lo, bounded = verdict_log_odds({"Yes": -0.1, "Maybe": -3.0}, "yes", "no")
    assert bounded and lo == pytest.approx(-0.1 + 3.0)  # No gets the smallest listed log-prob
    assert verdict_log_odds({"Maybe": -0.1}, "yes", "no") is None


def test_judge_spec_and_settings_errors() -> None:
    settings = parse_ranker_spec("judge:openai:Qwen/Qwen2.5-7B-Instruct@http://gpu:8000/v1")
    assert settings.backend == "openai" and settings.server.base_url == "http://gpu:8000/v1"
    with pytest.raises(ValueError, match="mode rubric needs a served judge"):
        RankConfig(rankers=[{"kind": "judge", "mode": "rubric"}])
    with pytest.raises(ValueError, match="judge:openai:NAME@URL"):
        parse_ranker_spec("judge:openai:model-without-url")
