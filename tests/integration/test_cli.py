"""The CLI end to end in a subprocess: exit codes, one-line errors, schema, prompts, inspect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import grouppref
from tests.support.paths import REPO

ROOT = REPO


def test_schema_prints_json_schema() -> None:
    out = grouppref("schema", "Ranking")
    assert out.returncode == 0
    assert "tiers" in json.loads(out.stdout)["properties"]


@pytest.mark.parametrize("args,needle", [
    (["schema", "Nope"], "unknown record 'Nope'"),
    (["prompts", "missing.jsonl", "--out", "RUN"], "missing.jsonl: file not found"),
    (["inspect", "nowhere"], "no stage has run here"),
])
def test_user_errors_are_one_line_with_exit_code_2(tmp_path: Path, args: list[str],
                                                   needle: str) -> None:
    out = grouppref(*[str(tmp_path / a) if a in ("RUN", "nowhere") else a for a in args],
                    cwd=tmp_path)
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_prompts_with_bad_rows_continue_and_inspect_shows_counts(tmp_path: Path) -> None:
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "ok"}\n{"prompt": 3}\nnot json\n')
    out = grouppref("prompts", str(src), "--out", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    assert "3 in, 1 out, 2 rejected" in out.stdout  # the result on stdout ...
    assert "row 2" in out.stderr and "row 3" in out.stderr  # ... each reject on stderr
    assert "row 2" not in out.stdout
    again = grouppref("prompts", str(src), "--out", str(tmp_path / "run"))
    assert "skipped" in again.stderr
    table = grouppref("inspect", str(tmp_path / "run"))
    assert table.returncode == 0 and "prompts" in table.stdout and "complete" in table.stdout
    rejects = (tmp_path / "run" / "prompts" / "rejects.jsonl").read_text().splitlines()
    assert len(rejects) == 2
