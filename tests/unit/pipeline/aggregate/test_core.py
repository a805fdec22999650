"""``aggregate_groups``: the aggregate stage on records, with no run store; the stage writes
what it returns."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.core import aggregate_groups
from grouppref.pipeline.aggregate.stage import read_report, run_aggregate
from grouppref.pipeline.simulate.config import AnnotatorSpec, SimulateConfig
from grouppref.pipeline.simulate.core import simulate_groups
from grouppref.schemas import AnnotatedGroup
from tests.support.simulate import rank_run, scored_group


def _panel_groups(n: int) -> list[AnnotatedGroup]:
    rng = np.random.default_rng(3)
    groups = [scored_group(i, rng.normal(size=4).tolist()) for i in range(n)]
    config = SimulateConfig(annotators=[AnnotatorSpec(id=f"s{i}", flip_rate=0.1 * i)
                                        for i in range(3)])
    return simulate_groups(groups, config, np.random.default_rng(0)).groups


def test_the_stage_writes_what_the_core_returns(tmp_path: Path) -> None:
    store = rank_run(tmp_path, 24)
    config = AggregateConfig(min_rankings=1)
    stage = run_aggregate(store, config)
    done = aggregate_groups(store.load_records("rank", AnnotatedGroup),
                            config, source="rank")
    assert stage.records() == done.groups
    assert [r.model_dump() for r in stage.rejects()] == [r.model_dump() for r in done.rejects]
    assert read_report(store).summary == done.report.summary
    assert done.inputs == 24


def test_a_repeated_group_is_merged_and_a_rule_drops_rows() -> None:
    groups = _panel_groups(12)
    first = groups[0]
    again = first.model_copy(update={"rankings": first.rankings[:1]})
    done = aggregate_groups([*groups, again], AggregateConfig(min_rankings=5,
                                                              too_few_rankings="drop"))
    assert done.inputs == 13
    assert done.groups == []  # every group has 4 rankings < 5
    rows = [r for r in done.rejects if r.scope == "row"]
    assert [r.row for r in rows] == [13, *range(1, 13)]  # the merged row first (read order)
    assert "merged" in rows[0].reason
