"""benchmarks/train_peak.py end to end on the tiny shape: the engines, the interleaved
``matmul-limit`` engine and each engine's ratio to it per round (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import REPO

ROOT = REPO


def test_interleaved_matmul_limit_gives_each_engine_its_fraction(tmp_path):
    out = tmp_path / "peak.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "train_peak.py"), "--device", "cpu",
           "--shape", "tiny", "--groups", "2", "--prompt-len", "8", "--resp-len", "8",
           "--threads", "1", "--warmup", "1", "--steps", "3", "--peak-seconds", "0.05",
           "--engines", "grouppref,grouppref-unshared,matmul-limit", "--interleave",
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    engines = json.loads(out.read_text())["shapes"]["tiny"]["engines"]
    limit = engines["matmul-limit"]
    assert limit["flops"] == 2 * 2048**3  # one square product covers the tiny step's FLOPs
    assert limit["flops"] >= engines["grouppref"]["flops"]
    for name in ("grouppref", "grouppref-unshared"):
        rounds = engines[name]["fraction_of_limit_by_round"]
        assert len(rounds) == 3 and all(0 < f < 1 for f in rounds)
        expected = engines[name]["achieved_flops"] / limit["achieved_flops"]
        assert engines[name]["fraction_of_limit"] == expected
    assert "of the matmul-limit rate" in done.stdout
