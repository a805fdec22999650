"""A stage's ``data/`` written and read without ``datasets`` (grouppref/runs/saved.py): the
same files, byte for byte, as ``datasets``' own ``Dataset.save_to_disk`` of the same table, and
each side reads the other's."""

from __future__ import annotations

import filecmp
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from grouppref.runs import saved
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


@pytest.mark.parametrize("rows, shard_bytes, batch_rows", [
    (7, None, None),  # one file, one batch
    (0, None, None),  # no rows: one empty file, as the stage saves an empty output
    (25, 3, 4),       # four files of contiguous rows (25 = 7+6+6+6), batches of 4
])
def test_the_folder_is_save_to_disks_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   rows: int, shard_bytes: int | None,
                                                   batch_rows: int | None) -> None:
    table = _table(rows)
    kwargs: dict[str, int] = {"num_shards": 1} if rows == 0 else {}
    if shard_bytes:  # datasets cuts by its max_shard_size, we by SHARD_BYTES: the same size
        limit = table.nbytes // shard_bytes
        kwargs["max_shard_size"] = limit
        monkeypatch.setattr(saved, "SHARD_BYTES", limit)
    if batch_rows:
        monkeypatch.setattr(datasets.config, "DEFAULT_MAX_BATCH_SIZE", batch_rows)
        monkeypatch.setattr(saved, "BATCH_ROWS", batch_rows)
    info = datasets.DatasetInfo(features=features_for(CandidateGroup))
    theirs = table_dataset(table, info, "key")
    theirs.save_to_disk(str(tmp_path / "theirs"), **kwargs)
    saved.write_saved(table, arrow_schema_for(CandidateGroup), tmp_path / "ours",
                      theirs._fingerprint)
    names = _same_folder(tmp_path / "theirs", tmp_path / "ours")
    assert sum(n.endswith(".arrow") for n in names) == (4 if shard_bytes else 1)
    back = datasets.load_from_disk(str(tmp_path / "ours"))
    assert back.features == features_for(CandidateGroup) and back.to_list() == table.to_pylist()
    read = saved.read_saved(tmp_path / "theirs")
    assert read.equals(table) and read.schema.metadata == arrow_schema_for(CandidateGroup).metadata
