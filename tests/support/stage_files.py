"""Two runs of one stage compared file by file: the same files, the same bytes (the manifest
aside, which holds times and the run's name, and whose counts, stats, fingerprints and cache
key are compared instead)."""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST_KEYS = ("counts", "stats", "output_fingerprint", "config_hash")


def assert_same_stage(one: Path, other: Path, *, folders: tuple[bytes, bytes] | None = None
                      ) -> None:
    """``one`` and ``other`` (two ``RUN/<stage>`` folders) hold the same files with the same
    bytes; ``folders``: ``(in one, in other)``, the run folders that the rejects name, read as
    one."""
    names = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(other) for p in other.rglob("*") if p.is_file())
    for name in names:
        if name.name == "manifest.json":
            continue
        mine = (one / name).read_bytes()
        if folders is not None:
            mine = mine.replace(*folders)
        assert mine == (other / name).read_bytes(), name
    manifests = [json.loads((d / "manifest.json").read_text(encoding="utf-8"))
                 for d in (one, other)]
    for key in MANIFEST_KEYS:
        assert manifests[0][key] == manifests[1][key], key
