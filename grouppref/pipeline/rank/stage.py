"""The ``rank`` stage: automatic rankers add one :class:`Ranking` per group per ranker.

Reads ``RUN/<input_stage>`` (``generate`` by default: CandidateGroup rows, or AnnotatedGroup
rows whose rankings are kept), writes ``RUN/rank`` (AnnotatedGroup rows). Each ranker's scores
become tiers (:func:`~grouppref.pipeline.rank.scoring.scores_to_tiers`: scores within
``tie_tolerance`` of a tier's best share it); an optional weighted ensemble of z-scored ranker
scores is one more ranking. A ranker that cannot score a group (too long, no reference, ...)
leaves a part-reject with the reason; the group is still written with its other rankings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from pydantic import ValidationError

from grouppref.errors import StageError
from grouppref.models.loading import model_fingerprint
from grouppref.models.served.pool import merge_usage
from grouppref.pipeline.rank import scoring as rs
from grouppref.pipeline.rank.config import STAGE, STAGE_VERSION, EnsembleSettings, RankConfig
from grouppref.pipeline.rank.rankers import Judged, Outcome, Ranker, Skip, build_ranker
from grouppref.pipeline.rank.settings import (
    ANNOTATOR_KIND,
    RankerSettings,
    annotator_for,
    ranker_keys,
    validation_message,
)
from grouppref.pipeline.rank.shard_scoring import ShardScorer
from grouppref.runs.hashing import sha256_text
from grouppref.runs.progress import stage_progress
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking, Reject, from_row


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
    rejects). Also used by the trainer's refresh rounds
    (:mod:`grouppref.train.refresh.fresh_groups`)."""
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


# -- the stage -----------------------------------------------------------------------------------
def _read_input(store: RunStore, config: RankConfig) -> list[Any]:
    manifest = store.require(config.input_stage)
    if manifest.record_type not in ("CandidateGroup", "AnnotatedGroup", "ValidatedGroup"):
        raise StageError(f"rank: stage {config.input_stage!r} holds {manifest.record_type} rows, "
                         "not candidate groups; rank the output of `grouppref generate`")
    return list(store.load_dataset(config.input_stage))


def _parse_row(row: dict[str, Any], number: int, source: str) -> AnnotatedGroup | Reject:
    keep = AnnotatedGroup.model_fields
    try:
        return from_row(AnnotatedGroup, {k: v for k, v in row.items() if k in keep})
    except ValidationError as e:
        return Reject(stage=STAGE, reason=validation_message(e), source=source, row=number,
                      group_id=row.get("group_id"))


def _model_fingerprints(rankers: list[Ranker]) -> list[str]:
    """Fingerprints of the rankers' model folders (weights hashed once, then memoised)."""
    return [model_fingerprint(path) for r in rankers if (path := r.model_path()) is not None]


def run_rank(store: RunStore, config: RankConfig,
             context: StageContext = StageContext()) -> StageRun[AnnotatedGroup]:
    """Rank every group of ``config.input_stage`` with every ranker; write ``RUN/rank``.

    Models are checked (path or Hub id, architecture, one output for a reward model) before
    any work, and loaded only when a shard is left to compute. A shard's served-judge requests
    all go out together and the in-process rankers run meanwhile (:class:`ShardScorer`).

    Raises:
        ModelNotFoundError: a model path or id that does not exist.
        ConfigError: a model of the wrong kind (e.g. a reward model with two outputs).
        StageError: the input stage has not completed.
    """
    rankers = [build_ranker(s, config.device, config.dtype) for s in config.rankers]
    for ranker in rankers:
        ranker.check()
    scorer = ShardScorer(rankers)
    rows = _read_input(store, config)
    parsed = [_parse_row(row, i + 1, config.input_stage) for i, row in enumerate(rows)]
    groups = [(i + 1, g) for i, g in enumerate(parsed) if isinstance(g, AnnotatedGroup)]
    fingerprint = sha256_text("|".join(_model_fingerprints(rankers)))
    previous = store.manifest(STAGE)  # a resumed run adds its server usage to this one's
    key: dict[str, Any] = {"input_fingerprint": fingerprint, "inputs": [config.input_stage],
                           "stage_version": STAGE_VERSION}
    with scorer:  # served judges hold a connection pool
        if context.force or store.cached(STAGE, config, **key) is None:
            # served judges: reach the servers before the stage opens; a fresh stage's first
            # questions do the checking (kept for its first shard), a resumed one sends probes
            fresh = context.force or previous is None or previous.status != "running"
            scorer.connect(groups[0][1] if fresh and groups else None)
        stage = store.open_stage(STAGE, config, record_type=AnnotatedGroup, force=context.force, **key)
        if stage.cached:
            return stage
        stage.add_rejects("input", [r for r in parsed if isinstance(r, Reject)])
        annotators = [annotator_for(s) for s in config.rankers]
        before = (previous.stats.get("servers") or []) if previous is not None and (
            previous.status == "running" and stage.done_items(groups, config.shard_size)) else []
        _rank_shards(stage, scorer, groups, config, annotators, before)
    stage.finish(inputs=len(rows))
    return _with_stats(store, stage, config, annotators, merge_usage(before, scorer.usage()))


def _rank_shards(stage: StageRun[AnnotatedGroup], scorer: ShardScorer,
                 groups: list[tuple[int, AnnotatedGroup]], config: RankConfig,
                 annotators: list[Annotator], before: list[dict[str, Any]]) -> None:
    """Score and write every pending shard (models loaded at the first one: a cached or fully
    resumed stage loads no model); ``before`` is earlier sessions' server usage."""
    with stage_progress() as bar:
        task = bar.add_task(STAGE, total=len(groups), unit="groups",
                            completed=stage.done_items(groups, config.shard_size))
        for shard in stage.pending_shards(groups, shard_size=config.shard_size):
            batch = [g for _, g in shard.items]
            outcomes = scorer.score(batch)  # (rankers, groups)
            records, rejects = [], []
            for j, (number, group) in enumerate(shard.items):
                record, part = rank_group(group, [o[j] for o in outcomes], config, annotators,
                                          number)
                records.append(record)
                rejects.extend(part)
            if servers := merge_usage(before, scorer.usage()):  # saved with the shard (resume)
                stage.manifest = stage.manifest.model_copy(update={"stats": {"servers": servers}})
            stage.write_shard(shard, records, rejects)
            bar.advance(task, len(shard.items))


def _with_stats(store: RunStore, stage: StageRun[AnnotatedGroup], config: RankConfig,
                annotators: list[Annotator],
                servers: list[dict[str, Any]] | None = None) -> StageRun[AnnotatedGroup]:
    """Count, from the finished output (so a resumed run counts every shard), per annotator the
    groups ranked, skipped and with ties; write them into the manifest's stats."""
    ids = [a.id for a in annotators] + ([config.ensemble.name] if config.ensemble else [])
    per: dict[str, dict[str, int]] = {i: {"ranked": 0, "skipped": 0, "with_ties": 0} for i in ids}
    records = stage.records()
    for group in records:
        for r in group.rankings:
            if r.annotator.id in per:
                per[r.annotator.id]["ranked"] += 1
                per[r.annotator.id]["with_ties"] += int(len(r.tiers) < group.k)
    skipped = [r for r in stage.rejects() if r.scope == "part"]
    for reject in skipped:
        aid = (reject.field or "").removeprefix("rankings[").removesuffix("]")
        if aid in per:
            per[aid]["skipped"] += 1
    stats: dict[str, Any] = {"rankers": per, "skipped": len(skipped),
                             "tie_tolerance": config.tie_tolerance,
                             "groups_without_rankings": sum(not g.rankings for g in records)}
    if servers:
        stats["servers"] = servers
    stage.manifest = stage.manifest.model_copy(update={"stats": stats})
    store.write_manifest(stage.manifest)
    return stage
