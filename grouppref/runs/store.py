"""Run store: run directories, manifests, caching, resumable shards and rejects.

Layout of one run (``RUN`` is any directory, conventionally ``runs/<name>``)::

    RUN/<stage>/manifest.json     what ran: config, hashes, counts, timings, versions, stats
    RUN/<stage>/data/             the output ``datasets.Dataset`` (save_to_disk), one row per group
    RUN/<stage>/rejects.jsonl     rows (or parts of rows) left out, each with its reason
    RUN/<stage>/shards/           work in progress: one Arrow + rejects file per finished shard

A stage is *cached* when its manifest is complete and has the same config hash, input
fingerprint and stage version (and its non-record outputs still exist): it is then skipped
(``force=True`` re-runs it). The input fingerprint covers the files it read and the output
fingerprint of every stage of the run it read, so re-running an upstream stage with other
settings makes every stage below it *stale* (:meth:`RunStore.stale_inputs`). A stage that was
killed resumes: shards already written are kept, the rest are computed. Writing shards and
merging them is :class:`~grouppref.runs.stage_run.StageRun`'s part
(:mod:`grouppref.runs.stage_run`; imported from here too); this module keeps the run's folders,
manifests, cache keys and staleness.

Typical use inside a stage::

    stage = store.open_stage("rank", config, inputs=["generate"], record_type=AnnotatedGroup)
    if stage.cached:
        return stage
    for shard in stage.pending_shards(groups, shard_size=config.shard_size):
        records, rejects = work(shard.items)
        stage.write_shard(shard, records, rejects)
    return stage.finish(inputs=len(groups), stats={...})
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from grouppref.errors import ConfigError, StageError
from grouppref.runs.hashing import (
    canonical_json,
    config_hash,
    fingerprint_file,
    fingerprint_folder,
    fingerprint_inputs,
    sha256_text,
)
from grouppref.runs.manifest import (
    MANIFEST,
    Manifest,
    atomic_write_text,
    now,
    package_versions,
)
from grouppref.runs.stage_run import DATA, SHARDS, Shard, StageRun

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

__all__ = ["DATA", "SHARDS", "RunStore", "Shard", "StageRun", "is_remote"]  # StageRun, Shard: stage_run.py

R = TypeVar("R", bound=BaseModel)

REMOTE_PREFIXES = ("hub:", "argilla:", "http://", "https://")


def is_remote(location: str) -> bool:
    """True for an output that lives elsewhere (a Hub repo, an Argilla dataset)."""
    return location.startswith(REMOTE_PREFIXES)


class RunStore:
    """The directory of one run; each stage gets ``RUN/<stage>/`` (``export/<target>`` for
    the exports: one folder, manifest and cache entry per target)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def name(self) -> str:
        return self.root.resolve().name

    def _make_root(self) -> None:
        """Create the run directory, or say in one line why it cannot be one."""
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"{self.root}: not a directory; the run directory (--out, "
                              "run_dir) must be a folder")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{self.root}: cannot create the run directory "
                              f"({e.strerror})") from e

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
        atomic_write_text(path, manifest.model_dump_json(indent=2) + "\n")

    def manifests(self) -> list[Manifest]:
        """Every stage manifest of the run (nested ones such as ``export/<target>`` too),
        oldest first."""
        paths = [*self.root.glob(f"*/{MANIFEST}"), *self.root.glob(f"*/*/{MANIFEST}")]
        found = [self.manifest(str(p.parent.relative_to(self.root))) for p in paths]
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
        import datasets

        self.require(stage)
        return datasets.load_from_disk(str(self.stage_dir(stage) / DATA))

    def load_table(self, stage: str) -> pa.Table:
        """The rows of a complete stage's ``data/`` as one Arrow table, memory-mapped and
        read without ``datasets`` (:func:`~grouppref.runs.saved.read_saved`)."""
        from grouppref.runs.saved import read_saved

        self.require(stage)
        return read_saved(self.stage_dir(stage) / DATA)

    def load_records(self, stage: str, record_type: type[R]) -> list[R]:
        from grouppref.schemas.arrow import from_table

        return from_table(self.load_table(stage), record_type)

    # -- cache keys and staleness ------------------------------------------------------------
    def input_fingerprints(self, stages: Sequence[str]) -> dict[str, str]:
        """The current output fingerprint of each stage read (each must be complete)."""
        return {s: self.require(s).output_fingerprint or "" for s in stages}

    def output_fingerprint(self, manifest: Manifest) -> str:
        """Identity of a stage's output: the content of ``data/``; for a stage with
        non-record outputs (a model, an export) also its settings, input and locations, since
        the same records can give another model."""
        data = self.stage_dir(manifest.stage) / DATA
        hashed = fingerprint_folder if manifest.data_hash == "files" else fingerprint_file
        content = hashed(data) if data.is_dir() else ""
        if not manifest.outputs:
            return content
        return sha256_text(canonical_json({
            "data": content, "outputs": manifest.outputs, "config": manifest.config_hash,
            "input": manifest.input_fingerprint}))

    def data_files(self, stage: str) -> dict[str, list[int]]:
        """The files of ``RUN/<stage>/data``: relative name -> ``[size, mtime_ns]``."""
        data = self.stage_dir(stage) / DATA
        if not data.is_dir():
            return {}
        return {str(p.relative_to(data)): [(st := p.stat()).st_size, st.st_mtime_ns]
                for p in sorted(data.rglob("*")) if p.is_file()}

    def intact(self, stage: str) -> bool:
        """Stage ``stage`` is complete and its ``data/`` is byte for byte what it wrote: rows it
        wrote from validated records, not edited since. Its files' sizes and modification
        times as the manifest recorded them say so without reading them (as ``git status``
        trusts its index); else the content must give the output fingerprint again."""
        m = self.manifest(stage)
        if m is None or m.status != "complete" or not m.output_fingerprint:
            return False
        if m.data_files and self.data_files(stage) == m.data_files:
            return True
        return self.output_fingerprint(m) == m.output_fingerprint

    def stale_inputs(self, stage: str) -> list[str]:
        """The stages this stage read that changed (re-run with other settings or results,
        or gone) since it ran; empty when it is current or has not run."""
        m = self.manifest(stage)
        if m is None:
            return []
        changed = []
        for name, fingerprint in m.inputs.items():
            now_m = self.manifest(name)
            if now_m is None or now_m.status != "complete" or now_m.output_fingerprint != fingerprint:
                changed.append(name)
        return changed

    def lineage(self, stage: str) -> list[Manifest]:
        """The manifests ``stage``'s output derives from, upstream first, itself last (each
        once): what a dataset card or a report describes as "how it was made"."""
        seen: dict[str, Manifest] = {}

        def visit(name: str) -> None:
            m = self.manifest(name)
            if m is None or name in seen:
                return
            for upstream in m.inputs:
                visit(upstream)
            seen[name] = m

        visit(stage)
        return list(seen.values())

    def _reusable(self, manifest: Manifest) -> bool:
        """Complete, and every local output it names still exists."""
        return manifest.status == "complete" and all(
            is_remote(loc) or Path(loc).exists() for loc in manifest.outputs.values())

    def cached(self, stage: str, config: BaseModel | dict[str, Any], *, input_fingerprint: str = "",
               inputs: Sequence[str] = (), stage_version: str = "1") -> Manifest | None:
        """The complete manifest :meth:`open_stage` would reuse, without opening anything (so
        every process of a distributed launch can ask, and only the main one writes)."""
        m = self.manifest(stage)
        key = fingerprint_inputs(input_fingerprint, self.input_fingerprints(inputs))
        if not _same_key(m, config_hash(config, stage_version), key, stage_version):
            return None
        return m if m is not None and self._reusable(m) else None

    def open_stage(
        self,
        stage: str,
        config: BaseModel | dict[str, Any],
        *,
        record_type: type[R] | None,
        input_fingerprint: str = "",
        inputs: Sequence[str] = (),
        stage_version: str = "1",
        force: bool = False,
    ) -> StageRun[R]:
        """Start, resume or reuse a stage.

        Args:
            stage (str): its folder name in the run.
            config (BaseModel | dict): the validated settings (hashed into the cache key).
            record_type (type | None): the record the stage writes to ``data/``; ``None`` for
                a stage whose output lives elsewhere (``finish(outputs=...)``).
            input_fingerprint (str): what it read from outside the run (a file's hash).
            inputs (Sequence[str]): stages of the run it reads; their output fingerprints join
                the cache key and the manifest (a later change upstream makes this one stale).
            stage_version (str): bump it when the stage's output changes for the same input.
            force (bool): run again even when cached.

        Returns a cached :class:`StageRun` (``.cached`` is True) when a complete manifest has
        the same config hash, input fingerprint and stage version, its outputs still exist and
        ``force`` is False. A ``running`` manifest with the same key resumes its shards;
        anything else starts afresh.
        """
        self._make_root()
        read = self.input_fingerprints(inputs)
        fingerprint = fingerprint_inputs(input_fingerprint, read)
        chash = config_hash(config, stage_version)
        previous = self.manifest(stage)
        same_key = _same_key(previous, chash, fingerprint, stage_version)
        if previous is not None and same_key and not force and self._reusable(previous):
            return StageRun(self, previous, record_type, cached=True)
        resuming = same_key and not force and previous is not None and previous.status == "running"
        resumed = previous if resuming else None
        if resumed is None:
            shutil.rmtree(self.stage_dir(stage) / SHARDS, ignore_errors=True)
        manifest = Manifest(
            stage=stage, run=self.name, status="running", stage_version=stage_version,
            config=config.model_dump(mode="json") if isinstance(config, BaseModel) else config,
            config_hash=chash, input_fingerprint=fingerprint, inputs=read,
            record_type=record_type.__name__ if record_type else None, data_hash="files",
            started_at=resumed.started_at if resumed is not None else now(),
            seconds=resumed.seconds if resumed is not None else None,
            versions=package_versions())
        self.write_manifest(manifest)
        return StageRun(self, manifest, record_type, cached=False)


def _same_key(manifest: Manifest | None, chash: str, fingerprint: str, stage_version: str) -> bool:
    """Whether ``manifest`` was made with this cache key (settings, input, stage version)."""
    return (manifest is not None and manifest.config_hash == chash
            and manifest.input_fingerprint == fingerprint
            and manifest.stage_version == stage_version)
