"""Run store: run directories, manifests, caching, resumable shards and rejects.

Layout of one run (``RUN`` is any directory, conventionally ``runs/<name>``)::

    RUN/<stage>/manifest.json     what ran: config, hashes, counts, timings, versions, stats
    RUN/<stage>/data/             the output ``datasets.Dataset`` (save_to_disk), one row per group
    RUN/<stage>/rejects.jsonl     rows (or parts of rows) left out, each with its reason
    RUN/<stage>/shards/           work in progress: one Parquet + rejects file per finished shard

A stage is *cached* when its manifest is complete and has the same config hash, input
fingerprint and stage version: it is then skipped (``force=True`` re-runs it). A stage that was
killed resumes: shards already written are kept, the rest are computed. A shard is written to a
temporary name and renamed, so a shard on disk is always whole.

Typical use inside a stage::

    stage = store.open_stage("rank", config, input_fingerprint=fp, record_type=AnnotatedGroup)
    if stage.cached:
        return stage.result()
    for shard in stage.pending_shards(groups, shard_size=config.shard_size):
        records, rejects = work(shard.items)
        stage.write_shard(shard, records, rejects)
    return stage.finish(stats={...})
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from grouppref.errors import StageError
from grouppref.schemas import Reject, features_for, from_dataset, to_row

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)

MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"
DATA = "data"
SHARDS = "shards"
_TRACKED_PACKAGES = ("grouppref", "pydantic", "datasets", "pyarrow", "torch", "transformers",
                     "accelerate", "argilla", "numpy")


class Counts(BaseModel):
    """Row counts of one stage: ``inputs == outputs + rejected`` (``partial`` rows were kept)."""

    model_config = ConfigDict(extra="forbid")

    inputs: int = 0
    outputs: int = 0
    rejected: int = 0
    partial: int = Field(default=0, description="Rejects of part of a row (the row was kept).")


class Manifest(BaseModel):
    """What one stage did; written to ``RUN/<stage>/manifest.json``."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    run: str
    status: Literal["running", "complete"]
    stage_version: str
    config: dict[str, Any]
    config_hash: str
    input_fingerprint: str
    output_fingerprint: str | None = None
    record_type: str | None = None
    counts: Counts = Field(default_factory=Counts)
    started_at: datetime
    finished_at: datetime | None = None
    seconds: float | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    stats: dict[str, Any] = Field(default_factory=dict)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_hash(config: BaseModel | dict[str, Any], stage_version: str) -> str:
    """Hash of the validated settings plus the stage version (the cache key's config half)."""
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    return sha256_text(canonical_json({"config": data, "stage_version": stage_version}))


def fingerprint_file(path: Path) -> str:
    """sha256 of a file's bytes, or of every file under a directory (names included)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def fingerprint_records(records: Iterable[BaseModel]) -> str:
    """sha256 over the canonical JSON of records, in order."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(canonical_json(record.model_dump(mode="json")).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_rejects(path: Path, rejects: Iterable[Reject]) -> int:
    """Write rejects as JSON lines (atomically); returns how many."""
    lines = [r.model_dump_json() for r in rejects]
    _atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_rejects(path: Path) -> list[Reject]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as fh:
        return [Reject.model_validate_json(line) for line in fh if line.strip()]


@dataclass(frozen=True)
class Shard(Generic[T]):
    """A slice of a stage's input: ``items`` are input rows ``start .. start+len(items)-1``."""

    index: int
    start: int
    items: Sequence[T]


class StageRun(Generic[R]):
    """One execution (or cached result) of a stage; made by :meth:`RunStore.open_stage`."""

    def __init__(self, store: RunStore, manifest: Manifest, record_type: type[R], cached: bool):
        self.store = store
        self.manifest = manifest
        self.record_type = record_type
        self.cached = cached
        self.dir = store.stage_dir(manifest.stage)
        self._t0 = time.perf_counter()
        self._seconds_before = 0.0 if cached else (manifest.seconds or 0.0)

    # -- work -------------------------------------------------------------------------------
    def _shard_path(self, index: int) -> Path:
        return self.dir / SHARDS / f"shard-{index:05d}.parquet"

    def shard_done(self, index: int) -> bool:
        return self._shard_path(index).exists()

    def pending_shards(self, items: Sequence[T], shard_size: int) -> Iterator[Shard[T]]:
        """Yield the shards of ``items`` not yet written (all of them on a fresh run)."""
        if shard_size < 1:
            raise StageError(f"shard_size must be >= 1, got {shard_size}")
        for index, start in enumerate(range(0, len(items), shard_size)):
            if not self.shard_done(index):
                yield Shard(index=index, start=start, items=items[start : start + shard_size])

    def done_items(self, items: Sequence[T], shard_size: int) -> int:
        """How many of ``items`` lie in shards already written (for progress bars on resume)."""
        return sum(
            len(items[s : s + shard_size])
            for i, s in enumerate(range(0, len(items), shard_size))
            if self.shard_done(i)
        )

    def write_shard(self, shard: Shard[Any], records: Sequence[R], rejects: Sequence[Reject]) -> None:
        """Persist one shard's output and rejects; rename makes it all-or-nothing."""
        path = self._shard_path(shard.index)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_rejects(path.with_suffix(".rejects.jsonl"), rejects)
        table = pa.Table.from_pylist(
            [to_row(r) for r in records],
            schema=features_for(self.record_type).arrow_schema,
        )
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)  # the shard counts as done only from here on
        elapsed = self._seconds_before + time.perf_counter() - self._t0
        self.manifest = self.manifest.model_copy(update={"seconds": round(elapsed, 3)})
        self.store.write_manifest(self.manifest)  # a resumed run adds to this time

    def add_rejects(self, name: str, rejects: Sequence[Reject]) -> None:
        """Rejects found outside shards (e.g. while reading the input file), kept on resume."""
        (self.dir / SHARDS).mkdir(parents=True, exist_ok=True)
        write_rejects(self.dir / SHARDS / f"{name}.rejects.jsonl", rejects)

    def finish(self, inputs: int, stats: dict[str, Any] | None = None) -> StageRun[R]:
        """Merge the shards into ``data/``, write ``rejects.jsonl`` and the final manifest.

        Args:
            inputs (int): rows the stage read; must equal outputs + whole-row rejects.
            stats (dict | None): stage-specific numbers for the manifest (noise rate, tokens, ...).

        Raises:
            StageError: if the counts do not add up (a row would be silently lost).
        """
        shard_dir = self.dir / SHARDS
        parquet_files = sorted(shard_dir.glob("shard-*.parquet"))
        features = features_for(self.record_type)
        tables = [pq.read_table(p) for p in parquet_files]
        table = pa.concat_tables(tables) if tables else features.arrow_schema.empty_table()
        dataset = datasets.Dataset(table, info=datasets.DatasetInfo(features=features))
        rejects = [r for f in sorted(shard_dir.glob("*.rejects.jsonl")) for r in read_rejects(f)]
        counts = Counts(
            inputs=inputs,
            outputs=len(dataset),
            rejected=sum(r.scope == "row" for r in rejects),
            partial=sum(r.scope == "part" for r in rejects),
        )
        if counts.inputs != counts.outputs + counts.rejected:
            raise StageError(
                f"stage {self.manifest.stage!r}: {counts.inputs} rows in but {counts.outputs} out "
                f"+ {counts.rejected} rejected; a row would be lost (this is a bug in the stage)"
            )
        data_dir = self.dir / DATA
        tmp_dir = self.dir / (DATA + ".tmp")
        shutil.rmtree(tmp_dir, ignore_errors=True)
        # An empty dataset must still be saved as one (empty) shard to load back.
        dataset.save_to_disk(str(tmp_dir), num_shards=1 if len(dataset) == 0 else None)
        shutil.rmtree(data_dir, ignore_errors=True)
        os.replace(tmp_dir, data_dir)
        write_rejects(self.dir / REJECTS, rejects)
        finished = _now()
        self.manifest = self.manifest.model_copy(update={
            "status": "complete",
            "counts": counts,
            "finished_at": finished,
            "seconds": round(self._seconds_before + time.perf_counter() - self._t0, 3),
            "output_fingerprint": fingerprint_file(data_dir),
            "stats": stats or {},
        })
        self.store.write_manifest(self.manifest)
        shutil.rmtree(shard_dir, ignore_errors=True)
        return self

    # -- results ----------------------------------------------------------------------------
    def dataset(self) -> datasets.Dataset:
        return self.store.load_dataset(self.manifest.stage)

    def records(self) -> list[R]:
        return from_dataset(self.dataset(), self.record_type)

    def rejects(self) -> list[Reject]:
        return read_rejects(self.dir / REJECTS)


class RunStore:
    """The directory of one run; each stage gets ``RUN/<stage>/``."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def name(self) -> str:
        return self.root.resolve().name

    def stage_dir(self, stage: str) -> Path:
        return self.root / stage

    def manifest(self, stage: str) -> Manifest | None:
        path = self.stage_dir(stage) / MANIFEST
        if not path.exists():
            return None
        return Manifest.model_validate_json(path.read_text(encoding="utf-8"))

    def write_manifest(self, manifest: Manifest) -> None:
        path = self.stage_dir(manifest.stage) / MANIFEST
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(path, manifest.model_dump_json(indent=2) + "\n")

    def manifests(self) -> list[Manifest]:
        """Every stage manifest of the run, oldest first."""
        found = [self.manifest(p.parent.name) for p in self.root.glob(f"*/{MANIFEST}")]
        return sorted((m for m in found if m), key=lambda m: m.started_at)

    def is_complete(self, stage: str) -> bool:
        m = self.manifest(stage)
        return m is not None and m.status == "complete"

    def require(self, stage: str) -> Manifest:
        """The manifest of a complete stage, or a ``StageError`` saying what to run first."""
        m = self.manifest(stage)
        if m is None or m.status != "complete":
            state = "has not run" if m is None else "did not finish"
            raise StageError(f"{self.root}: stage {stage!r} {state}; run `grouppref {stage}` first")
        return m

    def latest(self, stages: Sequence[str]) -> Manifest:
        """The most recently finished complete stage among ``stages``."""
        done = [m for s in stages if (m := self.manifest(s)) and m.status == "complete"]
        if not done:
            raise StageError(f"{self.root}: none of the stages {list(stages)} has completed")
        return max(done, key=lambda m: m.finished_at or m.started_at)

    def load_dataset(self, stage: str) -> datasets.Dataset:
        self.require(stage)
        return datasets.load_from_disk(str(self.stage_dir(stage) / DATA))

    def load_records(self, stage: str, record_type: type[R]) -> list[R]:
        return from_dataset(self.load_dataset(stage), record_type)

    def open_stage(
        self,
        stage: str,
        config: BaseModel | dict[str, Any],
        *,
        input_fingerprint: str,
        record_type: type[R],
        stage_version: str = "1",
        force: bool = False,
    ) -> StageRun[R]:
        """Start, resume or reuse a stage.

        Returns a cached :class:`StageRun` (``.cached`` is True) when a complete manifest has the
        same config hash, input fingerprint and stage version and ``force`` is False. A
        ``running`` manifest with the same key resumes its shards; anything else starts afresh.
        """
        chash = config_hash(config, stage_version)
        previous = self.manifest(stage)
        same_key = (
            previous is not None
            and previous.config_hash == chash
            and previous.input_fingerprint == input_fingerprint
            and previous.stage_version == stage_version
        )
        if previous is not None and same_key and previous.status == "complete" and not force:
            return StageRun(self, previous, record_type, cached=True)
        stage_dir = self.stage_dir(stage)
        resuming = previous is not None and same_key and previous.status == "running" and not force
        if not resuming:
            shutil.rmtree(stage_dir / SHARDS, ignore_errors=True)
        config_data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
        manifest = Manifest(
            stage=stage,
            run=self.name,
            status="running",
            stage_version=stage_version,
            config=config_data,
            config_hash=chash,
            input_fingerprint=input_fingerprint,
            record_type=record_type.__name__,
            started_at=previous.started_at if resuming and previous else _now(),
            seconds=previous.seconds if resuming and previous else None,
            versions=package_versions(),
        )
        self.write_manifest(manifest)
        return StageRun(self, manifest, record_type, cached=False)
