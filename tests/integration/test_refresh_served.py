"""A refresh round ranks its fresh groups as the rank stage does (:class:`ShardScorer`): the
requests of two served judges are in flight together, the outputs equal the rankers scoring
one after another, and the judges' connection pool is closed between rounds.

The servers are the in-flight FAKE of tests/support/served_fakes.py (:class:`VaryingFake`),
used ONLY to count requests in flight across servers, which real servers do not report. The
real llama.cpp judge tests are in tests/system/test_judge_server.py; the real refresh rounds (tiny
Llama, real sampler) in tests/system/test_refresh.py. No wall-clock threshold: counts only.
"""

from __future__ import annotations

from contextlib import ExitStack

from grouppref.pipeline.rank.rankers import build_ranker
from grouppref.pipeline.rank.settings import annotator_for
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, from_row
from grouppref.train.refresh.fresh_groups import RefreshPlan, rank_groups
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.settings.shared import DataConfig
from tests.support.served_fakes import (
    MODELS,
    VaryingFake,
    _judge,
    _judge_of,
    _max_overlap,
    _one_after_another,
    _servers,
    _without_times,
)

RULE = {"kind": "rule", "checks": [{"check": "length", "target": 6}]}


def _plan(rankers: list[dict]) -> RefreshPlan:
    """A refresh plan with ``rankers`` (no policy: ranking needs none)."""
    config = TrainConfig(data=DataConfig(chat_template=False),
                         refresh={"every": 1, "prompts": 2, "k": 3, "rankers": rankers})
    assert config.refresh is not None
    rank_config = config.refresh.rank_config()
    return RefreshPlan(config=config, prompts=[], context=None, rank_config=rank_config,
                       rankers=[build_ranker(s) for s in rank_config.rankers],
                       annotators=[annotator_for(s) for s in rank_config.rankers])


def _groups(store: RunStore, stage: str) -> list[AnnotatedGroup]:
    keep = AnnotatedGroup.model_fields
    return [from_row(AnnotatedGroup, {k: v for k, v in row.items() if k in keep})
            for row in store.load_dataset(stage)]


def test_two_served_judges_overlap_in_a_refresh_round(
        groups_run: RunStore) -> None:
    # pointwise: 6 questions at concurrency 2 on one server; pairwise: 12 at 4 on the other:
    # three bursts each, so together every burst reaches the hold of 6 and is answered at once
    # (no idle wait). One judge after another, the fakes would see at most 4 in flight.
    fake = VaryingFake(hold=6)
    with ExitStack() as stack:
        url1, url2 = _servers(fake, 2, stack)
        plan = _plan([RULE, _judge("pointwise", MODELS[0], url1, 2),
                      _judge("pairwise", MODELS[1], url2, 4)])
        annotated, rejects = rank_groups(plan, _groups(groups_run, plan.rank_config.input_stage))
        assert plan.scorer.pool is None  # closed once the round is ranked
        by = {m: [r for r in fake.requests if _judge_of(r) == m] for m in ("pointwise", "pairwise")}
        assert (len(by["pointwise"]), len(by["pairwise"])) == (6, 12)
        assert fake.max_in_flight == 6  # both servers' limits at once
        assert (_max_overlap(by["pointwise"]), _max_overlap(by["pairwise"])) == (2, 4)
        assert any(fake.in_flight_together(a, b) for a in by["pointwise"] for b in by["pairwise"])
        # a second round: the scorer opens a new pool (the first was closed). The overlap is
        # counted: from here on the fake answers each request at once (hold 1), not after the
        # idle wait that ends a burst of fewer than 6
        fake.hold = 1
        again, _ = rank_groups(plan, _groups(groups_run, plan.rank_config.input_stage))
        records, expected_rejects, _ = _one_after_another(groups_run, plan.rank_config)
    assert [_without_times(g) for g in annotated] == [_without_times(g) for g in records]
    assert [_without_times(g) for g in again] == [_without_times(g) for g in records]
    assert [(r.row, r.group_id, r.field, r.reason, r.scope) for r in rejects] == expected_rejects
    assert all(r.stage == "refresh" for r in rejects)
    assert {r.annotator.id for r in annotated[0].rankings} == {a.id for a in plan.annotators}
