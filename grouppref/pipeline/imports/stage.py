"""The ``import`` stage (``grouppref import``): public or in-house preference data, read with
its rankings into ``RUN/import`` as AnnotatedGroup rows that ``aggregate`` (and ``rank``,
``simulate``) read directly. And ``generate --import``: the same reading, candidates only,
into ``RUN/generate`` (CandidateGroup rows), for runs that rank them afterwards.

The layouts (docs/import.md) live in :mod:`grouppref.pipeline.imports.layouts`, one module
each. Counts: a stage input is a group as assembled from the rows (each part of a split group
counts) or a row rejected on its own (``inputs == outputs + rejected``); the rows read, the
blank lines, the rankings (partial ones too) and the annotators are in the manifest's stats.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grouppref.errors import InputFileError
from grouppref.pipeline.imports.config import (
    CANDIDATES_STAGE,
    CANDIDATES_VERSION,
    STAGE,
    STAGE_VERSION,
    ImportConfig,
)
from grouppref.pipeline.imports.layouts import READERS, context, detect, nectar_columns, peek
from grouppref.pipeline.imports.layouts.raw_groups import Imported
from grouppref.pipeline.imports.parallel import plan, read_parallel
from grouppref.readers.lines import jsonl_file
from grouppref.readers.rows import Decoding, iter_rows, source_fingerprint, source_kind
from grouppref.runs.collector import cycle_collection_paused
from grouppref.runs.processes import default_workers
from grouppref.runs.progress import live_count
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import AnnotatedGroup, CandidateGroup, Reject

if TYPE_CHECKING:
    import pyarrow as pa


def read_import(config: ImportConfig, stage: str = STAGE, scratch: Path | None = None
                ) -> Imported:
    """Read ``config.source`` with its layout (told from the first row when ``auto``); a large
    file in parts on several cores (:mod:`.parallel`, its files in ``scratch``, a bar of the
    bytes read on stderr), else in this process: a JSON Lines file of Nectar rows over columns
    (:mod:`.layouts.nectar_columns`), any other with a live count of the rows on a terminal.

    Raises:
        InputFileError: the source is missing, unreadable, not UTF-8 text, holds no rows, or
            its layout cannot be told.
    """
    source = str(config.source)
    read = iter_rows(source, config.split)
    first, rows = peek(read)
    layout: str = config.layout
    if layout == "auto":
        layout = detect(first, config, source) if first is not None else "responses"
    ranges = plan(config, layout)
    imported = None
    if ranges is not None:  # a large file: its parts read on several cores
        read.close()  # its file, open since the first row, is closed
        imported = read_parallel(config, layout, stage, ranges, scratch)
        if imported is None:
            rows = iter_rows(source, config.split)
    ctx = context(config, layout, source, stage)
    whole = jsonl_file(source) if imported is None and nectar_columns.applies(ctx) else None
    if whole is not None:  # over columns, in this process
        read.close()
        decoding = Decoding(Path(source))
        with cycle_collection_paused():
            imported = nectar_columns.read_range(Path(source), whole, decoding, ctx)
        decoding.check()
    elif imported is None:
        with cycle_collection_paused(), live_count(stage, "rows") as counted:
            imported = READERS[layout](counted(rows), ctx)
    if imported.rows - imported.blank == 0:
        extra = f" (only {imported.blank} blank lines)" if imported.blank else ""
        raise InputFileError(f"{source}: no rows{extra}")
    return imported


def _settings(config: ImportConfig) -> ImportConfig:
    return config.model_copy(update={"source": str(Path(config.source))})


def run_import(store: RunStore, config: ImportConfig,
               context: StageContext = StageContext()) -> StageRun[AnnotatedGroup]:
    """Import ``config.source`` into ``RUN/import``; bad rows and parts go to rejects.

    Raises:
        InputFileError: the source cannot be used at all (see :func:`read_import`).
    """
    source_kind(config.source)  # a missing file or unknown format: before the run is touched
    stage = store.open_stage(STAGE, _settings(config),
                             input_fingerprint=_fingerprint(config.source),
                             record_type=AnnotatedGroup, stage_version=STAGE_VERSION, force=context.force)
    if stage.cached:
        return stage
    with cycle_collection_paused():  # while the groups are read, built and written
        with stage.scratch() as scratch:
            imported = read_import(config, scratch=scratch)
        stage.add_rejects("input", imported.rejects)
        _write_shards(stage, imported.table, config.shard_size)
        inputs, stats = imported.units, imported.stats
        del imported  # the groups' table goes before the shards are merged into data/
        return stage.finish(inputs=inputs, stats=stats)


def _fingerprint(source: str) -> str:
    """The source's fingerprint, hashed in a thread while this one imports the Arrow modules
    every read needs (pyarrow's JSON reader, and the pandas pyarrow imports when it first makes
    an array of a list, 0.2 s here): they are imported once, before the read's processes fork,
    and the hashing, which lets other threads run, hides their time."""
    with ThreadPoolExecutor(1) as pool:
        digest = pool.submit(source_fingerprint, str(source))
        import pyarrow as pa
        import pyarrow.json  # noqa: F401

        pa.array(["one"])
        return digest.result()


def _write_shards(stage: StageRun[Any], table: pa.Table, shard_size: int) -> None:
    """The rows of ``table`` as the stage's shards (those not written yet): their files
    written in threads, one per core (Arrow lets the others run while it copies and writes),
    each made a shard in order."""
    shards = list(stage.pending_shards(range(table.num_rows), shard_size=shard_size))
    with ThreadPoolExecutor(max(1, min(default_workers(), len(shards)))) as pool:
        files = pool.map(lambda shard: stage.shard_files(
            shard, table.slice(shard.start, len(shard.items)), []), shards)
        for shard, file in zip(shards, files, strict=True):
            stage.commit_shard(shard, file)


def run_import_candidates(store: RunStore, config: ImportConfig,
                          context: StageContext = StageContext()) -> StageRun[CandidateGroup]:
    """``generate --import``: the candidates of ``config.source`` into ``RUN/generate``; a
    group's rankings are not kept (a part-reject says how many, and that ``grouppref import``
    keeps them)."""
    source_kind(config.source)
    stage = store.open_stage(CANDIDATES_STAGE, _settings(config),
                             input_fingerprint=source_fingerprint(str(config.source)),
                             record_type=CandidateGroup, stage_version=CANDIDATES_VERSION,
                             force=context.force)
    if stage.cached:
        return stage
    with cycle_collection_paused(), stage.scratch() as scratch:
        imported = read_import(config, stage=CANDIDATES_STAGE, scratch=scratch)
    with cycle_collection_paused():
        return _write_candidates(stage, config, imported)


def _write_candidates(stage: StageRun[CandidateGroup], config: ImportConfig,
                      imported: Imported) -> StageRun[CandidateGroup]:
    """The candidates of ``imported`` as ``RUN/generate``'s shards; the rankings a part-reject."""
    import pyarrow.compute as pc

    rejects = list(imported.rejects)
    table = imported.table
    ranked = pc.list_value_length(table.column("rankings")).to_pylist()
    for gid, n, row in zip(table.column("group_id").to_pylist(), ranked, imported.group_rows,
                           strict=True):
        if n:
            rejects.append(Reject(
                stage=CANDIDATES_STAGE, source=imported.stats["source"], group_id=gid,
                field="rankings", scope="part", row=row,
                reason=f"{n} ranking(s) not kept: generate --import keeps the candidates only "
                "(`grouppref import` keeps the rankings)"))
    stage.add_rejects("input", rejects)
    # a CandidateGroup's stored row: the AnnotatedGroup's without its rankings
    _write_shards(stage, table.select(["group_id", "prompt", "candidates"]), config.shard_size)
    return stage.finish(inputs=imported.units, stats=imported.stats)
