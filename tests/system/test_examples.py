"""The example configs in ``examples/`` run end to end through ``grouppref run``.

- ``import.yaml`` as shipped (only the output paths moved into the test's folder);
- ``auto.yaml`` with the tiny Llama (``tiny_lm_dir``) as generator, judge and policy;
- ``human.yaml`` against the session's real embedded Argilla, the tiny reward model standing
  in for the placeholder, annotators answering over REST as the web UI does: the first run
  pushes and stops ("waiting for ..."), the second still waits, the third (``--wait``) polls
  until the last answers come in, pulls exactly the submitted rankings and goes on.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import datasets
import pyarrow.parquet as pq
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner, Result

from grouppref.commands import run as run_commands
from grouppref.runner import load_run_config, run_pipeline
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, ValidatedGroup
from tests.support.labelling import annotator_http, annotator_records, respond
from tests.support.paths import REPO

ROOT = REPO
EXAMPLES = ROOT / "examples"


def grouppref_run(*args: str) -> Result:
    app = typer.Typer()
    run_commands.register(app)
    result = CliRunner().invoke(app, ["run", *map(str, args)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def outputs(tmp_path: Path) -> list[str]:
    """--set options that move an example's exports into ``tmp_path``."""
    return ["--set", f"export.0.to_dir={tmp_path / 'export' / 'groups'}",
            "--set", f"export.1.parquet={tmp_path / 'export' / 'pairs'}"]


@pytest.mark.parametrize("name", ["auto", "human", "import", "demo"])
def test_examples_are_valid_configs(name: str) -> None:
    cfg = load_run_config(EXAMPLES / f"{name}.yaml")
    assert (cfg.generate is None) == (name == "import")


def test_import_example_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root
    result = grouppref_run(EXAMPLES / "import.yaml", "--run-dir", tmp_path / "run",
                           *outputs(tmp_path))
    assert result.exit_code == 0, result.output
    assert "run complete" in result.output and "cached: nothing" in result.output
    store = RunStore(tmp_path / "run")
    counts = {m.stage: (m.counts.inputs, m.counts.outputs, m.counts.rejected, m.counts.partial)
              for m in store.manifests()}
    exports = {k: v for k, v in counts.items() if k.startswith("export/")}
    # 12 rows in the file; the 4 prompts without a reference are skipped by the verify rule
    assert {k: v for k, v in counts.items() if k not in exports} == {
        "import": (12, 12, 0, 0), "rank": (12, 12, 0, 4), "simulate": (12, 12, 0, 0),
        "aggregate": (12, 12, 0, 0), "validate": (12, 12, 0, 0), "report": (0, 0, 0, 0)}
    assert sorted(v for v in exports.values()) == [(12, 12, 0, 0)] * 2  # one per target
    groups = store.load_records("validate", ValidatedGroup)
    assert {len(g.rankings) for g in groups} == {4, 5}  # 2 rules (1 without reference) + 3 sim
    exported = datasets.load_from_disk(str(tmp_path / "export" / "groups"))
    assert {s: len(d) for s, d in exported.items()} == {
        s: sum(g.split == s for g in groups) for s in ("train", "test")}
    (parquet,) = [m for m in store.manifests() if m.stage.startswith("export/parquet-")]
    for split, rows in parquet.stats["rows"].items():  # one file per split
        assert pq.read_table(tmp_path / "export" / "pairs" / f"{split}.parquet").num_rows == rows
    assert (store.stage_dir("report") / "report.html").stat().st_size > 10_000


@pytest.mark.slow
def test_auto_example_with_tiny_models(tmp_path: Path, tiny_lm_dir: Path) -> None:
    train = {"model": str(tiny_lm_dir), "max_steps": 1, "batch_size": 2, "logging_steps": 1,
             "data": {"max_prompt_length": 64, "max_response_length": 16}}
    sets = ["prompts.limit=5", f"prompts.source={ROOT / 'data' / 'demo_prompts.jsonl'}",
            f"generate.models=[{{name: '{tiny_lm_dir}', count: 3}}]",
            "generate.max_new_tokens=8", f"rank.rankers.3.model={tiny_lm_dir}",
            f"train={json.dumps(train)}", "validate.test_fraction=0.4"]
    result = grouppref_run(EXAMPLES / "auto.yaml", "--run-dir", tmp_path / "run",
                           *outputs(tmp_path), *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 0, result.output
    store = RunStore(tmp_path / "run")
    assert all(store.is_complete(s) for s in ("prompts", "generate", "rank", "aggregate",
                                               "validate", "train", "eval"))
    exports = [m.status for m in store.manifests() if m.stage.startswith("export/")]
    assert exports and set(exports) == {"complete"}
    ranked = store.load_records("rank", AnnotatedGroup)
    ids = {r.annotator.id for g in ranked for r in g.rankings}
    assert {"rule:verify", "rule:concise", "ensemble"} <= ids
    assert any(i.startswith("similarity:") for i in ids) and any(i.startswith("judge:")
                                                                  for i in ids)
    assert store.manifest("aggregate").config["input_stage"] == "rank"
    assert (store.stage_dir("eval") / "metrics.json").exists()


# -- humans in Argilla ---------------------------------------------------------------------------
def expected_tiers(group: AnnotatedGroup, slot_tiers: list[list[str]]) -> list[list[str]]:
    """The tiers a response over response slots means for ``group`` (empty slots dropped)."""
    ids = {f"response_{i + 1}": c.candidate_id for i, c in enumerate(group.candidates)}
    return [t for t in ([ids[s] for s in tier if s in ids] for tier in slot_tiers) if t]


def answer(server: Any, key: str, dataset_ids: list[str], plan: dict[str, list[list[str]]],
           status: str = "submitted") -> None:
    with annotator_http(server.url, key) as http:
        records = {gid: rec for did in dataset_ids
                   for gid, rec in annotator_records(http, did).items()}
        for gid, tiers in plan.items():
            respond(http, records[gid]["id"], tiers, status=status)


@pytest.mark.argilla
def test_human_example_waits_then_pulls_the_submitted_rankings(
        tmp_path: Path, argilla_server: Any, tiny_lm_dir: Path, tiny_reward_model_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARGILLA_API_KEY", argilla_server.api_key)
    monkeypatch.delenv("ARGILLA_API_URL", raising=False)
    sets = ["prompts.limit=3", f"prompts.source={ROOT / 'data' / 'demo_prompts.jsonl'}",
            f"generate.models=[{{name: '{tiny_lm_dir}'}}]", "generate.k=3",
            "generate.max_new_tokens=8", f"rank.rankers.0.model={tiny_reward_model_dir}",
            f"label.api_url={argilla_server.url}", "label.push.dataset=examples-human",
            "validate.test_fraction=0.0"]
    args = [EXAMPLES / "human.yaml", "--run-dir", tmp_path / "run", *outputs(tmp_path),
            *[a for s in sets for a in ("--set", s)]]
    store = RunStore(tmp_path / "run")

    first = grouppref_run(*args)
    assert first.exit_code == 0, first.output
    assert "waiting for 6 more submitted ranking(s): 0/3 groups have 2 each" in first.output
    assert "pushed 3 groups" in first.output
    assert not store.is_complete("label") and not store.stage_dir("aggregate").exists()
    pushed = json.loads((store.stage_dir("label") / "push.json").read_text())["datasets"]
    dataset_ids = [d["dataset_id"] for d in pushed]  # one dataset per group size

    groups = {g.group_id: g for g in store.load_records("rank", AnnotatedGroup)}
    a, b, c = groups
    users = [argilla_server.create_user(f"ex-ann{i}") for i in (1, 2, 3)]
    plans = {  # annotator -> group -> slot tiers (best first); ties allowed
        users[0][0]: {a: [["response_2"], ["response_1"], ["response_3"]],
                      b: [["response_1", "response_3"], ["response_2"]],
                      c: [["response_3"], ["response_2"], ["response_1"]]},
        users[1][0]: {a: [["response_1"], ["response_2"], ["response_3"]]},
    }
    answer(argilla_server, users[0][2], dataset_ids, plans[users[0][0]])
    answer(argilla_server, users[1][2], dataset_ids, plans[users[1][0]])
    answer(argilla_server, users[2][2], dataset_ids, {b: [["response_1"], ["response_2"],
                                                         ["response_3"]]}, status="draft")

    second = grouppref_run(*args)
    assert second.exit_code == 0, second.output
    assert "waiting for 2 more submitted ranking(s): 1/3 groups have 2 each" in second.output
    assert "pushed" not in second.output  # nothing changed since the push
    assert "4 submitted ranking(s) (ex-ann1 3, ex-ann2 1), 1 draft(s)" in second.output

    # --wait: the run polls; the last answers come in while it waits
    later = {b: [["response_3"], ["response_2", "response_1"]], c: [["response_1"],
                                                                    ["response_2"],
                                                                    ["response_3"]]}
    plans[users[1][0]].update(later)
    log = io.StringIO()
    cfg = load_run_config(args[0], sets + ["label.poll_seconds=0.2", *outputs(tmp_path)[1::2]],
                          run_dir=str(tmp_path / "run"))

    def answer_once_waiting() -> None:
        deadline = time.monotonic() + 120  # answer anyway then, so a failure cannot hang
        while "1 draft(s)" not in log.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)  # wait until the run has polled and is waiting
        answer(argilla_server, users[1][2], dataset_ids, later)

    thread = threading.Thread(target=answer_once_waiting, daemon=True)
    thread.start()
    third = run_pipeline(cfg, wait=True, console=Console(file=log, width=200))
    thread.join(timeout=60)
    assert third.status == "done" and "aggregate" in third.ran, log.getvalue()
    assert "4 submitted ranking(s) (ex-ann1 3, ex-ann2 1), 1 draft(s)" in log.getvalue()
    assert "6 submitted ranking(s) (ex-ann1 3, ex-ann2 3), 1 draft(s); 3/3 groups ready" in \
        log.getvalue()
    pulled = {g.group_id: g for g in store.load_records("label", AnnotatedGroup)}
    got = {(gid, r.annotator.id): r.tiers for gid, g in pulled.items() for r in g.rankings
           if r.annotator.kind == "human"}
    want = {(gid, user): expected_tiers(groups[gid], tiers) for user, plan in plans.items()
            for gid, tiers in plan.items()}
    assert got == want  # exactly the submitted rankings: no draft, nothing else
    assert all(g.rankings[0].annotator.id == "reward:rm" for g in pulled.values())
    assert store.manifest("aggregate").config["input_stage"] == "label"
    validated = store.load_records("validate", ValidatedGroup)
    assert len(validated) == 3 and all(g.agreement.num_annotators >= 2 for g in validated)


def test_docs_import_md_own_files_block_runs_as_written(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/import.md's block of a team's own files (compressed JSON Lines, TSV, a Hub-layout
    folder by split) runs line by line, from a folder that sees the repository's examples/
    and tests/ (the shell line with bash, the grouppref lines through the CLI), and prints the
    lines the page shows."""
    from grouppref.cli import app

    doc = (ROOT / "docs" / "import.md").read_text(encoding="utf-8")
    command, shown = re.search(r"```bash\n(gzip -c [^`]*?)```\s*```text\n(.*?)```", doc,
                               flags=re.S).groups()
    for name in ("examples", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    printed = ""
    for line in command.strip().splitlines():
        if not line.startswith("grouppref "):
            subprocess.run(["bash", "-c", line], check=True)
            continue
        result = CliRunner().invoke(app, shlex.split(line, comments=True)[1:])
        assert result.exit_code == 0, (line, result.output)
        printed += result.output
    for line in shown.strip().splitlines():
        assert line in printed, (line, printed)


# -- the README's Python example -----------------------------------------------------------------
def readme_python_example() -> str:
    """The README's ``grouppref.api`` example, as printed there."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"```python\n(from grouppref import api\n.*?)```", text, re.S)
    assert found, "README.md has no ```python block starting with 'from grouppref import api'"
    return found.group(1)


@pytest.mark.slow
def test_readme_python_example_runs_with_the_tiny_model(tmp_path: Path, tiny_lm_dir: Path,
                                                        monkeypatch, capsys) -> None:
    # the README's code, run as printed except for the model (the tiny Llama generates,
    # judges and is trained, one step) and 6 of the demo prompts; each edit must find its
    # text, so a README that changes fails here until this test follows it
    tiny = json.dumps(str(tiny_lm_dir))
    code = readme_python_example()
    for old, new in [
        ("k=4, max_new_tokens=48)", f"k=4, max_new_tokens=8, models=[{{'name': {tiny}}}])"),
        ('{"kind": "judge"}', f'{{"kind": "judge", "model": {tiny}}}'),
        ('api.TrainConfig(loss="gspo", max_steps=8)',
         f'api.TrainConfig(loss="gspo", max_steps=1, batch_size=2, model={tiny})'),
    ]:
        assert old in code, f"the README example no longer holds {old!r}"
        code = code.replace(old, new)
    (tmp_path / "data").mkdir()
    prompts = (ROOT / "data" / "demo_prompts.jsonl").read_text(encoding="utf-8").splitlines()
    (tmp_path / "data" / "demo_prompts.jsonl").write_text("\n".join(prompts[:6]) + "\n")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    printed = capsys.readouterr().out
    assert "winner=" in printed and "loser=" in printed  # print(groups[0].pairs[0])
    store = RunStore(tmp_path / "runs" / "mine")
    assert all(store.is_complete(s) for s in ("generate", "rank", "aggregate", "validate"))
    assert (tmp_path / "runs" / "mine" / "model" / "config.json").exists()
