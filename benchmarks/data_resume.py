"""A data stage killed with SIGKILL half-way resumes to exactly the output of an uninterrupted
run (issue 32), at real size: ``import``, ``aggregate`` and ``validate`` of a Nectar-shaped file
(:func:`data_stages.write_nectar`), each as the command a user runs.

For each stage: run A runs it to the end; run B starts the same command on a copy of the same
input, waits until some of its shards are on disk (``RUN/<stage>/shards/shard-*.arrow``), kills
it with SIGKILL, checks the stage is not complete, and runs the command again. The script then
compares B's ``data/`` (as Arrow tables), ``rejects.jsonl`` and manifest counts with A's and
prints one line per stage; it exits 1 on any difference.

Usage::

    .venv/bin/python benchmarks/data_resume.py --groups 20000 --work /tmp/grouppref-resume
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from data_stages import write_nectar

ROOT = Path(__file__).resolve().parents[1]
SHARD_SIZE = 1000


def _command(stage: str, data: Path, run: Path) -> list[str]:
    py = [sys.executable, "-m", "grouppref"]
    if stage == "import":
        return py + ["import", str(data), "--out", str(run), "--layout", "nectar",
                     "--shard-size", str(SHARD_SIZE)]
    return py + [stage, str(run), "--shard-size", str(SHARD_SIZE)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[2:4])} failed:\n{done.stderr[-3000:]}")


def _kill_half_way(argv: list[str], shards: Path, wanted: int) -> int:
    """Start ``argv``, SIGKILL it once ``wanted`` shards are on disk; the shards there then."""
    proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while len(list(shards.glob("shard-*.arrow"))) < wanted:
        if proc.poll() is not None:
            sys.exit(f"{' '.join(argv[2:4])} finished before it could be killed; use more "
                     "--groups")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return len(list(shards.glob("shard-*.arrow")))


def _output(run: Path, stage: str) -> tuple[Any, str, dict[str, int]]:
    import datasets

    table = datasets.load_from_disk(str(run / stage / "data")).with_format("arrow")[:]
    rejects = (run / stage / "rejects.jsonl").read_text(encoding="utf-8")
    counts = json.loads((run / stage / "manifest.json").read_text(encoding="utf-8"))["counts"]
    return table, rejects, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=20000)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = args.work / f"nectar-{args.groups}-k7-c600-s0.jsonl"
    if not data.exists():
        write_nectar(data, args.groups, 7, 600, 0)
    clean, killed = args.work / "clean", args.work / "killed"
    for run in (clean, killed):
        shutil.rmtree(run, ignore_errors=True)
    shards_total = -(-args.groups // SHARD_SIZE)
    failed = False
    for stage in ("import", "aggregate", "validate"):
        _run(_command(stage, data, clean))
        shards = killed / stage / "shards"
        on_disk = _kill_half_way(_command(stage, data, killed), shards, shards_total // 4)
        manifest = json.loads((killed / stage / "manifest.json").read_text(encoding="utf-8"))
        if manifest["status"] == "complete":
            sys.exit(f"{stage}: completed before the kill landed; use more --groups")
        _run(_command(stage, data, killed))
        want, got = _output(clean, stage), _output(killed, stage)
        same = (want[0].equals(got[0]), want[1] == got[1], want[2] == got[2])
        failed |= not all(same)
        print(f"{stage}: killed with {on_disk} of {shards_total} shards on disk, resumed: "
              f"data {'equal' if same[0] else 'DIFFERENT'}, rejects "
              f"{'equal' if same[1] else 'DIFFERENT'}, counts "
              f"{'equal' if same[2] else 'DIFFERENT'} {got[2]}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
