"""Partial rankings (a ranking that names only some of a group's candidates) through the
statistics, against naive references: Bradley-Terry (choix on the comparisons the rankings
imply), Kendall's tau (scipy on the shared candidates), Kendall's W (the mean pairwise
Spearman form, scipy's spearmanr; the textbook form where rankings are complete), the
leave-one-out reliability consensus, connected components; then the schema and the aggregate
stage's noise rules on imported pairs."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import choix
import numpy as np
import pytest
import scipy.stats
import torch
from pydantic import ValidationError

from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.stage import read_report, run_aggregate
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.stage import run_import
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from grouppref.stats import bt, rankstats
from grouppref.stats.reliability import loo_concordance
from tests.support.factories import make_group

ALPHA = 0.1


def partial_ranks(rng: np.random.Generator, b: int, a: int, k: int) -> torch.Tensor:
    """``(B, A, K)`` rankings with ties, each leaving out a random subset (keeping >= 2)."""
    ranks = torch.tensor(rng.integers(0, k, size=(b, a, k)))
    for g, s in itertools.product(range(b), range(a)):
        keep = rng.choice(k, size=int(rng.integers(2, k + 1)), replace=False)
        mask = torch.ones(k, dtype=torch.bool)
        mask[torch.tensor(keep)] = False
        ranks[g, s, mask] = -1
    return ranks


def test_bt_fit_on_partial_rankings_matches_choix_on_their_comparisons() -> None:
    rng = np.random.default_rng(7)
    ranks = partial_ranks(rng, b=30, a=4, k=5)
    theta = bt.map_pairwise(bt.wins_rankings(ranks, torch.ones(30, 4)), ALPHA)
    for g in range(30):
        data = []  # choix takes unit comparisons: a strict win twice, a tie once each way
        for s in range(4):
            r = ranks[g, s].tolist()
            for i, j in itertools.permutations(range(5), 2):
                if r[i] >= 0 and r[j] >= 0:
                    data += [(i, j)] * (2 if r[i] < r[j] else 1 if r[i] == r[j] else 0)
        ref = choix.opt_pairwise(5, data, alpha=2 * ALPHA, tol=1e-12)
        # our float64 MAP vs choix's optimiser (tol 1e-12 on the gradient): strengths ~1,
        # well-conditioned by the prior: 1e-6 bounds choix's stopping error
        np.testing.assert_allclose(theta[g].numpy(), ref - ref.mean(), atol=1e-6, rtol=0)


def test_kendall_tau_of_a_partial_ranking_uses_its_own_candidates() -> None:
    rng = np.random.default_rng(8)
    for _ in range(60):
        a, b = rng.integers(-1, 4, size=6), rng.integers(0, 4, size=6)
        shared = (a >= 0) & (b >= 0)
        ours = rankstats.kendall_tau(torch.tensor(a), torch.tensor(b)).item()
        ref = scipy.stats.kendalltau(a[shared], b[shared], variant="b").statistic \
            if shared.sum() >= 2 else math.nan
        assert (math.isnan(ours) and np.isnan(ref)) or abs(ours - ref) < 1e-12


def naive_w_partial(rankings: list[list[int]]) -> float:
    """``(1 + (m - 1) rho_bar) / m``, rho by scipy on the candidates two rankings share."""
    m, rhos = len(rankings), []
    for x, y in itertools.combinations(rankings, 2):
        shared = [i for i in range(len(x)) if x[i] >= 0 and y[i] >= 0]
        xs, ys = [x[i] for i in shared], [y[i] for i in shared]
        if len(shared) >= 2 and len(set(xs)) > 1 and len(set(ys)) > 1:
            rhos.append(scipy.stats.spearmanr(xs, ys).statistic)
    if not rhos:
        return math.nan
    return min(max((1 + (m - 1) * float(np.mean(rhos))) / m, 0.0), 1.0)


def test_kendall_w_of_partial_rankings_matches_the_pairwise_spearman_form() -> None:
    rng = np.random.default_rng(9)
    ranks = partial_ranks(rng, b=50, a=4, k=6)
    w = rankstats.kendall_w(ranks, torch.ones(50, 4, dtype=torch.bool), chunk=7)
    for g in range(50):
        ref = naive_w_partial(ranks[g].tolist())
        assert (math.isnan(ref) and math.isnan(w[g].item())) or abs(w[g].item() - ref) < 1e-9


def test_the_pairwise_form_equals_the_textbook_w_on_complete_untied_rankings() -> None:
    rng = np.random.default_rng(10)
    ranks = torch.stack([torch.stack([torch.tensor(rng.permutation(5)) for _ in range(3)])
                         for _ in range(20)])
    included = torch.ones(20, 3, dtype=torch.bool)
    # the partial and the complete formula on complete rankings, float64 sums of ~20 small integers:
    # ~eps64
    torch.testing.assert_close(rankstats._kendall_w_partial(ranks, included),
                               rankstats._kendall_w_complete(ranks, included), atol=1e-12, rtol=0)


def test_leave_one_out_consensus_orders_only_what_the_others_compared() -> None:
    """Naive reference: per ranking, choix on the other rankings' comparisons; its consensus
    covers the candidates those compared; concordant / discordant pairs counted by hand."""
    rng = np.random.default_rng(11)
    ranks = partial_ranks(rng, b=25, a=3, k=5)
    ranks[:6, 1:] = -1  # groups of one ranking: no other votes, no consensus to fit
    c, d = loo_concordance(ranks, torch.ones(25, 3, dtype=bt.DTYPE), ALPHA, 100, 1e-6)
    for g, s in itertools.product(range(25), range(3)):
        data, seen = [], set()
        for o in set(range(3)) - {s}:
            r = ranks[g, o].tolist()
            for i, j in itertools.permutations(range(5), 2):
                if r[i] >= 0 and r[j] >= 0:
                    data += [(i, j)] * (2 if r[i] < r[j] else 1 if r[i] == r[j] else 0)
                    seen |= {i, j}
        theta = choix.opt_pairwise(5, data, alpha=2 * ALPHA, tol=1e-12) if data else np.zeros(5)
        mine = ranks[g, s].tolist()
        conc = disc = 0
        for i, j in itertools.combinations(range(5), 2):
            if i in seen and j in seen and mine[i] >= 0 and mine[j] >= 0 and mine[i] != mine[j] \
                    and abs(theta[i] - theta[j]) > 1e-6:
                agree = (mine[i] < mine[j]) == (theta[i] > theta[j])
                conc, disc = conc + agree, disc + (not agree)
        assert (c[g, s].item(), d[g, s].item()) == (conc, disc), (g, s)


def test_components_match_a_breadth_first_search() -> None:
    rng = np.random.default_rng(12)
    wins = torch.tensor(rng.random((100, 6, 6)) < 0.12, dtype=bt.DTYPE)
    valid = torch.tensor(rng.random((100, 6)) < 0.9)
    got = rankstats.components(wins, valid)
    for g in range(100):
        adj = (wins[g] + wins[g].T).numpy() > 0
        left, count = {i for i in range(6) if valid[g, i]}, 0
        while left:
            count += 1
            todo = [left.pop()]
            while todo:
                u = todo.pop()
                for v in [v for v in left if adj[u, v]]:
                    left.discard(v)
                    todo.append(v)
        assert int(got[g]) == count


def test_a_ranking_may_cover_a_subset_of_two_or_more_candidates() -> None:
    group = make_group(k=4)
    ids = group.candidate_ids()

    def annotated(*tiers: list[str]) -> AnnotatedGroup:
        ranking = Ranking(annotator=Annotator(id="a", kind="human"), group_id=group.group_id,
                          tiers=list(tiers))
        return AnnotatedGroup(**group.model_dump(), rankings=[ranking])

    assert annotated([ids[2]], [ids[0]]).rankings[0].tiers == [[ids[2]], [ids[0]]]
    for bad, why in (([[ids[0]]], "at least 2"), ([[ids[0]], [ids[0]]], "twice"),
                     ([[ids[0]], ["c-unknown"]], "unknown")):
        with pytest.raises(ValidationError, match=why):
            annotated(*bad)


def test_noise_rules_on_imported_pairs(tmp_path: Path) -> None:
    """Pairs only: a consistent group, a contradicted one (low agreement), an intransitive
    one (cycle) and one whose pairs never meet (disconnected)."""
    def pairs(prompt: str, *won: tuple[str, str]) -> list[dict]:
        return [{"prompt": prompt, "chosen": w, "rejected": lo} for w, lo in won]

    rows = (pairs("Consistent?", ("a", "b"), ("a", "b"), ("b", "c"), ("a", "c"))
            + pairs("Contradicted?", ("a", "b"), ("b", "a"), ("a", "b"), ("b", "a"))
            + pairs("Cycle?", ("a", "b"), ("b", "c"), ("c", "a"))
            + pairs("Apart?", ("a", "b"), ("c", "d"), ("a", "b")))
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = RunStore(tmp_path / "run")
    run_import(store, ImportConfig(source=str(source)))
    stage = run_aggregate(store, AggregateConfig(min_rankings=2))
    flags = {g.prompt.text: set(g.flags) for g in stage.records()}
    assert flags["Consistent?"] == set()
    assert "low_agreement" in flags["Contradicted?"]
    assert "cycle" in flags["Cycle?"] and "disconnected" not in flags["Cycle?"]
    assert flags["Apart?"] == {"disconnected"}
    apart = next(g for g in stage.records() if g.prompt.text == "Apart?")
    assert apart.agreement.kendall_w == 1.0 and apart.agreement.noise == 0.0
    report = read_report(store)
    assert report.summary.input_stage == "import" and report.rules["disconnected"].flagged == 1
