"""The ``generate`` stage: sample K candidates per prompt from one or more causal LMs and write
``CandidateGroup`` rows to ``RUN/generate``.

What it reads: a prompt file (``source``), a list of prompts, or the ``RUN/prompts`` stage.
What it writes: one group per prompt; prompts that cannot give ``min_k`` distinct candidates,
or that do not fit the model's context, go to ``rejects.jsonl`` with the reason.

Every candidate records its model, sampling settings, its own derived seed, ``num_tokens`` and
``behavior_logp`` (see :mod:`grouppref.models.sampling`; for served models
:mod:`grouppref.pipeline.generate.served`). Work is done in shards of prompts; a killed run
resumes at the first missing shard and, because each candidate has its own seed, gives exactly
the rows an uninterrupted run gives (for a served model: when its server honours seeds).

Served models are checked (``/models`` and a first draw per endpoint) before the stage is opened,
so a wrong URL, model name or key stops with one line and leaves the run as it was; a cached
stage contacts no server. Requests and tokens per server and model go to the manifest's
``stats["servers"]`` (:class:`~grouppref.schemas.reports.ServerUsage`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouppref.models.loading import is_embedded, model_fingerprint, resolve_model
from grouppref.models.served.pool import ServerPool, merge_usage
from grouppref.pipeline.generate.config import STAGE, STAGE_VERSION, GenerateConfig
from grouppref.pipeline.generate.served import ServedSampler, server_settings
from grouppref.pipeline.generate.shard import ModelSlot, ShardGenerator, load_encoders
from grouppref.readers.prompts import read_prompts
from grouppref.runs.hashing import fingerprint_records, sha256_text
from grouppref.runs.manifest import Manifest
from grouppref.runs.progress import stage_progress
from grouppref.runs.stage import StageContext
from grouppref.runs.stage_run import read_shard_file
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import CandidateGroup, Prompt, Reject, make_group_id


@dataclass
class _Prompts:
    """The prompts to sample for, where each came from, the input rejects and counts."""

    items: list[Prompt]
    rejects: list[Reject]
    rows: int
    fingerprint: str
    source: str  # the prompts file, or RUN/prompts
    item_rows: list[int]  # the source row of each prompt


def _load_prompts(store: RunStore, config: GenerateConfig,
                  prompts: Sequence[Prompt] | None) -> _Prompts:
    """Prompts, input rejects, rows read and a fingerprint, from a list, a file or RUN/prompts."""
    if prompts is not None:
        kept: list[Prompt] = []
        rejects: list[Reject] = []
        seen: dict[str, int] = {}
        for number, prompt in enumerate(prompts, start=1):
            gid = make_group_id(prompt)
            if gid in seen:
                rejects.append(Reject(stage=STAGE, reason=f"same prompt as #{seen[gid]}",
                                      source="prompt list", row=number, group_id=gid))
                continue
            seen[gid] = number
            kept.append(prompt)
        return _Prompts(kept, rejects, len(prompts), fingerprint_records(prompts), "prompts",
                        [seen[make_group_id(p)] for p in kept])
    if config.source is not None:
        result = read_prompts(config.source, config.mapping, stage=STAGE, split=config.split)
        return _Prompts(result.items, result.rejects, result.rows, result.fingerprint,
                        result.source, result.item_rows)
    manifest = store.require("prompts")
    records = store.load_records("prompts", Prompt)
    return _Prompts(records, [], len(records),
                    manifest.output_fingerprint or fingerprint_records(records),
                    str(store.stage_dir("prompts")), list(range(1, len(records) + 1)))


def _located(rejects: list[Reject], loaded: _Prompts) -> list[Reject]:
    """Every reject naming its file and row: the prompt's source and row, by group id."""
    where = {make_group_id(p): row for p, row in zip(loaded.items, loaded.item_rows, strict=True)}
    return [r if r.source and r.row is not None else r.model_copy(update={
        "source": r.source or loaded.source,
        "row": r.row if r.row is not None else where.get(r.group_id or "")}) for r in rejects]


def _model_slots(config: GenerateConfig) -> list[ModelSlot]:
    """Resolve every model in process (fails fast on a bad name) and give each model its slots
    0..K-1 (served models are checked on their server, see :class:`ServedSampler`)."""
    slots, start = [], 0
    for share in config.models:
        count = share.count or 0
        path = None if share.backend == "openai" else resolve_model(
            None if is_embedded(share.name) else share.name)
        slots.append(ModelSlot(share=share, path=path, slots=range(start, start + count)))
        start += count
    return slots


def _fingerprint(slot: ModelSlot) -> str:
    """A model's part of the input fingerprint: its weights, or for a served model its server
    and name (the weights behind a server cannot be seen: --force after changing them)."""
    if slot.served:
        return sha256_text(f"openai|{slot.share.base_url}|{slot.name}")
    return model_fingerprint(slot.path)


def run_generate(store: RunStore, config: GenerateConfig, context: StageContext = StageContext(),
                 *, prompts: Sequence[Prompt] | None = None,
                 show_progress: bool = True) -> StageRun[CandidateGroup]:
    """Sample ``config.k`` candidates for every prompt into ``RUN/generate``.

    Args:
        store (RunStore): the run.
        config (GenerateConfig): validated settings.
        context (StageContext): ``force``: re-run even when a complete result with the same
            key exists.
        prompts (Sequence[Prompt] | None): prompts to use; when None, ``config.source`` is read,
            or, when that is None too, the run's ``prompts`` stage.
        show_progress (bool): draw the progress bar (prompts/s and tokens/s).

    Returns:
        StageRun[CandidateGroup]: the finished (or cached) stage.

    Raises:
        ModelNotFoundError: a model name is neither a folder nor a Hub id (before any work).
        ConfigError: ``max_new_tokens`` leaves no room for a prompt in a model's context.
        InputFileError / StageError: the prompts cannot be read.
    """
    slots = _model_slots(config)  # a bad model name fails here, before anything is read
    loaded = _load_prompts(store, config, prompts)
    items = loaded.items
    encoders = load_encoders(slots, config)  # tokenizers and contexts: cheap, before any model
    cfg = config if config.source is None else config.model_copy(
        update={"source": str(Path(config.source))})
    fingerprint = sha256_text("|".join([loaded.fingerprint, *(_fingerprint(s) for s in slots)]))
    reads = ["prompts"] if prompts is None and config.source is None else []
    key: dict[str, Any] = {"input_fingerprint": fingerprint, "inputs": reads,
                           "stage_version": STAGE_VERSION}
    if not context.force and store.cached(STAGE, cfg, **key) is not None:
        return store.open_stage(STAGE, cfg, record_type=CandidateGroup, **key)
    with ExitStack() as stack:
        served = None
        previous = store.manifest(STAGE)
        if config.served():
            pool = stack.enter_context(ServerPool(server_settings(config), seed=config.seed))
            served = ServedSampler(pool, config)
            fresh = context.force or previous is None or previous.status != "running"
            # before the stage is opened; a fresh stage's first draws do the checking
            served.check([s for s in slots if s.served], items, first_draws=fresh)
        stage = store.open_stage(STAGE, cfg, record_type=CandidateGroup, force=context.force, **key)
        stage.add_rejects("input", loaded.rejects)
        worker = ShardGenerator(slots, encoders, config, served)
        usage = _Usage(served.pool if served else None,
                       _usage_before(stage, previous, items, config.shard_size))
        _run_shards(stage, worker, loaded, config.shard_size, show_progress, usage)
        return stage.finish(inputs=loaded.rows, stats=_stats(stage, worker, usage.total()))


@dataclass
class _Usage:
    """Server usage of the stage: this session's pool plus what the sessions it resumes used."""

    pool: ServerPool | None
    before: list[dict[str, Any]]

    def total(self) -> list[dict[str, Any]] | None:
        return None if self.pool is None else merge_usage(self.before, self.pool.usage())


def _run_shards(stage: StageRun[CandidateGroup], worker: ShardGenerator, loaded: _Prompts,
                shard_size: int, show_progress: bool, usage: _Usage) -> None:
    """Generate and write every pending shard, with a progress bar (prompts, tokens/s)."""
    items = loaded.items
    with stage_progress(disable=not show_progress) as bar:
        done = stage.done_items(items, shard_size)
        task = bar.add_task(STAGE, total=len(items), unit="prompts", completed=done)
        for shard in stage.pending_shards(items, shard_size=shard_size):
            worker.on_batch = lambda tps, share, n=len(shard.items), at=done: bar.update(
                task, completed=at + share * n, extra=f"{tps:,.0f} tokens/s")
            groups, rejects = worker.run(shard.items)
            if (servers := usage.total()) is not None:  # saved with the shard: a resume adds to it
                stage.manifest = stage.manifest.model_copy(update={"stats": {"servers": servers}})
            stage.write_shard(shard, groups, _located(rejects, loaded))
            done += len(shard.items)
            bar.update(task, completed=done)


def _usage_before(stage: StageRun[CandidateGroup], previous: Manifest | None,
                  items: Sequence[Prompt], shard_size: int) -> list[dict[str, Any]]:
    """Server usage recorded by the session this one resumes (none on a fresh start)."""
    if previous is None or previous.status != "running" or not stage.done_items(items, shard_size):
        return []
    return list(previous.stats.get("servers") or [])


def _stats(stage: StageRun[CandidateGroup], worker: ShardGenerator,
           servers: list[dict[str, Any]] | None) -> dict[str, object]:
    """Manifest numbers: kept candidates and tokens (whole run), this session's throughput, and
    for served models the requests and tokens per server (every session)."""
    kept_tokens = candidates = 0
    for path in stage.shard_paths():
        for row in read_shard_file(path, ["candidates"]).column(0).to_pylist():
            candidates += len(row)
            kept_tokens += sum(c["num_tokens"] or 0 for c in row)
    stats: dict[str, object] = {"candidates": candidates, "candidate_tokens": kept_tokens,
                                **worker.session_stats()}
    if servers is not None:
        stats["servers"] = servers
    return stats

