"""Throughput of the model rankers, batched vs one sequence at a time (the peer), in one run.

Workload: G synthetic groups of K = 4 candidates (short math prompts, 5-20 word answers),
CPU, fp32. Rankers: the LLM judge on the embedded SmolLM2-135M-Instruct (pointwise: K
prompts per group; pairwise: K(K-1)), and the similarity ranker (all-MiniLM-L6-v2). Each is
timed with ``batch_size=1`` (the peer) and with its batched default, after one warm-up call;
the scores of the two runs are compared (max abs difference) so speed is not bought with a
different result.

Usage::

    .venv/bin/python benchmarks/rank_batching.py --groups 8
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from grouppref.pipeline.rank.rankers import JudgeRanker, SimilarityRanker  # noqa: E402
from grouppref.pipeline.rank.settings import (  # noqa: E402
    JudgeRankerSettings,
    SimilarityRankerSettings,
)
from grouppref.schemas import CandidateGroup  # noqa: E402
from tests.support.factories import make_group  # noqa: E402


def workload(n: int) -> list[CandidateGroup]:
    words = "so we add the two numbers and carry the one to get".split()
    return [make_group(prompt_text=f"What is {i} + {2 * i}?", reference=str(3 * i),
                       texts=[" ".join(words[: 5 + 3 * j]) + f" {3 * i + j}." for j in range(4)])
            for i in range(n)]


def timed(ranker, groups: list[CandidateGroup]) -> tuple[float, list]:
    ranker.score(groups[:1])  # warm-up
    t0 = time.perf_counter()
    out = ranker.score(groups)
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8)
    args = parser.parse_args()
    groups = workload(args.groups)
    cases = [("judge pointwise", JudgeRanker, JudgeRankerSettings(mode="pointwise"), 8),
             ("judge pairwise", JudgeRanker, JudgeRankerSettings(mode="pairwise"), 8),
             ("similarity", SimilarityRanker, SimilarityRankerSettings(), 32)]
    print(f"{'ranker':<16} {'batch':>5} {'groups/s':>9} {'peer (b=1)':>11} {'ratio':>6} "
          f"{'max |diff|':>10}")
    for label, cls, settings, batch in cases:
        ranker = cls(settings.model_copy(update={"batch_size": 1}))
        ranker.load()
        t_peer, out_peer = timed(ranker, groups)
        ranker.settings = settings.model_copy(update={"batch_size": batch})  # same model
        t_fast, out_fast = timed(ranker, groups)
        diff = max(abs(a - b) for x, y in zip(out_peer, out_fast, strict=True)
                   for a, b in zip(x, y, strict=True))
        n = len(groups)
        print(f"{label:<16} {batch:>5} {n / t_fast:>9.2f} {n / t_peer:>11.2f} "
              f"{t_peer / t_fast:>6.2f} {diff:>10.2e}")


if __name__ == "__main__":
    main()
