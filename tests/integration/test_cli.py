"""The CLI end to end in a subprocess: exit codes, one-line errors, schema, prompts, inspect."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
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
