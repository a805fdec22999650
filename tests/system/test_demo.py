"""The main job end to end: `grouppref demo --quick` on the embedded SmolLM2, offline, CPU.

Every stage runs for real (generate, four rankers, simulated panel, aggregate, validate,
export, GSPO training, eval, report); the second run must skip every stage from its cache.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from grouppref.commands.demo import demo_config, human_config
from grouppref.runs.store import RunStore
from grouppref.stages import NAMES
from tests.support.cli import grouppref_here
from tests.support.paths import REPO

ROOT = REPO


def _demo(out: Path) -> subprocess.CompletedProcess[str]:
    """``grouppref demo --quick`` through ``cli.main()`` in this process (offline: conftest sets
    HF_HUB_OFFLINE); what is checked is the run it writes and its output, not the process."""
    return grouppref_here("demo", "--quick", "--out", out, cwd=ROOT)


@pytest.mark.slow
def test_quick_demo_runs_every_stage_then_caches(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    first = _demo(out)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "run complete" in first.stdout
    store = RunStore(out)
    stages = {m.stage: m for m in store.manifests()}
    expected = {"prompts", "generate", "rank", "simulate", "aggregate", "validate", "train", "eval"}
    assert expected <= set(stages), sorted(stages)
    assert all(m.status == "complete" for m in stages.values())
    for m in stages.values():  # nothing lost anywhere
        assert m.counts.inputs == m.counts.outputs + m.counts.rejected, m.stage
    assert stages["prompts"].counts.outputs == 8
    assert stages["generate"].counts.outputs + stages["generate"].counts.rejected == 8
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert {"baseline", "model"} <= set(metrics["metrics"])
    assert (out / "export" / "groups" / "README.md").exists()
    assert list(out.glob("export/hub-dry-run-*/dry-run/data/*.parquet"))
    html = (out / "report" / "report.html").read_text()
    assert "Training" in html and "Evaluation" in html and "data:image/png;base64," in html

    mtimes = {s: (out / s / "manifest.json").stat().st_mtime_ns for s in expected}
    second = _demo(out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert {s: (out / s / "manifest.json").stat().st_mtime_ns for s in expected} == mtimes


def test_demo_configs_validate(tmp_path: Path) -> None:
    full = demo_config(tmp_path / "d")
    quick = demo_config(tmp_path / "q", quick=True)
    assert full.generate.k == 4 and quick.generate.k == 3 and quick.prompts.limit == 8
    assert Path(full.prompts.source).is_file() and full.run_dir == str(tmp_path / "d")
    human = human_config(full, tmp_path / "argilla", annotators=2)
    assert human.simulate is None and human.label is not None
    assert human.label.min_rankings == 2 and human.label.state_dir == str(tmp_path / "argilla")
    assert set(NAMES) >= {"label", "simulate"}
