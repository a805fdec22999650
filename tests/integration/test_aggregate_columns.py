"""The aggregate stage's column-wise builder (:mod:`grouppref.pipeline.aggregate.columns`,
through :func:`~grouppref.pipeline.aggregate.stored.stored_outcomes`) writes the Parquet bytes
the records path writes (:func:`~grouppref.pipeline.aggregate.core.outcomes` + ``to_row``, the
schema of record), with the same rejects: K varying in one table, ties, partial rankings,
groups without rankings, a dropped group, ten rankings of a group (means over more than eight
values), annotators seen in a set order, candidate ids JSON escapes, an input of many chunks or
without a rankings column, and a fit whose aggregate fails a check."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from grouppref.pipeline.aggregate.config import STAGE, AggregateConfig
from grouppref.pipeline.aggregate.core import Aggregation, collect_groups, fit_parsed, outcomes
from grouppref.pipeline.aggregate.parse import ParsedInput
from grouppref.pipeline.aggregate.stored import stored_input, stored_outcomes, with_records
from grouppref.schemas import (
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateGroup,
    CandidateSource,
    Ranking,
    ValidatedGroup,
)
from grouppref.schemas.arrow import features_for, to_row, to_table
from grouppref.schemas.records import AnnotatorKind
from tests.support.factories import make_group

WHO = ("a3", "a0", "rm", "a7", "a1", "a5", "a2", "a9", "a4", "a6", "a8")  # first-seen order


def _escaped(g: int) -> CandidateGroup:
    """A group whose candidate ids JSON escapes (a quote, a backslash) or not (non-ASCII)."""
    base = make_group(k=3, prompt_text=f"Escape {g}.")
    ids = ['q"' + str(g), "b\\" + str(g), "é✓" + str(g)]
    return base.model_copy(update={"candidates": [
        Candidate(candidate_id=i, text=f"answer {i}", source=CandidateSource(kind="model"))
        for i in ids]})


def _ranking(gid: str, ids: list[str], order: list[int], who: str, case: int) -> Ranking:
    tiers = [[ids[i]] for i in order]
    if case == 5 and len(tiers) > 2:  # the first two tied
        tiers = [tiers[0] + tiers[1], *tiers[2:]]
    if case == 6 and len(tiers) > 2:  # partial: the last left out
        tiers = tiers[:-1]
    if case == 7:  # every candidate in one tier: no tau
        tiers = [[ids[i] for i in order]]
    kind: AnnotatorKind = "reward_model" if who == "rm" else "human"
    return Ranking(annotator=Annotator(id=who, kind=kind), group_id=gid, tiers=tiers)


def _corpus(n: int = 60, seed: int = 1) -> list[AnnotatedGroup]:
    """Groups reaching every branch of the aggregate (see the module docstring)."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n):
        base = _escaped(g) if g % 9 == 4 else make_group(
            k=int(rng.integers(2, 8)), prompt_text=f"Question {g}?")
        gid, ids, k = base.group_id, base.candidate_ids(), base.k
        truth = [int(i) for i in rng.permutation(k)]
        case = g % 8
        many = 10 if g % 11 == 3 else int(rng.integers(1, 4))  # ten: a mean over > 8 values
        rankings = []
        for who in ([] if case == 0 else WHO[:many]):
            order = list(truth)
            if rng.random() < 0.4:  # a flipped adjacent pair
                i = int(rng.integers(0, k - 1))
                order[i], order[i + 1] = order[i + 1], order[i]
            rankings.append(_ranking(gid, ids, order, who, case))
        groups.append(AnnotatedGroup(**dict(base), rankings=rankings))
    return groups


def _parquet(table: pa.Table) -> bytes:
    """What ``StageRun.write_table`` writes for ``table``."""
    schema = features_for(ValidatedGroup).arrow_schema
    sink = io.BytesIO()
    pq.write_table(table.select(schema.names).cast(schema), sink)
    return sink.getvalue()


def _records(groups: list[AnnotatedGroup], agg: Aggregation, config: AggregateConfig,
             shard: list[int]) -> tuple[pa.Table, list[tuple[int | None, str | None, str]]]:
    parsed = collect_groups(groups, "rank", STAGE)
    kept, rejects = outcomes(parsed, agg, config, shard)
    return (to_table(kept, ValidatedGroup),
            [(r.row, r.group_id, r.reason) for r in rejects])


def _stored(table: pa.Table, parsed: ParsedInput, agg: Aggregation, config: AggregateConfig,
            shard: list[int]) -> tuple[pa.Table, list[tuple[int | None, str | None, str]]]:
    out, rejects = stored_outcomes(parsed, table, agg.fit, agg.dec, config, shard, STAGE)
    return out, [(r.row, r.group_id, r.reason) for r in rejects]


CONFIGS = {
    "default": AggregateConfig(min_groups_for_reliability=3),
    "drop rules, hard targets": AggregateConfig(
        cycle="drop", low_agreement="drop", too_few_rankings="drop", pair_targets="hard",
        min_groups_for_reliability=3),
    "no ranking flagged": AggregateConfig(no_rankings="flag", drop_unreliable=False,
                                          min_groups_for_reliability=3),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_columns_write_the_bytes_the_records_write(name: str) -> None:
    config, groups = CONFIGS[name], _corpus()
    whole = to_table(groups, AnnotatedGroup)
    table = pa.concat_tables([whole.slice(s, 7) for s in range(0, whole.num_rows, 7)])
    parsed = stored_input(table, AnnotatedGroup, "rank")
    assert parsed is not None  # the stored path is taken
    assert parsed.annotators == [w for w in WHO if w in parsed.index]  # first seen first
    agg = fit_parsed(parsed, config)
    everything = list(range(len(groups)))
    for shard in (everything, everything[5:23], everything[::3][::-1], []):
        got, want = _stored(table, parsed, agg, config, shard), _records(groups, agg, config,
                                                                        shard)
        assert got[1] == want[1]
        assert _parquet(got[0]) == _parquet(want[0])
        assert got[0].to_pylist() == want[0].to_pylist()
    assert agg.dec.rejected.any() or name == "no ranking flagged"


def test_a_table_without_rankings_and_a_fit_that_fails_a_check() -> None:
    config = CONFIGS["no ranking flagged"]
    plain = [make_group(k=2 + g % 5, prompt_text=f"Plain {g}?") for g in range(9)]
    table = to_table(plain, CandidateGroup)
    parsed = stored_input(table, CandidateGroup, "rank")
    assert parsed is not None
    agg = fit_parsed(parsed, config)
    annotated = [AnnotatedGroup(**dict(g)) for g in plain]
    shard = list(range(len(plain)))
    got, want = _stored(table, parsed, agg, config, shard), _records(annotated, agg, config,
                                                                    shard)
    assert _parquet(got[0]) == _parquet(want[0]) and got[1] == want[1] == []
    assert all(r["flags"][0] == "no_rankings" and r["rankings"] == [] for r in got[0].to_pylist())

    groups = _corpus(20)
    table = to_table(groups, AnnotatedGroup)
    parsed = stored_input(table, AnnotatedGroup, "rank")
    assert parsed is not None
    agg = fit_parsed(parsed, CONFIGS["default"])
    w = agg.fit.w.copy()
    w[2, 0, 1] = w[2, 1, 0] = 1.5  # a weight out of range: the record's validation names it
    bad = replace(agg, fit=replace(agg.fit, w=w))
    for run in (lambda: _stored(table, parsed, bad, CONFIGS["default"], [1, 2, 3]),
                lambda: _records(groups, bad, CONFIGS["default"], [1, 2, 3])):
        with pytest.raises(ValidationError, match="weight"):
            run()
    ok = _stored(table, parsed, bad, CONFIGS["default"], [0, 1, 3])
    assert _parquet(ok[0]) == _parquet(_records(groups, bad, CONFIGS["default"], [0, 1, 3])[0])


def test_records_in_place_of_rows_that_fail_a_check() -> None:
    """Rows replaced by records (what a group whose aggregate fails a check gets) land in
    their place among the column-built rows."""
    groups = _corpus(12)
    table = to_table(groups, AnnotatedGroup)
    parsed = stored_input(table, AnnotatedGroup, "rank")
    assert parsed is not None
    config = CONFIGS["no ranking flagged"]
    agg = fit_parsed(parsed, config)
    shard = list(range(12))
    built = _stored(table, parsed, agg, config, shard)[0]
    records = outcomes(collect_groups(groups, "rank", STAGE), agg, config, shard)[0]
    bad = np.zeros(12, dtype=bool)
    bad[[0, 4, 5, 11]] = True
    merged = with_records(built.slice(0, 12).combine_chunks(), bad,
                          lambda i: to_row(records[i]))
    assert merged.to_pylist() == [to_row(g) for g in records] == built.to_pylist()
    assert _parquet(merged) == _parquet(built)


def test_a_validated_stage_read_again() -> None:
    """Groups aggregated once, stored as ValidatedGroups (the aggregate columns of the input
    are left out), aggregate to what their AnnotatedGroups give."""
    config, groups = CONFIGS["no ranking flagged"], _corpus(30)
    first = outcomes(collect_groups(groups, "rank", STAGE),
                     fit_parsed(collect_groups(groups, "rank", STAGE), config), config,
                     range(30))[0]
    table = to_table(first, ValidatedGroup)
    parsed = stored_input(table, ValidatedGroup, "aggregate")
    assert parsed is not None
    agg = fit_parsed(parsed, config)
    shard = list(range(len(first)))
    annotated = [AnnotatedGroup(**{f: getattr(g, f) for f in AnnotatedGroup.model_fields})
                 for g in first]
    got, want = _stored(table, parsed, agg, config, shard), _records(annotated, agg, config,
                                                                    shard)
    assert _parquet(got[0]) == _parquet(want[0]) and got[1] == want[1]
