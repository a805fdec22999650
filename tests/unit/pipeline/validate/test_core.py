"""``validate_groups``: the validate stage's checks and split on records, no run store."""

from __future__ import annotations

from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.pipeline.validate.core import CHECKS, split_key, split_of, validate_groups
from tests.support.validated import make_validated


def test_checks_and_split_of_typed_groups() -> None:
    groups = [make_validated(f"question {i}") for i in range(20)]
    config = ValidateConfig(test_fraction=0.3, seed=1)
    done = validate_groups([*groups, groups[3], make_validated("question 5", k=4)], config)
    assert set(done.checks) == set(CHECKS)
    assert done.checks["duplicate_group_id"] == 1
    assert done.checks["conflicting_contents"] == 2  # question 5 with other candidates
    assert [r.row for r in done.rejects] == sorted(r.row or 0 for r in done.rejects)
    assert len(done.groups) + len(done.rejects) == 22
    for g in done.groups:
        assert g.split == split_of(split_key(g, config.split_by), 1, 0.3)
    assert done.summary["prompt_overlap"] == 0
    assert sum(s["groups"] for s in done.summary["splits"].values()) == len(done.groups)
