"""The validate stage: row checks, dataset checks, split by prompt, report, resume and cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from grouppref.commands import export as export_commands
from grouppref.errors import StageError
from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.export.stage import run_export
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.pipeline.validate.core import split_key, split_of
from grouppref.pipeline.validate.stage import load_report, run_validate
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas import (
    PairPreference,
    ValidatedGroup,
)
from tests.support.validated import make_validated, write_aggregate


def many_groups(n: int) -> list[ValidatedGroup]:
    return [make_validated(f"Question number {i}?") for i in range(n)]


# -- split --------------------------------------------------------------------------------------
def test_split_is_a_pure_function_of_seed_and_prompt() -> None:
    keys = [f"prompt {i}" for i in range(2000)]
    splits = [split_of(k, seed=3, test_fraction=0.2) for k in keys]
    # Expected share 0.2; with n=2000 the binomial sd is sqrt(.2*.8/2000)=0.0089: allow 4 sd.
    assert abs(splits.count("test") / len(keys) - 0.2) < 4 * 0.0089
    assert splits == [split_of(k, seed=3, test_fraction=0.2) for k in keys]
    assert splits != [split_of(k, seed=4, test_fraction=0.2) for k in keys]
    assert all(split_of(k, seed=3, test_fraction=0.0) == "train" for k in keys)


def test_split_by_prompt_text_ignores_case_and_spaces() -> None:
    a = make_validated("Name a colour.")
    b = make_validated("name  a COLOUR.")
    assert split_key(a, "prompt") != split_key(b, "prompt")
    assert split_key(a, "prompt_text") == split_key(b, "prompt_text")


def test_valid_rows_pass_with_stable_splits(tmp_path: Path) -> None:
    records = many_groups(40)
    store = write_aggregate(tmp_path / "run", records)
    stage = run_validate(store, ValidateConfig(test_fraction=0.25, seed=1))
    out = stage.records()
    assert [r.group_id for r in out] == [r.group_id for r in records]
    assert {r.split for r in out} == {"train", "test"}
    assert stage.manifest.counts.model_dump() == {"inputs": 40, "outputs": 40, "rejected": 0,
                                                  "partial": 0}
    report = load_report(store)
    assert report.passed and report.prompt_overlap == 0
    assert report.splits["train"]["groups"] + report.splits["test"]["groups"] == 40
    assert report.splits["train"]["pairs"] == 3 * report.splits["train"]["groups"]  # K=3
    # float64 Kendall's W of identical rankings: sums of small integers, one division: ~eps64 from 1
    assert report.agreement["mean_kendall_w"] == pytest.approx(1.0, abs=1e-12)
    # Adding rows never moves an existing prompt to the other split.
    store2 = write_aggregate(tmp_path / "run2", records + many_groups(60)[40:])
    more = {r.group_id: r.split for r in run_validate(store2, ValidateConfig(
        test_fraction=0.25, seed=1)).records()}
    assert all(more[r.group_id] == r.split for r in out)


def test_cached_then_forced_and_stale_input(tmp_path: Path) -> None:
    store = write_aggregate(tmp_path / "run", many_groups(5))
    first = run_validate(store, ValidateConfig())
    assert not first.cached
    assert run_validate(store, ValidateConfig()).cached
    assert not run_validate(store, ValidateConfig(), StageContext(force=True)).cached
    assert not run_validate(store, ValidateConfig(seed=9)).cached  # new config
    write_aggregate(tmp_path / "run", many_groups(6))  # aggregate re-ran: new input
    again = run_validate(store, ValidateConfig(seed=9))
    assert not again.cached and again.manifest.counts.inputs == 6


def test_needs_aggregate(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="aggregate"):
        run_validate(RunStore(tmp_path / "empty"), ValidateConfig())


def test_killed_run_resumes_from_its_shards(tmp_path: Path) -> None:
    records = many_groups(6)
    store = write_aggregate(tmp_path / "run", records)
    config = ValidateConfig(shard_size=2, test_fraction=0.5)
    fresh = run_validate(store, config).records()
    # The state a killed run leaves: a running manifest with the same key and shard 0 on disk.
    # Shard 0 carries a marker flag so that we can see it was kept, not recomputed.
    stage = store.open_stage("validate", config, inputs=["aggregate"],
                             record_type=ValidatedGroup, force=True)
    marked = [r.model_copy(update={"flags": ["from-shard-0"]}) for r in fresh[:2]]
    shard = next(stage.pending_shards(list(range(1, 7)), shard_size=2))
    stage.write_shard(shard, marked, [])
    resumed = run_validate(store, config)
    assert not resumed.cached
    out = resumed.records()
    assert [r.flags for r in out] == [["from-shard-0"]] * 2 + [[]] * 4
    assert [r.model_copy(update={"flags": []}) for r in out] == fresh
    assert resumed.manifest.counts.outputs == 6


def test_empty_aggregate_gives_empty_validate(tmp_path: Path) -> None:
    store = write_aggregate(tmp_path / "run", [])
    stage = run_validate(store, ValidateConfig())
    assert stage.manifest.counts.inputs == stage.manifest.counts.outputs == 0
    assert load_report(store).splits == {"train": {"groups": 0, "pairs": 0},
                                         "test": {"groups": 0, "pairs": 0}}
    with pytest.raises(StageError, match="nothing to export"):
        run_export(store, ExportConfig(to_dir=str(tmp_path / "out")))


# -- bad input ----------------------------------------------------------------------------------
def _bad_rows() -> tuple[list[ValidatedGroup], dict[int, tuple[str, str | None, str]]]:
    """Aggregate rows with known problems; returns them and row -> (check, field, reason part)."""
    good = many_groups(4)
    unknown = make_validated("Unknown candidate?")
    r0 = unknown.rankings[0]
    bad_ranking = r0.model_copy(update={"tiers": [*r0.tiers[:-1], ["c-doesnotexist"]]})
    unknown = unknown.model_copy(update={"rankings": [bad_ranking, unknown.rankings[1]]})
    twice = make_validated("Annotator twice?")
    twice = twice.model_copy(update={"rankings": [twice.rankings[0], twice.rankings[0]]})
    high_p = make_validated("Probability too high?")
    pair = PairPreference.model_construct(**{**high_p.pairs[1].model_dump(), "p": 1.3})
    high_p = high_p.model_copy(update={"pairs": [high_p.pairs[0], pair, *high_p.pairs[2:]]})
    heavy = make_validated("Weight negative?")
    pair = PairPreference.model_construct(**{**heavy.pairs[0].model_dump(), "weight": -0.1})
    heavy = heavy.model_copy(update={"pairs": [pair, *heavy.pairs[1:]]})
    conflict_a = make_validated("Conflict?", k=3)
    conflict_b = make_validated("Conflict?", k=4)  # same group id, other candidates
    reprompt = make_validated("Question number 1?").model_copy(update={"group_id": "g-other"})
    reprompt = reprompt.model_copy(update={"rankings": [
        r.model_copy(update={"group_id": "g-other"}) for r in reprompt.rankings]})
    no_pairs = make_validated("No pairs?").model_copy(update={"pairs": []})
    flagged = make_validated("Flagged?", flags=["low_agreement"])
    rows = [good[0], unknown, good[1], twice, high_p, heavy, conflict_a, good[2], good[0],
            conflict_b, reprompt, no_pairs, flagged, good[3]]
    expected = {
        2: ("schema", "rankings[0].tiers", "unknown candidates ['c-doesnotexist']"),
        4: ("schema", "rankings[1].annotator.id", "ranks this group twice"),
        5: ("schema", "pairs[1].p", "less than or equal to 1"),
        6: ("schema", "pairs[0].weight", "greater than or equal to 0"),
        7: ("conflicting_contents", "group_id", "rows [7, 10] share this group id"),
        9: ("duplicate_group_id", "group_id", "duplicate group id, first at row 1"),
        10: ("conflicting_contents", "group_id", "differ in candidates"),
        11: ("duplicate_prompt", "prompt", f"same prompt as group {good[1].group_id!r} at row 3"),
        12: ("too_few_pairs", "pairs", "0 pair preferences"),
        13: ("flagged", "flags", "flagged low_agreement"),
    }
    return rows, expected


def test_bad_rows_rejected_with_reasons_and_counts_add_up(tmp_path: Path) -> None:
    rows, expected = _bad_rows()
    store = write_aggregate(tmp_path / "run", rows)
    stage = run_validate(store, ValidateConfig(reject_flags=["low_agreement"]))
    rejects = {r.row: r for r in stage.rejects()}
    assert set(rejects) == set(expected)
    for row, (check, field, part) in expected.items():
        assert rejects[row].reason.startswith(check + ":"), rejects[row]
        assert rejects[row].field == field, rejects[row]
        assert part in rejects[row].reason, rejects[row]
        assert rejects[row].group_id == rows[row - 1].group_id
    counts = stage.manifest.counts
    assert (counts.inputs, counts.outputs, counts.rejected) == (14, 4, 10)
    assert [r.group_id for r in stage.records()] == [rows[i].group_id for i in (0, 2, 7, 13)]
    report = json.loads((stage.dir / "report.json").read_text())
    assert report["checks"] == {"schema": 4, "conflicting_contents": 2, "duplicate_group_id": 1,
                                "duplicate_prompt": 1, "too_few_pairs": 1, "flagged": 1}
    assert [f["row"] for f in report["failures"]] == sorted(expected)
    assert stage.manifest.stats["checks"] == report["checks"]


def test_unparseable_json_column_is_a_reject(tmp_path: Path) -> None:
    good = make_validated("Fine?")
    bad = make_validated("Broken strengths?")
    store = write_aggregate(tmp_path / "run", [good, bad])
    # Corrupt one JSON cell the way a hand-edited file would (rewrite the saved dataset).
    ds = store.load_dataset("aggregate")
    ds = ds.map(lambda row, i: {"strengths": "{not json" if i == 1 else row["strengths"]},
                with_indices=True)
    data = store.stage_dir("aggregate") / "data"
    ds.save_to_disk(str(tmp_path / "tmp"))
    shutil.rmtree(data)
    shutil.move(str(tmp_path / "tmp"), data)
    stage = run_validate(store, ValidateConfig())
    (reject,) = stage.rejects()
    assert reject.row == 2 and reject.reason.startswith("schema:")
    assert stage.manifest.counts.outputs == 1


# -- CLI ----------------------------------------------------------------------------------------
def test_cli_validate_prints_table(tmp_path: Path) -> None:
    rows, _ = _bad_rows()
    write_aggregate(tmp_path / "run", rows)
    app = typer.Typer()
    export_commands.register(app)
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "run"), "--test-fraction",
                                      "0.5", "--reject-flag", "low_agreement"],
                                terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "duplicate_group_id" in result.output and "10 rejected" in result.output
    assert "rankings[0].tiers" in result.output
    assert json.loads((tmp_path / "run/validate/report.json").read_text())["config"][
        "test_fraction"] == 0.5
