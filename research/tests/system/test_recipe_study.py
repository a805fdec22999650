"""The recipe study (research/ifeval_recipe/study.py) end to end on a tiny scale: three prompt
splits on disjoint topics, the package's own data stages, the learning-rate screen on val with
curve checkpoints, the seeds on test, TRL's DPOTrainer on the trl-pairs export as the peer, the
report's tables; and a restart that finds every task done and trains nothing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from research.ifeval_cpu import build as b
from research.ifeval_recipe import study
from research.ifeval_recipe.study_report import markdown


def test_three_splits_on_disjoint_topics_and_the_old_two_unchanged() -> None:
    train, test, val = b.build(60, 30, seed=0, held_out_topics=10, n_val=20, val_topics=8)
    topics = [{r["metadata"]["topic"] for r in rows} for rows in (train, test, val)]
    assert not (topics[0] & topics[1] or topics[0] & topics[2] or topics[1] & topics[2])
    assert sum(frozenset(r["metadata"]["kinds"].split("+")) in b.HELD_OUT_PAIRS
               for r in val) == len(val) // 2  # val is drawn like the test split
    old_train, old_test = b.build(60, 30, seed=0, held_out_topics=10)
    assert (old_train, old_test) == tuple(b.build(60, 30, seed=0, held_out_topics=10,
                                                  n_val=0, val_topics=0))
    with pytest.raises(ValueError, match="val_topics"):
        b.build(10, 5, seed=0, held_out_topics=4, n_val=3)


@pytest.mark.slow
def test_study_screens_chooses_a_rate_runs_seeds_and_resumes(tmp_path: Path, monkeypatch) -> None:
    # 12 prompts x 3 candidates of 12 tokens from the embedded model leave a few groups with
    # signal (the rest are coin flips), enough for 2 steps of 2 groups. Not the tiny random
    # Llama: its answers are noise, and in one full run under load every group was a coin flip
    tiny = replace(study.SCALES["smoke"], val=2, test=2, seeds=2, steps=2, curve=(1,),
                   lrs=(1e-3, 5e-3), samples=1)
    monkeypatch.setitem(study.SCALES, "smoke", tiny)
    # the screen's choice and the seeds' clean-up are tested on gspo_hard (two rates, two
    # seeds); the peer, whose runs cost as much, screens one rate of the grid for one seed
    # through a method's own "lrs" and "seeds" (as trl_dpo_all's): one TRL run instead of three
    peer = {**study.METHODS["trl_dpo"], "lrs": [tiny.lrs[0]], "seeds": 1}
    monkeypatch.setitem(study.METHODS, "trl_dpo", peer)
    runs = {"gspo_hard": (tiny.lrs, tiny.seeds), "trl_dpo": (peer["lrs"], 1)}
    args = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--scale", "smoke",
            "--threads", "1", "--methods", "gspo_hard,trl_dpo"]
    study.main(args)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    tasks = results["tasks"]
    for method, (lrs, seeds) in runs.items():
        assert results["chosen_lr"][method] in lrs
        for lr in lrs:
            name = f"{method}-lr{study.lr_tag(lr)}-seed0"
            assert f"eval:val:greedy:{name}" in tasks and f"eval:val:greedy:{name}@1" in tasks
        chosen = f"{method}-lr{study.lr_tag(results['chosen_lr'][method])}"
        for seed in range(seeds):
            got = tasks[f"eval:test:full:{chosen}-seed{seed}"]["per_prompt"]
            assert len(got) == 2 and all(len(p["s"]) == 1 for p in got)
        assert f"eval:test:full:{chosen}-seed{seeds}" not in tasks
        assert tasks[f"train:{chosen}-seed0"]["tokens_at"]["1"] > 0
    assert not any(k.startswith(f"train:trl_dpo-lr{study.lr_tag(tiny.lrs[1])}") for k in tasks)
    # the peer trained on the export a TRL user reads, one best-vs-worst pair per group
    assert tasks[f"train:trl_dpo-lr{study.lr_tag(tiny.lrs[0])}-seed0"]["pairs_in_data"] >= 1
    assert "| gspo_hard |" in markdown(results) and "trl_dpo" in markdown(results)
    before = (tmp_path / "out" / "results.json").read_text()
    study.main(args)  # a restart: every task is in results.json
    assert json.loads((tmp_path / "out" / "results.json").read_text())["tasks"] == \
        json.loads(before)["tasks"]
    # grown by a seed and sampled answers: the finished tasks stay, seed 2 trains, and the
    # sampled evaluation runs where a model is on disk (seed 0 kept, seed 2 new; seed 1 gone)
    study.main([*args, "--seeds", "3", "--samples", "2", "--methods", "gspo_hard"])
    grown = json.loads((tmp_path / "out" / "results.json").read_text())
    changed = [k for k, v in json.loads(before)["tasks"].items() if grown["tasks"].get(k) != v]
    assert changed == []
    chosen = f"gspo_hard-lr{study.lr_tag(results['chosen_lr']['gspo_hard'])}"
    assert f"eval:test:full:{chosen}-seed2" in grown["tasks"]
    sampled = {k for k in grown["tasks"] if k.startswith("eval:test:sampled:")}
    assert sampled == {f"eval:test:sampled:{chosen}-seed{s}" for s in (0, 2)} | {
        "eval:test:sampled:base"}
    assert all(len(p["s"]) == 2 for p in grown["tasks"][f"eval:test:sampled:{chosen}-seed2"]
               ["per_prompt"])
    assert "| gspo_hard | 0.001 | 3 |" in markdown(grown) or "| gspo_hard | 0.005 | 3 |" in \
        markdown(grown)
