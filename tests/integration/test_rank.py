"""The ``rank`` stage: rankings per ranker, ties, ensemble, part-rejects, cache, resume, bad
input, and the CLI (a local typer app), on tiny real models and real run directories."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from grouppref.commands import rank as rank_cmd
from grouppref.errors import ConfigError, StageError
from grouppref.models.loading import ModelNotFoundError
from grouppref.pipeline.rank.config import STAGE_VERSION, RankConfig, load_rank_config
from grouppref.pipeline.rank.settings import parse_ranker_spec
from grouppref.pipeline.rank.stage import run_rank
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, CandidateGroup
from tests.support.factories import make_annotated, make_group, make_ranking


def write_generate(root: Path, groups: list[Any], record_type: type = CandidateGroup) -> RunStore:
    """A completed RUN/generate holding ``groups`` (the input of the rank stage)."""
    store = RunStore(root)
    stage = store.open_stage("generate", {"fixture": True}, input_fingerprint="fixture",
                             record_type=record_type)
    for shard in stage.pending_shards(groups, shard_size=len(groups)):
        stage.write_shard(shard, list(shard.items), [])
    stage.finish(inputs=len(groups))
    return store


def specs(*items: str, **extra: Any) -> RankConfig:
    return load_rank_config({"rankers": [parse_ranker_spec(s).model_dump() for s in items],
                             **extra}, "test")


GROUPS = [
    make_group(prompt_text="What is 2+3?", reference="5",
               texts=["It is 5.", "The answer is 6.", "5", "I am not sure."]),
    make_group(prompt_text="Capital of France?", reference="Paris",
               texts=["Final answer: Paris", "Lyon", "Final answer: Marseille"]),
    make_group(prompt_text="Say hi.", texts=["hi", "hello there"]),  # no reference
    make_group(prompt_text="What is 10/4?", reference="2.5",
               texts=["word " * 120 + "2.5", "The answer is 2.5", "3"]),  # one long candidate
]


def by_annotator(group: AnnotatedGroup) -> dict[str, Any]:
    return {r.annotator.id: r for r in group.rankings}


def test_rank_stage_end_to_end(tmp_path: Path, tiny_reward_model_dir: Path,
                               tiny_lm_dir: Path) -> None:
    store = write_generate(tmp_path, GROUPS)
    config = load_rank_config({
        "rankers": [
            {"kind": "reward", "model": str(tiny_reward_model_dir), "max_length": 100,
             "name": "rm"},
            parse_ranker_spec("verify").model_dump(),
            parse_ranker_spec(r"rule:regex=\d").model_dump(),
            {"kind": "judge", "model": str(tiny_lm_dir), "batch_size": 4},
            parse_ranker_spec("similarity").model_dump(),
        ],
        "ensemble": {"weights": {"rm": 1, "verify": 2}},
        "shard_size": 3,
    }, "test")
    stage = run_rank(store, config)
    c = stage.manifest.counts
    # skips: verify + similarity + ensemble on the group without reference (3); the long
    # candidate (>100 tokens) for the reward model and the ensemble that needs it (2); the
    # judge's prompt with that candidate fits its 512-token context
    assert (c.inputs, c.outputs, c.rejected, c.partial) == (4, 4, 0, 5)
    records = {g.group_id: g for g in stage.records()}
    assert list(records) == [g.group_id for g in GROUPS]  # every group out, in order
    ids = {"reward:rm", "rule:verify", r"rule:regex=\d", f"judge:{tiny_lm_dir}",
           "similarity:all-MiniLM-L6-v2", "ensemble"}
    first = by_annotator(records[GROUPS[0].group_id])
    assert set(first) == ids
    kinds = {a: r.annotator.kind for a, r in first.items()}
    assert kinds == {"reward:rm": "reward_model", "rule:verify": "rule",
                     r"rule:regex=\d": "rule", f"judge:{tiny_lm_dir}": "llm_judge",
                     "similarity:all-MiniLM-L6-v2": "rule", "ensemble": "rule"}
    g0 = GROUPS[0].candidate_ids()
    # verify: "It is 5." and "5" right (tie), the others wrong (tie); regex \d: digits or not
    assert first["rule:verify"].tiers == [[g0[0], g0[2]], [g0[1], g0[3]]]
    assert first[r"rule:regex=\d"].tiers == [[g0[0], g0[1], g0[2]], [g0[3]]]
    assert first["rule:verify"].scores == {g0[0]: 1.0, g0[1]: 0.0, g0[2]: 1.0, g0[3]: 0.0}
    # the ensemble: weighted mean of within-group z-scores, recomputed by hand
    ens = first["ensemble"].scores
    z = {}
    for key in ("reward:rm", "rule:verify"):
        s = first[key].scores
        m = sum(s.values()) / len(s)
        sd = math.sqrt(sum((v - m) ** 2 for v in s.values()) / len(s))
        z[key] = {cid: (v - m) / sd for cid, v in s.items()}
    for cid in g0:
        # float64 z-scores of a few values and a weighted mean, recomputed here in another order
        assert ens[cid] == pytest.approx((z["reward:rm"][cid] + 2 * z["rule:verify"][cid]) / 3,
                                         abs=1e-9)
    no_ref = by_annotator(records[GROUPS[2].group_id])
    assert set(no_ref) == {"reward:rm", r"rule:regex=\d", f"judge:{tiny_lm_dir}"}
    assert set(by_annotator(records[GROUPS[3].group_id])) == ids - {"reward:rm", "ensemble"}
    stats = stage.manifest.stats
    assert stats["skipped"] == 5 and stats["groups_without_rankings"] == 0
    assert stats["rankers"]["reward:rm"] == {"ranked": 3, "skipped": 1, "with_ties": 0}
    assert stats["rankers"]["rule:verify"]["skipped"] == 1
    assert stats["rankers"]["ensemble"] == {"ranked": 2, "skipped": 2, "with_ties": 0}
    reasons = [r.reason for r in stage.rejects() if r.group_id == GROUPS[3].group_id]
    assert any("more than max_length 100" in r for r in reasons)
    assert all(r.scope == "part" for r in stage.rejects())


def test_existing_rankings_kept_same_annotator_replaced(tmp_path: Path) -> None:
    g = make_group(prompt_text="2+2?", reference="4", texts=["4", "5", "four"])
    human = make_annotated(g, [[2, 1, 0]])  # annotator ann-1
    stale = make_ranking(g, [1, 0, 2], annotator="rule:verify", kind="rule")
    row = human.model_copy(update={"rankings": [human.rankings[0], stale]})
    store = write_generate(tmp_path, [row], record_type=AnnotatedGroup)
    (out,) = run_rank(store, specs("verify")).records()
    got = by_annotator(out)
    assert set(got) == {"ann-1", "rule:verify"}
    assert got["ann-1"] == human.rankings[0]
    ids = g.candidate_ids()
    assert got["rule:verify"].tiers == [[ids[0]], [ids[1], ids[2]]]  # recomputed, not stale


def test_cache_force_and_resume(tmp_path: Path) -> None:
    groups = [make_group(prompt_text=f"{i} + 1?", reference=str(i + 1),
                         texts=[str(i + 1), str(i + 2)]) for i in range(4)]
    store = write_generate(tmp_path, groups)
    config = specs("verify", shard_size=2)
    first = run_rank(store, config)
    assert not first.cached
    assert run_rank(store, config).cached
    assert not run_rank(store, config, StageContext(force=True)).cached
    # a run killed after its first shard: the shard on disk is kept, only the rest is computed
    records = first.records()
    partial = store.open_stage("rank", config, input_fingerprint=first.manifest.input_fingerprint,
                               record_type=AnnotatedGroup, stage_version=STAGE_VERSION, force=True)
    shard = next(partial.pending_shards(records, shard_size=2))
    marked = [g.model_copy(update={"rankings": []}) for g in shard.items]  # not what rank writes
    partial.write_shard(shard, marked, [])
    resumed = run_rank(store, config)
    assert not resumed.cached
    out = resumed.records()
    assert [len(g.rankings) for g in out] == [0, 0, 1, 1]
    assert resumed.manifest.counts.outputs == 4
    assert resumed.manifest.stats["rankers"]["rule:verify"]["ranked"] == 2


def test_invalid_input_row_is_rejected_with_reason(tmp_path: Path) -> None:
    good = make_group(prompt_text="ok?", reference="1", texts=["1", "2"])
    src = make_group(prompt_text="bad?", texts=["x", "y"])
    # written without validation, as a buggy upstream stage might: one candidate twice
    bad = CandidateGroup.model_construct(**{**dict(src), "candidates": [src.candidates[0]] * 2})
    stage = run_rank(write_generate(tmp_path, [good, bad]), specs("verify"))
    c = stage.manifest.counts
    assert (c.inputs, c.outputs, c.rejected, c.partial) == (2, 1, 1, 0)
    (reject,) = stage.rejects()
    assert (reject.row, reject.scope, reject.source) == (2, "row", "generate")
    assert "duplicate candidate id" in reject.reason


def test_bad_models_fail_before_any_work(tmp_path: Path, tiny_reward_model_dir: Path) -> None:
    store = write_generate(tmp_path, GROUPS[:1])
    with pytest.raises(ModelNotFoundError, match="nope"):
        run_rank(store, specs("verify", f"reward:{tmp_path / 'nope'}"))
    with pytest.raises(ModelNotFoundError):
        run_rank(store, specs("reward:not a/valid id"))
    with pytest.raises(ConfigError, match="not a causal LM"):
        run_rank(store, specs(f"judge:{tiny_reward_model_dir}"))
    assert not (tmp_path / "rank").exists()
    with pytest.raises(StageError, match="generate"):
        run_rank(RunStore(tmp_path / "empty"), specs("verify"))


@pytest.mark.parametrize("data,match", [
    ({"rankers": [{"kind": "rule", "checks": [{"check": "verify"}]}] * 2}, "appear twice"),
    ({"rankers": [{"kind": "rule", "checks": [{"check": "verify"}]}],
      "ensemble": {"weights": {"reward": 1}}}, "unknown rankers"),
    ({"rankers": [{"kind": "rule", "checks": [{"check": "verify"}]}],
      "ensemble": {"weights": {"verify": 0}}}, "must be > 0"),
    ({"rankers": [{"kind": "bogus"}]}, "rankers.0"),
    ({"rankers": [{"kind": "judge", "mode": "listwise"}]}, "mode"),
    ({"rankers": [{"kind": "reward", "model": "x", "temperature": 1}]}, "temperature"),
    ({"rankers": []}, "rankers"),
    ({"rankers": [{"kind": "rule", "checks": [{"check": "verify"}]}], "input_stage": "rank"},
     "input_stage"),
])
def test_rank_config_errors(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_rank_config(data, "test")


def test_cli_specs_config_file_and_errors(tmp_path: Path, tiny_lm_dir: Path) -> None:
    app = typer.Typer()
    rank_cmd.register(app)
    runner = CliRunner()
    groups = [make_group(prompt_text="1+1?", reference="2", texts=["2", "3"]),
              make_group(prompt_text="Hello?", texts=["Hello!", "Go away."])]
    run = tmp_path / "run"
    write_generate(run, groups)
    result = runner.invoke(app, [str(run), "--ranker", "verify", "--ranker",
                                 "rule:length=5;2*keywords=hello", "--ensemble", "verify=2,rule=1",
                                 "--tie-tolerance", "0.01"])
    assert result.exit_code == 0, result.output
    assert "2 in, 2 out, 0 rejected" in result.output
    assert "rule:verify: 1 ranked, 1 skipped" in result.output
    manifest = RunStore(run).manifest("rank")
    assert manifest.config["tie_tolerance"] == 0.01
    assert manifest.config["ensemble"]["weights"] == {"verify": 2.0, "rule": 1.0}

    config_file = tmp_path / "rank.yaml"
    config_file.write_text(yaml.safe_dump({"rank": {"rankers": [
        {"kind": "judge", "model": str(tiny_lm_dir), "mode": "pairwise", "name": "pj"}]}}))
    result = runner.invoke(app, [str(run), "--config", str(config_file), "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    (g, _) = RunStore(run).load_records("rank", AnnotatedGroup)
    assert [r.annotator.id for r in g.rankings] == ["judge:pj"]
    assert RunStore(run).manifest("rank").config["rankers"][0]["batch_size"] == 2

    bad = runner.invoke(app, [str(run), "--ranker", f"reward:{tmp_path / 'missing'}"])
    assert isinstance(bad.exception, ModelNotFoundError)
    # options override the file, the rankers too (the precedence of every command)
    both = runner.invoke(app, [str(run), "--config", str(config_file), "--ranker", "verify"])
    assert both.exit_code == 0, both.output
    assert [r["kind"] for r in RunStore(run).manifest("rank").config["rankers"]] == ["rule"]
    none = runner.invoke(app, [str(run)])
    assert isinstance(none.exception, ConfigError)
