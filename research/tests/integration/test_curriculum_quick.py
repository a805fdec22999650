"""Smoke test of experiment 10's ``--quick`` mode (research/curriculum/curriculum.py): the real
script end to end at toy sizes (tiny LM, simulated human panel and automatic ranker, package
aggregation, the package's MixSampler and gspo step). It checks the results' shape and that
each method trained on the sources its schedule names; the findings are in research/curriculum/README.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research.curriculum import curriculum


def test_curriculum_quick(tmp_path: Path) -> None:
    result = curriculum.main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    cfg = result["settings"]
    assert len(result["runs"]) == len(cfg["seeds"]) * len(curriculum.METHODS) * len(cfg["evals"])
    on_disk = json.loads((tmp_path / "curriculum_quick.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(result["summary"]))
    assert (tmp_path / "curriculum_quick.png").stat().st_size > 1000
    assert "| curriculum | 6 |" in (tmp_path / "curriculum_quick_table.md").read_text()
    share = cfg["human_prompts"] / (cfg["human_prompts"] + cfg["auto_prompts"])
    last = {m: result["summary"][m][str(cfg["steps"])] for m in curriculum.METHODS}
    assert last["human_only"]["human_share"]["mean"] == 1.0
    assert last["auto_only"]["human_share"]["mean"] == 0.0
    # a drawn share of 8 groups an update: within one group (1/8) of the target
    assert last["all_mixed"]["human_share"]["mean"] == pytest.approx(share, abs=1 / 8)
    # linear 0.8 -> 0 over 6 updates: mean scheduled share 0.4
    assert last["curriculum"]["human_share"]["mean"] == pytest.approx(0.4, abs=1 / 48 + 1e-9)
    for m in curriculum.METHODS:
        assert 0.0 <= last[m]["pair_accuracy"]["mean"] <= 1.0
    labels = result["runs"][0]["labels"]
    assert labels["human_consensus_accuracy"] > labels["auto_consensus_accuracy"]
