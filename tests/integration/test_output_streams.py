"""stdout carries results only and cuts nothing; progress bars, notes and rejects go to stderr.

Every command runs as a child process with stdout and stderr piped (not a terminal), the way
``grouppref ... > file`` or ``| grep`` sees it, with ``COLUMNS=40`` to make any cutting show."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import grouppref as run_cli
from tests.support.paths import REPO

ROOT = REPO
LONG_ID = "simulated-annotator-with-a-rather-long-identifier-0001"
# what a progress bar line has (a table's heavy border has the bar's "━" too)
PROGRESS = ("/s ", "/s\n", " 0:00:", "Saving the dataset", "Loading weights")
# cli.main() in a child on a narrow "terminal" (COLUMNS=40) that a pipe must ignore
grouppref = functools.partial(run_cli, env={**os.environ, "COLUMNS": "40"}, main_in_child=True)


def clean(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The stdout lines of a successful command, checked to hold no progress and no cut text."""
    assert result.returncode == 0, result.stderr
    assert not any(mark in result.stdout for mark in PROGRESS), result.stdout
    assert "…" not in result.stdout
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The import example through ``grouppref run`` (no model is loaded), with a long
    annotator id and an export under a long path; checks the run's own streams too."""
    base = tmp_path_factory.mktemp("streams")
    deep = base / "a-folder-with-a-long-name" / "and-another-one-below-it" / "groups-export"
    result = grouppref(
        "run", ROOT / "examples" / "import.yaml", "--run-dir", base / "run",
        "--set", f"import.source={ROOT / 'examples' / 'data' / 'candidates.jsonl'}",
        "--set", f"export=[{{format: groups, to_dir: '{deep}'}}]",
        "--set", f"simulate.annotators.0.id={LONG_ID}", cwd=base)
    lines = clean(result)
    assert lines[0].startswith(f"run complete: {base / 'run'} (computed: import, rank, ")
    assert lines[1:] == [f"report: {base / 'run' / 'report' / 'report.html'}",
                         f"inspect it: grouppref inspect {base / 'run'}"]
    # the progress of every stage went to stderr, with the one line per stage
    assert "groups/s" in result.stderr and "validate: done 12 in, 12 out" in result.stderr
    return base / "run"


def test_inspect_prints_whole_stage_names_and_paths(run_dir: Path) -> None:
    lines = clean(grouppref("inspect", run_dir, cwd=run_dir.parent))
    table = "\n".join(lines)
    export = next(p.parent.name for p in (run_dir / "export").glob("*/manifest.json"))
    assert f"│ export/{export} │" in table and export.startswith("dir-groups-export-")
    assert f"{run_dir / 'run.json'})" in lines[-1]  # the last line names run.json, whole


def test_aggregate_table_keeps_annotator_ids_whole(run_dir: Path) -> None:
    lines = clean(grouppref("aggregate", run_dir, "--force", "--min-rankings", "2",
                            "--dpo-fallback-threshold", "0.15", cwd=run_dir.parent))
    rows = [line for line in lines if LONG_ID in line]
    assert len(rows) == 1 and rows[0].startswith(f"│ {LONG_ID} ")


def test_export_prints_where_it_wrote_and_rejects_go_to_stderr(run_dir: Path,
                                                               tmp_path: Path) -> None:
    target = tmp_path / "a-long-folder-name-for-the-trl-pairs-export" / "pairs"
    result = grouppref("export", run_dir, "--format", "trl-pairs", "--parquet", target,
                       "--min-weight", "0.8", cwd=tmp_path)
    lines = clean(result)
    assert lines[0].startswith("export (trl-pairs) ") and lines[0].endswith(f"-> {target}")
    # a group without a pair heavy enough is a reject: one line on stderr, none on stdout
    assert "left out [export]" not in result.stdout
    assert "left out [export] row " in result.stderr


def test_validate_table_and_counts_on_stdout(run_dir: Path) -> None:
    result = grouppref("validate", run_dir, "--force", "--test-fraction", "0.25",
                       cwd=run_dir.parent)
    lines = clean(result)
    assert any(line.startswith("│ duplicate_group_id ") for line in lines)
    assert lines[-1].startswith(f"validate: 12 in, 12 out, 0 rejected -> {run_dir / 'validate'}")


@pytest.mark.parametrize("command", [[], ["export"], ["train"], ["run"], ["label", "push"]])
def test_help_never_cuts_option_names(command: list[str], tmp_path: Path) -> None:
    text = "\n".join(clean(grouppref(*command, "--help", cwd=tmp_path)))
    wanted = {(): ["--help"], ("export",): ["--license-name", "--max-shard-size",
                                            "--dry-run-dir", "--allow-stale"],
              ("train",): ["--gradient-checkpointing", "--no-gradient-checkpointing",
                           "--reference-cache", "--importance-clip", "--allow-stale"],
              ("run",): ["--allow-stale", "--run-dir"], ("label", "push"): ["--help"]}
    for option in wanted[tuple(command)]:
        assert option in text


@pytest.mark.slow
def test_training_progress_goes_to_stderr(run_dir: Path, tiny_lm_dir: Path,
                                          tmp_path: Path) -> None:
    result = grouppref("train", run_dir, "--model", tiny_lm_dir, "--max-steps", "1",
                       "--batch-size", "2", "--max-prompt-length", "64",
                       "--max-response-length", "16", "--out", tmp_path / "model", cwd=tmp_path)
    lines = clean(result)
    assert "steps/s" in result.stderr  # the bar
    assert lines[0].startswith("train: ") and any(line.startswith("│ loss ") for line in lines)


def test_text_from_data_is_never_read_as_markup(tmp_path: Path) -> None:
    """A path or message holding ``[/x]`` or ``[export]`` prints as it is: rich markup would
    drop ``[export]`` and raise on ``[/x]`` (a traceback instead of the one error line)."""
    odd = tmp_path / "runs[/x]" / "[export]"
    odd.mkdir(parents=True)
    result = grouppref("inspect", odd, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"error: {odd}: no stage has run here (no */manifest.json)"
