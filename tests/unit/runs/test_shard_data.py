"""A stage's ``data/`` is made of its shards (``StageRun.finish``): one Arrow stream file per
shard, moved there, with ``save_to_disk``'s ``state.json`` and ``dataset_info.json``, which
``datasets.load_from_disk`` reads as it reads a folder ``save_to_disk`` wrote; a stage with
no rows saves one file of none; and a shard an earlier version wrote as an IPC file (not a
stream) is read on resume and written again as a stream."""

from __future__ import annotations

from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from grouppref.runs.stage_run import IPC_FILE_MAGIC
from grouppref.runs.store import RunStore
from grouppref.schemas import CandidateGroup
from grouppref.schemas.arrow import arrow_schema_for, to_table
from tests.support.factories import make_group


def _groups(n: int) -> list[CandidateGroup]:
    return [make_group(k=3 + i % 3, prompt_text=f"Name colour {i}.") for i in range(n)]


def _run(tmp_path: Path, groups: list[CandidateGroup], *, old_first_shard: bool = False
         ) -> Path:
    store = RunStore(tmp_path / "run")
    stage = store.open_stage("generate", {"k": 1}, input_fingerprint="test",
                             record_type=CandidateGroup)
    for shard in stage.pending_shards(groups, shard_size=2):
        if old_first_shard and shard.index == 0:  # as an earlier version wrote it
            path = stage.dir / "shards" / "shard-00000.arrow"
            path.parent.mkdir(parents=True, exist_ok=True)
            table = to_table(list(shard.items), CandidateGroup).cast(
                arrow_schema_for(CandidateGroup))
            with pa.OSFile(str(path), "wb") as sink, \
                    pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            continue
        stage.write_shard(shard, list(shard.items), [])
    stage.finish(inputs=len(groups))
    return stage.dir / "data"


@pytest.mark.parametrize("old_first_shard", [False, True])
def test_data_is_the_shards_and_load_from_disk_reads_it(tmp_path: Path,
                                                        old_first_shard: bool) -> None:
    groups = _groups(5)
    data = _run(tmp_path, groups, old_first_shard=old_first_shard)
    files = sorted(p.name for p in data.glob("*.arrow"))
    assert files == [f"data-{i:05d}-of-00003.arrow" for i in range(3)]  # shards of 2, 2, 1
    assert all((data / f).read_bytes()[:6] != IPC_FILE_MAGIC for f in files)  # streams
    loaded = datasets.load_from_disk(str(data))
    assert loaded.num_rows == 5
    assert loaded.to_list() == to_table(groups, CandidateGroup).to_pylist()
    assert not (data.parent / "shards").exists()


def test_a_stage_of_no_rows_saves_one_file_of_none(tmp_path: Path) -> None:
    data = _run(tmp_path, [])
    assert sorted(p.name for p in data.glob("*.arrow")) == ["data-00000-of-00001.arrow"]
    assert datasets.load_from_disk(str(data)).num_rows == 0
