"""Simulated annotator panels: Mallows flip rates against exact enumeration, the stage."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from grouppref.errors import ConfigError, StageError
from grouppref.pipeline.simulate.config import AnnotatorSpec, SimulateConfig
from grouppref.pipeline.simulate.core import (
    mallows_flip_rate,
    mallows_phi,
    order_flips,
    simulate_order,
    true_scores,
)
from grouppref.pipeline.simulate.stage import run_simulate
from grouppref.schemas import (
    AnnotatedGroup,
)
from tests.support.simulate import rank_run, scored_group, write_stage


def exact_mallows_flip_rate(phi: float, k: int) -> float:
    """Enumerate all k! permutations with weight phi^(inversions)."""
    total = z = 0.0
    for perm in itertools.permutations(range(k)):
        inv = sum(perm[i] > perm[j] for i in range(k) for j in range(i + 1, k))
        total += inv * phi**inv
        z += phi**inv
    return total / z / (k * (k - 1) / 2)


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("phi", [0.0, 0.3, 0.8, 1.0])
def test_mallows_flip_rate_matches_enumeration(k: int, phi: float) -> None:
    assert abs(mallows_flip_rate(phi, k) - exact_mallows_flip_rate(phi, k)) < 1e-12


def test_mallows_phi_inverts_flip_rate() -> None:
    for k in (2, 4, 8):
        for f in (0.0, 0.05, 0.2, 0.4, 0.5):
            assert abs(mallows_flip_rate(mallows_phi(f, k), k) - f) < 1e-9
    with pytest.raises(ValueError, match="flip_rate"):
        mallows_phi(0.7, 4)


@pytest.mark.parametrize(("spec", "want"), [
    (AnnotatorSpec(id="a", flip_rate=0.0), 0.0),
    (AnnotatorSpec(id="a", flip_rate=0.2), 0.2),
    (AnnotatorSpec(id="a", flip_rate=0.4), 0.4),
    (AnnotatorSpec(id="a", behavior="random"), 0.5),
    (AnnotatorSpec(id="a", behavior="reversed"), 1.0),
])
def test_simulated_orders_flip_at_the_given_rate(spec: AnnotatorSpec, want: float) -> None:
    """3000 rankings of K=5 (30,000 pairs): the share of flipped pairs within 0.015."""
    rng = np.random.default_rng(0)
    flips = pairs = 0
    for _ in range(3000):
        scores = rng.normal(size=5).tolist()
        f, n = order_flips(simulate_order(scores, spec, rng), scores)
        flips, pairs = flips + f, pairs + n
    assert abs(flips / pairs - want) < 0.015


def test_order_flips_and_ties_in_the_truth() -> None:
    assert order_flips([0, 1, 2], [3.0, 2.0, 1.0]) == (0, 3)
    assert order_flips([2, 1, 0], [3.0, 2.0, 1.0]) == (3, 3)
    assert order_flips([1, 0, 2], [1.0, 1.0, 0.0]) == (0, 2)  # the tied pair does not count


def test_true_scores_from_scores_or_positions() -> None:
    group = scored_group(0, [2.0, 0.0, 1.0])
    cfg = SimulateConfig()
    assert true_scores(group, cfg) == [1.0, 0.0, 0.5]  # min-max normalised scores
    positions = true_scores(group, cfg.model_copy(update={"truth_use_scores": False}))
    assert positions == [1.0, 0.0, 0.5]  # 1 - (midrank - 1) / (K - 1)
    with pytest.raises(ValueError, match="no rankings of kind"):
        true_scores(group, cfg.model_copy(update={"truth_kinds": ["human"]}))
    by_id = cfg.model_copy(update={"truth_annotator": "rm-1"})
    assert true_scores(group, by_id) == [1.0, 0.0, 0.5]


def test_run_simulate_adds_rankings_records_flip_rates_and_rejects(tmp_path: Path) -> None:
    store = rank_run(tmp_path, n=40)
    human_only = scored_group(99, [1.0, 0.0], kind="human")  # no automatic ranking: no truth
    groups = store.load_records("rank", AnnotatedGroup) + [human_only]
    write_stage(store, "rank", groups)
    panel = [AnnotatorSpec(id="s1", flip_rate=0.0), AnnotatorSpec(id="s2", flip_rate=0.3),
             AnnotatorSpec(id="s3", behavior="reversed")]
    stage = run_simulate(store, SimulateConfig(annotators=panel, per_group=2, seed=3,
                                               shard_size=16))
    counts = stage.manifest.counts
    assert (counts.inputs, counts.outputs, counts.rejected) == (41, 40, 1)
    (reject,) = stage.rejects()
    assert reject.group_id == human_only.group_id and "true scores" in reject.reason
    records = stage.records()
    for r in records:
        assert len(r.rankings) == 3 and r.rankings[0].annotator.id == "rm-1"
        assert {x.annotator.kind for x in r.rankings[1:]} == {"simulated"}
    stats = stage.manifest.stats["annotators"]
    assert stats["s1"]["realised_flip_rate"] == 0.0
    assert stats["s3"]["realised_flip_rate"] == 1.0
    assert stats["s3"]["flip_rate"] == 1.0 and stats["s2"]["flip_rate"] == 0.3
    assert sum(s["pairs"] for s in stats.values()) == 40 * 2 * 6  # 2 annotators x 6 pairs
    again = run_simulate(store, SimulateConfig(annotators=panel, per_group=2, seed=3,
                                               shard_size=16))
    assert again.cached


def test_run_simulate_config_errors(tmp_path: Path) -> None:
    store = rank_run(tmp_path, n=2)
    twins = [AnnotatorSpec(id="a"), AnnotatorSpec(id="a")]
    with pytest.raises(ConfigError, match="unique"):
        run_simulate(store, SimulateConfig(annotators=twins))
    with pytest.raises(ConfigError, match="per_group=3"):
        run_simulate(store, SimulateConfig(annotators=[AnnotatorSpec(id="a")], per_group=3))
    with pytest.raises(StageError, match="label"):
        run_simulate(store, SimulateConfig(input_stage="label"))
