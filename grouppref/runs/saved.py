"""A stage's ``data/``: a folder in the layout of ``datasets``' ``Dataset.save_to_disk`` (so
``datasets.load_from_disk`` reads it), written and read with pyarrow alone.

The layout (``datasets`` 2.x to 5.x; the version this package pins is held to it by
tests/unit/runs/test_saved.py, which compares the files)::

    data/data-0000i-of-0000N.arrow   Arrow IPC *stream* files, the rows in order, in record
                                     batches of at most 1,000 rows
    data/state.json                  the files, the fingerprint, no format (sorted keys)
    data/dataset_info.json           the features, in ``Features.to_dict`` form

A stage's data files are its shards (:meth:`~grouppref.runs.stage_run.StageRun.finish` moves
them here, one file each, and :func:`write_saved_state` adds the two JSON files).
``save_to_disk`` would cut the same rows into files of up to 500 MB; with the same cut it
writes the same JSON files and the same rows in the same batches (its batches keep the padding
of the table they were cut from, a shard's are copied). ``datasets`` is not imported here
because its import alone costs a stage about 1.6 CPU-s (a tenth of what ``validate`` spends
on 50,000 groups).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

STATE = "state.json"
INFO = "dataset_info.json"


def data_file_name(index: int, files: int) -> str:
    """The name of file ``index`` of ``files`` in a ``save_to_disk`` folder."""
    return f"data-{index:05d}-of-{files:05d}.arrow"


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
    """The rows of a ``save_to_disk`` folder (a stage's ``data/``, or one ``datasets``
    own), memory-mapped as ``load_from_disk`` maps them: read from the page cache when used,
    not copied. Its schema is the files' own (with their ``huggingface`` metadata)."""
    import pyarrow as pa

    state = json.loads((folder / STATE).read_text(encoding="utf-8"))
    tables = [pa.ipc.open_stream(pa.memory_map(str(folder / f["filename"]))).read_all()
              for f in state["_data_files"]]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
