"""The rank stage's core: rankers' outcomes turned into rankings of typed groups, no run store.

:func:`rank_groups` ranks ``Sequence[AnnotatedGroup]`` with every ranker of a
:class:`~grouppref.pipeline.rank.config.RankConfig` (scored together by a
:class:`~grouppref.pipeline.rank.shard_scoring.ShardScorer`) and returns a :class:`Ranked`:
each group with its new rankings, and a part-reject for every group a ranker skipped. Each
ranker's scores become tiers (:func:`~grouppref.pipeline.rank.scoring.scores_to_tiers`: scores
within ``tie_tolerance`` of a tier's best share it); an optional weighted ensemble of z-scored
ranker scores is one more ranking. The ``rank`` stage (:mod:`grouppref.pipeline.rank.stage`)
calls it shard by shard, the trainer's refresh rounds once per round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grouppref.pipeline.rank import scoring as rs
from grouppref.pipeline.rank.config import STAGE, EnsembleSettings, RankConfig
from grouppref.pipeline.rank.outcomes import Judged, Outcome, Skip
from grouppref.pipeline.rank.settings import ANNOTATOR_KIND, RankerSettings, annotator_for, ranker_keys
from grouppref.pipeline.rank.shard_scoring import ShardScorer
from grouppref.runs.hashing import sha256_text
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking, Reject


# -- rankings ------------------------------------------------------------------------------------
def ranking_from_scores(annotator: Annotator, group: AnnotatedGroup, s: Sequence[float],
                        tol: float, metadata: dict[str, Any] | None = None) -> Ranking:
    """A ranking of ``group`` from per-candidate scores (group order), ties within ``tol``."""
    ids = group.candidate_ids()
    return Ranking(annotator=annotator, group_id=group.group_id,
                   tiers=rs.scores_to_tiers(ids, s, tol),
                   scores={cid: float(x) for cid, x in zip(ids, s, strict=True)},
                   metadata=metadata or None)


def ensemble_annotator(ensemble: EnsembleSettings, rankers: list[RankerSettings]) -> Annotator:
    """Kind: the members' kind when they share one, else the kind of the heaviest member
    (the first of the heaviest on a tie of weights)."""
    by_key = dict(zip(ranker_keys(rankers), rankers, strict=True))
    weights = ensemble.weights
    heaviest = max(weights, key=lambda k: weights[k])
    label = ",".join(f"{k}={w:g}" for k, w in weights.items())
    return Annotator(id=ensemble.name, kind=ANNOTATOR_KIND[by_key[heaviest].kind],
                     name=f"ensemble({label})",
                     version=sha256_text(ensemble.model_dump_json())[:12])


def rank_group(group: AnnotatedGroup, outcomes: list[Outcome], config: RankConfig,
               annotators: list[Annotator], number: int) -> tuple[AnnotatedGroup, list[Reject]]:
    """The group with its new rankings (replacing same-id ones), and part-rejects for skips.

    ``outcomes`` holds one entry per ranker of ``config`` (scores in candidate order, a judge's
    answers, or a :class:`Skip`); ``number`` is the group's 1-based input row (for the
    rejects)."""
    keys = ranker_keys(config.rankers)
    new: list[Ranking] = []
    rejects: list[Reject] = []
    scored: dict[str, list[float]] = {}
    for key, ann, out in zip(keys, annotators, outcomes, strict=True):
        if isinstance(out, Skip):
            rejects.append(_part_reject(group, number, ann.id, out.reason))
            continue
        notes, out = (out.metadata, out.scores) if isinstance(out, Judged) else (None, out)
        scored[key] = out
        new.append(ranking_from_scores(ann, group, out, config.tie_tolerance, notes))
    if config.ensemble is not None:
        ens = ensemble_annotator(config.ensemble, config.rankers)
        missing = [k for k in config.ensemble.weights if k not in scored]
        if missing:
            rejects.append(_part_reject(group, number, ens.id,
                                        f"members {missing} did not score this group"))
        else:
            s = torch.tensor([scored[k] for k in config.ensemble.weights])  # (R, K)
            w = torch.tensor(list(config.ensemble.weights.values()))  # (R,)
            new.append(ranking_from_scores(ens, group, rs.ensemble_scores(s, w).tolist(),
                                           config.tie_tolerance))
    new_ids = {r.annotator.id for r in new}
    kept = [r for r in group.rankings if r.annotator.id not in new_ids]
    return group.model_copy(update={"rankings": kept + new}), rejects


def _part_reject(group: AnnotatedGroup, number: int, annotator_id: str, reason: str) -> Reject:
    return Reject(stage=STAGE, reason=f"ranker {annotator_id!r} skipped the group: {reason}",
                  row=number, group_id=group.group_id, field=f"rankings[{annotator_id}]",
                  scope="part")


@dataclass(frozen=True)
class Ranked:
    """What :func:`rank_groups` makes: every group, in input order, with its new rankings
    (one per ranker that scored it, and the ensemble's), and the part-rejects of the rankers
    that skipped a group."""

    groups: list[AnnotatedGroup]
    rejects: list[Reject]


def rank_groups(groups: Sequence[AnnotatedGroup], scorer: ShardScorer, config: RankConfig,
                numbers: Sequence[int] | None = None) -> Ranked:
    """Rank ``groups`` with every ranker of ``config`` (``scorer`` holds them, built from
    ``config.rankers`` in order); ``numbers`` are the groups' 1-based input rows for the
    rejects (default: their places in ``groups``). Loads the in-process rankers' models at the
    first call; served judges need ``scorer`` connected (``with scorer:``)."""
    rows = list(numbers) if numbers is not None else list(range(1, len(groups) + 1))
    annotators = [annotator_for(s) for s in config.rankers]
    outcomes = scorer.score(list(groups))  # (rankers, groups)
    records: list[AnnotatedGroup] = []
    rejects: list[Reject] = []
    for j, (number, group) in enumerate(zip(rows, groups, strict=True)):
        record, part = rank_group(group, [o[j] for o in outcomes], config, annotators, number)
        records.append(record)
        rejects.extend(part)
    return Ranked(groups=records, rejects=rejects)
