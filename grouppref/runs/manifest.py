"""What a stage did, on disk: ``RUN/<stage>/manifest.json`` and ``RUN/<stage>/rejects.jsonl``.

The manifest records the settings (and their hash), what the stage read (its input
fingerprint, and for every stage of the run it read, that stage's output fingerprint at the
time: this is how a later re-run upstream makes it *stale*), what it wrote (record counts with
``inputs == outputs + rejected``, and ``outputs``: locations of non-record outputs such as a
model folder, an export or an Argilla dataset), timings and package versions.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grouppref.schemas.records import Reject

MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"
_TRACKED_PACKAGES = ("grouppref", "pydantic", "datasets", "pyarrow", "torch", "transformers",
                     "accelerate", "argilla", "numpy")


class Counts(BaseModel):
    """Row counts of one stage: ``inputs == outputs + rejected`` (``partial`` rows were kept)."""

    model_config = ConfigDict(extra="forbid")

    inputs: int = 0
    outputs: int = 0
    rejected: int = 0
    partial: int = Field(default=0, description="Rejects of part of a row (the row was kept).")


class Manifest(BaseModel):
    """What one stage did; written to ``RUN/<stage>/manifest.json``."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    run: str
    status: Literal["running", "complete"]
    stage_version: str
    config: dict[str, Any]
    config_hash: str
    input_fingerprint: str
    inputs: dict[str, str] = Field(default_factory=dict, description="Stages of the run this "
                                   "stage read -> their output fingerprint when it ran.")
    output_fingerprint: str | None = None
    data_hash: Literal["stream", "files"] = Field(
        default="stream", description="How output_fingerprint hashes data/: 'files' "
        "(fingerprint_folder: each file's sha256, hashed on every core), or 'stream' "
        "(fingerprint_file: one stream, as stages wrote before 'files'; kept so that their "
        "runs still check).")
    data_files: dict[str, list[int]] = Field(
        default_factory=dict, description="data/'s files when the stage completed: relative "
        "name -> [size, mtime_ns]. While they are unchanged, data/ counts as the stage wrote it "
        "without being hashed again (RunStore.intact).")
    outputs: dict[str, str] = Field(default_factory=dict, description="Non-record outputs: "
                                    "name -> location (a model folder, an export, a dataset).")
    record_type: str | None = None
    counts: Counts = Field(default_factory=Counts)
    started_at: datetime
    finished_at: datetime | None = None
    seconds: float | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    stats: dict[str, Any] = Field(default_factory=dict)
    stopped: str | None = Field(default=None, description="Why a ``running`` stage stopped "
                                "before it finished (the error, or 'interrupted'); run it again "
                                "with the same settings to resume its finished shards.")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def now() -> datetime:
    return datetime.now(timezone.utc)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary name beside ``path``, then rename: all or nothing."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_rejects(path: Path, rejects: Iterable[Reject]) -> int:
    """Write rejects as JSON lines (atomically); returns how many."""
    lines = [r.model_dump_json() for r in rejects]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_rejects(path: Path) -> list[Reject]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as fh:
        return [Reject.model_validate_json(line) for line in fh if line.strip()]
