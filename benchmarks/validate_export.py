"""Throughput of ``validate`` and ``export`` vs one plain parse of the same rows (the peer).

Workload: N synthetic aggregate rows (K = 8 candidates, 3 rankings, 28 pairs each) written to
``RUN/aggregate`` through the run store. The peer is ``RunStore.load_records`` (every row parsed
once through ``from_row``): validate parses each row twice (checks, then write with its split),
so a ratio near 2-3 means the checks themselves cost little.

Usage: ``.venv/bin/python benchmarks/validate_export.py --groups 5000``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from itertools import combinations
from pathlib import Path

import datasets

from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.export.stage import run_export
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.pipeline.validate.stage import run_validate
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas import (
    Agreement,
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateSource,
    PairPreference,
    Prompt,
    Ranking,
    ValidatedGroup,
    make_candidate_id,
    make_group_id,
)


def make_row(i: int, k: int = 8, annotators: int = 3) -> ValidatedGroup:
    prompt = Prompt(prompt_id=f"p{i}", text=f"Benchmark prompt number {i}?")
    gid = make_group_id(prompt)
    texts = [f"answer {j} to prompt {i}" for j in range(k)]
    cands = [Candidate(candidate_id=make_candidate_id(gid, t), text=t,
                       source=CandidateSource(kind="model", model="bench")) for t in texts]
    ids = [c.candidate_id for c in cands]
    rankings = [Ranking(annotator=Annotator(id=f"a{a}", kind="simulated"), group_id=gid,
                        tiers=[[c] for c in ids]) for a in range(annotators)]
    group = AnnotatedGroup(group_id=gid, prompt=prompt, candidates=cands, rankings=rankings)
    pairs = [PairPreference(winner=a, loser=b, p=0.8, weight=0.9) for a, b in combinations(ids, 2)]
    return ValidatedGroup(**group.model_dump(), consensus=[[c] for c in ids],
                          strengths={c: float(k - j) for j, c in enumerate(ids)}, pairs=pairs,
                          agreement=Agreement(num_annotators=annotators, kendall_w=1.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000)
    args = parser.parse_args()
    datasets.disable_progress_bars()
    rows = [make_row(i) for i in range(args.groups)]
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "run")
        stage = store.open_stage("aggregate", {"bench": True}, input_fingerprint="bench",
                                 record_type=ValidatedGroup)
        for shard in stage.pending_shards(rows, shard_size=1000):
            stage.write_shard(shard, list(shard.items), [])
        stage.finish(inputs=len(rows))
        t = time.perf_counter()
        store.load_records("aggregate", ValidatedGroup)
        peer = time.perf_counter() - t
        t = time.perf_counter()
        run_validate(store, ValidateConfig(), StageContext(force=True))
        validate = time.perf_counter() - t
        t = time.perf_counter()
        result = run_export(store, ExportConfig(format="trl-pairs", to_dir=f"{tmp}/out"),
                            StageContext(force=True)).manifest.stats
        export = time.perf_counter() - t
    n = args.groups
    print(f"groups: {n} (K=8, 3 rankings, 28 pairs each)")
    print(f"peer  load_records: {peer:7.2f} s  {n / peer:8.0f} groups/s")
    print(f"validate          : {validate:7.2f} s  {n / validate:8.0f} groups/s  "
          f"ratio to peer {validate / peer:.2f}")
    print(f"export trl-pairs  : {export:7.2f} s  {n / export:8.0f} groups/s  "
          f"ratio to peer {export / peer:.2f}  ({sum(result['rows'].values())} rows)")


if __name__ == "__main__":
    main()
