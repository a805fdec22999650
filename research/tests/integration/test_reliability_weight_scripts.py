"""The reliability-weight experiment's scripts (research/reliability_weight/) end to end at toy
sizes: the shape of their rows and tables, not their findings (research/reliability_weight/README.md)."""

from __future__ import annotations

import json
from pathlib import Path


def test_evidence_script_runs_replots_and_scale_leaves_the_order(tmp_path: Path) -> None:
    from research.reliability_weight import reliability_weight as rw

    rows = rw.main(["--groups", "40", "--seeds", "0", "1", "--out", str(tmp_path)])
    assert {(r["regime"], r["weight"]) for r in rows} == {
        (reg, w) for reg in ("mixed3", "mixed5", *(f"active_{a}" for a in rw.ACTIVE))
        for w in rw.WEIGHTS}
    by = {(r["seed"], r["regime"], r["weight"]): r for r in rows}
    for (seed, reg, w), r in by.items():  # scaling every weight by 2.2 keeps every order
        if w == "tau_scaled":
            assert r["accuracy"] == by[(seed, reg, "tau")]["accuracy"]
            assert r["log_loss"] != by[(seed, reg, "tau")]["log_loss"]  # but not p_ij
    table = (tmp_path / "reliability_weight_table.md").read_text(encoding="utf-8")
    assert "| mixed5 |" in table and "log_odds − tau_scaled" in table
    again = rw.main(["--replot", "--out", str(tmp_path)])  # the tables from the JSON alone
    assert again == json.loads((tmp_path / "reliability_weight.json").read_text())["rows"]


def test_training_evidence_script_runs_every_arm_on_shared_data(tmp_path: Path) -> None:
    from research.reliability_weight import reliability_training as rt

    rows = rt.main(["--quick", "--seeds", "0", "--out", str(tmp_path)])
    assert {(r["arm"], r["step"]) for r in rows} == {(a, s) for a in rt.ARMS for s in (4, 8)}
    at = {r["arm"]: r for r in rows if r["step"] == 8}
    assert at["uniform"]["weights"]["random"] == 1.0  # the positive control keeps the clicker
    assert at["tau"]["weights"]["random"] == 0.0 == at["log_odds"]["weights"]["random"]
    assert at["log_odds"]["weights"]["a05"] > 1.0 >= at["tau"]["weights"]["a05"]
    assert at["tau_scaled"]["consensus_accuracy"] == at["tau"]["consensus_accuracy"]
    table = (tmp_path / "reliability_training_quick_table.md").read_text(encoding="utf-8")
    assert "log_odds − tau" in table and "| uniform |" in table
