"""Rank and simulate stages written for the aggregate and training-mix tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from grouppref.runs.store import RunStore
from grouppref.schemas import (
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateSource,
    Prompt,
    Ranking,
    make_candidate_id,
    make_group_id,
)


def scored_group(index: int, scores: list[float], kind: str = "reward_model") -> AnnotatedGroup:
    """A group of len(scores) candidates ranked by one automatic annotator with these scores."""
    prompt = Prompt(prompt_id=f"p{index}", text=f"question {index}")
    gid = make_group_id(prompt)
    cands = [Candidate(candidate_id=make_candidate_id(gid, f"answer {index}.{i}"),
                       text=f"answer {index}.{i}", source=CandidateSource(kind="model"))
             for i in range(len(scores))]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    ranking = Ranking(annotator=Annotator(id="rm-1", kind=kind), group_id=gid,
                      tiers=[[cands[i].candidate_id] for i in order],
                      scores={c.candidate_id: s for c, s in zip(cands, scores, strict=True)})
    return AnnotatedGroup(group_id=gid, prompt=prompt, candidates=cands, rankings=[ranking])


def write_stage(store: RunStore, name: str, groups: list[AnnotatedGroup]) -> None:
    """Store ``groups`` as a complete stage ``name`` (as the rank / label stages do)."""
    stage = store.open_stage(name, {"test": True}, input_fingerprint="test",
                             record_type=AnnotatedGroup)
    for shard in stage.pending_shards(groups, shard_size=max(len(groups), 1)):
        stage.write_shard(shard, list(shard.items), [])
    stage.finish(inputs=len(groups))


def rank_run(tmp_path: Path, n: int, k: int = 4, seed: int = 0) -> RunStore:
    """A run whose ``rank`` stage holds ``n`` groups with random reward-model scores."""
    rng = np.random.default_rng(seed)
    store = RunStore(tmp_path / "run")
    write_stage(store, "rank", [scored_group(i, rng.normal(size=k).tolist()) for i in range(n)])
    return store
