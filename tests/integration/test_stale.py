"""Never mix stale stages: re-running an upstream stage with other settings makes every stage
below it stale (``inspect`` says so in pipeline order) and export, train, eval and report refuse
it unless ``--allow-stale`` (which their card, model card or report then states); ``grouppref
run`` with another config on the same directory marks the stages it did not make as not part
of this run, and the report leaves them out."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import yaml

from grouppref.errors import StageError
from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.export.stage import run_export
from grouppref.pipeline.report.stage import run_report
from grouppref.runner import load_run_config, run_pipeline
from grouppref.runs.freshness import read_run_record, run_manifests, stale_causes
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.train.policy.stage import run_train
from grouppref.train.settings.policy import TrainConfig
from tests.support.cli import grouppref_here
from tests.support.paths import REPO

ROOT = REPO
BELOW_GENERATE = ["rank", "simulate", "aggregate", "validate"]
# the command line's entry point, cli.main(), in this process: what these tests read is its output,
# exit code and the run directory, not the process (tests/integration/test_cli.py runs it in child processes)
grouppref = grouppref_here


def generate_config(tmp_path: Path, tiny: Path, k: int) -> Path:
    """Six demo prompts, K candidates from the tiny LM, two length rules and a simulated panel."""
    path = tmp_path / f"k{k}.yaml"
    path.write_text(yaml.safe_dump({
        "run_dir": str(tmp_path / "run"),
        "prompts": {"source": str(ROOT / "data" / "demo_prompts.jsonl"), "limit": 6},
        "generate": {"models": [{"name": str(tiny), "count": k}], "max_new_tokens": 8},
        "rank": {"rankers": [
            {"kind": "rule", "name": "short", "checks": [{"check": "length", "target": 10}]},
            {"kind": "rule", "name": "long", "checks": [{"check": "length", "target": 40}]}]},
        "simulate": {"annotators": [{"id": "sim-a", "flip_rate": 0.1}]},
        "aggregate": {"drop_unreliable": False},  # 6 random groups: nobody is "reliable"
        "validate": {"test_fraction": 0.4},
        "export": [{"format": "groups", "to_dir": str(tmp_path / "groups")}]}))
    return path


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory: pytest.TempPathFactory, tiny_lm_dir: Path) -> RunStore:
    """The whole pipeline with K=3, then ``grouppref generate --k 2`` on the same run."""
    base = tmp_path_factory.mktemp("stale")
    outcome = run_pipeline(load_run_config(generate_config(base, tiny_lm_dir, 3)))
    assert outcome.status == "done" and "export" in outcome.ran
    again = grouppref("generate", "--out", base / "run", "--model", f"{tiny_lm_dir}:2",
                      "--max-new-tokens", "8", "--quiet", cwd=base)
    assert again.returncode == 0, again.stderr
    return RunStore(base / "run")


@pytest.mark.slow  # the stale_run fixture generates with the tiny LM twice
def test_inspect_shows_every_stage_below_generate_stale_in_pipeline_order(
        stale_run: RunStore) -> None:
    shown = grouppref("inspect", stale_run.root, cwd=stale_run.root.parent)
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if line.startswith("│")]
    stages = [row.split("│")[1].strip() for row in rows]
    assert stages[:6] == ["prompts", "generate", *BELOW_GENERATE]
    assert stages[6].startswith("export/dir-groups-") and stages[7] == "report"
    status = {row.split("│")[1].strip(): row.split("│")[2].strip() for row in rows}
    assert status["prompts"] == status["generate"] == "complete"
    for stage in [*BELOW_GENERATE, stages[6], "report"]:
        assert status[stage] == "stale (input changed: generate)", stage
    assert stale_causes(stale_run, "validate") == ["generate"]


@pytest.mark.slow  # the stale_run fixture generates with the tiny LM twice
@pytest.mark.parametrize(("command", "use"), [
    (["export", "{run}", "--to", "{base}/again"], "export it"),
    (["train", "{run}", "--max-steps", "1"], "train on it"),
    (["eval", "{run}", "--model", "{base}/no-model"], "eval on it"),
    (["report", "{run}"], "report them under a warning")])
def test_export_train_eval_and_report_refuse_stale_input_in_one_line(
        stale_run: RunStore, command: list[str], use: str) -> None:
    base = stale_run.root.parent
    args = [a.format(run=stale_run.root, base=base) for a in command]
    before = {p: p.stat().st_mtime_ns for p in stale_run.root.rglob("manifest.json")}
    result = grouppref(*args, cwd=base)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.stderr
    assert "(input changed: generate)" in line and f"--allow-stale to {use}" in line
    if command[0] != "report":
        assert "re-run rank, simulate, aggregate, validate first (`grouppref run CONFIG " \
               "--from rank`" in line
    assert {p: p.stat().st_mtime_ns for p in stale_run.root.rglob("manifest.json")} == before
    assert not (base / "again").exists()


@pytest.mark.slow  # the stale_run fixture generates with the tiny LM twice
def test_allow_stale_export_says_so_in_the_card(stale_run: RunStore, tmp_path: Path) -> None:
    config = ExportConfig(to_dir=str(tmp_path / "stale"))
    stage = run_export(stale_run, config, StageContext(allow_stale=True))
    card = (tmp_path / "stale" / "README.md").read_text()
    assert "> **Warning.** Made with --allow-stale from stale input: validate (input changed: " \
           "generate)." in card
    # the 3-candidate groups of the first generate, under a card whose lineage says k: 2
    assert "k: 2" in card and stage.manifest.counts.outputs == stale_run.manifest(
        "validate").counts.outputs
    assert run_export(stale_run, config, StageContext(allow_stale=True)).cached


@pytest.mark.slow  # the stale_run fixture generates with the tiny LM twice
def test_allow_stale_report_opens_with_the_stale_stages(stale_run: RunStore,
                                                       tmp_path: Path) -> None:
    from grouppref.pipeline.report.config import ReportConfig

    stage = run_report(stale_run, ReportConfig(output=str(tmp_path / "r.html")),
                       StageContext(allow_stale=True))
    page = Path(stage.outputs["html"]).read_text()
    assert "<b>Stale input.</b> Made with --allow-stale from stale input: rank (input changed: " \
           "generate); simulate (input changed: generate)" in page


@pytest.mark.slow
def test_allow_stale_train_says_so_in_the_model_card(stale_run: RunStore, tiny_lm_dir: Path,
                                                     tmp_path: Path) -> None:
    config = TrainConfig(model=str(tiny_lm_dir), max_steps=1, batch_size=2,
                         data={"max_prompt_length": 64, "max_response_length": 16})
    with pytest.raises(StageError, match="validate is stale"):
        run_train(stale_run, config, out_dir=tmp_path / "model")
    stage = run_train(stale_run, config, StageContext(allow_stale=True), out_dir=tmp_path / "model")
    card = (tmp_path / "model" / "README.md").read_text()
    assert "> **Warning.** Made with --allow-stale from stale input: validate (input changed: " \
           "generate)." in card
    assert stage.manifest.outputs["model"] == str(tmp_path / "model")


@pytest.mark.slow  # the stale_run fixture generates with the tiny LM twice
def test_running_the_config_again_clears_the_staleness(stale_run: RunStore, tiny_lm_dir: Path,
                                                       tmp_path: Path) -> None:
    base = stale_run.root.parent
    outcome = run_pipeline(load_run_config(generate_config(base, tiny_lm_dir, 2)))
    # the CLI's generate has this config's settings: cached; everything below it runs again
    assert outcome.cached == ["prompts", "generate"] and outcome.ran[:4] == BELOW_GENERATE
    # what this run made or read is current; a stage still stale (the --allow-stale export and
    # training of the tests above, when they ran) was made before it and is not part of it
    in_run = {m.stage for m in run_manifests(stale_run)}
    stale = {m.stage for m in stale_run.manifests() if stale_causes(stale_run, m.stage)}
    assert {"validate", "report"} <= in_run and not stale & in_run
    status = _inspect_status(stale_run)
    assert all(status[s] == "not in this run (made before it, not by its config)" for s in stale)
    assert "Warning" not in (base / "groups" / "README.md").read_text()
    exported = datasets.load_from_disk(str(base / "groups"))
    assert {len(row["candidates"]) for ds in exported.values() for row in ds} == {2}


# -- another config on the same run directory --------------------------------------------------
def import_config(tmp_path: Path, name: str, exports: list[dict], **sections: object) -> Path:
    """The import example (no model is loaded) with its exports and extra sections replaced."""
    data = yaml.safe_load((ROOT / "examples" / "import.yaml").read_text())
    data.update(run_dir=str(tmp_path / "run"), export=exports, **sections)
    data["import"]["source"] = str(ROOT / "examples" / "data" / "candidates.jsonl")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _inspect_status(store: RunStore) -> dict[str, str]:
    shown = grouppref("inspect", store.root, cwd=store.root.parent)
    assert shown.returncode == 0, shown.stderr
    return {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in shown.stdout.splitlines() if line.startswith("│")}


def test_run_with_another_config_marks_the_stages_it_did_not_make(tmp_path: Path) -> None:
    both = [{"format": "groups", "to_dir": str(tmp_path / "groups")},
            {"format": "trl-pairs", "to_dir": str(tmp_path / "pairs")}]
    first = import_config(tmp_path, "a", both)
    run_pipeline(load_run_config(first), source=str(first))
    second = import_config(tmp_path, "b", both[:1])  # the same stages, less one export
    outcome = run_pipeline(load_run_config(second), source=str(second))
    store = RunStore(tmp_path / "run")
    record = read_run_record(store)
    assert record is not None and record.config == str(second) and record.status == "done"
    pairs = next(m.stage for m in store.manifests() if m.stage.startswith("export/dir-pairs"))
    assert pairs not in record.stages and "validate" in record.stages
    assert outcome.cached[:5] == ["import", "rank", "simulate", "aggregate", "validate"]
    status = _inspect_status(store)
    assert status[pairs] == "not in this run (made before it, not by its config)"
    assert {s for s, v in status.items() if v != "complete"} == {pairs}
    page = Path(store.manifest("report").outputs["html"]).read_text()
    assert "export/dir-groups-" in page and pairs not in page
    # a stage made by hand after the run belongs to the run as it is now
    later = run_export(store, ExportConfig(to_dir=str(tmp_path / "later")))
    assert _inspect_status(store)[later.name] == "complete"


def test_a_stale_export_names_the_step_to_run_from(tmp_path: Path) -> None:
    """Re-validating with another split makes the exports stale: the report says to run again
    from the `export` step (a `run --from` value), not from a stage folder's name."""
    from grouppref.pipeline.validate.config import ValidateConfig
    from grouppref.pipeline.validate.stage import run_validate

    exports = [{"format": "groups", "to_dir": str(tmp_path / "groups")}]
    config = import_config(tmp_path, "a", exports)
    run_pipeline(load_run_config(config), source=str(config))
    store = RunStore(tmp_path / "run")
    run_validate(store, ValidateConfig(test_fraction=0.5, seed=1))
    exported = next(m.stage for m in store.manifests() if m.stage.startswith("export/"))
    assert stale_causes(store, exported) == ["validate"]
    with pytest.raises(StageError, match=rf"{exported} \(input changed: validate\); re-run "
                       r"them \(`grouppref run CONFIG --from export`\)"):
        run_report(store)


def test_a_partial_run_of_the_same_config_keeps_its_other_stages(tmp_path: Path) -> None:
    exports = [{"format": "trl-pairs", "to_dir": str(tmp_path / "pairs")}]
    config = import_config(tmp_path, "a", exports)
    run_pipeline(load_run_config(config), source=str(config))
    outcome = run_pipeline(load_run_config(config), until="validate", source=str(config))
    assert "export" not in outcome.ran + outcome.cached
    status = _inspect_status(RunStore(tmp_path / "run"))
    pairs = next(s for s in status if s.startswith("export/dir-pairs"))
    assert status[pairs] == status["report"] == "complete"


@pytest.mark.slow
def test_report_of_another_config_leaves_out_the_old_training(tmp_path: Path,
                                                              tiny_lm_dir: Path) -> None:
    """Config A trains and evaluates; config B (same data, no training) runs on the same
    directory: A's train and eval are not part of B's run, and B's report does not present A's
    evaluation as its own."""
    train = {"model": str(tiny_lm_dir), "max_steps": 1, "batch_size": 2,
             "data": {"max_prompt_length": 64, "max_response_length": 16}}
    exports = [{"format": "groups", "to_dir": str(tmp_path / "groups")}]
    first = import_config(tmp_path, "a", exports, train=train, eval={})
    assert "eval" in run_pipeline(load_run_config(first), source=str(first)).ran
    store = RunStore(tmp_path / "run")
    page = Path(store.manifest("report").outputs["html"]).read_text()
    assert "<h2 id='evaluation'>Evaluation on the held-out split</h2><p class='muted'>" in page
    second = import_config(tmp_path, "b", exports)
    run_pipeline(load_run_config(second), source=str(second))
    status = _inspect_status(store)
    assert status["train"] == status["eval"] == \
        "not in this run (made before it, not by its config)"
    page = Path(store.manifest("report").outputs["html"]).read_text()
    assert "No training in this run." in page and "No evaluation in this run." in page
    assert "<td>train</td>" not in page and "<td>eval</td>" not in page
