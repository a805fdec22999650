"""A stage's ``data/``: a folder in the layout of ``datasets``' ``Dataset.save_to_disk`` (so
``datasets.load_from_disk`` reads it), written and read with pyarrow alone.

The layout (``datasets`` 2.x to 5.x; the version this package pins is held to it by
tests/unit/runs/test_saved.py, which compares the bytes)::

    data/data-00000-of-0000N.arrow   Arrow IPC *stream* files: the rows cut into N contiguous
                                     parts, N = in-memory bytes // 500 MB + 1 (at most one per
                                     row, 1 for no rows), each in record batches of at most
                                     1,000 rows (fewer when 1,000 rows pass 100 MB)
    data/state.json                  the files, the fingerprint, no format (sorted keys)
    data/dataset_info.json           the features, in ``Features.to_dict`` form

``datasets`` writes the same bytes; it is not imported here because its import alone costs a
stage about 1.6 CPU-s (a tenth of what ``validate`` spends on 50,000 groups), and ``data/`` is
written once and read by the next stage of every run. A stage's own ``data/`` is made of its
shards (:meth:`~grouppref.runs.stage_run.StageRun.finish`: one stream file each, moved, with
:func:`write_saved_state`'s two files), which ``load_from_disk`` reads as well;
:func:`write_saved` writes a table whole, cut as ``save_to_disk`` cuts it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

STATE = "state.json"
INFO = "dataset_info.json"
SHARD_BYTES = 500 * 10**6  # datasets' MAX_SHARD_SIZE, "500MB"
BATCH_ROWS = 1000  # datasets' DEFAULT_MAX_BATCH_SIZE
BATCH_BYTES = 100 * 10**6  # datasets' MAX_ROW_GROUP_SIZE, "100MB"


def data_file_name(index: int, files: int) -> str:
    """The name of file ``index`` of ``files`` in a ``save_to_disk`` folder."""
    return f"data-{index:05d}-of-{files:05d}.arrow"


def _parts(rows: int, files: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each of ``files`` contiguous parts of ``rows`` rows, the first
    ``rows % files`` one row longer (as ``Dataset.shard(contiguous=True)`` cuts them)."""
    div, mod = divmod(rows, files)
    return [(div * i + min(i, mod), div + (i < mod)) for i in range(files)]


def write_saved(table: pa.Table, schema: pa.Schema, folder: Path, fingerprint: str) -> None:
    """Write ``table`` (columns of ``schema``, whose metadata carries the features) as a
    ``save_to_disk`` folder at ``folder`` (made; it must not hold another dataset).

    Args:
        table (pa.Table): the rows.
        schema (pa.Schema): their schema with the ``huggingface`` metadata
            (:func:`grouppref.schemas.arrow.arrow_schema_for`).
        folder (Path): the folder to write.
        fingerprint (str): ``state.json``'s ``_fingerprint`` (names ``datasets``' cache files).
    """
    import pyarrow as pa

    table = table.select(schema.names).cast(schema)
    nbytes = table.nbytes
    files = 1 if table.num_rows == 0 else min(table.num_rows, nbytes // SHARD_BYTES + 1)
    batch = BATCH_ROWS if nbytes == 0 else min(
        BATCH_ROWS, max(1, table.num_rows * BATCH_BYTES // nbytes))
    folder.mkdir(parents=True, exist_ok=True)
    for index, (start, length) in enumerate(_parts(table.num_rows, files)):
        with pa.OSFile(str(folder / data_file_name(index, files)), "wb") as sink, \
                pa.ipc.new_stream(sink, schema) as writer:
            for at in range(start, start + length, batch):
                part = table.slice(at, min(batch, start + length - at)).combine_chunks()
                writer.write_table(part, max_chunksize=batch)
    write_saved_state(folder, [data_file_name(i, files) for i in range(files)], schema,
                      fingerprint)


def write_saved_state(folder: Path, names: list[str], schema: pa.Schema,
                      fingerprint: str) -> None:
    """``state.json`` and ``dataset_info.json`` of a ``save_to_disk`` folder whose data files
    (Arrow streams, already in ``folder``) are ``names``, in order."""
    state: dict[str, object] = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": fingerprint, "_format_columns": None, "_format_kwargs": {},
        "_format_type": None, "_output_all_columns": False, "_split": None}
    (folder / STATE).write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
    features = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
    info = {"citation": "", "description": "", "features": features, "homepage": "",
            "license": ""}
    (folder / INFO).write_text(json.dumps(info, indent=2), encoding="utf-8")


def read_saved(folder: Path) -> pa.Table:
    """The rows of a ``save_to_disk`` folder (one of :func:`write_saved`'s, or ``datasets``'
    own), memory-mapped as ``load_from_disk`` maps them: read from the page cache when used,
    not copied. Its schema is the files' own (with their ``huggingface`` metadata)."""
    import pyarrow as pa

    state = json.loads((folder / STATE).read_text(encoding="utf-8"))
    tables = [pa.ipc.open_stream(pa.memory_map(str(folder / f["filename"]))).read_all()
              for f in state["_data_files"]]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
