"""The loss screen and its per-loss rates (research/loss_screen/) in their ``--quick`` mode: the
shared main (``research.common.screen_main``) writes each JSON and table, ``--table`` reads the
JSON back, and the rates run picks up the screen's runs at its shared rate."""

from __future__ import annotations

import json
from pathlib import Path

from research.loss_screen import loss_rates, loss_screen


def test_screen_then_rates_quick(tmp_path: Path) -> None:
    screen = loss_screen.main(["--quick", "--out", str(tmp_path)])
    assert list(screen)[:4] == ["experiment", "settings", "methods", "conditions"]
    assert screen["experiment"] == "loss_screen" and screen["runs"]
    assert {r["method"] for r in screen["runs"]} == set(loss_screen.METHODS)
    assert json.loads((tmp_path / "loss_screen_quick.json").read_text())["runs"] == \
        json.loads(json.dumps(screen["runs"]))
    assert (tmp_path / "loss_screen_quick_table.md").read_text().strip()

    rates = loss_rates.main(["--quick", "--out", str(tmp_path)])
    assert rates["rates"] == sorted([loss_rates.SHARED_RATE, *loss_rates.NEW_RATES])
    assert {r["lr"] for r in rates["runs"]} == set(rates["rates"])  # the screen's 3e-4 runs read back
    assert {r["method"] for r in rates["runs"]} == set(loss_rates.METHODS)
    again = loss_rates.main(["--quick", "--table", "--out", str(tmp_path)])  # the table from the JSON
    assert again["runs"] == json.loads(json.dumps(rates["runs"]))
