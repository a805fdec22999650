"""The aggregate stage on its input's stored rows (issue 32) gives exactly what the records
path gives (:func:`aggregate_groups` on the validated records), on groups that reach every
branch: ties, partial rankings, several annotators (one unreliable, dropped), rotated orders,
disconnected comparisons, groups without rankings, audit and uncertainty selections, metadata
of every scalar type, K from 2 to 6; and a stage's data edited after it was written is read
as records again (validated, salvaged row by row)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pytest

from grouppref.pipeline.aggregate import config as aggregate_config
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.core import aggregate_groups
from grouppref.pipeline.aggregate.stage import run_aggregate
from grouppref.pipeline.aggregate.stored import stored_input
from grouppref.runs.manifest import read_rejects
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from grouppref.schemas.arrow import arrow_table, table_rows, to_row
from tests.support.factories import make_group
from tests.support.simulate import write_stage
from tests.support.stage_files import assert_same_stage

PANEL = ("h0", "h1", "h2", "rev")  # rev ranks every group backwards: unreliable


def _ranking(gid: str, ids: list[str], order: list[int], who: str, *, ties: bool = False,
             partial: bool = False, metadata: dict[str, object] | None = None) -> Ranking:
    """``who``'s ranking of candidates ``order`` (best first); ``ties``: the first two tied;
    ``partial``: the last left out."""
    tiers = [[ids[i]] for i in order]
    if ties and len(tiers) > 2:
        tiers = [tiers[0] + tiers[1], *tiers[2:]]
    if partial and len(tiers) > 2:
        tiers = tiers[:-1]
    kind = "reward_model" if who == "rm" else "human"
    return Ranking(annotator=Annotator(id=who, kind=kind), group_id=gid, tiers=tiers,
                   metadata=metadata)


def _corpus(n: int = 80, seed: int = 0) -> list[AnnotatedGroup]:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n):
        k = int(rng.integers(2, 7))
        base = make_group(k=k, prompt_text=f"Question {g}: name a colour, é ✓.")
        gid, ids = base.group_id, base.candidate_ids()
        truth = [int(i) for i in rng.permutation(k)]
        rankings: list[Ranking] = []
        case = g % 8
        if case == 1:  # a cycle among three annotators
            rot = [truth[1:] + truth[:1], truth[2:] + truth[:2], truth]
            rankings = [_ranking(gid, ids, r, who) for r, who in zip(rot, PANEL, strict=False)]
        elif case == 2 and k >= 4:  # two rankings of disjoint pairs: disconnected
            rankings = [_ranking(gid, ids, [0, 1], "h0"), _ranking(gid, ids, [2, 3], "h1")]
        elif case != 0:  # case 0: no ranking at all
            who_all = [*PANEL, "rm"]
            for a in rng.choice(len(who_all), size=int(rng.integers(1, 5)), replace=False):
                who = who_all[int(a)]
                order = truth[::-1] if who == "rev" else list(truth)
                if who != "rev" and rng.random() < 0.3:  # a flipped adjacent pair
                    i = int(rng.integers(0, k - 1))
                    order[i], order[i + 1] = order[i + 1], order[i]
                meta: dict[str, object] | None = None
                if case == 3:
                    meta = {"selection": "audit", "seconds": 1.5, "ok": True, "n": 3}
                elif case == 4:
                    meta = {"selection": "uncertain", "note": "ünïcode"}
                rankings.append(_ranking(gid, ids, order, who, ties=case == 5,
                                         partial=case == 6, metadata=meta))
        groups.append(AnnotatedGroup(**dict(base), rankings=rankings))
    return groups


CONFIGS = {
    "default": AggregateConfig(min_groups_for_reliability=5),
    "drop rules, hard targets": AggregateConfig(
        cycle="drop", disconnected="drop", low_agreement="drop", pair_targets="hard",
        min_groups_for_reliability=5),
    "no ranking flagged, nobody dropped": AggregateConfig(
        no_rankings="flag", drop_unreliable=False, min_groups_for_reliability=5),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stored_rows_give_what_the_records_give(tmp_path: Path, name: str) -> None:
    config, groups = CONFIGS[name], _corpus()
    store = RunStore(tmp_path / "run")
    write_stage(store, "rank", groups)
    table = arrow_table(store.load_dataset("rank"))
    assert stored_input(table, AnnotatedGroup, "rank") is not None  # the stored path is taken

    done = run_aggregate(store, config, StageContext())
    want = aggregate_groups(groups, config, source="rank")
    got_rows = list(table_rows(store.load_table("aggregate")))
    assert got_rows == [to_row(g) for g in want.groups]
    got_rejects = [(r.row, r.group_id, r.reason) for r in read_rejects(done.dir / "rejects.jsonl")]
    assert got_rejects == [(r.row, r.group_id, r.reason) for r in want.rejects]
    assert done.counts.outputs == len(want.groups)
    assert json.loads((done.dir / "report.json").read_text())["summary"] == \
        want.report.summary.model_dump(mode="json")
    flags = {f for g in want.groups for f in g.flags}
    reached = {"default": {"disconnected", "low_agreement", "unreliable_annotator_dropped"},
               "drop rules, hard targets": {"unreliable_annotator_dropped"},
               "no ranking flagged, nobody dropped": {"no_rankings", "disconnected"}}
    assert reached[name] <= flags
    assert want.rejects or name == "no ranking flagged, nobody dropped"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_stage_writes_the_same_bytes_with_its_fits_and_shards_in_processes(
        tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 7 groups (the leave-one-out fits of every reliability round and the final
    fits) and shards of 9 made in 3 processes give the bytes of one process."""
    monkeypatch.setattr(aggregate_config, "PARALLEL_GROUPS", 1)
    groups = _corpus()
    written = {}
    for workers in (1, 3):
        store = RunStore(tmp_path / f"w{workers}" / "run")
        write_stage(store, "rank", groups)
        config = CONFIGS[name].model_copy(update={"batch_size": 7, "shard_size": 9,
                                                  "workers": workers})
        written[workers] = run_aggregate(store, config, StageContext()).dir
    assert (written[1] / "rejects.jsonl").stat().st_size or name == CONFIGS_WITHOUT_REJECTS
    assert_same_stage(written[1], written[3], folders=(b"/w1/", b"/w3/"))


CONFIGS_WITHOUT_REJECTS = "no ranking flagged, nobody dropped"


def test_data_edited_after_writing_is_validated_again(tmp_path: Path) -> None:
    groups = _corpus(24)
    store = RunStore(tmp_path / "run")
    write_stage(store, "rank", groups)
    ds = store.load_dataset("rank")
    rows = ds.data.table.to_pylist()
    rows[3]["candidates"][0]["text"] = "   "  # blank: no CandidateGroup allows it
    edited = datasets.Dataset(pa.Table.from_pylist(rows, schema=ds.data.table.schema),
                              info=ds.info)
    data = store.stage_dir("rank") / "data"
    edited.save_to_disk(str(tmp_path / "edited"))
    shutil.rmtree(data)
    shutil.move(tmp_path / "edited", data)
    assert not store.intact("rank")

    done = run_aggregate(store, AggregateConfig(min_groups_for_reliability=5), StageContext())
    rejects = read_rejects(done.dir / "rejects.jsonl")
    assert [r.row for r in rejects if r.scope == "row"][:1] == [4]
    assert any("text" in (r.field or "") + r.reason for r in rejects if r.row == 4)
    assert done.counts.inputs == done.counts.outputs + sum(r.scope == "row" for r in rejects)


def test_a_row_a_stage_wrote_wrongly_is_validated_and_salvaged(tmp_path: Path) -> None:
    """A stage writes its records as they are: a ranking naming an unknown candidate (a bug
    upstream) is intact on disk, but aggregate's encoding refuses it and the records path
    rejects that ranking, naming it, instead of failing."""
    groups = _corpus(24)
    bad = groups[9].rankings[0]
    groups[9] = groups[9].model_copy(update={"rankings": [
        bad.model_copy(update={"tiers": [*bad.tiers, ["c-nowhere"]]}), *groups[9].rankings[1:]]})
    store = RunStore(tmp_path / "run")
    write_stage(store, "rank", groups)
    assert store.intact("rank")
    assert stored_input(arrow_table(store.load_dataset("rank")), AnnotatedGroup,
                        "rank") is None

    done = run_aggregate(store, AggregateConfig(min_groups_for_reliability=5), StageContext())
    rejects = read_rejects(done.dir / "rejects.jsonl")
    assert any(r.row == 10 and "c-nowhere" in r.reason for r in rejects), rejects
