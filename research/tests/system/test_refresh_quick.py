"""The refresh experiment's script (research/refresh/refresh.py) end to end in its quick mode."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow
def test_evidence_quick_mode(tmp_path: Path) -> None:
    """research/refresh/refresh.py --quick end to end (toy sizes, TRL GRPO included): the
    shape of its results, not its findings (research/refresh/README.md)."""
    from research.refresh import refresh as experiment

    result = experiment.main(["--quick", "--out", str(tmp_path)])
    assert (tmp_path / "refresh_quick.json").exists() and (tmp_path / "refresh_quick.png").exists()
    runs = result["runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    for run in runs:
        methods = run["methods"]
        assert set(methods) == set(experiment.METHODS)
        assert methods["refresh_fast"]["rounds"] == 6 and methods["refresh_slow"]["rounds"] == 2
        assert methods["offline"]["rounds"] == 0
        assert methods["grpo"]["curve"][-1]["tokens_trained"] >= run["budget"]["tokens_trained"]
        assert set(methods["refresh_fast"]["rho"]) >= {"offline", "fresh_newest"}
    for budget in ("equal_tokens", "equal_wall", "equal_kl"):
        block = result["summary"]["budgets"][budget]
        assert set(block["methods"]) == set(experiment.METHODS)
        ci = block["vs_offline"]["refresh_fast"]["reward_gain"]
        assert ci["n"] == 2 and ci["lo"] <= ci["mean"] <= ci["hi"]
