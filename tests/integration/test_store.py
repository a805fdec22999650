"""Run store: caching, forced re-runs, counts that add up, and resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grouppref.errors import StageError
from grouppref.runs.hashing import fingerprint_file, fingerprint_folder
from grouppref.runs.store import RunStore
from grouppref.schemas import CandidateGroup, Reject
from tests.support.cli import grouppref_here
from tests.support.factories import make_group
from tests.support.paths import REPO

TOY_STAGE = textwrap.dedent(
    """
    # A shard-writing stage over 12 inputs, 2 per shard, slowed down so it can be killed.
    import sys, time
    from grouppref.runs.store import RunStore
    from grouppref.schemas import CandidateGroup, Reject
    from tests.support.factories import make_group

    store = RunStore(sys.argv[1])
    delay = float(sys.argv[2])
    items = list(range(12))
    stage = store.open_stage("toy", {"n": 12}, input_fingerprint="in-1", record_type=CandidateGroup)
    for shard in stage.pending_shards(items, shard_size=2):
        records, rejects = [], []
        for i in shard.items:
            if i % 5 == 4:  # rows 5 and 10 are rejected, with their row number
                rejects.append(Reject(stage="toy", reason="multiple of five", row=i + 1))
            else:
                records.append(make_group(k=3, prompt_text=f"prompt {i}"))
        time.sleep(delay)
        stage.write_shard(shard, records, rejects)
        print(f"shard {shard.index} written", flush=True)
    stage.finish(inputs=len(items))
    """
)


def _run_toy(run: Path, delay: float) -> subprocess.Popen[str]:
    root = REPO
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.Popen([sys.executable, "-c", TOY_STAGE, str(run), str(delay)], env=env,
                            cwd=root, stdout=subprocess.PIPE, text=True)


def _group_ids(run: Path) -> list[str]:
    return [g.group_id for g in RunStore(run).load_records("toy", CandidateGroup)]


def test_sigkill_then_resume_gives_exactly_the_uninterrupted_rows(tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    assert _run_toy(clean, 0.0).wait() == 0

    killed = tmp_path / "killed"
    proc = _run_toy(killed, 0.3)
    assert proc.stdout is not None
    for _ in range(3):  # wait until three shards are on disk, then kill without warning
        assert "written" in proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    shards = sorted((killed / "toy" / "shards").glob("shard-*.arrow"))
    assert 3 <= len(shards) < 6, "the kill should land part way"
    assert RunStore(killed).manifest("toy").status == "running"

    resumed = _run_toy(killed, 0.0)
    out, _ = resumed.communicate()
    assert resumed.returncode == 0
    assert out.count("written") == 6 - len(shards)  # only the missing shards were computed
    assert _group_ids(killed) == _group_ids(clean)
    assert len(set(_group_ids(killed))) == 10
    m = RunStore(killed).manifest("toy")
    assert (m.counts.inputs, m.counts.outputs, m.counts.rejected) == (12, 10, 2)
    rejects = RunStore(killed).stage_dir("toy") / "rejects.jsonl"
    rows = sorted(json.loads(line)["row"] for line in rejects.read_text().splitlines())
    assert rows == [5, 10]


def _write_stage(store: RunStore, config: dict, fp: str = "fp", force: bool = False,
                 inputs: int = 2):
    stage = store.open_stage("s", config, input_fingerprint=fp, record_type=CandidateGroup,
                             force=force)
    if not stage.cached:
        groups = [make_group(k=2, prompt_text="a"), make_group(k=2, prompt_text="b")]
        for shard in stage.pending_shards(groups, shard_size=1):
            stage.write_shard(shard, list(shard.items), [])
        stage.finish(inputs=inputs, stats={"note": "x"})
    return stage


def test_same_config_and_input_is_cached_force_reruns(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    first = _write_stage(store, {"a": 1})
    assert not first.cached
    assert _write_stage(store, {"a": 1}).cached
    assert not _write_stage(store, {"a": 1}, force=True).cached
    assert not _write_stage(store, {"a": 2}).cached  # config changed
    assert not _write_stage(store, {"a": 2}, fp="other").cached  # input changed


def test_manifest_records_what_ran(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    _write_stage(store, {"a": 1})
    m = store.manifest("s")
    assert m is not None and m.status == "complete"
    assert m.config == {"a": 1} and len(m.config_hash) == 64 and m.input_fingerprint == "fp"
    assert m.counts.inputs == 2 and m.counts.outputs == 2 and m.counts.rejected == 0
    assert m.seconds is not None and m.finished_at is not None and m.stats == {"note": "x"}
    assert {"python", "grouppref", "pydantic", "datasets"} <= set(m.versions)
    assert m.output_fingerprint == fingerprint_folder(store.stage_dir("s") / "data")
    assert not (store.stage_dir("s") / "shards").exists()


def test_a_stage_hashed_as_one_stream_before_still_checks_intact(tmp_path: Path) -> None:
    """A manifest written before ``data_hash`` (its data hashed as one stream) is checked
    with that hash: the stage stays intact, and an edit of its data is still seen."""
    store = RunStore(tmp_path / "run")
    _write_stage(store, {"a": 1})
    data = store.stage_dir("s") / "data"
    path = store.stage_dir("s") / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    assert manifest.pop("data_hash") == "files" and store.intact("s")
    del manifest["data_files"]  # nor did such a manifest record the files' times
    manifest["output_fingerprint"] = fingerprint_file(data)
    path.write_text(json.dumps(manifest), encoding="utf-8")
    assert fingerprint_file(data) != fingerprint_folder(data) and store.intact("s")
    shard = sorted(data.glob("*.arrow"))[0]
    shard.write_bytes(shard.read_bytes() + b"\0")
    assert not store.intact("s")


def test_intact_trusts_unchanged_file_times_and_hashes_changed_ones(tmp_path: Path) -> None:
    """``intact`` reads no byte while data/'s files keep the sizes and modification times the
    manifest recorded; a file with another time is hashed: the same bytes (a copy that did
    not keep times) are still intact, other bytes are not. An edit that keeps both the size
    and the time is not seen, as with ``git status``'s index."""
    store = RunStore(tmp_path / "run")
    _write_stage(store, {"a": 1})
    m = store.manifest("s")
    assert m is not None and m.data_files == store.data_files("s") and store.intact("s")
    shard = sorted((store.stage_dir("s") / "data").glob("*.arrow"))[0]
    kept = shard.read_bytes()
    stat = shard.stat()
    edited = kept[:-1] + bytes([kept[-1] ^ 1])
    shard.write_bytes(edited)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert store.intact("s")  # size and time as recorded: trusted unread
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert not store.intact("s")  # another time: hashed, and the bytes differ
    shard.write_bytes(kept)
    assert store.data_files("s") != m.data_files and store.intact("s")  # same bytes, new time


def test_counts_that_do_not_add_up_are_refused(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    with pytest.raises(StageError, match="3 rows in but 2 out"):
        _write_stage(store, {"a": 1}, inputs=3)


def test_require_names_the_missing_stage(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="stage 'rank' has not run"):
        RunStore(tmp_path).require("rank")


def test_a_stale_running_stage_with_other_config_starts_afresh(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run")
    stage = store.open_stage("s", {"a": 1}, input_fingerprint="fp", record_type=CandidateGroup)
    groups = [make_group(k=2, prompt_text=f"p{i}") for i in range(4)]
    shard = next(iter(stage.pending_shards(groups, shard_size=2)))
    stage.write_shard(shard, list(shard.items), [Reject(stage="s", reason="r", scope="part")])
    again = store.open_stage("s", {"a": 2}, input_fingerprint="fp", record_type=CandidateGroup)
    assert len(list(again.pending_shards(groups, shard_size=2))) == 2


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return grouppref_here(*args, cwd=cwd)  # cli.main() in this process


def test_a_stage_stopped_by_an_error_says_why_and_resumes(tmp_path: Path) -> None:
    """A stage that fails after it opened is not left looking "running": its manifest and
    ``inspect`` say why it stopped; a good run afterwards completes and clears it."""
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    failed = _cli("import", "bad.jsonl.gz", "--out", "rr", cwd=tmp_path)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    manifest = json.loads((tmp_path / "rr" / "import" / "manifest.json").read_text())
    assert manifest["status"] == "running"
    assert manifest["stopped"].startswith("error: bad.jsonl.gz: cannot decompress it as .gz")
    shown = _cli("inspect", "rr", cwd=tmp_path)
    assert shown.returncode == 0 and "stopped (error: bad.jsonl.gz" in " ".join(shown.stdout.split())

    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(3)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _cli("import", "pairs.jsonl", "--out", "rr", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "rr" / "import" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["stopped"] is None
    assert manifest["counts"]["inputs"] == 3
