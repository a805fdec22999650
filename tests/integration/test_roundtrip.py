"""Everything ``export`` writes reads back: the groups and TRL-pair formats in every container
(save_to_disk folder, Parquet folder or file, the Hub layout of a dry run) go into ``train``,
``eval``, ``validate --source`` and ``aggregate --source``; a local path is never looked up on
the Hub. The slow test runs export -> train 1 step -> eval per format through the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from grouppref.commands import aggregate as aggregate_commands
from grouppref.commands import export as export_commands
from grouppref.commands import train as train_commands
from grouppref.errors import InputFileError
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.stage import run_aggregate
from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.export.stage import run_export
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.stage import read_import
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.pipeline.validate.core import split_key, split_of
from grouppref.pipeline.validate.stage import run_validate
from grouppref.readers.pairs import FROM_PAIR
from grouppref.readers.published import read_validated
from grouppref.runner import load_run_config, run_pipeline
from grouppref.runs.store import RunStore
from grouppref.schemas import ValidatedGroup
from grouppref.train.data.sources import load_groups
from tests.support.paths import REPO
from tests.support.validated import make_validated, write_aggregate

ROOT = REPO
SPLIT = ValidateConfig(test_fraction=0.3, seed=0)
# every export format and container; {out} is the target
TARGETS: dict[str, dict[str, Any]] = {
    "groups-dir": {"format": "groups", "to_dir": "{out}"},
    "groups-parquet": {"format": "groups", "parquet": "{out}"},
    "groups-hub-layout": {"format": "groups", "hub": "me/prefs", "dry_run": True,
                          "dry_run_dir": "{out}"},
    "pairs-dir": {"format": "trl-pairs", "to_dir": "{out}"},
    "pairs-parquet": {"format": "trl-pairs", "parquet": "{out}"},
    "pairs-hub-layout": {"format": "trl-pairs", "hub": "me/prefs", "dry_run": True,
                         "dry_run_dir": "{out}"},
}


def _run(root: Path, chat: bool) -> RunStore:
    """A validated run of 10 groups of K=3 (every other prompt a chat when ``chat``)."""
    records = [make_validated(f"Question {i}?", k=3, chat=chat and i % 2 == 0) for i in range(10)]
    store = write_aggregate(root, records)
    run_validate(store, SPLIT)
    return store


def _export(store: RunStore, name: str, out: Path) -> ExportConfig:
    settings = {k: v.replace("{out}", str(out)) if isinstance(v, str) else v
                for k, v in TARGETS[name].items()}
    config = ExportConfig(**settings)
    run_export(store, config)
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, RunStore]:
    base = tmp_path_factory.mktemp("roundtrip")
    return {chat: _run(base / f"run-{chat}", chat) for chat in (True, False)}


# -- what each format reads back as -----------------------------------------------------------
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "text"])
@pytest.mark.parametrize("name", list(TARGETS))
def test_every_export_reads_back(runs: dict[bool, RunStore], tmp_path: Path, name: str,
                                 chat: bool) -> None:
    store = runs[chat]
    validated = {g.group_id: g for g in store.load_records("validate", ValidatedGroup)}
    _export(store, name, tmp_path / "out")
    read = load_groups(tmp_path / "out")
    assert read.rejects == [] and read.rows == len(read.groups)
    if name.startswith("groups"):
        assert read.format == "groups"
        assert {g.group_id: g for g in read.groups} == validated  # exact, splits included
        return
    # TRL pairs: one group of K=2 per consensus pair, with its p, weight, split and prompt
    assert read.format == "trl-pairs"
    assert len(read.groups) == sum(len(g.pairs) for g in validated.values())
    for pair_group in read.groups:
        origin = validated[pair_group.prompt.metadata["source_group_id"]]
        chosen, rejected = pair_group.candidates
        (pair,) = pair_group.pairs
        want = next(p for p in origin.pairs if (p.winner, p.loser) == (chosen.candidate_id,
                                                                     rejected.candidate_id))
        text = {c.candidate_id: c.text for c in origin.candidates}
        assert (chosen.text, rejected.text) == (text[want.winner], text[want.loser])
        assert (pair.p, pair.weight) == (want.p, want.weight)
        assert pair_group.split == origin.split and pair_group.flags == [FROM_PAIR]
        assert pair_group.consensus == [[chosen.candidate_id], [rejected.candidate_id]]
        assert pair_group.prompt.as_messages() == origin.prompt.as_messages()
        assert (pair_group.prompt.messages is None) == (not chat)  # chat stays chat


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_export_imports_back_by_split(runs: dict[bool, RunStore], tmp_path: Path,
                                            name: str) -> None:
    """`grouppref import` reads each container `export` writes (a save_to_disk folder, a
    Parquet folder, a Hub-layout folder), split by split, every row kept. (Groups from the
    text run: the chat run's factory gives every chat prompt the one id ``chat``, which import
    rightly rejects as one id for several prompts.)"""
    store = runs[not name.startswith("groups")]
    _export(store, name, tmp_path / "out")
    for split in ("train", "test"):
        want = [g for g in store.load_records("validate", ValidatedGroup) if g.split == split]
        got = read_import(ImportConfig(source=str(tmp_path / "out"), split=split))
        assert got.rejects == [] and got.groups
        if name.startswith("groups"):
            assert got.stats["layout"] == "groups" and got.rows == len(want)
            assert {g.group_id: ([c.text for c in g.candidates], len(g.rankings))
                    for g in got.groups} == {
                g.group_id: ([c.text for c in g.candidates], len(g.rankings)) for g in want}
        else:  # one row per pair; the pairs of a prompt merge into its group again
            assert got.stats["layout"] == "pairs"
            assert got.rows == sum(len(g.pairs) for g in want)
            assert sorted(sorted(c.text for c in g.candidates) for g in got.groups) == \
                sorted(sorted(c.text for c in g.candidates) for g in want)


def test_a_parquet_file_of_one_split_reads_as_that_split(runs: dict[bool, RunStore],
                                                         tmp_path: Path) -> None:
    store = runs[True]
    held = [g for g in store.load_records("validate", ValidatedGroup) if g.split == "test"]
    for fmt in ("groups", "trl-pairs"):
        out = tmp_path / f"{fmt}-heldout.parquet"  # neither name nor a column says the split:
        run_export(store, ExportConfig(format=fmt, parquet=str(out), split="test"))
        read = load_groups(out)  # ... the card beside it (FILE.md) does
        assert read.groups and {g.split for g in read.groups} == {"test"}
        assert len(read.groups) == (len(held) if fmt == "groups"
                                    else sum(len(g.pairs) for g in held))


def test_pairs_from_elsewhere_and_bad_rows(tmp_path: Path) -> None:
    """TRL rows without our extra columns (p and weight 1), one row per line in JSON Lines;
    rows that cannot make a group are rejects naming the row and the reason."""
    rows = [{"prompt": "Say hi.", "chosen": "Hi!", "rejected": "Go away."},
            {"prompt": [{"role": "user", "content": "Say hi."}],
             "chosen": [{"role": "assistant", "content": "Hello."}],
             "rejected": [{"role": "assistant", "content": "No."}]},
            {"prompt": "Same?", "chosen": "yes", "rejected": "Yes "},  # equal texts
            {"prompt": "Turns?", "chosen": [{"role": "user", "content": "a"},
                                            {"role": "assistant", "content": "b"}],
             "rejected": "c"}]
    path = tmp_path / "test_prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = load_groups(path)
    assert read.format == "trl-pairs" and read.rows == 4 and len(read.groups) == 2
    assert [(g.pairs[0].p, g.pairs[0].weight, g.split) for g in read.groups] == [
        (1.0, 1.0, "test")] * 2  # "test_prefs": a held-out split name
    assert [r.row for r in read.rejects] == [3, 4]
    assert "same normalised text" in read.rejects[0].reason
    assert "chosen holds 2 chat turns; expected one assistant turn" in read.rejects[1].reason


def test_a_local_path_is_never_looked_up_on_the_hub(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exports").mkdir()
    # "exports/prefs" has the shape of a Hub id, but exports/ is a local folder
    for missing in ("exports/prefs", "prefs.parquet", "./x/y", str(tmp_path / "nope")):
        with pytest.raises(InputFileError, match="no such file or folder$"):
            load_groups(missing)
    with pytest.raises(InputFileError, match="not a dataset folder grouppref can read"):
        load_groups(tmp_path / "exports")  # empty
    (tmp_path / "exports" / "notes.txt").write_text("hello")
    with pytest.raises(InputFileError, match=r"notes.txt: unknown format '.txt'"):
        load_groups(tmp_path / "exports")
    (tmp_path / "exports" / "notes.txt").unlink()
    (tmp_path / "exports" / "train.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    with pytest.raises(InputFileError, match=r"neither grouppref groups .* its columns are "
                       r"\['text'\]"):
        load_groups(tmp_path / "exports")
    with pytest.raises(InputFileError, match="the Hub dataset cannot be loaded"):
        load_groups("someone/prefs")  # a Hub id is tried (offline in the tests: it fails)


# -- a run started from a published dataset --------------------------------------------------
@pytest.mark.parametrize("name", ["groups-hub-layout", "pairs-parquet"])
def test_validate_source_starts_a_run_from_an_export(runs: dict[bool, RunStore], tmp_path: Path,
                                                     name: str) -> None:
    store = runs[True]
    _export(store, name, tmp_path / "out")
    fresh = RunStore(tmp_path / "fresh")
    config = SPLIT.model_copy(update={"source": str(tmp_path / "out")})
    stage = run_validate(fresh, config)
    published = read_validated(tmp_path / "out")
    assert stage.counts.inputs == stage.counts.outputs == len(published.groups)
    again = {g.group_id: g for g in stage.records()}
    if name.startswith("groups"):  # the same seed and test fraction give the same splits back
        assert again == {g.group_id: g for g in store.load_records("validate", ValidatedGroup)}
    else:  # many K=2 groups per prompt: no duplicate_prompt rejects, split by prompt as ever
        def unsplit(g: ValidatedGroup) -> ValidatedGroup:
            return g.model_copy(update={"split": None})

        assert {k: unsplit(g) for k, g in again.items()} == {
            g.group_id: unsplit(g) for g in published.groups}
        for g in again.values():
            assert g.split == split_of(split_key(g, "prompt"), SPLIT.seed, SPLIT.test_fraction)
    assert stage.manifest.inputs == {}  # no stage of the run: the file is the input
    assert run_validate(fresh, config).cached


def test_a_run_config_can_start_from_a_published_dataset(runs: dict[bool, RunStore],
                                                         tmp_path: Path) -> None:
    _export(runs[False], "groups-parquet", tmp_path / "published")
    config = tmp_path / "from-published.yaml"
    config.write_text(yaml.safe_dump({
        "run_dir": str(tmp_path / "run"),
        "validate": {"source": str(tmp_path / "published"), "test_fraction": 0.3},
        "export": [{"format": "trl-pairs", "to_dir": str(tmp_path / "pairs")}]}))
    outcome = run_pipeline(load_run_config(config))
    assert outcome.ran == ["validate", "export", "report"]  # nothing to aggregate
    assert "aggregate" in outcome.skipped
    assert load_groups(tmp_path / "pairs").format == "trl-pairs"


@pytest.fixture(scope="module")
def import_run(tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    """The import example (rules + simulated panel: real rankings), exported as groups."""
    base = tmp_path_factory.mktemp("import")
    cfg = load_run_config(ROOT / "examples" / "import.yaml", [
        f"import.source={ROOT / 'examples' / 'data' / 'candidates.jsonl'}",
        f"export=[{{format: groups, to_dir: {base / 'groups'}}}]", "report=null"],
        run_dir=str(base / "run"))
    run_pipeline(cfg)
    return RunStore(cfg.run_dir)


def test_aggregate_source_refits_the_rankings_of_an_export(import_run: RunStore,
                                                           tmp_path: Path) -> None:
    original = {g.group_id: g for g in import_run.load_records("aggregate", ValidatedGroup)}
    settings = import_run.manifest("aggregate").config
    exported = str(import_run.root.parent / "groups")
    app = typer.Typer()
    aggregate_commands.register(app)
    result = CliRunner().invoke(app, [
        "aggregate", str(tmp_path / "again"), "--source", exported,
        "--min-rankings", str(settings["min_rankings"]),
        "--dpo-fallback-threshold", str(settings["dpo_fallback_threshold"])])
    assert result.exit_code == 0, result.output
    again = {g.group_id: g for g in RunStore(tmp_path / "again").load_records(
        "aggregate", ValidatedGroup)}
    assert set(again) == set(original)
    for gid, group in again.items():  # the same rankings and settings give the same fit
        want = original[gid]
        assert group.rankings == want.rankings and group.consensus == want.consensus
        assert group.flags == want.flags
        assert [(p.winner, p.loser) for p in group.pairs] == [(p.winner, p.loser)
                                                              for p in want.pairs]
        for p, q in zip(group.pairs, want.pairs, strict=True):
            # the pair targets through Parquet/Arrow (float64, exact) or TRL's float32 columns (~eps32 *
            # 1 = 1.2e-7 relative, inside approx's default for the weight); p in [0, 1]
            assert p.p == pytest.approx(q.p, abs=1e-9) and p.weight == pytest.approx(
                q.weight, abs=1e-9)
    run_export(import_run, ExportConfig(format="trl-pairs", to_dir=str(tmp_path / "pairs")))
    with pytest.raises(InputFileError, match="TRL pairs hold already aggregated pairs and no "
                       "rankings"):
        run_aggregate(RunStore(tmp_path / "p"), AggregateConfig(source=str(tmp_path / "pairs")))


# -- export -> train 1 step -> eval, per format ------------------------------------------------
def _cli(*args: str) -> Any:
    app = typer.Typer()
    for module in (export_commands, train_commands):
        module.register(app)
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TARGETS))
def test_export_train_one_step_eval(runs: dict[bool, RunStore], tmp_path: Path, name: str,
                                    tiny_lm_dir: Path) -> None:
    store = runs[name.startswith("pairs")]  # pairs from chat prompts, groups from text ones
    out, model = tmp_path / "out", tmp_path / "model"
    settings = TARGETS[name]
    target = ["--hub", "me/prefs", "--dry-run", "--dry-run-dir", out] if "hub" in settings \
        else ["--to" if "to_dir" in settings else "--parquet", out]
    _cli("export", store.root, "--format", settings["format"], *target)
    short = ["--max-prompt-length", "64", "--max-response-length", "16"]
    _cli("train", out, "--out", model, "--model", tiny_lm_dir, "--max-steps", "1",
         "--batch-size", "2", *short)
    stats = json.loads((model / "metrics.json").read_text())
    read = load_groups(out)
    held = sum(g.split == "test" for g in read.groups)
    assert stats["steps"] == 1 and stats["groups"]["held_out"] == held > 0
    assert stats["groups"]["train"] == len(read.groups) - held
    card = (model / "README.md").read_text()
    assert f"`out` ({settings['format']}): {len(read.groups) - held} groups trained on" in card
    report = tmp_path / "eval.json"
    _cli("eval", out, "--model", model, "--baseline", tiny_lm_dir, "--out", report, *short)
    evaluated = json.loads(report.read_text())
    assert evaluated["split"] == "test" and evaluated["groups"] == held
    assert evaluated["metrics"]["baseline"]["pair_accuracy"] == 0.5  # its own reference
    # the eval stage scores what training logged at its end on the same held-out groups
    # a share of pairs: equal unless a margin within float32 noise of 0 flips
    assert evaluated["metrics"]["model"]["pair_accuracy"] == pytest.approx(
        stats["eval"]["pair_accuracy"], abs=1e-6)


def test_a_model_folder_names_reject_files_without_the_machines_paths(tmp_path: Path) -> None:
    from grouppref.schemas import Reject
    from grouppref.train.engine.model_folder import public_rejects

    folder = tmp_path / "prefs"
    (folder / "data").mkdir(parents=True)
    inside, elsewhere = folder / "data" / "test.parquet", tmp_path / "other" / "x.jsonl"
    rejects = [Reject(stage="train", reason="r", source=str(p))
               for p in (inside, elsewhere, folder)] + [Reject(stage="train", reason="r")]
    shown = [r.source for r in public_rejects(rejects, str(folder))]
    assert shown == ["prefs/data/test.parquet", "x.jsonl", "prefs", None]
    one_file = [r.source for r in public_rejects(rejects[:1], str(inside))]
    assert one_file == ["test.parquet"]
    assert [r.source for r in public_rejects(rejects[:1], "me/prefs")] == ["test.parquet"]
