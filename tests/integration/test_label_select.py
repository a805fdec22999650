"""Active selection for ``label push --select uncertain|random --budget N``: the uncertainty
math against independent references (numpy / scipy brute force, Monte Carlo), the choice of
groups on constructed cases (one per criterion), the seeded random baseline, and bad input
through the real CLI (one line, exit 2, before any connection).

The push against the real embedded Argilla is in ``tests/system/test_label_select_push.py``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import rankdata

from grouppref.labeling.config import PushConfig
from grouppref.labeling.select import select_groups
from grouppref.schemas import AnnotatedGroup
from grouppref.stats import bt
from grouppref.stats.uncertainty import disagreement, expected_pair_error, smallest_margin, top_n
from tests.support.labelling import write_stage
from tests.support.selection import _one_line, _push, panel


def ids_of(groups: list[AnnotatedGroup], idx: list[int]) -> list[str]:
    return [groups[i].group_id for i in idx]


# -- the math against references ----------------------------------------------------------
def kendall_w_reference(tiers: np.ndarray) -> float:
    """Textbook tie-corrected W from scipy's mid-ranks: ``tiers`` (m, n) tier indices."""
    m, n = tiers.shape
    r = np.array([rankdata(row) for row in tiers])  # mid-ranks, ties averaged
    s = ((r.sum(0) - m * (n + 1) / 2) ** 2).sum()
    t = sum(((c := np.unique(row, return_counts=True)[1]) ** 3 - c).sum() for row in tiers)
    return float(12 * s / (m**2 * (n**3 - n) - m * t))


def test_disagreement_is_one_minus_textbook_kendall_w_with_ties() -> None:
    rng = np.random.default_rng(0)
    ranks = torch.from_numpy(rng.integers(0, 3, size=(200, 4, 5)))  # ties in most rankings
    ranks[ranks.amax(-1) == ranks.amin(-1)] = torch.tensor([0, 1, 2, 0, 1])  # W defined
    included = torch.ones(200, 4, dtype=torch.bool)
    got = disagreement(ranks, included)
    want = [1 - kendall_w_reference(ranks[b].numpy()) for b in range(200)]
    # float64 Kendall's W of 4 rankers x <= 6 items vs a reference, values in [0, 1]: sums of ~30 exact
    # integers, one division: ~eps64
    np.testing.assert_allclose(got.numpy(), np.clip(want, 0, 1), atol=1e-12)
    # undefined W (one ranking; or every ranking one tier) counts as fully uncertain
    one = included.clone()
    one[:, 1:] = False
    assert torch.equal(disagreement(ranks, one), torch.ones(200, dtype=torch.float64))
    flat = torch.zeros(1, 3, 4, dtype=torch.long)
    assert disagreement(flat, torch.ones(1, 3, dtype=torch.bool)).item() == 1.0


def test_expected_pair_error_matches_monte_carlo_of_the_laplace_posterior() -> None:
    rng = np.random.default_rng(1)
    wins = torch.from_numpy(rng.integers(0, 4, size=(6, 4, 4)).astype(float))
    wins = wins * (1 - torch.eye(4, dtype=torch.float64))
    valid = torch.ones(6, 4, dtype=torch.bool)
    valid[5, 3] = False  # a padded candidate: no votes, left out of the pairs
    wins[5, 3, :] = 0
    wins[5, :, 3] = 0
    theta = bt.map_pairwise(wins, alpha=0.1)
    cov = bt.covariance_pairwise(theta, wins, 0.1)
    got = expected_pair_error(theta, cov, valid)
    for b in range(6):
        n = int(valid[b].sum())
        th, sig = theta[b, :n].numpy(), cov[b, :n, :n].numpy()
        draws = rng.multivariate_normal(th, sig, size=200_000)
        flips = [np.mean((draws[:, i] > draws[:, j]) != (th[i] > th[j]))
                 for i, j in itertools.combinations(range(n), 2)]
        assert abs(got[b].item() - float(np.mean(flips))) < 4e-3, b


def test_posterior_variance_alone_would_pick_the_agreed_group() -> None:
    """The docstring's reason to use the margin/sd ratio: three unanimous votes leave a wider
    posterior variance than a 2-1 split, yet the split is the uncertain one."""
    wins = torch.tensor([[[0.0, 3.0], [0.0, 0.0]], [[0.0, 2.0], [1.0, 0.0]]],
                        dtype=torch.float64)
    theta = bt.map_pairwise(wins, alpha=0.1)
    cov = bt.covariance_pairwise(theta, wins, 0.1)
    var = cov[:, 0, 0] + cov[:, 1, 1] - 2 * cov[:, 0, 1]
    assert var[0] > var[1]
    u = expected_pair_error(theta, cov, torch.ones(2, 2, dtype=torch.bool))
    assert u[1] > u[0]


def test_smallest_margin_is_the_smallest_adjacent_gap() -> None:
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(50, 6))
    valid = rng.random((50, 6)) > 0.2
    got = smallest_margin(torch.from_numpy(scores), torch.from_numpy(valid))
    for b in range(50):
        s = np.sort(scores[b][valid[b]])
        want = np.diff(s).min() if s.size >= 2 else np.inf
        # a difference of two float64 scores, the same arithmetic: float64, a few operations: approx's
        # default rel 1e-6 is ~1e9 eps64
        assert got[b].item() == pytest.approx(want)


def test_top_n_orders_ties_by_the_seed_and_keeps_strictly_larger_ones() -> None:
    u = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.5, 0.5, 0.2], dtype=torch.float64)
    picks = {tuple(top_n(u, 3, torch.Generator().manual_seed(s))) for s in range(20)}
    assert all(p[0] == 1 and set(p[1:]) <= {2, 3, 4, 5} for p in picks)
    assert len(picks) > 1  # the tied 0.5s are sampled, not always the first rows
    assert top_n(u, 2, torch.Generator().manual_seed(3)) == \
        top_n(u, 2, torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="n must be in"):
        top_n(u, 8)


# -- the selection on constructed cases ---------------------------------------------------
@pytest.mark.parametrize("criterion", ["kendall_w", "bt_posterior"])
def test_uncertain_picks_the_groups_where_the_rankers_disagree(criterion: str) -> None:
    groups = panel()
    sel = select_groups(groups, PushConfig(select="uncertain", budget=3, uncertainty=criterion,
                                           audit_share=0),
                        "rank")
    assert sel.ids == ids_of(groups, [8, 7, 6])  # most uncertain first
    values = [g.uncertainty for g in sel.selected]
    assert values == sorted(values, reverse=True) and values[-1] > sel.rest_mean
    assert sel.threshold == values[-1] and sel.groups == 9 and sel.uncertainty == criterion
    assert sel.rest_mean == pytest.approx(0.0, abs=0.2)  # the unanimous groups


def test_rm_margin_picks_the_closest_reward_scores() -> None:
    groups = panel()
    sel = select_groups(groups, PushConfig(select="uncertain", budget=2, uncertainty="rm_margin"),
                        "rank")
    assert sel.ids == ids_of(groups, [4, 2])  # gap 0.02, then 0.05 (same scale for all)
    std = np.std([s for g in groups for s in g.rankings[0].scores.values()], ddof=1)
    # a float64 gap over a float64 std: float64, a few operations: approx's default rel 1e-6 is ~1e9
    # eps64
    assert sel.selected[0].uncertainty == pytest.approx(-0.02 / std)


def test_random_is_seeded_and_reproducible() -> None:
    groups = panel()
    a = select_groups(groups, PushConfig(select="random", budget=4, seed=7), "rank")
    b = select_groups(groups, PushConfig(select="random", budget=4, seed=7), "rank")
    c = select_groups(groups, PushConfig(select="random", budget=4, seed=8), "rank")
    assert a.ids == b.ids and a.ids != c.ids
    assert len(set(a.ids)) == 4 and set(a.ids) <= {g.group_id for g in groups}
    assert all(g.uncertainty is None for g in a.selected) and a.seed == 7
    every = select_groups(groups, PushConfig(), "rank")
    assert every.select == "all" and every.ids == [g.group_id for g in groups]


@pytest.mark.parametrize(("args", "expected"), [
    (["--select", "uncertain", "--budget", "12"],
     "--budget 12 is more than the 9 groups of the rank stage; give a budget of at most 9"),
    (["--select", "uncertain", "--budget", "0"],
     "--budget: Input should be greater than or equal to 1; got 0"),
    (["--select", "random", "--budget", "-3"],
     "--budget: Input should be greater than or equal to 1; got -3"),
    (["--budget", "3"], "budget 3 needs select 'uncertain' or 'random'"),
    (["--select", "random"], "select 'random' needs a budget"),
])
def test_bad_budget_is_one_line_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    store = write_stage(tmp_path / "run", panel())
    assert expected in _one_line(_push(store.root, *args))
    assert not (store.root / "label").exists()  # nothing written


def test_criterion_without_its_inputs_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    one_ranker = [g.model_copy(update={"rankings": g.rankings[1:2]}) for g in panel()]
    store = write_stage(tmp_path / "one", one_ranker)  # only the rule ranker
    for criterion in ("kendall_w", "bt_posterior"):
        line = _one_line(_push(store.root, "--select", "uncertain", "--budget", "2",
                               "--uncertainty", criterion))
        assert f"--uncertainty {criterion} compares automatic rankings, but the rank stage has " \
               "1 automatic ranker(s) (rule); rank with two or more" in line
    line = _one_line(_push(store.root, "--select", "uncertain", "--budget", "2",
                           "--uncertainty", "rm_margin"))
    assert "needs reward-model scores" in line and "--ranker reward:MODEL" in line
