"""``simulate_groups``: the simulate stage's panel on records, no run store."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from grouppref.pipeline.simulate.config import AnnotatorSpec, SimulateConfig
from grouppref.pipeline.simulate.core import simulate_groups
from grouppref.pipeline.simulate.stage import run_simulate
from grouppref.schemas import AnnotatedGroup
from tests.support.simulate import rank_run, scored_group


def test_the_stage_writes_what_the_core_returns(tmp_path: Path) -> None:
    store = rank_run(tmp_path, 30)
    config = SimulateConfig(annotators=[AnnotatorSpec(id="a", flip_rate=0.2),
                                        AnnotatorSpec(id="b", behavior="random")], seed=4)
    stage = run_simulate(store, config)
    groups = store.load_records("rank", AnnotatedGroup)
    # one shard: the stage draws from the generator of (seed, shard 0)
    done = simulate_groups(groups, config, np.random.default_rng([config.seed, 0]))
    def orders(groups: list[AnnotatedGroup]) -> list[list[tuple[str, list[list[str]]]]]:
        return [[(r.annotator.id, r.tiers) for r in g.rankings] for g in groups]

    assert orders(stage.records()) == orders(done.groups)  # all but each ranking's time
    assert done.failed == []
    stats = stage.manifest.stats["annotators"]
    for aid, (flips, pairs) in done.flips.items():
        assert stats[aid]["pairs"] == pairs
        assert stats[aid]["realised_flip_rate"] == flips / pairs


def test_a_group_without_truth_fails_alone() -> None:
    groups = [g.model_copy(update={"rankings": []}) if i == 1 else g
              for i, g in enumerate(_groups())]
    done = simulate_groups(groups, SimulateConfig(annotators=[AnnotatorSpec(id="a")]),
                           np.random.default_rng(0))
    assert len(done.groups) == 2
    assert [i for i, _ in done.failed] == [1]
    assert "rank the group first" in done.failed[0][1]


def _groups() -> list[AnnotatedGroup]:
    return [scored_group(i, [0.1 * i, 1.0, 0.5]) for i in range(3)]
