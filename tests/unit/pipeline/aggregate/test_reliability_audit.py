"""Selection-aware annotator reliability (issue 18's finding): an annotator who ranked groups
chosen by uncertainty is judged on its uniformly drawn (audit) groups only.

The estimator against an independent reference (choix's Bradley-Terry fit and a pair-by-pair
concordance count), the slot rule against a loop, old data without markers bit for bit as
before, the aggregate stage through the run store on a constructed case where the machines are
wrong exactly where the human was sent, and ``--select uncertain --audit-share`` choosing a
uniform audit draw plus the most uncertain of the rest.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from grouppref.labeling.config import AUDIT_SHARE, PushConfig
from grouppref.labeling.select import select_groups
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.stage import read_report, run_aggregate
from grouppref.pipeline.report.selection import audit_note, describe_selection
from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from grouppref.schemas.label_reports import LabelSelection, SelectedGroup
from grouppref.schemas.reports import AnnotatorReliability
from grouppref.stats.reliability import (
    TARGETED,
    UNIFORM,
    UNMARKED,
    estimate_reliability,
    pairwise_agreement,
    reliability_slots,
)
from grouppref.stats.uncertainty import disagreement
from tests.support.factories import make_group
from tests.support.labelling import write_stage
from tests.support.reliability import ALPHA, K, loo_counts_reference, selected_panel
from tests.support.selection import _one_line, _push, panel


# -- the math against independent references --------------------------------------------------
def slots_reference(ann: np.ndarray, design: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Loop version of the rule: an annotator with a targeted slot counts its uniform slots."""
    targeted = np.zeros(n, dtype=bool)
    for (b, s), a in np.ndenumerate(ann):
        if a >= 0 and design[b, s] == TARGETED:
            targeted[a] = True
    count = np.zeros(ann.shape, dtype=bool)
    for (b, s), a in np.ndenumerate(ann):
        count[b, s] = a >= 0 and (not targeted[a] or design[b, s] == UNIFORM)
    return count, targeted


def test_reliability_slots_match_a_loop() -> None:
    rng = np.random.default_rng(0)
    ann = rng.integers(-1, 6, size=(50, 4))
    design = rng.choice([UNMARKED, UNIFORM, TARGETED], p=[0.5, 0.3, 0.2], size=(50, 4))
    design[(ann >= 3) & (design == TARGETED)] = UNMARKED  # annotators 3-5: never targeted
    count, targeted = reliability_slots(torch.from_numpy(ann), torch.from_numpy(design), 6)
    ref_count, ref_targeted = slots_reference(ann, design, 6)
    assert targeted.tolist() == ref_targeted.tolist() == [True] * 3 + [False] * 3
    assert count.tolist() == ref_count.tolist()


def loo_tau_reference(ranks: np.ndarray, ann: np.ndarray, g: int, s: int) -> float | None:
    """Tau of slot ``s`` of group ``g`` against choix's fit of the group's other rankings
    (weights 1): ``(c - d) / (c + d)`` of :func:`loo_counts_reference`."""
    c, d = loo_counts_reference(ranks, ann, g, s)
    return (c - d) / (c + d) if c + d else None


def test_tau_on_audit_groups_matches_choix_and_a_pair_count() -> None:
    ranks, ann, design = selected_panel()
    rel = estimate_reliability(ranks, ann, torch.ones(5, dtype=torch.float64), alpha=ALPHA,
                               iterations=0, min_groups=1, unreliable_tau=0.0, z=2.0, drop=False,
                               batch_size=7, max_iter=100, tie_tol=1e-6, design=design)
    r, a, dz = ranks.numpy(), ann.numpy(), design.numpy()
    assert rel.audit_only.tolist() == [False, False, False, True, False]
    for who in range(5):
        taus = [loo_tau_reference(r, a, g, s) for (g, s), x in np.ndenumerate(a)
                if x == who and (who != 3 or dz[g, s] == UNIFORM)]
        taus = [t for t in taus if t is not None]
        assert len(taus) == int(rel.groups[who]) == {3: 8, 4: 10}.get(who, 40)
        # the stage's vectorised float64 (bt.DTYPE) means of <= 40 Kendall taus in [-1, 1] vs numpy's:
        # ~40 eps64; 1e-6 also holds a float32 store of the report (~6e-8)
        assert float(rel.tau[who]) == pytest.approx(np.mean(taus), abs=1e-6)
        assert float(rel.tau_se[who]) == pytest.approx(np.std(taus, ddof=1) / math.sqrt(len(taus)),
                                                       abs=1e-6)


def test_flip_rate_agreement_counts_audit_groups_only() -> None:
    ranks, ann, design = selected_panel(1)
    count, _ = reliability_slots(ann, design, 5)
    agr = pairwise_agreement(ranks, ann, 5, batch_size=9, count=count)
    r, a = ranks.numpy(), ann.numpy()
    for x, y in [(3, 0), (0, 3), (4, 1), (0, 1)]:
        agree = total = 0
        for g in range(r.shape[0]):
            sx = [s for s in range(a.shape[1]) if a[g, s] == x and bool(count[g, s])]
            sy = [s for s in range(a.shape[1]) if a[g, s] == y and bool(count[g, s])]
            for s, t in itertools.product(sx, sy):
                for i, j in itertools.combinations(range(K), 2):
                    total += 1
                    agree += (r[g, s, i] < r[g, s, j]) == (r[g, t, i] < r[g, t, j])
        assert (float(agr.agree[x, y]), float(agr.total[x, y])) == (agree, total)
    assert float(agr.total[3, 0]) == 8 * 6  # the human's 8 audit groups, 6 pairs each
    assert float(agr.votes[3]) == 24 * 6  # its votes count every group it ranked


def test_data_without_targeted_markers_is_estimated_exactly_as_before() -> None:
    ranks, ann, design = selected_panel(2)
    kw = torch.tensor([0.5, 0.5, 0.5, 1.0, 1.0], dtype=torch.float64)
    args = dict(alpha=ALPHA, iterations=3, min_groups=5, unreliable_tau=0.0, z=2.0, drop=True,
                batch_size=16, max_iter=100, tie_tol=1e-6)
    before = estimate_reliability(ranks, ann, kw, **args)
    uniform_only = torch.where(design == TARGETED, UNIFORM, design)
    for d in (torch.full_like(design, UNMARKED), uniform_only):
        now = estimate_reliability(ranks, ann, kw, **args, design=d)
        for name in ("annotator_weight", "tau", "tau_se", "groups", "votes", "flip_rate",
                     "unreliable", "dropped"):
            assert torch.equal(getattr(now, name).nan_to_num(-9), getattr(before, name).nan_to_num(-9))
        assert not bool(now.audit_only.any())
    marked = estimate_reliability(ranks, ann, kw, **args, design=design)
    assert int(marked.groups[3]) == 8 and int(before.groups[3]) == 24
    assert marked.audit_only.tolist() == [False, False, False, True, False]
    few = estimate_reliability(ranks, ann, kw, **{**args, "min_groups": 9}, design=design)
    assert not bool(few.audit_only.any())  # 8 audit groups < 9: judged on all, as before
    for name in ("annotator_weight", "tau", "groups", "flip_rate", "dropped"):
        assert torch.equal(getattr(few, name).nan_to_num(-9),
                           getattr(estimate_reliability(ranks, ann, kw, **{**args, "min_groups": 9}),
                                   name).nan_to_num(-9))


# -- the aggregate stage through the run store ------------------------------------------------
def machines_wrong_where_the_human_is_sent(marks: dict[str, str | None]) -> list[AnnotatedGroup]:
    """40 groups whose truth is candidate order 0 < 1 < 2 < 3. Three machines rank 30 of them
    right and agree on the reversed order in the 10 "hard" ones; the human ranks right in the
    10 hard groups (selection ``marks["hard"]``) and in 6 easy ones (``marks["easy"]``)."""
    kinds = {"rm": "reward_model", "rule": "rule", "judge": "llm_judge"}
    out = []
    for i in range(40):
        g = make_group(K, prompt_text=f"Question {i}?", texts=[f"reply {i}.{j}" for j in range(K)])
        ids = g.candidate_ids()
        machine = [3, 2, 1, 0] if i < 10 else [0, 1, 2, 3]
        rankings = [Ranking(annotator=Annotator(id=who, kind=kind), group_id=g.group_id,
                            tiers=[[ids[j]] for j in machine]) for who, kind in kinds.items()]
        if i < 16:
            mark = marks["hard" if i < 10 else "easy"]
            rankings.append(Ranking(annotator=Annotator(id="ann", kind="human"),
                                    group_id=g.group_id, tiers=[[x] for x in ids],
                                    metadata={"selection": mark} if mark else None))
        out.append(AnnotatedGroup(**g.model_dump(), rankings=rankings))
    return out


def human_report(tmp_path: Path, name: str, marks: dict[str, str | None],
                 config: AggregateConfig | None = None) -> AnnotatorReliability:
    store = write_stage(tmp_path / name, machines_wrong_where_the_human_is_sent(marks), "label")
    run_aggregate(store, config or AggregateConfig())
    return next(a for a in read_report(store).annotators if a.id == "ann")


def test_stage_judges_a_selected_human_on_its_audit_groups(tmp_path: Path) -> None:
    old = human_report(tmp_path, "old", {"hard": None, "easy": None})
    assert old.reliability_groups == "all" and old.groups == 16
    # a mean of +-1 over 16 groups: a binary fraction, float64, a few operations: approx's default rel
    # 1e-6 is ~1e9 eps64
    assert old.tau == pytest.approx((10 * -1 + 6 * 1) / 16)
    assert old.dropped and old.annotator_weight == 0.0  # as before: judged on the hard groups

    fixed = human_report(tmp_path, "audit", {"hard": "uncertain", "easy": "audit"})
    assert fixed.reliability_groups == "audit" and fixed.groups == 6
    # a mean of 1s: float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert fixed.tau == pytest.approx(1.0) and not fixed.unreliable
    assert fixed.annotator_weight == pytest.approx(1.0)
    assert fixed.votes == 16 * 6  # every ranking still counts in the fit

    no_audit = human_report(tmp_path, "noaudit", {"hard": "uncertain", "easy": "uncertain"})
    assert no_audit.model_dump() == old.model_dump()  # too few audit groups: all, as before

    forced = human_report(tmp_path, "all", {"hard": "uncertain", "easy": "audit"},
                          AggregateConfig(reliability_groups="all"))
    assert forced.model_dump() == old.model_dump()

    random_push = human_report(tmp_path, "random", {"hard": "random", "easy": "random"})
    assert random_push.model_dump() == old.model_dump()  # a uniform push: judged on all


def test_report_names_the_audit_share_the_rankings_carry(tmp_path: Path) -> None:
    store = write_stage(tmp_path / "run", machines_wrong_where_the_human_is_sent(
        {"hard": "uncertain", "easy": "audit"}), "label")
    run_aggregate(store, AggregateConfig(reliability_weight="log_odds"))
    settings = read_report(store).settings
    assert settings is not None and settings.reliability_weight == "log_odds"
    assert (settings.audit_groups, settings.targeted_groups) == (6, 10)
    # k / n: float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert settings.audit_share == pytest.approx(6 / 16)
    assert "audit share 0.38 (6 audit of 16 selected groups)" in settings.describe()


# -- choosing audit groups --------------------------------------------------------------------
def test_audit_share_draws_uniformly_and_fills_with_the_most_uncertain() -> None:
    groups = panel()  # groups 6, 7, 8 disagree (8 the most); 0-5 are unanimous
    base = select_groups(groups, PushConfig(select="uncertain", budget=3, audit_share=0,
                                            uncertainty="kendall_w"), "rank")
    assert [g.role for g in base.selected] == ["uncertain"] * 3 and base.audit_share == 0
    config = PushConfig(select="uncertain", budget=4, uncertainty="kendall_w", audit_share=0.5)
    sel = select_groups(groups, config, "rank")
    roles = [g.role for g in sel.selected]
    assert roles == ["uncertain", "uncertain", "audit", "audit"] and len(set(sel.ids)) == 4
    u = disagreement(*_tensors(groups))
    ids = [g.group_id for g in groups]
    audit = {ids.index(g.group_id) for g in sel.selected if g.role == "audit"}
    rest = sorted((i for i in range(len(groups)) if i not in audit), key=lambda i: -float(u[i]))
    targeted = [ids.index(g.group_id) for g in sel.selected if g.role == "uncertain"]
    assert [float(u[i]) for i in targeted] == [float(u[i]) for i in rest[:2]]
    # the same float32 value read twice (float -> JSON -> float): exact, approx as an upper bound
    assert sel.threshold == pytest.approx(float(u[targeted[-1]]))
    assert "2 of them are audit groups drawn uniformly from all groups (--audit-share 0.5)" \
        in describe_selection(sel)

    hits = np.zeros(len(groups))  # every group equally likely to be audited
    seeds = 900
    for seed in range(seeds):
        drawn = select_groups(groups, config.model_copy(update={"seed": seed}), "rank")
        for g in drawn.selected:
            hits[ids.index(g.group_id)] += g.role == "audit"
    expected = seeds * 2 / len(groups)  # 200 per group
    assert np.abs(hits - expected).max() < 4 * math.sqrt(expected)  # ~3.4 sd of a binomial


def _tensors(groups: list[AnnotatedGroup]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 3, K) tier indices of the three automatic rankings, and the used mask."""
    ranks = torch.tensor([[[next(t for t, tier in enumerate(r.tiers) if cid in tier)
                            for cid in g.candidate_ids()] for r in g.rankings] for g in groups])
    return ranks, torch.ones(ranks.shape[:2], dtype=torch.bool)


def test_select_uncertain_audits_a_fifth_of_the_budget_by_default() -> None:
    groups = panel()
    assert PushConfig(select="uncertain", budget=5).audit_share == AUDIT_SHARE == 0.2
    assert PushConfig(select="random", budget=5).audit_share == 0.0  # uniform already
    assert PushConfig().audit_share == 0.0
    assert PushConfig(select="uncertain", budget=5, audit_share=0).audit_share == 0.0
    sel = select_groups(groups, PushConfig(select="uncertain", budget=5,
                                           uncertainty="kendall_w"), "rank")
    assert sel.audit_share == 0.2 and [g.role for g in sel.selected].count("audit") == 1
    # the recorded settings validate again to the same share (a run config round trip)
    again = PushConfig.model_validate(PushConfig(select="random", budget=5).model_dump())
    assert again.audit_share == 0.0


def _selection(audit: int, share: float, budget: int, select: str = "uncertain"
               ) -> LabelSelection:
    roles = ["audit"] * audit + ["uncertain" if select == "uncertain" else select] * (
        budget - audit)
    return LabelSelection(select=select, budget=budget, audit_share=share, source_stage="rank",
                          groups=400, selected=[SelectedGroup(group_id=f"g{i}", uncertainty=None,
                                                              role=r)
                                                for i, r in enumerate(roles)])


def test_audit_note_says_when_the_audit_falls_short() -> None:
    assert audit_note(_selection(5, 0.2, 25)) is None  # enough for the aggregate
    assert audit_note(_selection(0, 0.0, 40, "random")) is None  # uniform: needs no audit
    none = audit_note(_selection(0, 0.0, 40))
    assert none is not None and none.startswith("no audit groups in a budget of 40 "
                                                "(--audit-share 0); the aggregate needs 5")
    assert "the default --audit-share 0.2 gives 5 from a budget of 25" in none
    few = audit_note(_selection(2, 0.2, 10))
    assert few is not None and few.startswith("only 2 audit groups in a budget of 10 "
                                              "(--audit-share 0.2); the aggregate needs 5 per "
                                              "person, so it will judge these annotators on "
                                              "all their groups")
    assert "a budget of 25 or more at --audit-share 0.2 gives 5" in few
    assert audit_note(_selection(3, 0.3, 10), min_groups=3) is None
    shown = describe_selection(_selection(2, 0.2, 10).model_copy(
        update={"uncertainty": "kendall_w", "measure": "1 - W"}))  # the report says it too
    assert shown.endswith(f"Note: {few}")
    assert "Note:" not in describe_selection(_selection(5, 0.2, 25).model_copy(
        update={"uncertainty": "kendall_w", "measure": "1 - W"}))


def test_audit_share_needs_select_uncertain() -> None:
    with pytest.raises(ValueError, match="audit_share 0.2 needs select 'uncertain'"):
        PushConfig(select="random", budget=3, audit_share=0.2)
    with pytest.raises(ValueError, match="less than or equal to 1"):
        PushConfig(select="uncertain", budget=3, audit_share=1.5)


def test_audit_share_without_select_uncertain_is_one_line_exit_2(tmp_path: Path) -> None:
    store = write_stage(tmp_path / "run", panel())
    line = _one_line(_push(store.root, "--select", "random", "--budget", "3", "--audit-share",
                           "0.2"))
    assert "audit_share 0.2 needs select 'uncertain' (a select 'random' push is already " \
           "uniform); add --select uncertain or drop --audit-share" in line
    assert not (store.root / "label").exists()  # nothing written
