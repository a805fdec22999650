"""The data stages give exactly the records, rejects and counts of the per-row implementation
(issue 32): a snapshot of prompts, import, aggregate, validate and export on the demo prompts,
every import fixture, a Nectar-shaped file and a hostile corpus
(:mod:`tests.support.equivalence`), against the one recorded from that implementation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.equivalence import clean_snapshot
from tests.support.paths import TEST_DATA

RECORDED = TEST_DATA / "equivalence" / "snapshot.json"


def _differences(got: Any, want: Any, where: str = "") -> list[str]:
    if isinstance(got, dict) and isinstance(want, dict):
        out = [f"{where}/{k}: only in one" for k in sorted(set(got) ^ set(want))]
        for k in sorted(set(got) & set(want)):
            out += _differences(got[k], want[k], f"{where}/{k}")
        return out
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in _differences(g, w, f"{where}[{i}]")]
    return [] if got == want else [f"{where}: {str(got)[:300]} != {str(want)[:300]}"]


def test_every_stage_gives_what_the_per_row_implementation_gave(tmp_path: Path) -> None:
    want = json.loads(RECORDED.read_text(encoding="utf-8"))
    got = json.loads(json.dumps(clean_snapshot(tmp_path / "work"), sort_keys=True))
    differences = _differences(got, want)
    assert not differences, "\n".join(differences[:30])
