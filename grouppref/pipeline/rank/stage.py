"""The ``rank`` stage: automatic rankers add one :class:`Ranking` per group per ranker.

Reads ``RUN/<input_stage>`` (``generate`` by default: CandidateGroup rows, or AnnotatedGroup
rows whose rankings are kept), writes ``RUN/rank`` (AnnotatedGroup rows), shard by shard, each
ranked by :func:`~grouppref.pipeline.rank.core.rank_groups` (scores to tiers, the ensemble). A
ranker that cannot score a group (too long, no reference, ...) leaves a part-reject with the
reason; the group is still written with its other rankings.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from grouppref.errors import StageError
from grouppref.models.loading import model_fingerprint
from grouppref.models.served.pool import merge_usage
from grouppref.pipeline.rank.config import STAGE, STAGE_VERSION, RankConfig
from grouppref.pipeline.rank.core import rank_groups
from grouppref.pipeline.rank.rankers import Ranker, build_ranker
from grouppref.pipeline.rank.settings import annotator_for, validation_message
from grouppref.pipeline.rank.shard_scoring import ShardScorer
from grouppref.runs.hashing import sha256_text
from grouppref.runs.progress import stage_progress
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import AnnotatedGroup, Annotator, Reject, from_row


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
        _rank_shards(stage, scorer, groups, config, before)
    stage.finish(inputs=len(rows))
    return _with_stats(store, stage, config, annotators, merge_usage(before, scorer.usage()))


def _rank_shards(stage: StageRun[AnnotatedGroup], scorer: ShardScorer,
                 groups: list[tuple[int, AnnotatedGroup]], config: RankConfig,
                 before: list[dict[str, Any]]) -> None:
    """Score and write every pending shard (models loaded at the first one: a cached or fully
    resumed stage loads no model); ``before`` is earlier sessions' server usage."""
    with stage_progress() as bar:
        task = bar.add_task(STAGE, total=len(groups), unit="groups",
                            completed=stage.done_items(groups, config.shard_size))
        for shard in stage.pending_shards(groups, shard_size=config.shard_size):
            ranked = rank_groups([g for _, g in shard.items], scorer, config,
                                 [n for n, _ in shard.items])
            if servers := merge_usage(before, scorer.usage()):  # saved with the shard (resume)
                stage.manifest = stage.manifest.model_copy(update={"stats": {"servers": servers}})
            stage.write_shard(shard, ranked.groups, ranked.rejects)
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
