"""The log-odds reliability weight (``aggregate --reliability-weight log_odds``): the pure
function against scipy's Beta posterior, the estimator's weights against a pair-by-pair count
of each annotator's votes against choix's leave-one-out consensus, and the aggregate stage
(through its CLI) on a simulated crowd of mixed quality."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from grouppref.pipeline.simulate.config import AnnotatorSpec
from grouppref.pipeline.simulate.core import simulate_order
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from grouppref.stats.reliability import UNIFORM, estimate_reliability, log_odds_weight
from tests.support.cli import grouppref_here
from tests.support.factories import make_group
from tests.support.labelling import write_stage
from tests.support.paths import REPO
from tests.support.reliability import ALPHA, K, loo_counts_reference, selected_panel

ROOT = REPO


def weight_reference(d: float, n: float, m: float = 2.0, min_rate: float = 0.02) -> float:
    """The posterior mean of a Beta(m/2, m/2) prior after ``d`` of ``n`` votes against, as
    scipy computes it, then the log-odds clipped to [0, log((1 - min_rate) / min_rate)]."""
    e = stats.beta(m / 2 + d, m / 2 + n - d).mean()
    e = min(max(e, min_rate), 0.5)
    return math.log((1 - e) / e)


def test_log_odds_weight_matches_the_beta_posterior_reference() -> None:
    cases = [(0, 0), (0, 3), (0, 10_000), (1, 10), (5, 100), (30, 100), (50, 100), (80, 100),
             (2.5, 7.5), (12, 12)]
    d = torch.tensor([x for x, _ in cases], dtype=torch.float64)
    n = torch.tensor([y for _, y in cases], dtype=torch.float64)
    for m, floor in [(2.0, 0.02), (10.0, 0.05), (0.5, 0.001)]:
        got = log_odds_weight(d, n, prior_pairs=m, min_rate=floor)
        want = [weight_reference(x, y, m, floor) for x, y in cases]
        # float64 log-odds of a few counts, vectorised vs a loop: ~10 eps64 * |log| (< 5)
        assert got.tolist() == pytest.approx(want, abs=1e-12)
    w = log_odds_weight(d, n)
    assert float(w[0]) == 0.0  # no votes: the prior's 0.5, weight 0
    # float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert float(w[2]) == pytest.approx(math.log(49))  # a perfect record is capped
    assert float(w[1]) < float(w[2])  # three perfect votes are worth less than 10 000
    assert float(w[7]) == 0.0 and float(w[9]) == 0.0  # worse than chance: 0, never negative
    assert float(w[4]) > float(w[3]) > float(w[5]) > float(w[6]) == 0.0  # 5/100, 1/10, 30/100


def test_estimator_weights_are_the_log_odds_of_votes_against_the_loo_consensus() -> None:
    ranks, ann, design = selected_panel(3)
    kw = torch.ones(5, dtype=torch.float64)  # the reference's consensus weighs rankings alike
    args = dict(alpha=ALPHA, iterations=1, min_groups=1, unreliable_tau=0.0, z=2.0,
                drop=False, batch_size=11, max_iter=100, tie_tol=1e-6, design=design)
    rel = estimate_reliability(ranks, ann, kw, **args, weight="log_odds")
    r, a, dz = ranks.numpy(), ann.numpy(), design.numpy()
    for who in range(5):  # the human (3) on its 8 audit groups only, as tau is
        c = d = 0
        for (g, s), x in np.ndenumerate(a):
            if x == who and (who != 3 or dz[g, s] == UNIFORM):
                cg, dg = loo_counts_reference(r, a, g, s)
                c, d = c + cg, d + dg
        # a ratio of counts: float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
        assert float(rel.loo_disagreement[who]) == pytest.approx(d / (c + d))
        want = weight_reference(d, c + d)
        # float64 (bt.DTYPE) log-odds of the same counts, vectorised vs the reference: ~10 eps64 * |log|
        # (< 5); 1e-9 with room
        assert float(rel.annotator_weight[who]) == pytest.approx(want, abs=1e-9)
    tau = estimate_reliability(ranks, ann, kw, **args)  # the default: clip(tau, 0, 1)
    assert torch.equal(tau.annotator_weight, kw * tau.tau.clamp(0, 1))
    for name in ("tau", "groups", "unreliable", "audit_only"):  # only the weight differs
        assert torch.equal(getattr(rel, name).nan_to_num(-9), getattr(tau, name).nan_to_num(-9))


def crowd(seed: int = 0) -> list[AnnotatedGroup]:
    """60 groups of K = 4, each ranked by two good (flip 0.05, 0.1), a fair (0.3) and a random
    simulated annotator."""
    rng = np.random.default_rng(seed)
    specs = [AnnotatorSpec(id="good", flip_rate=0.05), AnnotatorSpec(id="good2", flip_rate=0.1),
             AnnotatorSpec(id="fair", flip_rate=0.3), AnnotatorSpec(id="clicker", behavior="random")]
    out = []
    for i in range(60):
        g = make_group(K, prompt_text=f"Question {i}?", texts=[f"reply {i}.{j}" for j in range(K)])
        ids, truth = g.candidate_ids(), rng.normal(size=K).tolist()
        rankings = [Ranking(annotator=Annotator(id=s.id, kind="simulated"), group_id=g.group_id,
                            tiers=[[ids[j]] for j in simulate_order(truth, s, rng)])
                    for s in specs]
        out.append(AnnotatedGroup(**g.model_dump(), rankings=rankings))
    return out


@pytest.mark.parametrize("weight", ["tau", "log_odds"])
def test_aggregate_cli_weighs_a_mixed_crowd(tmp_path: Path, weight: str) -> None:
    store = write_stage(tmp_path / "run", crowd(), "simulate")
    done = grouppref_here("aggregate", store.root, "--reliability-weight", weight,  # in process
                          "--min-kendall-w", "0.3", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads((store.root / "aggregate" / "report.json").read_text(encoding="utf-8"))
    settings = report["settings"]  # the report names what shaped its numbers
    assert settings["reliability_weight"] == weight and settings["model"] == "bradley_terry"
    assert settings["noise_filters"]["low_agreement"] == {"action": "flag", "threshold": 0.3}
    assert f"reliability weight {weight} (3 rounds" in " ".join(done.stdout.split())
    w = {a["id"]: a["annotator_weight"] for a in report["annotators"]}
    manifest = json.loads((store.root / "aggregate" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["config"]["reliability_weight"] == weight
    assert min(w["good"], w["good2"]) > w["fair"] > 0 and w["clicker"] == 0.0  # dropped
    if weight == "log_odds":  # the good annotator's vote is worth more than in [0, 1]
        assert 1.0 < w["good"] <= math.log(49)
    else:
        assert w["good"] <= 1.0
