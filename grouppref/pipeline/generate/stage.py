"""The ``generate`` stage: sample K candidates per prompt from one or more causal LMs and write
``CandidateGroup`` rows to ``RUN/generate``.

What it reads: a prompt file (``source``), a list of prompts, or the ``RUN/prompts`` stage.
What it writes: one group per prompt; prompts that cannot give ``min_k`` distinct candidates,
or that do not fit the model's context, go to ``rejects.jsonl`` with the reason.

Every candidate records its model, sampling settings, its own derived seed, ``num_tokens`` and
``behavior_logp`` (see :mod:`grouppref.models.sampling`). Work is done in shards of prompts;
a killed run resumes at the first missing shard and, because each candidate has its own seed,
gives exactly the rows an uninterrupted run gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grouppref.errors import ConfigError
from grouppref.models.loading import is_embedded, model_fingerprint, resolve_model
from grouppref.pipeline.generate.shard import ModelSlot, ShardGenerator, load_encoders
from grouppref.readers.rows import ColumnMapping, read_prompts
from grouppref.runs.progress import stage_progress
from grouppref.runs.store import (
    SHARDS,
    RunStore,
    StageRun,
    fingerprint_records,
    sha256_text,
)
from grouppref.schemas import MAX_K, MIN_K, CandidateGroup, Prompt, Reject, make_group_id

STAGE = "generate"
STAGE_VERSION = "1"
DEFAULT_K = 4


class ModelShare(BaseModel):
    """One model of a group's mix and how many candidates of each group it writes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="embedded", description="Hub id or local path of a causal LM; "
                      "'embedded' is the bundled SmolLM2-135M-Instruct.")
    count: int | None = Field(default=None, ge=1, le=MAX_K, description="Candidates per group "
                              "from this model (left out: K is split evenly between models).")

    @classmethod
    def parse(cls, spec: str) -> ModelShare:
        """``NAME`` or ``NAME:COUNT`` (e.g. ``HuggingFaceTB/SmolLM2-360M-Instruct:2``).

        Raises:
            ConfigError: an empty name or a count that is not a positive integer.
        """
        name, sep, tail = spec.rpartition(":")
        if not sep or not tail.strip().lstrip("-").isdigit():
            name, count = spec, None
        else:
            count = int(tail)
            if count < 1:
                raise ConfigError(f"--model {spec!r}: the count after ':' must be >= 1")
        if not name.strip():
            raise ConfigError(f"--model {spec!r}: give a model name or path before ':'")
        return cls(name=name.strip(), count=count)


class GenerateConfig(BaseModel):
    """Settings of the ``generate`` stage (every field is part of the cache key)."""

    model_config = ConfigDict(extra="forbid")

    source: str | None = Field(default=None, description="Prompt file (JSONL/JSON/CSV/Parquet), "
                               "saved dataset or Hub id; left out: the run's prompts stage.")
    split: str = Field(default="train", description="Split to read from a dataset with splits.")
    mapping: ColumnMapping = Field(default_factory=ColumnMapping,
                                   description="Which columns hold the prompt fields.")
    models: list[ModelShare] = Field(default_factory=lambda: [ModelShare()], min_length=1,
                                     description="Models to sample from, NAME or NAME:COUNT; "
                                     "repeat to mix models in one group.")
    k: int | None = Field(default=None, ge=MIN_K, le=MAX_K, description="Candidates per prompt "
                          f"(default {DEFAULT_K}, or the sum of the models' counts).")
    min_k: int = Field(default=MIN_K, ge=MIN_K, le=MAX_K, description="Fewest distinct "
                       "candidates a group may keep; groups with fewer go to rejects.")
    max_resample: int = Field(default=3, ge=0, le=20, description="Rounds of re-sampling for "
                              "empty or duplicate candidates before giving up on them.")
    temperature: float = Field(default=1.0, gt=0.0, le=10.0,
                               description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling: keep the "
                         "smallest set of tokens with this much probability (1.0 keeps all).")
    max_new_tokens: int = Field(default=256, ge=1, description="Most tokens per candidate.")
    seed: int = Field(default=0, ge=0, description="Run seed; each candidate's seed is derived "
                      "from it, the group id, the model, its slot and its attempt.")
    batch_size: int = Field(default=16, ge=1, description="Sequences per generate call.")
    shard_size: int = Field(default=32, ge=1, description="Prompts per shard (the unit of "
                            "resuming a killed run).")
    chat_template: bool = Field(default=True, description="Format prompts with the tokenizer's "
                                "chat template (plain-text prompts become one user turn).")
    truncate_prompts: bool = Field(default=False, description="Keep the last tokens of a prompt "
                                   "too long for the model's context instead of rejecting it.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(default="float32",
                                                             description="Model weights dtype.")
    device: str = Field(default="cpu", description="Torch device, e.g. 'cpu' or 'cuda:0'.")

    @model_validator(mode="after")
    def _resolve_counts(self) -> GenerateConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models {names}: name each model once (use NAME:COUNT)")
        counts = [m.count for m in self.models]
        if all(c is not None for c in counts):
            total = sum(c for c in counts if c is not None)
            if self.k is not None and self.k != total:
                raise ValueError(f"k={self.k} but the model counts {counts} add up to {total}; "
                                 "leave k out or make them agree")
            self.k = total
        elif any(c is not None for c in counts):
            raise ValueError(f"models {names}: give a count to every model or to none")
        else:
            k = self.k or DEFAULT_K
            if k < len(self.models):
                raise ValueError(f"k={k} is fewer than the {len(self.models)} models")
            self.k = k
            self.models = [ModelShare(name=m.name, count=k // len(self.models)
                                      + (i < k % len(self.models)))
                           for i, m in enumerate(self.models)]
        if not MIN_K <= self.k <= MAX_K:
            raise ValueError(f"k={self.k}: a group holds {MIN_K} to {MAX_K} candidates")
        if self.min_k > self.k:
            raise ValueError(f"min_k={self.min_k} is more than k={self.k}")
        return self


def _load_prompts(store: RunStore, config: GenerateConfig,
                  prompts: Sequence[Prompt] | None) -> tuple[list[Prompt], list[Reject], int, str]:
    """Prompts, input rejects, rows read and a fingerprint, from a list, a file or RUN/prompts."""
    if prompts is not None:
        kept, rejects, seen = [], [], {}
        for number, prompt in enumerate(prompts, start=1):
            gid = make_group_id(prompt)
            if gid in seen:
                rejects.append(Reject(stage=STAGE, reason=f"same prompt as #{seen[gid]}",
                                      row=number, group_id=gid))
                continue
            seen[gid] = number
            kept.append(prompt)
        return kept, rejects, len(prompts), fingerprint_records(prompts)
    if config.source is not None:
        result = read_prompts(config.source, config.mapping, stage=STAGE, split=config.split)
        return result.items, result.rejects, result.rows, result.fingerprint
    manifest = store.require("prompts")
    records = store.load_records("prompts", Prompt)
    return records, [], len(records), manifest.output_fingerprint or fingerprint_records(records)


def _model_slots(config: GenerateConfig) -> list[ModelSlot]:
    """Resolve every model (fails fast on a bad name) and give each its slots 0..K-1."""
    slots, start = [], 0
    for share in config.models:
        count = share.count or 0
        path = resolve_model(None if is_embedded(share.name) else share.name)
        slots.append(ModelSlot(name=share.name, path=path, slots=range(start, start + count)))
        start += count
    return slots


def run_generate(store: RunStore, config: GenerateConfig, prompts: Sequence[Prompt] | None = None,
                 force: bool = False, show_progress: bool = True) -> StageRun[CandidateGroup]:
    """Sample ``config.k`` candidates for every prompt into ``RUN/generate``.

    Args:
        store (RunStore): the run.
        config (GenerateConfig): validated settings.
        prompts (Sequence[Prompt] | None): prompts to use; when None, ``config.source`` is read,
            or, when that is None too, the run's ``prompts`` stage.
        force (bool): re-run even when a complete result with the same key exists.
        show_progress (bool): draw the progress bar (prompts/s and tokens/s).

    Returns:
        StageRun[CandidateGroup]: the finished (or cached) stage.

    Raises:
        ModelNotFoundError: a model name is neither a folder nor a Hub id (before any work).
        ConfigError: ``max_new_tokens`` leaves no room for a prompt in a model's context.
        InputFileError / StageError: the prompts cannot be read.
    """
    slots = _model_slots(config)  # a bad model name fails here, before anything is read
    items, input_rejects, rows, prompts_fp = _load_prompts(store, config, prompts)
    encoders = load_encoders(slots, config)  # tokenizers and contexts: cheap, before any model
    cfg = config if config.source is None else config.model_copy(
        update={"source": str(Path(config.source))})
    fingerprint = sha256_text("|".join([prompts_fp, *(model_fingerprint(s.path) for s in slots)]))
    stage = store.open_stage(STAGE, cfg, input_fingerprint=fingerprint, record_type=CandidateGroup,
                             stage_version=STAGE_VERSION, force=force)
    if stage.cached:
        return stage
    stage.add_rejects("input", input_rejects)
    worker = ShardGenerator(slots, encoders, config)
    with stage_progress(disable=not show_progress) as bar:
        done = stage.done_items(items, config.shard_size)
        task = bar.add_task(STAGE, total=len(items), unit="prompts", completed=done)
        for shard in stage.pending_shards(items, shard_size=config.shard_size):
            worker.on_batch = lambda tps, share, n=len(shard.items), at=done: bar.update(
                task, completed=at + share * n, extra=f"{tps:,.0f} tokens/s")
            groups, rejects = worker.run(shard.items)
            stage.write_shard(shard, groups, rejects)
            done += len(shard.items)
            bar.update(task, completed=done)
    return stage.finish(inputs=rows, stats=_stats(stage, worker))


def _stats(stage: StageRun[CandidateGroup], worker: ShardGenerator) -> dict[str, object]:
    """Manifest numbers: kept candidates and tokens (whole run) and this session's throughput."""
    import pyarrow.parquet as pq

    kept_tokens = candidates = 0
    for path in sorted((stage.dir / SHARDS).glob("shard-*.parquet")):
        for row in pq.read_table(path, columns=["candidates"]).column(0).to_pylist():
            candidates += len(row)
            kept_tokens += sum(c["num_tokens"] or 0 for c in row)
    return {"candidates": candidates, "candidate_tokens": kept_tokens, **worker.session_stats()}

