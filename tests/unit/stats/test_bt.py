"""Batched Bradley-Terry math against independent references: choix, torch autograd, scipy,
naive loops and worked examples."""

from __future__ import annotations

import itertools
import math

import choix
import numpy as np
import pytest
import scipy.stats
import torch

from grouppref.stats import bt, noise, rankstats

# choix's optimiser stops at its own tolerance; strengths ~1 in float64
ATOL_CHOIX = 1e-6  # strengths after centring, same L2 prior
ALPHA = 0.1


def random_ranks(rng: np.random.Generator, b: int, a_max: int, k_max: int,
                 one_sided_share: float = 0.4) -> torch.Tensor:
    """(B, A, K) random tiered rankings with padding; ``one_sided_share`` of the groups have
    every ranking identical and strict (one candidate wins every vote)."""
    ranks = torch.full((b, a_max, k_max), -1, dtype=torch.long)
    for g in range(b):
        k, a = int(rng.integers(2, k_max + 1)), int(rng.integers(1, a_max + 1))
        if rng.random() < one_sided_share:
            order = torch.tensor(rng.permutation(k))
            ranks[g, :a, :k] = order
        else:
            ranks[g, :a, :k] = torch.tensor(rng.integers(0, k, size=(a, k)))  # ties likely
    return ranks


def choix_fit(v: torch.Tensor, weights: np.ndarray, alpha: float) -> np.ndarray:
    """choix reference for one group. ``v`` (A, K, K) votes (1, 0.5, 0); integer ``weights``.

    choix takes unit comparisons, so the data are doubled: a strict win enters twice, a tie
    once each way, each repeated ``weight`` times; the objective doubles too, so alpha doubles.
    """
    k = v.shape[-1]
    data = []
    for a in range(v.shape[0]):
        for i, j in itertools.permutations(range(k), 2):
            data += [(i, j)] * int(round(2 * float(v[a, i, j]))) * int(weights[a])
    if not data:
        return np.zeros(k)
    theta = choix.opt_pairwise(k, data, alpha=2 * alpha, tol=1e-12)
    return theta - theta.mean()


def test_map_pairwise_matches_choix_with_ties_and_one_sided_wins() -> None:
    rng = np.random.default_rng(0)
    ranks = random_ranks(rng, b=80, a_max=4, k_max=6)
    weights = rng.integers(1, 3, size=ranks.shape[:2]).astype(float)  # 1 or 2: choix repeats
    wins = bt.wins_rankings(ranks, torch.tensor(weights))
    theta = bt.map_pairwise(wins, ALPHA)
    votes = bt.votes_rankings(ranks)
    one_sided = 0
    for g in range(ranks.shape[0]):
        k = int((ranks[g] >= 0).any(0).sum())
        ref = choix_fit(votes[g, :, :k, :k], weights[g], ALPHA)
        ours = theta[g, :k].numpy()
        np.testing.assert_allclose(ours - ours.mean(), ref, atol=ATOL_CHOIX, rtol=0)
        w = wins[g, :k, :k]
        one_sided += int(((w > 0) & (w.T > 0)).sum() == 0 and bool((w > 0).any()))
    assert one_sided >= 20  # the hard case (MLE would diverge) is really covered
    assert theta.sum(-1).abs().max() < 1e-9  # the L2 prior centres the fit


def test_gradient_and_hessian_match_autograd() -> None:
    rng = np.random.default_rng(1)
    ranks = random_ranks(rng, b=5, a_max=3, k_max=5)
    wins = bt.wins_rankings(ranks, torch.ones(ranks.shape[:2], dtype=torch.float64))
    theta = torch.tensor(rng.normal(size=(5, 5)), dtype=torch.float64)
    for g in range(5):
        def f(t: torch.Tensor, g: int = g) -> torch.Tensor:
            return bt.objective_pairwise(t[None], wins[g : g + 1], ALPHA)[0]

        grad = torch.autograd.functional.jacobian(f, theta[g])
        hess = torch.autograd.functional.hessian(f, theta[g])
        # float64 closed form vs the autograd of the same objective: sums of <= K^2 = 36 terms ~1, 36 *
        # eps64 ~ 1e-14; 1e-10 with room
        torch.testing.assert_close(bt.gradient_pairwise(theta, wins, ALPHA)[g], grad,
                                   atol=1e-10, rtol=0)
        torch.testing.assert_close(bt.hessian_pairwise(theta, wins, ALPHA)[g], hess,
                                   atol=1e-10, rtol=0)


def test_gradient_vanishes_at_the_fit_and_p_is_sigmoid() -> None:
    wins = torch.tensor([[[0.0, 3.0, 2.0], [0.0, 0.0, 1.5], [1.0, 0.5, 0.0]]], dtype=torch.float64)
    theta = bt.map_pairwise(wins, ALPHA)
    assert bt.gradient_pairwise(theta, wins, ALPHA).abs().max() < 1e-9
    p = bt.probabilities_pairwise(theta)
    assert abs(p[0, 0, 1].item() - 1 / (1 + math.exp(-(theta[0, 0] - theta[0, 1]).item()))) < 1e-15
    # sigmoid(x) + sigmoid(-x) in float64: a few eps64 from 1 (assert_close's float64 default rtol 1e-7)
    torch.testing.assert_close(p + p.transpose(-1, -2), torch.ones_like(p))


def test_two_candidate_one_sided_fit_worked_example() -> None:
    """K=2, 3 votes for candidate 0, alpha=0.1: by symmetry theta = (d/2, -d/2) with
    3 sigmoid(-d) = alpha d (stationarity of 3 softplus(-d) + alpha d^2 / 2); d = 2.4292, p = 0.919."""
    wins = torch.tensor([[[0.0, 3.0], [0.0, 0.0]]], dtype=torch.float64)
    theta = bt.map_pairwise(wins, ALPHA)
    d = (theta[0, 0] - theta[0, 1]).item()
    assert abs(3 / (1 + math.exp(d)) - ALPHA * d) < 1e-9
    assert abs(d - 2.4292) < 1e-4


def test_laplace_covariance_and_confidence() -> None:
    wins = torch.tensor([[[0.0, 3.0, 2.0], [0.0, 0.0, 1.0], [1.0, 2.0, 0.0]],
                         [[0.0] * 3] * 3], dtype=torch.float64)
    theta = bt.map_pairwise(wins, ALPHA)
    cov = bt.covariance_pairwise(theta, wins, ALPHA)
    hess = torch.autograd.functional.hessian(
        lambda t: bt.objective_pairwise(t[None], wins[:1], ALPHA)[0], theta[0])
    # float64 inverse of a well-conditioned K x K Hessian (the L2 prior bounds it), entries ~1: cond *
    # eps64 << 1e-10
    torch.testing.assert_close(cov[0], torch.linalg.inv(hess), atol=1e-10, rtol=0)
    w = bt.confidence_pairwise(cov, ALPHA)
    off = ~torch.eye(3, dtype=torch.bool)
    assert bool(((w[0][off] > 0) & (w[0][off] < 1)).all())
    assert w[1][off].abs().max() < 1e-12  # no votes: the prior only, zero confidence
    more = bt.confidence_pairwise(bt.covariance_pairwise(theta[:1], 10 * wins[:1], ALPHA), ALPHA)
    assert bool((more[0][off] > w[0][off]).all())  # more votes, more confidence


def test_map_pairwise_errors() -> None:
    wins = torch.tensor([[[0.0, 3.0], [1.0, 0.0]]], dtype=torch.float64)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        bt.map_pairwise(wins, alpha=0.0)
    with pytest.raises(ValueError, match="finite"):
        bt.map_pairwise(-wins, alpha=0.1)
    with pytest.raises(bt.ConvergenceError, match="not converged after 1 Newton"):
        bt.map_pairwise(wins, alpha=0.1, max_iter=1)


def test_kendall_tau_matches_scipy_tau_b() -> None:
    rng = np.random.default_rng(2)
    for _ in range(50):
        k = int(rng.integers(3, 8))
        x, y = rng.integers(0, k, size=k), rng.integers(0, k, size=k)
        ours = rankstats.kendall_tau(torch.tensor(x), torch.tensor(y)).item()
        ref = scipy.stats.kendalltau(x, y, variant="b").statistic
        if np.isnan(ref):
            assert math.isnan(ours)
        else:
            assert abs(ours - ref) < 1e-12


def naive_kendall_w(rankings: list[list[int]]) -> float:
    """Textbook W with tie correction from mid-ranks (scipy.stats.rankdata)."""
    m, n = len(rankings), len(rankings[0])
    r = np.array([scipy.stats.rankdata(x) for x in rankings])
    s = ((r.sum(0) - m * (n + 1) / 2) ** 2).sum()
    t = sum(sum(c**3 - c for c in np.unique(x, return_counts=True)[1]) for x in rankings)
    return 12 * s / (m**2 * (n**3 - n) - m * t)


def test_kendall_w_worked_example_and_naive_reference() -> None:
    """3 judges, 4 items, orders (0 1 2 3), (0 1 3 2), (1 0 2 3): rank sums 4, 5, 10, 11,
    mean 7.5, S = 12.25 + 6.25 + 6.25 + 12.25 = 37, W = 12 * 37 / (9 * 60) = 0.8222..."""
    ranks = torch.tensor([[[0, 1, 2, 3], [0, 1, 3, 2], [1, 0, 2, 3]]])
    w = rankstats.kendall_w(ranks, torch.ones(1, 3, dtype=torch.bool))
    assert abs(w.item() - 12 * 37 / 540) < 1e-12
    rng = np.random.default_rng(3)
    for _ in range(30):
        m, k = int(rng.integers(2, 5)), int(rng.integers(3, 7))
        x = rng.integers(0, k, size=(m, k))
        if all(len(set(row)) == 1 for row in x):
            continue
        padded = torch.full((1, 5, 8), -1, dtype=torch.long)
        padded[0, :m, :k] = torch.tensor(x)
        included = torch.zeros(1, 5, dtype=torch.bool)
        included[0, :m] = True
        assert abs(rankstats.kendall_w(padded, included).item() - naive_kendall_w(x.tolist())) < 1e-12
    one = rankstats.kendall_w(ranks[:, :1], torch.ones(1, 1, dtype=torch.bool))
    assert math.isnan(one.item())  # W needs two rankings


def naive_has_cycle(adj: np.ndarray) -> bool:
    """Depth-first search for a directed cycle."""
    k, state = len(adj), [0] * len(adj)

    def visit(u: int) -> bool:
        state[u] = 1
        for v in range(k):
            if adj[u, v] and (state[v] == 1 or (state[v] == 0 and visit(v))):
                return True
        state[u] = 2
        return False

    return any(state[u] == 0 and visit(u) for u in range(k))


def test_majority_cycles() -> None:
    rps = torch.tensor([[[0, 1, 2]], [[1, 2, 0]], [[2, 0, 1]]]).permute(1, 0, 2)  # (1, 3, 3)
    assert bool(rankstats.majority_cycles(bt.wins_rankings(rps, torch.ones(1, 3)))[0])
    rng = np.random.default_rng(4)
    wins = torch.tensor(rng.integers(0, 3, size=(200, 6, 6)), dtype=torch.float64)
    got = rankstats.majority_cycles(wins)
    for g in range(200):
        w = wins[g].numpy()
        assert bool(got[g]) == naive_has_cycle(w - w.T > 0)
    assert 0 < int(got.sum()) < 200


def test_tiers_strengths_ties_and_padding() -> None:
    theta = torch.tensor([[0.5, -0.5, 0.5, 0.0], [1.0, 1.0 + 1e-9, -1.0, 0.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True, True], [True, True, True, False]])
    tiers = rankstats.tiers_strengths(theta, valid, tol=1e-6)
    assert tiers.tolist() == [[0, 2, 0, 1], [0, 0, 1, -1]]


def test_midranks_example() -> None:
    assert rankstats.midranks(torch.tensor([0, 1, 1, 2, -1])).tolist() == [1.0, 2.5, 2.5, 4.0, 0.0]


def test_flip_rates_moment_recovers_exact_agreement() -> None:
    """If agree_ab = n (1 + q_a q_b) / 2 exactly, the estimator returns f = (1 - q) / 2."""
    f_true = torch.tensor([0.0, 0.1, 0.25, 0.4, 0.5, 0.9], dtype=torch.float64)
    q = 1 - 2 * f_true
    n = torch.full((6, 6), 100.0, dtype=torch.float64).fill_diagonal_(0)
    agree = n * (1 + q[:, None] * q[None, :]) / 2
    # float64 moment estimator: square roots of products of exact counts; sqrt near q = 0 (f = 0.5)
    # loses half the digits: ~1e-8, 1e-6 with room
    torch.testing.assert_close(noise.flip_rates_moment(agree, n), f_true, atol=1e-6, rtol=0)
    lonely = torch.tensor([[0.0, 10.0], [10.0, 0.0]], dtype=torch.float64)
    assert bool(torch.isnan(noise.flip_rates_moment(lonely * 0.9, lonely)).all())  # one partner


def test_concordance_slots_matches_pairwise_concordance() -> None:
    rng = np.random.default_rng(5)
    ranks = random_ranks(rng, b=20, a_max=3, k_max=5, one_sided_share=0.0)
    c, d = rankstats.concordance_slots(ranks)
    for a, b in itertools.product(range(3), range(3)):
        c2, d2 = rankstats.concordance(ranks[:, a], ranks[:, b])
        # counts in float: exact up to assert_close's float defaults
        torch.testing.assert_close(c[:, a, b], c2)
        torch.testing.assert_close(d[:, a, b], d2)
