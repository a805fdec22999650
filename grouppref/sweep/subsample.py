"""Group size as a training setting: a group of K candidates subsampled to k of them, seeded,
with everything the losses read (rankings, consensus, strengths, pair targets p_ij / w_ij)
restricted to the candidates kept. k = 2 gives pairs from the same data."""

from __future__ import annotations

import random

from grouppref.schemas import MIN_K, ValidatedGroup


def _restrict(tiers: list[list[str]], keep: set[str]) -> list[list[str]]:
    """``tiers`` with only the ids in ``keep``, empty tiers dropped (order kept)."""
    out = [[cid for cid in tier if cid in keep] for tier in tiers]
    return [tier for tier in out if tier]


def subsample_group(group: ValidatedGroup, k: int, seed: int) -> ValidatedGroup:
    """``group`` restricted to ``k`` of its candidates, chosen at random from ``seed`` and the
    group id (the same call gives the same subset; another seed usually another).

    The candidates keep their order; the consensus and every ranking keep their order
    restricted to the candidates kept (a ranking left naming fewer than 2 of them is dropped);
    ``strengths``, ``scores`` and ``pairs`` (p_ij, w_ij) keep only the kept candidates. A
    group with k or fewer candidates is returned as it is.

    Raises:
        ValueError: ``k`` is below 2.
    """
    if k < MIN_K:
        raise ValueError(f"group size k must be at least {MIN_K}, not {k}")
    if group.k <= k:
        return group
    rng = random.Random(f"{seed}:{group.group_id}")
    keep = set(rng.sample(group.candidate_ids(), k))
    rankings = []
    for r in group.rankings:
        tiers = _restrict(r.tiers, keep)
        if sum(len(t) for t in tiers) < MIN_K:
            continue
        scores = None if r.scores is None else {c: v for c, v in r.scores.items() if c in keep}
        rankings.append(r.model_copy(update={"tiers": tiers, "scores": scores}))
    data = group.model_dump()
    data.update(
        candidates=[c.model_dump() for c in group.candidates if c.candidate_id in keep],
        rankings=[r.model_dump() for r in rankings],
        consensus=_restrict(group.consensus, keep),
        strengths={c: v for c, v in group.strengths.items() if c in keep},
        pairs=[p.model_dump() for p in group.pairs if p.winner in keep and p.loser in keep])
    return ValidatedGroup.model_validate(data)
