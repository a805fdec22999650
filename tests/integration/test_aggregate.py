"""The aggregate stage: fits against a direct BT fit, reliability and noise on simulated panels
with known flip rates, noise rules, bad input, report and CLI."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from grouppref.commands import aggregate as aggregate_cmd
from grouppref.errors import ConfigError, StageError
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.fit import resolve_targets
from grouppref.pipeline.aggregate.outcome import recommendation
from grouppref.pipeline.aggregate.stage import read_report, run_aggregate
from grouppref.pipeline.simulate.config import AnnotatorSpec
from grouppref.pipeline.simulate.core import order_flips, simulate_order
from grouppref.pipeline.simulate.panel import tied_panel as make_tied_panel
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from grouppref.stats import bt, rankstats
from grouppref.stats.reliability import estimate_reliability, noise_rate
from tests.support.cli import grouppref_here
from tests.support.factories import make_group, make_ranking
from tests.support.paths import REPO, TEST_DATA
from tests.support.simulate import rank_run, scored_group, write_stage

NOISE_TOL = 0.03  # |estimated - true| share of flipped votes, 1000-2000 groups x 3 annotators
FLIP_TOL = 0.05  # per annotator (~5,000 votes each)
PANEL = [AnnotatorSpec(id=f"h{i}", flip_rate=f) for i, f in enumerate((0.0, 0.1, 0.2, 0.3, 0.4))]
BAD = [AnnotatorSpec(id="random", behavior="random"), AnnotatorSpec(id="reversed",
                                                                    behavior="reversed")]


def simulated_tensors(panel: list[AnnotatorSpec], groups: int, k: int, per_group: int,
                      seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """ranks (B, A, K), ann (B, A), and each annotator's true (flips, pairs)."""
    rng = np.random.default_rng(seed)
    ranks = torch.empty(groups, per_group, k, dtype=torch.long)
    ann = torch.empty(groups, per_group, dtype=torch.long)
    flips, pairs = np.zeros(len(panel)), np.zeros(len(panel))
    for g in range(groups):
        scores = rng.normal(size=k).tolist()
        for a, m in enumerate(rng.choice(len(panel), per_group, replace=False)):
            order = simulate_order(scores, panel[m], rng)
            f, n = order_flips(order, scores)
            flips[m], pairs[m] = flips[m] + f, pairs[m] + n
            ranks[g, a, torch.tensor(order)] = torch.arange(k)
            ann[g, a] = int(m)
    return ranks, ann, flips, pairs


def reliability(ranks: torch.Tensor, ann: torch.Tensor, n: int, **overrides: object):
    cfg = AggregateConfig(**overrides)
    with bt.torch_threads(1):  # as in run_aggregate
        return _estimate(ranks, ann, n, cfg)


def _estimate(ranks: torch.Tensor, ann: torch.Tensor, n: int, cfg: AggregateConfig):
    return estimate_reliability(
        ranks, ann, torch.ones(n, dtype=torch.float64), alpha=cfg.prior_strength,
        iterations=cfg.reliability_iterations, min_groups=cfg.min_groups_for_reliability,
        unreliable_tau=cfg.unreliable_tau, z=cfg.unreliable_z, drop=cfg.drop_unreliable,
        batch_size=1024, max_iter=cfg.max_iter, tie_tol=cfg.tie_tolerance)


def test_noise_rate_and_unreliable_annotators_on_a_simulated_panel() -> None:
    panel = PANEL + BAD
    ranks, ann, flips, pairs = simulated_tensors(panel, groups=2000, k=4, per_group=3)
    rel = reliability(ranks, ann, len(panel))
    assert [panel[i].id for i in rel.unreliable.nonzero()[:, 0].tolist()] == ["random", "reversed"]
    assert rel.dropped.tolist() == rel.unreliable.tolist()
    used = np.array([a.behavior == "noisy" for a in panel])
    true_noise = flips[used].sum() / pairs[used].sum()  # ~0.20
    assert abs(noise_rate(rel) - true_noise) < NOISE_TOL
    np.testing.assert_allclose(rel.flip_rate.numpy(), flips / pairs, atol=FLIP_TOL, rtol=0)
    taus = rel.tau.numpy()[:5]
    assert list(np.argsort(-taus)) == [0, 1, 2, 3, 4]  # reliability follows the flip rates
    weights = rel.annotator_weight.numpy()
    assert weights[5] == weights[6] == 0.0 and bool((weights[:5] > 0).all())


@pytest.mark.parametrize("flip", [0.05, 0.3])
def test_noise_rate_on_equal_panels(flip: float) -> None:
    panel = [AnnotatorSpec(id=f"a{i}", flip_rate=flip) for i in range(4)]
    ranks, ann, flips, pairs = simulated_tensors(panel, groups=1000, k=4, per_group=3, seed=1)
    rel = reliability(ranks, ann, len(panel))
    assert not bool(rel.unreliable.any())
    assert abs(noise_rate(rel) - flips.sum() / pairs.sum()) < NOISE_TOL


def tied_panel(groups: int, flip: float, levels: int, declared: bool
               ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray, float]:
    """A constructed tied panel (:func:`grouppref.pipeline.simulate.panel.tied_panel`, seed 0):
    ranks (B, A, K), ann (B, A), each annotator's (flips, votes) on decided pairs, and the true
    share of tied pairs."""
    p = make_tied_panel(groups, flip, levels, declared, seed=0)
    return p.ranks, p.ann, p.flips, p.votes, p.tie_share


@pytest.mark.parametrize("flip", [0.0, 0.1, 0.3])
def test_noise_rate_on_a_tied_panel_with_declared_ties(flip: float) -> None:
    # a rule ranking declares the true ties: pairs it ties are left out, so the estimate is
    # the flip rate on decided pairs (the rule itself votes with the truth there)
    ranks, ann, flips, votes, tie_share = tied_panel(1500, flip, levels=3, declared=True)
    rel = reliability(ranks, ann, 4)
    true_noise = flips.sum() / votes.sum()
    assert abs(noise_rate(rel) - true_noise) < NOISE_TOL
    np.testing.assert_allclose(rel.flip_rate.numpy(), flips / votes, atol=FLIP_TOL, rtol=0)
    # counts (integers in float): exact
    np.testing.assert_allclose(rel.votes.numpy(), votes)  # strict votes on decided pairs only
    # a ratio of counts, float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert rel.tied_share == pytest.approx(tie_share)  # ~1/3, reported on its own
    # ratios of counts, float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert rel.tie_rate.numpy() == pytest.approx([0, 0, 0, tie_share])


def test_noise_rate_on_a_tied_panel_without_declared_ties_reads_the_ties_as_noise() -> None:
    # no ranking declares the ties: with three forced orders per group the ties cannot be told
    # from noise; the estimate then follows f' = (1 - sqrt(1 - t) (1 - 2 f)) / 2 (docs)
    flip = 0.1
    ranks, ann, flips, votes, tie_share = tied_panel(1500, flip, levels=3, declared=False)
    rel = reliability(ranks, ann, 3)
    f = flips.sum() / votes.sum()  # ~0.08 on decided pairs
    expected = (1 - math.sqrt(1 - tie_share) * (1 - 2 * f)) / 2  # ~0.16
    assert abs(noise_rate(rel) - expected) < NOISE_TOL
    assert noise_rate(rel) > f + 0.05
    assert rel.tied_share == 0.0


def test_stage_reports_ties_of_a_rule_ranker_separately(tmp_path: Path) -> None:
    # the pipeline case of issue 16: a rule ranker with many tied scores is the truth, a
    # simulated panel orders tied candidates at random; the simulate stage keeps the rule's
    # ranking, so the aggregate stage sees the ties and leaves those pairs out of the noise
    from grouppref.pipeline.simulate.config import SimulateConfig
    from grouppref.pipeline.simulate.stage import run_simulate

    rng = np.random.default_rng(5)
    groups = []
    for i in range(400):
        g = scored_group(i, rng.integers(0, 3, size=4).astype(float).tolist(), kind="rule")
        r = g.rankings[0]
        by_score: dict[float, list[str]] = {}
        for cid, sc in r.scores.items():
            by_score.setdefault(sc, []).append(cid)
        tiers = [by_score[sc] for sc in sorted(by_score, reverse=True)]
        groups.append(g.model_copy(update={"rankings": [r.model_copy(update={"tiers": tiers})]}))
    store = RunStore(tmp_path / "run")
    write_stage(store, "rank", groups)
    sim = run_simulate(store, SimulateConfig(annotators=[
        AnnotatorSpec(id=f"s{i}", flip_rate=0.1) for i in range(3)], seed=1))
    run_aggregate(store, AggregateConfig())
    report = read_report(store)
    realised = sim.manifest.stats["annotators"]
    by_id = {a.id: a for a in report.annotators}
    true_noise = (sum(realised[a]["realised_flip_rate"] * by_id[a].votes for a in realised)
                  / sum(a.votes for a in report.annotators))  # the rule ranking votes with the truth
    tie_share = sum(len(t) * (len(t) - 1) / 2 for g in groups for t in g.rankings[0].tiers) / (400 * 6)
    # ratios of counts, float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert report.noise.tied_pair_share == pytest.approx(tie_share)
    assert report.summary.tied_pair_share == pytest.approx(tie_share)
    assert abs(report.noise.estimated - true_noise) < 0.04
    # a ratio of counts, float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert by_id["rm-1"].tie_rate == pytest.approx(tie_share) and by_id["s0"].tie_rate == 0.0


def _panel_run(tmp_path: Path, n: int, orders: list[list[list[int]]] | None = None) -> RunStore:
    """A 'label' stage of K=3 groups with human rankings given as orders (indices, best first)."""
    store = RunStore(tmp_path / "run")
    groups = []
    for i, group_orders in enumerate(orders or []):
        g = make_group(k=3, prompt_text=f"prompt {i}")
        groups.append(AnnotatedGroup(**g.model_dump(), rankings=[
            make_ranking(g, o, annotator=f"ann-{a + 1}") for a, o in enumerate(group_orders)]))
    write_stage(store, "label", groups)
    return store


def test_output_rows_match_a_direct_weighted_fit(tmp_path: Path) -> None:
    store = rank_run(tmp_path, n=30)
    from grouppref.pipeline.simulate.config import SimulateConfig
    from grouppref.pipeline.simulate.stage import run_simulate

    run_simulate(store, SimulateConfig(annotators=PANEL[:3]))
    stage = run_aggregate(store, AggregateConfig(min_groups_for_reliability=5))
    assert stage.manifest.counts.inputs == stage.manifest.counts.outputs == 30
    report = read_report(store)
    weight = {a.id: a.annotator_weight for a in report.annotators}
    assert 0 < weight["rm-1"] <= 0.5  # reward models count half of a human by default
    for row in stage.records():
        ids = row.candidate_ids()
        ranks = torch.tensor([[[next(t for t, tier in enumerate(r.tiers) if c in tier)
                                for c in ids] for r in row.rankings]])
        w = torch.tensor([[weight[r.annotator.id] for r in row.rankings]], dtype=torch.float64)
        theta = bt.map_pairwise(bt.wins_rankings(ranks, w), 0.1)[0]
        got = torch.tensor([row.strengths[c] for c in ids], dtype=torch.float64)
        # the stage's float64 MAP fit vs the same fit here: one Newton solve, strengths ~1 stored as
        # JSON floats (repr round-trips): ~1e-15; 1e-9 allows a last Newton step of another stopping
        # point
        torch.testing.assert_close(got, theta, atol=1e-9, rtol=0)
        assert len(row.pairs) == len(ids) * (len(ids) - 1) // 2
        for pair in row.pairs:
            assert row.strengths[pair.winner] >= row.strengths[pair.loser]
            assert 0.5 <= pair.p <= 1 and 0 <= pair.weight <= 1
        order = sorted(ids, key=lambda c: -row.strengths[c])
        assert [c for tier in row.consensus for c in tier] == order
    again = run_aggregate(store, AggregateConfig(min_groups_for_reliability=5))
    assert again.cached


def test_consensus_targets_are_hard_and_skip_ties_and_padding() -> None:
    p, w = rankstats.consensus_targets(torch.tensor([[1, 0, 1, -1]]))
    assert p[0].tolist() == [[0.5, 0.0, 0.5, 0.5], [1.0, 0.5, 1.0, 0.5],
                             [0.5, 0.0, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]]
    assert w[0].tolist() == [[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]


def test_auto_targets_follow_the_noise_estimate() -> None:
    cfg = AggregateConfig()
    assert (cfg.pair_targets, cfg.hard_targets_above) == ("auto", 0.25)  # docs/evidence.md
    assert resolve_targets(cfg, 0.19) == "soft" and resolve_targets(cfg, None) == "soft"
    assert resolve_targets(cfg, 0.29) == "hard"
    assert resolve_targets(AggregateConfig(pair_targets="soft"), 0.4) == "soft"
    assert resolve_targets(AggregateConfig(pair_targets="hard"), 0.0) == "hard"
    # with hard targets the DPO fallback is not recommended (gspo held its own at 30-40%)
    assert recommendation(0.35, 0.25, targets="hard").loss == "gspo"
    assert recommendation(0.35, 0.25, targets="soft").loss == "dpo"


@pytest.mark.parametrize(("flip", "targets", "want"), [
    (0.35, "auto", "hard"), (0.35, "soft", "soft"), (0.05, "auto", "soft"), (0.05, "hard", "hard")])
def test_pair_targets_follow_the_noise_estimate_through_the_stage(
        tmp_path: Path, flip: float, targets: str, want: str) -> None:
    # auto: soft below hard_targets_above (0.25) estimated noise, hard above; soft / hard: fixed
    store = rank_run(tmp_path, n=60)
    from grouppref.pipeline.simulate.config import SimulateConfig
    from grouppref.pipeline.simulate.stage import run_simulate

    run_simulate(store, SimulateConfig(annotators=[
        AnnotatorSpec(id=f"s{i}", flip_rate=flip) for i in range(3)]))
    stage = run_aggregate(store, AggregateConfig(pair_targets=targets, kind_weights={"reward_model": 0}))
    report = read_report(store)
    assert (report.noise.estimated > 0.25) == (flip > 0.25)
    assert report.summary.pair_targets == report.recommendation.pair_targets == want
    noisy_soft = flip > 0.25 and want == "soft"  # the only case where DPO is recommended
    assert report.recommendation.loss == ("dpo" if noisy_soft else "gspo")
    for row in stage.records():
        tier = {c: t for t, ids in enumerate(row.consensus) for c in ids}
        for pair in row.pairs:
            split = tier[pair.winner] != tier[pair.loser]
            if want == "hard":
                assert (pair.p, pair.weight) == ((1.0, 1.0) if split else (0.5, 0.0))
                assert not split or tier[pair.winner] < tier[pair.loser]
            else:
                assert pair.p < 1.0 and pair.weight < 1.0


def test_rules_flag_or_drop(tmp_path: Path) -> None:
    orders = [
        [[0, 1, 2], [1, 2, 0], [2, 0, 1]],  # rock-paper-scissors: cycle, low agreement, coin flip
        [[0, 1, 2]],  # one ranking: too few; one-sided, so not a coin flip
        [[0, 1, 2], [2, 1, 0]],  # opposite rankings: all tied, coin flip
        [[0, 1, 2], [0, 1, 2], [0, 2, 1]],  # clean
    ]
    store = _panel_run(tmp_path, 4, orders)
    cfg = AggregateConfig(reliability_iterations=0)
    flags = [r.flags for r in run_aggregate(store, cfg).records()]
    assert "cycle" in flags[0] and "low_agreement" in flags[0] and "coin_flip" in flags[0]
    assert flags[1] == ["too_few_rankings"]
    assert "coin_flip" in flags[2] and "cycle" not in flags[2]
    assert flags[3] == []
    rows = run_aggregate(store, cfg).records()
    assert rows[1].pairs[0].p > 0.5 and rows[1].agreement.kendall_w is None
    assert rows[2].consensus == [rows[2].candidate_ids()]  # one tier: a tie
    dropped = run_aggregate(store, cfg.model_copy(update={"cycle": "drop", "coin_flip": "off"}))
    c = dropped.manifest.counts
    assert (c.inputs, c.outputs, c.rejected) == (4, 3, 1)
    assert "rule cycle" in dropped.rejects()[0].reason
    report = read_report(store)
    assert report.rules["cycle"].model_dump() == {"action": "drop", "matched": 1, "flagged": 0,
                                                  "dropped": 1}
    assert all("coin_flip" not in r.flags for r in dropped.records())


def test_bad_input_rejected_with_reasons_and_counts_add_up(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    g1, g2, g3 = (make_group(k=3, prompt_text=f"p{i}") for i in range(3))
    ok = make_ranking(g1, [0, 1, 2], "a")
    unknown = Ranking.model_construct(**{**make_ranking(g1, [1, 0, 2], "b").__dict__,
                                         "tiers": [["c-unknown"], *[[c] for c in g1.candidate_ids()]]})
    copy_a = make_ranking(g1, [0, 1, 2], "a")
    c1, c2 = make_ranking(g1, [0, 1, 2], "c"), make_ranking(g1, [2, 1, 0], "c")
    rows = [
        AnnotatedGroup.model_construct(**g1.__dict__, rankings=[ok, unknown, copy_a, c1, c2]),
        AnnotatedGroup.model_construct(**g2.__dict__, rankings=[make_ranking(g2, [0, 1, 2], "a")]),
        # same group id, same contents: merged (new annotator b kept, duplicate a left out)
        AnnotatedGroup.model_construct(**g2.__dict__, rankings=[make_ranking(g2, [1, 0, 2], "b"),
                                                                make_ranking(g2, [0, 1, 2], "a")]),
        # same group id, different candidates: conflicting contents
        AnnotatedGroup.model_construct(**{**g2.__dict__, "candidates": g3.candidates}, rankings=[]),
        # an invalid group: one candidate only
        AnnotatedGroup.model_construct(**{**g3.__dict__, "candidates": g3.candidates[:1]},
                                       rankings=[]),
        # every ranking bad: no usable ranking
        AnnotatedGroup.model_construct(**g3.__dict__, rankings=[make_ranking(g1, [0, 1, 2], "a")]),
    ]
    write_stage(store, "label", rows)
    stage = run_aggregate(store, AggregateConfig(reliability_iterations=0))
    counts = stage.manifest.counts
    assert (counts.inputs, counts.outputs, counts.rejected) == (6, 2, 4)
    assert counts.inputs == counts.outputs + counts.rejected
    rejects = stage.rejects()
    part = {(r.row, r.field): r.reason for r in rejects if r.scope == "part"}
    assert "unknown candidates" in part[(1, "rankings[1]")]
    assert "same ranking" in part[(1, "rankings[2]")]
    assert "different tiers" in part[(1, "rankings[3]")] and (1, "rankings[4]") in part
    assert "already ranks this group in row 2" in part[(3, "rankings[1]")]
    assert "is for group" in part[(6, "rankings[0]")]
    whole = {r.row: r for r in rejects if r.scope == "row"}
    assert "merged" in whole[3].reason
    assert "conflicting group contents" in whole[4].reason
    assert whole[5].field == "candidates"
    assert "no usable ranking" in whole[6].reason
    assert counts.partial == len(part) == 6
    out = {r.group_id: r for r in stage.records()}
    assert [x.annotator.id for x in out[g1.group_id].rankings] == ["a"]
    assert [x.annotator.id for x in out[g2.group_id].rankings] == ["a", "b"]
    flagged = run_aggregate(store, AggregateConfig(reliability_iterations=0, no_rankings="flag"))
    assert flagged.manifest.counts.outputs == 3
    assert "no_rankings" in {f for r in flagged.records() for f in r.flags}


def test_kind_weights_and_config_errors(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    groups = [scored_group(i, [1.0, 0.0, 0.5]) for i in range(3)]
    write_stage(store, "rank", groups)
    cfg = AggregateConfig(kind_weights={"reward_model": 0.0})
    assert cfg.kind_weights["human"] == 1.0  # merged over the defaults
    stage = run_aggregate(store, cfg)
    assert stage.manifest.counts.rejected == 3  # the only rankings have weight 0
    with pytest.raises(ValueError, match=">= 0"):
        AggregateConfig(kind_weights={"human": -1.0})
    zero = dict.fromkeys(("human", "simulated", "reward_model", "rule", "llm_judge"), 0.0)
    with pytest.raises(ConfigError, match="every kind weight is 0"):
        run_aggregate(store, AggregateConfig(kind_weights=zero))
    with pytest.raises(StageError, match="none of"):
        run_aggregate(RunStore(tmp_path / "empty"), AggregateConfig())


def test_recommendation_is_dpo_only_above_the_threshold() -> None:
    assert recommendation(0.10, 0.15).loss == "gspo"
    high = recommendation(0.20, 0.15)
    assert high.loss == "dpo" and high.automatic is False and "evidence" in high.note
    assert recommendation(None, 0.15).loss == "gspo"
    assert AggregateConfig().dpo_fallback_threshold == 0.25  # docs/evidence.md, experiment 5
    doomed = recommendation(0.45, 0.25, all_unreliable=True)
    assert doomed.loss is None and "should not be trained on" in doomed.reason


def test_cli_aggregate_and_simulate_with_report(tmp_path: Path) -> None:
    store = rank_run(tmp_path, n=20)
    app = typer.Typer()
    aggregate_cmd.register(app)
    runner = CliRunner()
    sim = runner.invoke(app, ["simulate", str(store.root), "--annotator", "x=0.1",
                              "--annotator", "y=0.3", "--annotator", "z=random"])
    assert sim.exit_code == 0, sim.output
    assert "simulated panel" in sim.output
    out = runner.invoke(app, ["aggregate", str(store.root), "--kind-weight", "reward_model=0.25",
                              "--dpo-fallback-threshold", "0.01", "--cycle", "drop"])
    assert out.exit_code == 0, out.output
    assert "annotator reliability" in out.output and "recommendation: dpo" in out.output
    report = json.loads((store.root / "aggregate" / "report.json").read_text())
    assert f"pair targets: {report['summary']['pair_targets']} " in out.output
    assert report["summary"]["pair_targets"] == resolve_targets(
        AggregateConfig(), report["noise"]["estimated"])  # auto by default
    assert report["recommendation"]["loss"] == "dpo" and report["recommendation"]["automatic"] is False
    assert report["counts"]["inputs"] == 20
    assert store.manifest("aggregate").config["kind_weights"]["reward_model"] == 0.25
    assert store.manifest("aggregate").stats["recommendation"] == "dpo"
    hard = runner.invoke(app, ["aggregate", str(store.root), "--pair-targets", "hard"])
    assert hard.exit_code == 0, hard.output
    assert "pair targets: hard " in hard.output and "recommendation: gspo" in hard.output
    assert json.loads((store.root / "aggregate" / "report.json").read_text())["summary"][
        "pair_targets"] == "hard"
    bad = runner.invoke(app, ["aggregate", str(store.root), "--pair-targets", "sharp"])
    assert isinstance(bad.exception, ConfigError) and "'auto', 'soft' or 'hard'" in str(bad.exception)
    bad = runner.invoke(app, ["aggregate", str(store.root), "--kind-weight", "human"])
    assert isinstance(bad.exception, ConfigError)
    bad = runner.invoke(app, ["aggregate", str(store.root), "--prior-strength", "0"])
    assert isinstance(bad.exception, ConfigError) and "prior-strength" in str(bad.exception)


def test_annotator_of_one_kind_only_unused_kind_is_not_counted(tmp_path: Path) -> None:
    """Rankings by an annotator kind weighted 0 are kept in the row but not used in the fit."""
    g = make_group(k=3)
    judge = Ranking(annotator=Annotator(id="judge", kind="llm_judge"), group_id=g.group_id,
                    tiers=[[c] for c in reversed(g.candidate_ids())])
    rows = [AnnotatedGroup(**g.model_dump(), rankings=[make_ranking(g, [0, 1, 2], "a"),
                                                        make_ranking(g, [0, 1, 2], "b"), judge])]
    store = RunStore(tmp_path / "run")
    write_stage(store, "label", rows)
    (row,) = run_aggregate(store, AggregateConfig(kind_weights={"llm_judge": 0.0})).records()
    assert len(row.rankings) == 3 and row.agreement.num_annotators == 2
    assert row.agreement.kendall_w == 1.0 and row.agreement.noise == 0.0
    assert row.consensus == [[c] for c in g.candidate_ids()]


def test_no_group_has_a_ranking(tmp_path: Path) -> None:
    """Groups without any ranking (e.g. imported candidates only): no annotator to estimate;
    flagged or rejected by the no_rankings rule, never an IndexError."""
    store = RunStore(tmp_path / "run")
    groups = [AnnotatedGroup(**make_group(3, prompt_text=f"q{i}").model_dump(), rankings=[])
              for i in range(3)]
    write_stage(store, "rank", groups)
    flagged = run_aggregate(store, AggregateConfig(no_rankings="flag"))
    assert flagged.manifest.counts.outputs == 3
    assert all("no_rankings" in r.flags for r in flagged.records())
    assert all(p.weight == 0 for r in flagged.records() for p in r.pairs)
    rejected = run_aggregate(store, AggregateConfig(no_rankings="reject"), StageContext(force=True))
    assert (rejected.manifest.counts.outputs, rejected.manifest.counts.rejected) == (0, 3)


def test_no_noise_estimate_names_overlap_of_ties_only(tmp_path: Path) -> None:
    """Two raters on every group, but where both ranked a pair one of them tied it: the
    recommendation says why there is no noise estimate (not "no two annotators ranked the same
    groups", which is false here)."""
    data = TEST_DATA / "newuser" / "team_scores.csv"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = tmp_path / "e2e"
    for args in (["import", str(data), "--out", str(run), "--layout", "scores", "--score",
                  "rater_1", "--score", "rater_2", "--group-by", "qid", "--text-column",
                  "question", "--response-column", "answer", "--missing", "NA", "--missing", ""],
                 ["aggregate", str(run)]):
        done = grouppref_here(*args, env=env)  # cli.main() in this process
        assert done.returncode == 0, done.stderr
    report = read_report(RunStore(run))
    assert report.noise.estimated is None and report.recommendation.noise is None
    assert "shared pairs are all ties" in report.recommendation.reason
