"""Synthetic groups, a validate stage and the trainer's final parameters, for the training tests."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from grouppref.runs.store import RunStore, Shard
from grouppref.schemas import (
    Agreement,
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
from grouppref.train.settings.shared import DataConfig

WORDS = ["apple", "river", "stone", "cloud", "green", "table", "music", "light", "paper", "horse",
         "glass", "smile", "winter", "garden", "bread", "ocean", "candle", "forest", "silver"]


PLAIN = DataConfig(chat_template=False)


def synthetic_group(i: int, split: str, rng: random.Random,
                    texts: list[str] | None = None) -> ValidatedGroup:
    """Group i: candidates 0, 1 ("sunny ...") beat candidates 2, 3 ("rainy ...")."""
    prompt = Prompt(prompt_id=f"p{i}", text=f"Describe the {rng.choice(WORDS)} number {i}.")
    gid = make_group_id(prompt)
    w = rng.sample(WORDS, 4)
    texts = texts or [f"sunny {w[0]}", f"sunny {w[1]}", f"rainy {w[2]}", f"rainy {w[3]}"]
    cands = [Candidate(candidate_id=make_candidate_id(gid, t), text=t, behavior_logp=-5.0,
                       source=CandidateSource(kind="model", model="synthetic")) for t in texts]
    ids = [c.candidate_id for c in cands]
    good, bad = ids[:2], ids[2:]
    pairs = [PairPreference(winner=g, loser=b, p=1.0, weight=1.0, votes_for=3.0)
             for g in good for b in bad]
    ranking = Ranking(annotator=Annotator(id="rule", kind="rule"), group_id=gid,
                      tiers=[good, bad])
    return ValidatedGroup(
        group_id=gid, prompt=prompt, candidates=cands, rankings=[ranking], consensus=[good, bad],
        strengths={c: 1.0 if c in good else -1.0 for c in ids}, pairs=pairs,
        agreement=Agreement(num_annotators=1), split=split)


def synthetic_groups(n_train: int, n_test: int, seed: int = 0) -> list[ValidatedGroup]:
    rng = random.Random(seed)
    return ([synthetic_group(i, "train", rng) for i in range(n_train)]
            + [synthetic_group(n_train + i, "test", rng) for i in range(n_test)])


def _final_params(model) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for p in model.parameters()])


def _write_validate(run: Path, groups: list[ValidatedGroup]) -> RunStore:
    """A run whose validate stage holds ``groups`` (written through the real store)."""
    store = RunStore(run)
    stage = store.open_stage("validate", {"test": True}, input_fingerprint="synthetic",
                             record_type=ValidatedGroup)
    stage.write_shard(Shard(index=0, start=0, items=groups), groups, [])
    stage.finish(inputs=len(groups))
    return store


def mixed_groups(n_human: int, n_auto: int, n_test: int) -> list[ValidatedGroup]:
    """Synthetic groups, the first ``n_human`` ranked by a human, the next ``n_auto`` by a reward
    model, the last ``n_test`` in the test split (the training-mix tests)."""
    rng = random.Random(3)
    out = []
    for i in range(n_human + n_auto + n_test):
        g = synthetic_group(i, "test" if i >= n_human + n_auto else "train", rng)
        kind = "human" if i < n_human else "reward_model"
        ranking = g.rankings[0].model_copy(update={"annotator": Annotator(id="a", kind=kind)})
        out.append(g.model_copy(update={"rankings": [ranking], "consensus_kinds": [kind]}))
    return out
