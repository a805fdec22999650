"""``grouppref sweep`` (docs/sweep.md): the group-size subsampling, the search space syntax, and
sweeps end to end on the 2-layer tiny Llama (tests/conftest.py): a grid over k and lr with a
``best.yaml`` that ``train --config`` reads, a failing trial recorded, resume after a stop and a
kill, and two worker processes on one PostgreSQL study (tests/argilla_fixtures.py's cluster).

The data: 4-candidate groups with a strict consensus (c0 > c1 > c2 > c3, "sunny" ones first),
pair targets p = 1 for every pair, 16 training and 8 held-out groups.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from grouppref.cli import app
from grouppref.errors import ConfigError
from grouppref.schemas import (
    Agreement,
    Annotator,
    Candidate,
    CandidateSource,
    PairPreference,
    Prompt,
    Ranking,
    ValidatedGroup,
    make_candidate_id,
    make_group_id,
)
from grouppref.sweep.config import SweepConfig, parse_dimension
from grouppref.sweep.subsample import subsample_group
from tests.support.paths import REPO

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
WORDS = ["apple", "river", "stone", "cloud", "green", "table", "music", "light", "paper", "horse"]
ROOT = REPO


def ranked_group(i: int, split: str, k: int = 4, seed: int = 0) -> ValidatedGroup:
    """Group i with k candidates in a strict order c0 > c1 > ...; a second, partial ranking
    names only the last two."""
    rng = random.Random(f"{seed}:{i}")
    prompt = Prompt(prompt_id=f"p{i}", text=f"Describe the {rng.choice(WORDS)} number {i}.")
    gid = make_group_id(prompt)
    words = rng.sample(WORDS, k)
    texts = [f"{'sunny' if j < k // 2 else 'rainy'} {words[j]}" for j in range(k)]
    cands = [Candidate(candidate_id=make_candidate_id(gid, t), text=t,
                       source=CandidateSource(kind="model", model="synthetic")) for t in texts]
    ids = [c.candidate_id for c in cands]
    pairs = [PairPreference(winner=ids[a], loser=ids[b], p=1.0, weight=1.0 - 0.1 * (b - a - 1),
                            votes_for=1.0) for a in range(k) for b in range(a + 1, k)]
    rankings = [Ranking(annotator=Annotator(id="rule", kind="rule"), group_id=gid,
                        tiers=[[c] for c in ids], scores={c: float(k - j) for j, c in enumerate(ids)}),
                Ranking(annotator=Annotator(id="ann", kind="human"), group_id=gid,
                        tiers=[[ids[-2]], [ids[-1]]])]
    return ValidatedGroup(group_id=gid, prompt=prompt, candidates=cands, rankings=rankings,
                          consensus=[[c] for c in ids],
                          strengths={c: float(k - j) for j, c in enumerate(ids)}, pairs=pairs,
                          agreement=Agreement(num_annotators=2), split=split)


# -- subsampling ------------------------------------------------------------------------------
def test_subsample_keeps_the_ranking_restricted_to_the_kept_candidates() -> None:
    group = ranked_group(0, "train", k=6)
    order = group.candidate_ids()  # best first
    sub = subsample_group(group, 3, seed=7)
    kept = sub.candidate_ids()
    assert len(kept) == 3 and set(kept) <= set(order)
    assert kept == [c for c in order if c in kept]  # candidates keep their order
    assert sub.consensus == [[c] for c in order if c in kept]  # the order restricted
    assert set(sub.strengths) == set(kept)
    assert all(sub.strengths[c] == group.strengths[c] for c in kept)
    want = {(p.winner, p.loser): (p.p, p.weight) for p in group.pairs
            if p.winner in kept and p.loser in kept}
    assert {(p.winner, p.loser): (p.p, p.weight) for p in sub.pairs} == want and len(want) == 3
    rule = next(r for r in sub.rankings if r.annotator.id == "rule")
    assert rule.tiers == [[c] for c in order if c in kept] and set(rule.scores) == set(kept)
    partial = set(order[-2:])  # the human ranking names two: kept only when both are
    assert any(r.annotator.id == "ann" for r in sub.rankings) == (partial <= set(kept))
    assert sub.group_id == group.group_id and sub.prompt == group.prompt


def test_subsample_is_seeded_and_k2_is_a_pair() -> None:
    group = ranked_group(1, "train", k=8)
    assert subsample_group(group, 4, 3) == subsample_group(group, 4, 3)
    assert len({tuple(subsample_group(group, 4, s).candidate_ids()) for s in range(10)}) > 1
    pair = subsample_group(group, 2, 5)
    assert pair.k == 2 and len(pair.pairs) == 1 and len(pair.consensus) == 2
    assert pair.pairs[0].winner == pair.consensus[0][0]
    assert subsample_group(group, 8, 0) is group and subsample_group(group, 12, 0) is group
    with pytest.raises(ValueError, match="at least 2"):
        subsample_group(group, 1, 0)


# -- the search space -------------------------------------------------------------------------
def test_search_space_syntax() -> None:
    assert parse_dimension("k", "2,4,8").choices == (2, 4, 8)
    assert parse_dimension("lr", "1e-5,5e-5").choices == (1e-5, 5e-5)
    assert parse_dimension("loss", ["gspo", "dpo"]).choices == ("gspo", "dpo")
    d = parse_dimension("lr", "loguniform:1e-6:1e-4")
    assert (d.kind, d.low, d.high) == ("loguniform", 1e-6, 1e-4)
    assert parse_dimension("data.max_response_length", "int:8:64").kind == "int"
    for key, spec, message in [("k", "1,2", "group sizes"), ("foo", "1", "unknown key"),
                               ("data.nope", "1", "unknown key"), ("lr", "uniform:2:1", "LOW"),
                               ("k", "2,2", "twice")]:
        with pytest.raises(ValueError, match=message):
            parse_dimension(key, spec)
    with pytest.raises(ValueError, match="grid sampler takes lists"):
        SweepConfig(params={"lr": "loguniform:1e-6:1e-4"})
    with pytest.raises(ValueError, match="needs amount"):
        SweepConfig(budget="tokens")
    assert SweepConfig(params={"k": "2,3", "lr": "1,2"}).total_trials() == 4
    assert SweepConfig(sampler="tpe", params={"lr": "uniform:0:1"}).total_trials() == 10


# -- end to end on the tiny model ---------------------------------------------------------------
def _dataset(tmp_path: Path) -> Path:
    import datasets

    from grouppref.schemas import to_dataset

    path = tmp_path / "ds"
    datasets.DatasetDict({
        "train": to_dataset([ranked_group(i, "train") for i in range(16)], ValidatedGroup),
        "test": to_dataset([ranked_group(100 + i, "test") for i in range(8)], ValidatedGroup),
    }).save_to_disk(str(path))
    return path


def _base(tmp_path: Path, tiny_lm_dir: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({
        "model": str(tiny_lm_dir), "batch_size": 4, "beta": 0.5, "logging_steps": 1,
        "data": {"chat_template": False, "max_response_length": 8}}))
    return path


def _sweep_args(data: Path, out: Path, base: Path, *extra: str) -> list[str]:
    return ["sweep", str(data), "--out", str(out), "--train-config", str(base),
            "--param", "k=2,3", "--param", "lr=1e-3,5e-3", "--amount", "3", "--evals", "1",
            "--pruner", "none", *extra]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_grid_sweep_over_k_and_lr_writes_a_best_yaml_train_reads(
        tiny_lm_dir: Path, tmp_path: Path) -> None:
    data, base, out = _dataset(tmp_path), _base(tmp_path, tiny_lm_dir), tmp_path / "sweep"
    result = CliRunner().invoke(app, _sweep_args(data, out, base, "--seeds", "2"))
    assert result.exit_code == 0, result.output
    summary = _summary(out)
    assert [t["state"] for t in summary["trials"]] == ["complete"] * 4
    assert sorted((t["params"]["k"], t["params"]["lr"]) for t in summary["trials"]) == [
        (2, 1e-3), (2, 5e-3), (3, 1e-3), (3, 5e-3)]
    assert summary["budget"] == "steps" and summary["amount"] == 3
    for t in summary["trials"]:
        assert t["steps"] == 3 and len(t["seed_values"]) == 2 and t["reads"] == 16 * t["params"]["k"]
    settings = summary["settings"]
    assert len(settings) == 4 and all(s["n"] == 2 and s["low"] <= s["mean"] <= s["high"]
                                      for s in settings)
    assert settings[0]["mean"] == max(s["mean"] for s in settings)
    assert summary["best"] == settings[0]["params"]
    for name in ("summary.md", "sweep.png", "best.yaml", "study.db"):
        assert (out / name).exists(), name
    assert not (out / "trials" / "0000" / "seed-0" / "model.safetensors").exists()
    assert (out / "trials" / "0000" / "seed-0" / "metrics.json").exists()
    assert "equal optimizer steps" in (out / "summary.md").read_text()
    assert "sweep" in result.stdout and "best: " in result.stdout
    assert "trial 3 finished (4 of 4)" in result.stderr and "best so far" in result.stderr
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["lr"] == summary["best"]["lr"] and "k" not in best
    trained = CliRunner().invoke(app, ["train", str(data), "--config", str(out / "best.yaml"),
                                       "--max-steps", "1", "--out", str(tmp_path / "long")])
    assert trained.exit_code == 0, trained.output
    card = json.loads((tmp_path / "long" / "metrics.json").read_text())
    assert card["steps"] == 1


def test_a_failing_trial_is_recorded_and_the_sweep_goes_on(
        tiny_lm_dir: Path, tmp_path: Path) -> None:
    data, base, out = _dataset(tmp_path), _base(tmp_path, tiny_lm_dir), tmp_path / "sweep"
    result = CliRunner().invoke(app, [
        "sweep", str(data), "--out", str(out), "--train-config", str(base), "--param",
        "loss=dpo", "--param", "pair_targets=soft,hard", "--amount", "2", "--evals", "1",
        "--budget", "tokens", "--amount", "200"])
    assert result.exit_code == 0, result.output
    trials = {t["params"]["pair_targets"]: t for t in _summary(out)["trials"]}
    assert trials["soft"]["state"] == "complete" and trials["hard"]["state"] == "failed"
    assert "pair_targets 'hard' applies to loss 'gspo'" in trials["hard"]["error"]
    assert "\n" not in trials["hard"]["error"]
    assert trials["soft"]["steps"] >= 1 and trials["soft"]["tokens"] > 0
    assert "failed: ConfigError" in result.stderr
    assert "trial 1 failed" in result.stdout or "trial 0 failed" in result.stdout


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from grouppref.cli import main; main()", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1"}


def test_resume_after_a_stop_and_a_kill(tiny_lm_dir: Path, tmp_path: Path) -> None:
    data, base, out = _dataset(tmp_path), _base(tmp_path, tiny_lm_dir), tmp_path / "sweep"
    args = _sweep_args(data, out, base)
    first = CliRunner().invoke(app, [*args, "--max-trials", "1"])
    assert first.exit_code == 0, first.output
    assert [t["state"] for t in _summary(out)["trials"]] == ["complete"]
    done_at = (out / "trials" / "0000" / "seed-0" / "metrics.json").stat().st_mtime_ns
    # a second worker, killed while its trial trains (its metrics log has started)
    proc = subprocess.Popen(_cli(*args), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    log = out / "trials" / "0001" / "seed-0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not log.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert log.exists()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "trial 1 was interrupted: queued again" in again.stderr
    trials = _summary(out)["trials"]
    assert [t["state"] for t in trials] == ["complete", "interrupted", "complete", "complete",
                                            "complete"]
    assert trials[2]["params"] == trials[1]["params"]  # the killed setting, run again
    complete = [tuple(sorted(t["params"].items())) for t in trials if t["state"] == "complete"]
    assert len(set(complete)) == 4  # every grid point once: trial 0 was not run again
    assert (out / "trials" / "0000" / "seed-0" / "metrics.json").stat().st_mtime_ns == done_at
    rerun = CliRunner().invoke(app, args)  # nothing left: the table again, no training
    assert rerun.exit_code == 0 and "4 of 4 trials done" in rerun.stderr
    assert ") started:" not in rerun.stderr


def test_two_workers_share_one_postgresql_study(
        tiny_lm_dir: Path, tmp_path: Path, argilla_postgres_url: str) -> None:
    import psycopg

    data, base = _dataset(tmp_path), _base(tmp_path, tiny_lm_dir)
    with psycopg.connect(argilla_postgres_url, autocommit=True) as db:  # a database of its own
        db.execute("DROP DATABASE IF EXISTS sweep")
        db.execute("CREATE DATABASE sweep")
    url = argilla_postgres_url.rsplit("/", 1)[0] + "/sweep"
    workers = [subprocess.Popen(
        _cli(*_sweep_args(data, tmp_path / f"worker{i}", base, "--storage", url,
                          "--study", "shared")),
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    for w, (stdout, stderr) in zip(workers, outputs, strict=True):
        assert w.returncode == 0, stderr
        assert url.split("@")[0].split(":")[-1] not in stdout + stderr  # no password shown
    ran = [len(list((tmp_path / f"worker{i}" / "trials").glob("*"))) for i in range(2)]
    assert all(n >= 1 for n in ran), ran  # both workers trained
    # each worker's summary is the study as it stood when that worker stopped (the other's
    # last trial may still have been running); the same command once more, with every grid
    # point done, trains nothing and writes the whole study's summary
    again = CliRunner().invoke(app, _sweep_args(data, tmp_path / "final", base, "--storage", url,
                                                "--study", "shared"))  # in this process
    assert again.exit_code == 0, again.output
    assert not (tmp_path / "final" / "trials").exists() or not any(
        (tmp_path / "final" / "trials").iterdir())  # nothing trained again
    last = _summary(tmp_path / "final")
    complete = [tuple(sorted(t["params"].items())) for t in last["trials"]
                if t["state"] == "complete"]
    assert len(complete) == 4 and len(set(complete)) == 4, complete  # each grid point once
    assert sum(ran) == 4  # a grid point drawn twice (a race) is skipped, not trained
    assert {t["state"] for t in last["trials"]} <= {"complete", "duplicate"}
    assert last["storage"].startswith("postgresql://***@")


def test_a_bad_storage_url_is_one_line(tmp_path: Path) -> None:
    from grouppref.sweep.engine import Sweep

    sweep = Sweep(SweepConfig(storage="postgresql://u:secret@127.0.0.1:1/x"), [], "f", tmp_path)
    with pytest.raises(ConfigError, match="cannot open the study") as e:
        sweep.open_study()
    assert "secret" not in str(e.value)


def test_sweep_stage_of_a_run_in_inspect_and_the_report(tiny_lm_dir: Path, tmp_path: Path) -> None:
    from grouppref.pipeline.report.stage import run_report
    from grouppref.runs.store import RunStore, Shard

    groups = [ranked_group(i, "train") for i in range(12)] + [
        ranked_group(100 + i, "test") for i in range(6)]
    store = RunStore(tmp_path / "run")
    stage = store.open_stage("validate", {"test": True}, input_fingerprint="synthetic",
                             record_type=ValidatedGroup)
    stage.write_shard(Shard(index=0, start=0, items=groups), groups, [])
    stage.finish(inputs=len(groups))
    base = _base(tmp_path, tiny_lm_dir)
    args = ["sweep", str(store.root), "--train-config", str(base), "--param", "k=2,3",
            "--amount", "2", "--evals", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = store.require("sweep")
    assert manifest.status == "complete" and manifest.inputs == {
        "validate": store.require("validate").output_fingerprint}
    assert (store.stage_dir("sweep") / "best.yaml").exists()
    again = CliRunner().invoke(app, args)  # cached: same settings, same RUN/validate
    assert again.exit_code == 0 and "unchanged settings and input" in again.stderr
    assert ") started:" not in again.stderr and "best: " in again.stdout
    shown = CliRunner().invoke(app, ["inspect", str(store.root)])
    assert shown.exit_code == 0 and "sweep" in shown.stdout
    page = Path(run_report(store).outputs["html"]).read_text()
    assert "Sweep: group size and recipe" in page and "equal optimizer steps" in page
    assert "data:image/png;base64," in page


def test_the_run_step_starts_from_the_runs_train_section() -> None:
    from grouppref.runner import RunConfig, stage_sections, with_run_defaults
    from grouppref.stages import NAMES, stage_named

    config = RunConfig.model_validate({
        "run_dir": "r", "validate": {"source": "ds"}, "train": {"lr": 1e-3, "loss": "dpo"},
        "sweep": {"params": {"k": [2, 4]}, "budget": "annotation", "amount": 64}})
    sweep = stage_named("sweep")
    [section] = stage_sections(with_run_defaults(config), sweep)
    assert section.train.lr == 1e-3 and section.train.loss == "dpo"
    assert NAMES.index("sweep") == NAMES.index("train") - 1
    own = RunConfig.model_validate({"run_dir": "r", "validate": {"source": "ds"},
                                    "train": {"lr": 1e-3}, "sweep": {"train": {"lr": 2e-3}}})
    assert stage_sections(with_run_defaults(own), sweep)[0].train.lr == 2e-3


def test_the_median_pruner_stops_a_trial_behind_the_median(
        tiny_lm_dir: Path, tmp_path: Path) -> None:
    data, base, out = _dataset(tmp_path), _base(tmp_path, tiny_lm_dir), tmp_path / "sweep"
    # sampler seed 1 draws lr 5e-3 first (checked below); lr 1e-9 leaves the rewards near 0,
    # held-out accuracy near 0.5, below trial 0's at the same evaluation
    result = CliRunner().invoke(app, [
        "sweep", str(data), "--out", str(out), "--train-config", str(base), "--param",
        "lr=5e-3,1e-9", "--amount", "6", "--evals", "3", "--startup-trials", "1",
        "--seed", "1"])
    assert result.exit_code == 0, result.output
    first, second = _summary(out)["trials"]
    assert first["params"]["lr"] == 5e-3 and first["state"] == "complete"
    assert second["state"] == "pruned" and second["last_intermediate"] < first["value"]
    assert second["value"] is None and "trial 1 pruned" in result.stdout
    metrics = (out / "trials" / "0001" / "seed-1" / "metrics.jsonl").read_text().splitlines()
    assert max(json.loads(x)["step"] for x in metrics) < 6  # stopped before its last step


def test_budgets_of_equal_annotation_cost_and_equal_tokens(tiny_lm_dir: Path) -> None:
    from grouppref.sweep.engine import plan_seed
    from grouppref.train.settings.policy import TrainConfig

    groups = [ranked_group(i, "train") for i in range(16)] + [ranked_group(100, "test")]
    config = TrainConfig(model=str(tiny_lm_dir), batch_size=2, epochs=2,
                         data={"chat_template": False})
    pairs = plan_seed(groups, config, 2, 0, "annotation", 20)
    fours = plan_seed(groups, config, 4, 0, "annotation", 20)
    assert (pairs.train_groups, pairs.reads, pairs.steps) == (10, 20, 10)  # 2 epochs of 5
    assert (fours.train_groups, fours.reads, fours.steps) == (5, 20, 6)  # 2 epochs of 3
    assert len(pairs.groups) == 11 and pairs.groups[-1].k == 4  # held-out groups stay whole
    assert plan_seed(groups, config, 2, 0, "annotation", 20).groups == pairs.groups  # seeded
    small, large = (plan_seed(groups, config, k, 0, "tokens", 2000) for k in (2, 4))
    assert small.steps > large.steps  # fewer tokens per group: more steps for the same tokens
    for plan in (small, large):
        assert abs(plan.tokens - 2000) < 2000 / plan.steps  # within one step of the budget
    with pytest.raises(ConfigError, match="buys no group"):
        plan_seed(groups, config, 4, 0, "annotation", 3)


def test_a_sweep_whose_every_trial_fails_is_an_error(tiny_lm_dir: Path, tmp_path: Path) -> None:
    from grouppref.errors import StageError

    data, base, out = _dataset(tmp_path), _base(tmp_path, tiny_lm_dir), tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", str(data), "--out", str(out), "--train-config",
                                      str(base), "--param", "loss=dpo,lipo", "--param",
                                      "pair_targets=hard"])
    assert isinstance(result.exception, StageError)  # one line and exit code 2 from the CLI
    message = str(result.exception)
    assert "every trial failed (2)" in message and "applies to loss 'gspo'" in message
    assert [t["state"] for t in _summary(out)["trials"]] == ["failed", "failed"]
