"""The ``import`` stage and ``grouppref import``: the Stage contract (cached second run,
resume after a kill, ``inputs == outputs + rejected``), exit codes (every row rejected: one
line and exit 2; some rejected: exit 0 with the reject counts), ``generate --import`` as the
candidates-only alias, and an imported UltraFeedback run through aggregate, validate, the
HTML report, export and one training step of a tiny model."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import datasets
import pytest

from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.stage import run_import, run_import_candidates
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import ValidatedGroup
from tests.support.cli import grouppref_here as grouppref  # cli.main() in this process (tests/support/cli.py)
from tests.support.import_rows import NECTAR_ROWS, UF_ROWS, aspects, uf_completion, uf_row
from tests.support.paths import REPO

ROOT = REPO


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# -- the Stage contract -----------------------------------------------------------------------
def test_second_run_is_cached_and_counts_add_up(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "nectar.jsonl", [*NECTAR_ROWS, {"prompt": "no answers"}])
    store = RunStore(tmp_path / "run")
    first = run_import(store, ImportConfig(source=str(source)))
    c = first.counts
    assert (c.inputs, c.outputs, c.rejected) == (4, 3, 1) and c.inputs == c.outputs + c.rejected
    assert first.manifest.stats["layout"] == "nectar" and first.manifest.stats["rows"] == 4
    again = run_import(store, ImportConfig(source=str(source)))
    assert again.cached and again.manifest == first.manifest
    assert not run_import(store, ImportConfig(source=str(source)), StageContext(force=True)).cached
    changed = run_import(store, ImportConfig(source=str(source), annotator="gpt-4-judge"))
    assert not changed.cached
    assert {r.annotator.id for g in changed.records() for r in g.rankings} == {"gpt-4-judge"}


def test_a_killed_import_resumes_from_its_written_shards(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    source = write_jsonl(tmp_path / "uf.jsonl", UF_ROWS)
    config = ImportConfig(source=str(source), shard_size=1)
    straight = run_import(RunStore(tmp_path / "a"), config).records()
    real_finish = StageRun.finish

    def killed(self: StageRun, *args: object, **kwargs: object) -> StageRun:
        raise KeyboardInterrupt  # killed after every shard was written, before finishing

    monkeypatch.setattr(StageRun, "finish", killed)
    store = RunStore(tmp_path / "b")
    with pytest.raises(KeyboardInterrupt):
        run_import(store, config)
    assert store.manifest("import").status == "running"
    written = sorted(p.name for p in (store.stage_dir("import") / "shards").glob("*.arrow"))
    assert written == [f"shard-0000{i}.arrow" for i in range(3)]
    monkeypatch.setattr(StageRun, "finish", real_finish)
    resumed = run_import(store, config)
    assert not resumed.cached and resumed.records() == straight


def test_generate_import_keeps_candidates_only_and_says_so(tmp_path: Path) -> None:
    stage = run_import_candidates(RunStore(tmp_path / "run"),
                                  ImportConfig(source=str(write_jsonl(tmp_path / "uf.jsonl",
                                                                      UF_ROWS[:2]))))
    assert stage.name == "generate" and stage.manifest.record_type == "CandidateGroup"
    assert [g.k for g in stage.records()] == [3, 2]
    notes = [r for r in stage.rejects() if r.field == "rankings"]
    assert len(notes) == 2 and all(r.scope == "part" and r.row in (1, 2) for r in notes)
    assert "`grouppref import` keeps the rankings" in notes[0].reason


# -- the command: exit codes --------------------------------------------------------------------
def test_every_row_rejected_is_one_line_and_exit_2(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": "a", "chosen": "x", "rejected": "y"},
        {"prompt": "b", "chosen": "x", "rejected": "y"},
        {"prompt": "c", "completions": "not a list"}])
    out = grouppref("import", source, "--out", tmp_path / "run", "--layout", "ultrafeedback",
                    cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    error = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in out.stderr
    assert "import: all 3 input rows were rejected; most common reason (2 of 3): expected a " \
        "list of completions in 'completions', got NoneType" in error[0]
    assert "row 1" in error[0] and "rejects.jsonl" in error[0]


def test_some_rows_rejected_exit_0_with_the_counts(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "uf.jsonl", [*UF_ROWS, {"instruction": "x"}])
    out = grouppref("import", source, "--out", tmp_path / "run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # the 3 part-rejects: "What is 2+2?" has 3 aspects that rate one completion only
    assert "import: 4 in, 3 out, 1 rejected, 3 partly rejected" in out.stdout
    assert "rejected: 1 x expected a list of completions" in out.stderr
    assert "layout ultrafeedback, 4 rows read (0 blank) -> 3 groups" in out.stderr
    assert "error" not in out.stderr


# -- an imported run, end to end ----------------------------------------------------------------
def e2e_rows() -> list[dict]:
    """12 UltraFeedback prompts, 4 completions each, rated by a hidden quality (one "N/A" in
    every row, ties); the last row's ratings split the candidates into two unlinked pairs."""
    rows = []
    for i in range(11):
        completions = []
        for q, model in zip((5, 4, 3, 2), ("gpt-4", "bard", "alpaca-7b", "pythia-12b"), strict=True):
            honesty = "N/A" if q == 3 else str(q)
            completions.append(uf_completion(model, f"answer {i}-{q}: " + "word " * q,
                                             aspects(str(q), honesty, str(min(q, 4)), str(q)),
                                             2.0 * q, float(q)))
        rows.append(uf_row(f"Question number {i}?", completions))
    split = [uf_completion("m", f"reply {k}", aspects(h, h, i, i), 5.0, 3.0)
             for k, (h, i) in enumerate([("5", "N/A"), ("3", "N/A"), ("N/A", "4"), ("N/A", "2")])]
    rows.append(uf_row("A split question?", split))
    return rows


@pytest.mark.slow
def test_imported_run_through_aggregate_validate_report_export_and_training(
        tmp_path: Path, tiny_lm_dir: Path) -> None:
    source = write_jsonl(tmp_path / "uf.jsonl", e2e_rows())
    run = tmp_path / "run"
    steps = [
        ("import", source, "--out", run, "--layout", "ultrafeedback"),
        ("aggregate", run, "--min-rankings", "2"),
        ("validate", run, "--test-fraction", "0.25"),
        ("report", run),
        ("export", run, "--to", tmp_path / "export"),
        ("train", run, "--model", tiny_lm_dir, "--max-steps", "1", "--batch-size", "2",
         "--no-chat-template", "--max-response-length", "16"),
    ]
    for args in steps:
        out = grouppref(*args, cwd=tmp_path)
        assert out.returncode == 0, (args[0], out.stderr)
    store = RunStore(run)
    assert store.manifest("aggregate").config["input_stage"] == "import"  # the default input
    groups = {g.prompt.text: g for g in store.load_records("validate", ValidatedGroup)}
    assert len(groups) == 12
    q0 = groups["Question number 0?"]
    honesty = next(r for r in q0.rankings if r.annotator.id == "honesty")
    assert sum(len(t) for t in honesty.tiers) == 3  # the N/A completion is left out
    best = next(c.candidate_id for c in q0.candidates if c.text.startswith("answer 0-5"))
    assert q0.consensus[0] == [best] and "disconnected" not in q0.flags
    split = groups["A split question?"]
    assert "disconnected" in split.flags
    weights = {frozenset((p.winner, p.loser)): p.weight for p in split.pairs}
    ids = split.candidate_ids()
    assert weights[frozenset(ids[:2])] > 0.1 and weights[frozenset((ids[0], ids[2]))] == 0.0
    report = json.loads((store.stage_dir("aggregate") / "report.json").read_text())
    assert report["rules"]["disconnected"]["flagged"] == 1
    assert {a["id"] for a in report["annotators"]} == {
        "helpfulness", "honesty", "instruction_following", "truthfulness"}
    page = Path(store.manifest("report").outputs["html"]).read_text(encoding="utf-8")
    assert "disconnected" in page and "honesty" in page
    exported = datasets.load_from_disk(str(tmp_path / "export"))
    assert sum(len(d) for d in exported.values()) == 12
    train = store.require("train")
    assert train.counts.outputs > 0 and (store.stage_dir("train") / "model" / "config.json").exists()


def test_docs_examples_print_what_docs_import_md_shows(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``grouppref import`` command of docs/import.md, run on its example file, prints
    the lines the page shows (paths under ``runs/``)."""
    from typer.testing import CliRunner

    from grouppref.cli import app

    doc = (ROOT / "docs" / "import.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(grouppref import [^`]*?)```(?:(?!```bash).)*?"
                        r"```text\n(.*?)```", doc, flags=re.S)
    assert len(blocks) == 10
    monkeypatch.chdir(ROOT)
    for command, shown in blocks:
        args = shlex.split(command.replace("\\\n", " "))[1:]
        out_at = args.index("--out") + 1
        args[out_at] = str(tmp_path / args[out_at])
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (command, result.output)
        printed = result.output.replace(str(tmp_path) + "/", "")
        for line in shown.strip().splitlines():
            assert line in printed, (command, line, printed)


def test_docs_import_md_names_every_option() -> None:
    from grouppref.commands.imports import MAPPING_FLAGS

    doc = (ROOT / "docs" / "import.md").read_text(encoding="utf-8")
    flags = {"scores": "--score", "langs": "--lang", "transcripts": "--no-transcripts"}
    for name in ImportConfig.model_fields:
        if name in ("source", "mapping", "layout"):
            continue
        assert flags.get(name, "--" + name.replace("_", "-")) in doc, name
    for dotted, flag in MAPPING_FLAGS.items():
        assert flag in doc, dotted
    assert "--layout" in doc


def test_a_run_config_with_an_import_section_aggregates_the_imported_rankings(
        tmp_path: Path) -> None:
    """`grouppref run`: with an import section and no rank/simulate/label, aggregate reads
    RUN/import (its rankings), and a second run is cached."""
    config = tmp_path / "run.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\n"
                      f"import: {{source: {ROOT / 'examples/data/import/nectar.jsonl'}, "
                      "layout: nectar}\naggregate: {}\nvalidate: null\nreport: null\n")
    first = grouppref("run", config, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    store = RunStore(tmp_path / "run")
    assert store.manifest("aggregate").config["input_stage"] == "import"
    groups = store.load_records("aggregate", ValidatedGroup)
    assert len(groups) == 3 and all(g.rankings and g.pairs for g in groups)
    again = grouppref("run", config, cwd=tmp_path)
    assert again.returncode == 0 and "(computed: nothing; cached: import, aggregate)" in \
        again.stdout, again.stdout
