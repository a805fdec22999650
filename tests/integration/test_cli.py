"""The CLI end to end in a subprocess: exit codes, one-line errors, schema, prompts, inspect."""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer

from grouppref.cli import COMMANDS, make_app
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


def test_each_command_is_registered_by_the_module_the_cli_imports_for_it() -> None:
    """A command's run imports only the module :data:`COMMANDS` names for it: that module
    registers exactly those commands, and the full app has them all."""

    def names(app: typer.Typer) -> list[str]:
        return list(typer.main.get_group(app).commands)

    for module, commands in COMMANDS.items():
        for command in commands:
            assert names(make_app(command)) == list(commands), (module, command)
    assert sorted(names(make_app())) == sorted(c for cs in COMMANDS.values() for c in cs)
    assert names(make_app("no-such-command")) == names(make_app())


def test_a_command_runs_without_the_other_commands_modules(tmp_path: Path) -> None:
    code = ("import sys\nfrom grouppref.cli import main\n"
            "sys.argv = ['grouppref', 'schema', 'Ranking']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('grouppref.commands.')))\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, check=True)
    loaded = ast.literal_eval(got.stdout.strip().splitlines()[-1])
    assert "grouppref.commands.core" in loaded
    assert not {f"grouppref.commands.{m}" for m in ("train", "rank", "aggregate", "imports",
                                                     "label_server")} & set(loaded), loaded


def test_ctrl_c_records_in_the_manifest_that_the_stage_was_interrupted(tmp_path: Path) -> None:
    """Typer turns Ctrl-C into exit code 130; the stage it stopped says ``interrupted`` (and
    stays resumable), as ``grouppref inspect`` shows."""
    src = tmp_path / "prompts.jsonl"
    with src.open("w", encoding="utf-8") as fh:  # ~20 MB: read in one process, for seconds
        for i in range(40_000):
            fh.write(json.dumps({"prompt": f"Question {i}: " + "word " * 100}) + "\n")
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "grouppref", "prompts", str(src), "--out", str(run)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    manifest = run / "prompts" / "manifest.json"
    while not manifest.exists() and proc.poll() is None:  # the stage opens, then reads
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    written = json.loads(manifest.read_text(encoding="utf-8"))
    assert (written["status"], written["stopped"]) == ("running", "interrupted")
    shown = grouppref("inspect", str(run))
    assert "interrupted" in shown.stdout + shown.stderr
