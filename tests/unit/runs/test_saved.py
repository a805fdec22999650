"""A stage's ``data/`` written and read without ``datasets`` (grouppref/runs/saved.py, its
shard files): what ``datasets``' own ``Dataset.save_to_disk`` writes of the same rows cut into
the same files, and each side reads the other's."""

from __future__ import annotations

import filecmp
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from grouppref.runs import saved, stage_run
from grouppref.schemas import CandidateGroup
from grouppref.schemas.arrow import arrow_schema_for, features_for, table_dataset, to_table
from tests.support.factories import make_group


def _table(n: int) -> pa.Table:
    return to_table([make_group(k=3 + i % 3, prompt_text=f"Name colour {i}.") for i in range(n)],
                    CandidateGroup)


def _same_folder(a: Path, b: Path) -> list[str]:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert all(filecmp.cmp(a / n, b / n, shallow=False) for n in names), names
    return names


@pytest.mark.parametrize("rows, files, batch_rows", [
    (7, 1, None),  # one file, one batch
    (0, 1, None),  # no rows: one empty file, as the stage saves an empty output
    (25, 4, 4),    # four files of contiguous rows (25 = 7+6+6+6), batches of 4
])
def test_the_folder_is_save_to_disks_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   rows: int, files: int,
                                                   batch_rows: int | None) -> None:
    """A folder made as a stage makes its ``data/`` (a shard file per part, the two JSON
    files of :func:`saved.write_saved_state`) holds what ``save_to_disk`` writes when it cuts
    the rows into the same files: the JSON files byte for byte, the same rows in the same
    record batches, and the same bytes where a batch is a whole table (``save_to_disk``
    writes a batch cut from a larger table with its buffers padded to 64 bytes, a shard file
    copies each batch into buffers of its own)."""
    schema = arrow_schema_for(CandidateGroup)
    table = _table(rows).cast(schema)
    if batch_rows:
        monkeypatch.setattr(datasets.config, "DEFAULT_MAX_BATCH_SIZE", batch_rows)
        monkeypatch.setattr(stage_run, "SHARD_BATCH", batch_rows)
    info = datasets.DatasetInfo(features=features_for(CandidateGroup))
    theirs = table_dataset(table, info, "key")
    theirs.save_to_disk(str(tmp_path / "theirs"), num_shards=files)
    ours = tmp_path / "ours"
    ours.mkdir()
    names = [saved.data_file_name(i, files) for i in range(files)]
    div, mod = divmod(rows, files)  # save_to_disk's contiguous parts: the first ones longer
    start = 0
    for i, name in enumerate(names):
        length = div + (i < mod)
        stage_run.write_shard_file(table.slice(start, length), ours / name)
        start += length
    saved.write_saved_state(ours, names, schema, theirs._fingerprint)
    assert sorted(p.name for p in ours.iterdir()) == sorted(
        p.name for p in (tmp_path / "theirs").iterdir())
    for name in (saved.STATE, saved.INFO):
        assert (ours / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes()
    for name in names:  # the same rows in the same batches; the bytes where a batch is whole
        mine, their = (pa.ipc.open_stream((d / name).read_bytes()).read_all()
                       for d in (ours, tmp_path / "theirs"))
        assert mine.equals(their) and mine.schema.metadata == their.schema.metadata
        assert [b.num_rows for b in mine.to_batches()] == [
            b.num_rows for b in their.to_batches()]
    if batch_rows is None:  # one batch per file: datasets writes it whole, as we do
        _same_folder(tmp_path / "theirs", ours)
    back = datasets.load_from_disk(str(ours))
    assert back.features == features_for(CandidateGroup) and back.to_list() == table.to_pylist()
    read = saved.read_saved(tmp_path / "theirs")
    assert read.equals(table) and read.schema.metadata == schema.metadata
