"""One stage's execution inside a run: its input cut into shards, each written atomically
(an Arrow IPC file, written to a temporary name and then renamed, so a shard on disk is always
whole; Arrow's own format, not Parquet, so that writing a shard and merging the shards cost no
encoding or decoding: 1.5 of the 9 CPU-s ``validate`` spent on 50,000 groups), merged into
``data/`` with ``rejects.jsonl`` and the final manifest when the stage finishes; and the
results read back. :class:`StageRun` is what every stage returns (the Stage contract,
:mod:`grouppref.runs.stage`); :meth:`grouppref.runs.store.RunStore.open_stage` makes one.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from grouppref.errors import StageError
from grouppref.runs.manifest import REJECTS, Counts, Manifest, now, read_rejects, write_rejects
from grouppref.schemas.records import Reject

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)

DATA = "data"
SHARDS = "shards"
PARTS = "parts"  # the files of a stage's own work (StageRun.scratch)
SHARD_GLOB = "shard-*.arrow"
STOP_REASON_CHARS = 300
_UNFINISHED: dict[int, StageRun[Any]] = {}  # stages this process opened and has not finished


class StageFolders(Protocol):
    """What a :class:`StageRun` needs of its run (:class:`grouppref.runs.store.RunStore`)."""

    def stage_dir(self, stage: str) -> Path: ...

    def write_manifest(self, manifest: Manifest) -> None: ...

    def output_fingerprint(self, manifest: Manifest) -> str: ...

    def data_files(self, stage: str) -> dict[str, list[int]]: ...

    def load_dataset(self, stage: str) -> datasets.Dataset: ...

    def load_records(self, stage: str, record_type: type[R]) -> list[R]: ...


@dataclass(frozen=True)
class Shard(Generic[T]):
    """A slice of a stage's input: ``items`` are input rows ``start .. start+len(items)-1``."""

    index: int
    start: int
    items: Sequence[T]


class StageRun(Generic[R]):
    """One execution (or cached result) of a stage; made by :meth:`RunStore.open_stage`.

    It is also what every stage returns (the Stage contract, :mod:`grouppref.runs.stage`):
    ``cached``, ``manifest`` (counts, stats, outputs), ``dir``, ``records()`` and ``rejects()``.
    """

    def __init__(self, store: StageFolders, manifest: Manifest, record_type: type[R] | None,
                 cached: bool):
        self.store = store
        self.manifest = manifest
        self.record_type = record_type
        self.cached = cached
        self.dir = store.stage_dir(manifest.stage)
        self._t0 = time.perf_counter()
        self._seconds_before = 0.0 if cached else (manifest.seconds or 0.0)
        if not cached:
            _UNFINISHED[id(self)] = self

    @property
    def name(self) -> str:
        return self.manifest.stage

    @property
    def counts(self) -> Counts:
        return self.manifest.counts

    @property
    def outputs(self) -> dict[str, str]:
        return self.manifest.outputs

    # -- work -------------------------------------------------------------------------------
    def _shard_path(self, index: int) -> Path:
        return self.dir / SHARDS / f"shard-{index:05d}.arrow"

    def shard_paths(self) -> list[Path]:
        """The shards written so far, in order."""
        return sorted((self.dir / SHARDS).glob(SHARD_GLOB))

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

    def _record_type(self) -> type[R]:
        """The record type of ``data/``, or a ``StageError`` for a stage that writes none."""
        if self.record_type is None:
            raise StageError(f"stage {self.name!r} writes no records (it has outputs: "
                             f"{sorted(self.outputs)})")
        return self.record_type

    def _schema(self) -> pa.Schema:
        from grouppref.schemas.arrow import arrow_schema_for

        return arrow_schema_for(self._record_type())

    def write_shard(self, shard: Shard[Any], records: Sequence[R], rejects: Sequence[Reject]) -> None:
        """Persist one shard's output and rejects; rename makes it all-or-nothing."""
        from grouppref.schemas.arrow import to_table

        self.write_table(shard, to_table(records, self._record_type()), rejects)

    def write_table(self, shard: Shard[Any], table: pa.Table, rejects: Sequence[Reject]) -> None:
        """:meth:`write_shard` for records already in Arrow form (rows :func:`to_row` would
        give, e.g. rows read back from another stage that a check proved valid)."""
        self.commit_shard(shard, self.shard_files(shard, table, rejects))

    def shard_files(self, shard: Shard[Any], table: pa.Table, rejects: Sequence[Reject]) -> Path:
        """The first half of :meth:`write_table`, which another process of the stage may do:
        write the shard's rejects, and its rows to a temporary file (returned) that
        :meth:`commit_shard` makes the shard."""
        path = self._shard_path(shard.index)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_rejects(path.with_suffix(".rejects.jsonl"), rejects)
        schema = self._schema()
        tmp = path.with_name(path.name + ".tmp")
        write_shard_file(table.select(schema.names).cast(schema), tmp)
        return tmp

    def commit_shard(self, shard: Shard[Any], tmp: Path) -> None:
        """The shard's file written by :meth:`shard_files` becomes the shard (done from here
        on, on resume too), and the manifest records the time spent."""
        os.replace(tmp, self._shard_path(shard.index))
        elapsed = self._seconds_before + time.perf_counter() - self._t0
        self.manifest = self.manifest.model_copy(update={"seconds": round(elapsed, 3)})
        self.store.write_manifest(self.manifest)  # a resumed run adds to this time

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """``RUN/<stage>/parts``, a folder for the files of the stage's own work (a read in
        processes): emptied of what a killed run left there, and removed after the block."""
        folder = self.dir / PARTS
        shutil.rmtree(folder, ignore_errors=True)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def add_rejects(self, name: str, rejects: Sequence[Reject]) -> None:
        """Rejects found outside shards (e.g. while reading the input file), kept on resume."""
        (self.dir / SHARDS).mkdir(parents=True, exist_ok=True)
        write_rejects(self.dir / SHARDS / f"{name}.rejects.jsonl", rejects)

    def _write_data(self) -> int:
        """The shards become ``data/`` (atomically): a ``save_to_disk`` folder
        (:mod:`grouppref.runs.saved`) whose data files are the shards, Arrow streams moved
        there, one file each, not copied; returns the number of records."""
        from grouppref.runs.hashing import sha256_text
        from grouppref.runs.saved import data_file_name, write_saved_state

        schema = self._schema()
        shards = self.shard_paths()
        # The dataset's fingerprint (it names datasets' cache files) from what made the rows:
        # the stage's cache key and the shards' sizes, not a hash of every byte
        m = self.manifest
        key = sha256_text(" ".join([m.stage, m.config_hash, m.input_fingerprint,
                                    *(str(p.stat().st_size) for p in shards)]))[:16]
        data_dir, tmp_dir = self.dir / DATA, self.dir / (DATA + ".tmp")
        shutil.rmtree(tmp_dir, ignore_errors=True)
        tmp_dir.mkdir(parents=True)
        names = [data_file_name(i, max(len(shards), 1)) for i in range(max(len(shards), 1))]
        if not shards:  # no rows: one file of none, as save_to_disk writes it
            write_shard_file(schema.empty_table(), tmp_dir / names[0])
        rows = 0
        for shard, name in zip(shards, names, strict=False):
            table = read_shard_file(shard)
            rows += table.num_rows
            if _is_stream(shard):
                del table  # its mapping, before the file moves
                os.replace(shard, tmp_dir / name)
            else:  # a shard of a version that wrote IPC files: written again as a stream
                write_shard_file(table, tmp_dir / name)
        write_saved_state(tmp_dir, names, schema, key)
        shutil.rmtree(data_dir, ignore_errors=True)
        os.replace(tmp_dir, data_dir)
        return rows

    def finish(self, inputs: int, stats: dict[str, Any] | None = None, *,
               outputs: dict[str, str] | None = None, kept: int | None = None) -> StageRun[R]:
        """Merge the shards into ``data/``, write ``rejects.jsonl`` and the final manifest.

        Args:
            inputs (int): rows the stage read; must equal outputs + whole-row rejects.
            stats (dict | None): stage-specific numbers for the manifest (noise rate, tokens, ...).
            outputs (dict[str, str] | None): non-record outputs, name -> location (a model
                folder, an export path, ``hub:owner/name``, ``argilla:URL#dataset``).
            kept (int | None): for a stage that writes no records: how many input rows it
                used (its ``outputs`` count).

        Raises:
            StageError: if the counts do not add up (a row would be silently lost).
        """
        shard_dir = self.dir / SHARDS
        produced = self._write_data() if self.record_type is not None else (kept or 0)
        rejects = [r for f in sorted(shard_dir.glob("*.rejects.jsonl")) for r in read_rejects(f)]
        counts = Counts(inputs=inputs, outputs=produced,
                        rejected=sum(r.scope == "row" for r in rejects),
                        partial=sum(r.scope == "part" for r in rejects))
        if counts.inputs != counts.outputs + counts.rejected:
            raise StageError(
                f"stage {self.manifest.stage!r}: {counts.inputs} rows in but {counts.outputs} out "
                f"+ {counts.rejected} rejected; a row would be lost (this is a bug in the stage)"
            )
        write_rejects(self.dir / REJECTS, rejects)
        self.manifest = self.manifest.model_copy(update={
            "status": "complete", "counts": counts, "finished_at": now(), "outputs": outputs or {},
            "seconds": round(self._seconds_before + time.perf_counter() - self._t0, 3),
            "stats": stats or {}})
        self.manifest.output_fingerprint = self.store.output_fingerprint(self.manifest)
        self.manifest.data_files = self.store.data_files(self.manifest.stage)
        self.store.write_manifest(self.manifest)
        shutil.rmtree(shard_dir, ignore_errors=True)
        _UNFINISHED.pop(id(self), None)
        return self

    # -- results ----------------------------------------------------------------------------
    def dataset(self) -> datasets.Dataset:
        return self.store.load_dataset(self.manifest.stage)

    def records(self) -> list[R]:
        return self.store.load_records(self.manifest.stage, self._record_type())

    def rejects(self) -> list[Reject]:
        return read_rejects(self.dir / REJECTS)


SHARD_BATCH = 1000  # rows per record batch of a shard file (as in data/)


def write_shard_file(table: pa.Table, path: Path) -> None:
    """Write ``table`` as one shard file: an Arrow IPC stream (uncompressed), as a data file
    of ``data/`` is, in record batches of :data:`SHARD_BATCH` rows, each copied into buffers of
    its own: the file's bytes depend on its rows alone, not on the table's chunks (a table read
    in parts and joined writes the file a table read whole writes; IPC pads a buffer that is a
    slice of a larger one to 64 bytes, and writes a buffer of its own as it is)."""
    import pyarrow as pa

    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for start in range(0, table.num_rows, SHARD_BATCH):
            part = table.slice(start, SHARD_BATCH)
            writer.write_batch(pa.RecordBatch.from_arrays(
                [pa.concat_arrays(column.chunks) for column in part.columns],
                schema=part.schema))


def write_part_file(table: pa.Table, path: Path) -> None:
    """Write ``table`` as an Arrow IPC stream with its chunks as they are: a process's part of
    a read, which the parent maps back whole (:func:`read_shard_file`); unlike
    :func:`write_shard_file` no column is copied first, so its bytes depend on the chunks."""
    import pyarrow as pa

    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


IPC_FILE_MAGIC = b"ARROW1"  # how an Arrow IPC file (not a stream) begins


def _is_stream(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(len(IPC_FILE_MAGIC)) != IPC_FILE_MAGIC


def read_shard_file(path: Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A shard file's table (``columns``: only these), memory-mapped: its rows are read from
    the page cache when used, not copied. (A shard of a version that wrote IPC files, not
    streams, is read too.)"""
    import pyarrow as pa

    # not closed here: the table's buffers are the mapping (unmapped when they are freed)
    source = pa.memory_map(str(path))
    reader = pa.ipc.open_stream(source) if _is_stream(path) else pa.ipc.open_file(source)
    table = reader.read_all()
    return table.select(list(columns)) if columns is not None else table


def record_stops(reason: str) -> list[str]:
    """Write ``reason`` into the manifest of every stage this process opened and did not finish
    (it stopped on an error or an interruption), so ``inspect`` says why it is not complete
    instead of "running". The stage stays resumable. Returns the stages marked."""
    marked = []
    for stage in list(_UNFINISHED.values()):
        if stage.manifest.status != "running":
            continue
        stage.manifest = stage.manifest.model_copy(
            update={"stopped": reason[:STOP_REASON_CHARS], "finished_at": now()})
        try:
            stage.store.write_manifest(stage.manifest)
        except OSError:  # the run folder is gone or read-only: nothing to record into
            continue
        marked.append(stage.name)
    _UNFINISHED.clear()
    return marked

