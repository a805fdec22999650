"""``grouppref run``: config errors, stage selection (--from/--until/--force), caching, and the
waiting rule of the label stage.

The pipeline tests run the import example (no model is loaded: rules and a simulated panel),
so every stage is real and fast.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grouppref.errors import ConfigError, StageError
from grouppref.labeling.pull import ArgillaResponse, DatasetState
from grouppref.labeling.stage import label_progress
from grouppref.runner import RunConfig, check_stages, load_run_config, run_pipeline
from grouppref.runs.store import RunStore
from tests.support.cli import grouppref_here
from tests.support.paths import REPO

ROOT = REPO
EXAMPLE = ROOT / "examples" / "import.yaml"
SOURCE = ROOT / "examples" / "data" / "candidates.jsonl"
BASE = ("run_dir: RUN\nimport: {source: SRC}\n")


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("RUN", str(tmp_path / "run")).replace("SRC", str(SOURCE)))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    return str(info.value).splitlines()


# -- config errors -----------------------------------------------------------------------------
def test_unknown_key_names_the_dotted_key(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + "aggregate: {prior: 1}\nrank: {rankers: [{kind: rule, "
                 "checks: [{check: verify}], nmae: x}]}\n")
    assert problems(path) == [
        f"{path}: rank.rankers.0.nmae: Extra inputs are not permitted; got 'x'; unknown key "
        "(check the spelling; see the docs of this section)",
        f"{path}: aggregate.prior: Extra inputs are not permitted; got 1; unknown key (check "
        "the spelling; see the docs of this section)"]


def test_bad_choices_name_the_key_and_the_allowed_values(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + "rank:\n  rankers:\n    - {kind: reword, model: x}\n"
                 "    - {kind: rule, checks: [{check: length, target: 5, unit: bytes}]}\n"
                 "    - {model: x}\n"
                 "train: {loss: dpo2}\n")
    assert problems(path) == [
        f"{path}: rank.rankers.0.kind: not an allowed value; got 'reword'; allowed: 'reward', "
        "'rule', 'similarity', 'judge'",
        f"{path}: rank.rankers.1.checks.0.unit: Input should be 'chars' or 'words'; got 'bytes'",
        f"{path}: rank.rankers.2.kind: Field required",
        f"{path}: train.loss: Input should be 'gspo', 'plackett_luce', 'dpo', 'lipo', 'nca', "
        "'infonca' or 'sft'; got 'dpo2'"]


def test_generate_and_import_exclude_each_other(tmp_path: Path) -> None:
    both = write(tmp_path, BASE + "generate: {k: 4}\n")
    (line,) = problems(both)
    assert line.endswith("c.yaml: give either 'generate' or 'import', not both")
    neither = write(tmp_path, f"run_dir: {tmp_path}\n", "n.yaml")
    assert "a run needs candidates" in problems(neither)[0]


def test_toml_gives_the_same_config_as_yaml(tmp_path: Path) -> None:
    toml = write(tmp_path, 'run_dir = "RUN"\n[import]\nsource = "SRC"\n[[rank.rankers]]\n'
                 'kind = "rule"\nchecks = [{check = "verify"}]\n', "c.toml")
    yaml_ = write(tmp_path, BASE + "rank: {rankers: [{kind: rule, checks: [{check: verify}]}]}\n")
    assert load_run_config(toml) == load_run_config(yaml_)


def test_set_overrides_nested_keys_and_reports_bad_paths() -> None:
    cfg = load_run_config(EXAMPLE, ["rank.rankers.1.checks.0.target=80", "simulate.seed=7",
                                    "train={model: some/model, max_steps: 3}"], run_dir="x")
    assert cfg.rank.rankers[1].checks[0].target == 80 and cfg.simulate.seed == 7
    assert (cfg.train.model, cfg.train.max_steps, cfg.run_dir) == ("some/model", 3, "x")
    with pytest.raises(ConfigError, match="'9' is not an index"):
        load_run_config(EXAMPLE, ["rank.rankers.9.name=x"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_run_config(EXAMPLE, ["rank.rankers"])


def test_stage_names_are_checked() -> None:
    assert check_stages("aggregate", "export") == ["aggregate", "validate", "export"]
    with pytest.raises(ConfigError, match="--from 'agregate': unknown stage; allowed: prompts"):
        check_stages("agregate")
    with pytest.raises(ConfigError, match="--force 'bogus': unknown stage; allowed: .*, all"):
        check_stages(force=["rank", "bogus"])
    with pytest.raises(ConfigError, match="--from export comes after --until rank"):
        check_stages("export", "rank")


def test_cli_errors_are_one_line_per_problem_with_exit_code_2(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + "aggregate: {prior: 1}\nvalidate: {test_fraction: 2}\n")
    for args, lines in [([str(path)], [f"error: {path}: aggregate.prior: Extra inputs",
                                       f"{path}: validate.test_fraction: Input should be less "
                                       "than 1; got 2"]),
                        ([str(path), "--force", "bogus"], ["error: --force 'bogus': unknown"])]:
        out = grouppref_here("run", *args, cwd=tmp_path)  # cli.main() in this process
        assert out.returncode == 2, out.stderr
        got = out.stderr.strip().splitlines()
        assert len(got) == len(lines) and "Traceback" not in out.stderr
        assert all(g.startswith(want) for g, want in zip(got, lines, strict=True)), got
        assert not (tmp_path / "run").exists()  # nothing ran


# -- stages and caching ------------------------------------------------------------------------
def import_config(tmp_path: Path, *sets: str) -> RunConfig:
    return load_run_config(EXAMPLE, [f"import.source={SOURCE}",
                                     f"export.0.to_dir={tmp_path / 'out' / 'groups'}",
                                     f"export.1.parquet={tmp_path / 'out' / 'pairs'}",
                                     *sets], run_dir=str(tmp_path / "run"))


def manifests(store: RunStore) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in store.root.glob("*/manifest.json")}


def test_second_run_is_cached_and_force_reruns_one_stage(tmp_path: Path) -> None:
    cfg = import_config(tmp_path)
    store = RunStore(cfg.run_dir)
    first = run_pipeline(cfg)
    chain = ["import", "rank", "simulate", "aggregate", "validate", "export"]
    assert first.status == "done" and first.ran == [*chain, "report"]
    assert first.skipped == ["prompts", "generate", "label", "train_rm", "sweep", "train",
                             "eval"]
    assert store.manifest("aggregate").config["input_stage"] == "simulate"
    before = manifests(store)
    pairs = (tmp_path / "out" / "pairs" / "train.parquet").stat().st_mtime_ns

    again = run_pipeline(cfg)
    assert (again.ran, again.cached) == ([], [*chain, "report"])
    assert manifests(store) == before  # untouched, byte for byte
    assert (tmp_path / "out" / "pairs" / "train.parquet").stat().st_mtime_ns == pairs

    forced = run_pipeline(cfg, force=["aggregate"])
    assert forced.ran == ["aggregate", "report"]
    after = manifests(store)
    assert after["aggregate"] != before["aggregate"]  # re-run: new times in its manifest
    # the same input gives the same fit, so everything after it stays cached (the report,
    # which shows every stage's timings, is rendered again)
    assert {k: v for k, v in after.items() if k not in ("aggregate", "report")} == \
        {k: v for k, v in before.items() if k not in ("aggregate", "report")}

    changed = run_pipeline(import_config(tmp_path, "simulate.seed=1"), start="simulate",
                           until="export")
    assert changed.ran == ["simulate", "aggregate", "validate", "export"]
    assert (tmp_path / "out" / "pairs" / "train.parquet").stat().st_mtime_ns != pairs


def test_from_and_until_select_stages(tmp_path: Path) -> None:
    cfg = import_config(tmp_path)
    store = RunStore(cfg.run_dir)
    with pytest.raises(StageError, match="stage 'validate' has not run"):
        run_pipeline(cfg, start="export")
    first = run_pipeline(cfg, until="rank")
    assert first.ran == ["import", "rank"] and first.report is None
    assert not store.stage_dir("simulate").exists()
    rest = run_pipeline(cfg, start="simulate", until="validate")
    assert rest.ran == ["simulate", "aggregate", "validate"] and rest.cached == []
    assert not store.stage_dir("export").exists() and not store.stage_dir("report").exists()


# -- the label stage's waiting rule -----------------------------------------------------------
def response(group: str, user: str, status: str = "submitted") -> ArgillaResponse:
    return ArgillaResponse(response_id=f"{group}-{user}", group_id=group, username=user,
                           status=status, updated_at="2026-01-01T00:00:00", ranking=None,
                           rationale=None, mapping={})


def test_label_progress_counts_the_fewest_missing_submissions() -> None:
    state = DatasetState(datasets=[], records=[], responses=[
        response("a", "u1"), response("a", "u2"), response("b", "u1"), response("c", "u1",
        "draft"), response("other-run", "u1"), response("b", "u3", "discarded")])
    groups = ["a", "b", "c", "d"]
    # 2 rankings per group, every group: a ready, b needs 1, c and d need 2 each
    p = label_progress(state, groups, min_rankings=2, min_groups=1.0)
    assert (p.groups, p.ready, p.needed, p.missing, p.done) == (4, 1, 4, 5, False)
    assert (p.submitted, p.drafts, p.by_annotator) == (3, 1, {"u1": 2, "u2": 1})
    # half of the groups: a (ready) and b (1 missing)
    half = label_progress(state, groups, min_rankings=2, min_groups=0.5)
    assert (half.needed, half.missing) == (2, 1)
    assert label_progress(state, groups, min_rankings=1, min_groups=0.5).done


def test_docs_list_every_setting_and_option() -> None:
    from grouppref.labeling.config import LabelRunConfig

    doc = (ROOT / "docs" / "run.md").read_text()
    for model in (RunConfig, LabelRunConfig):
        for name, f in model.model_fields.items():
            assert f"| `{f.alias or name}` |" in doc, name
    for option in ("--from", "--until", "--force", "--wait", "--run-dir", "--set"):
        assert f"| `{option}" in doc, option
