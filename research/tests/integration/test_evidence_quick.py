"""Smoke tests of the evidence experiments' ``--quick`` modes (experiments 1 and 2).

They run the real scripts end to end (tiny LM, simulated panel, package aggregation and
losses) at toy sizes and check the shape and sanity of the results JSON, not the findings:
the full runs and their numbers are in research/synthetic/, research/group_size/ and
research/learning_curves/ (their README.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from research import common
from research.group_size import group_size
from research.learning_curves import curves
from research.learning_curves import curves_report as report
from research.synthetic import synthetic


@pytest.fixture(scope="module")
def synthetic_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("synthetic")
    return synthetic.main(["--quick", "--workers", "1", "--out", str(out)]), out


@pytest.fixture(scope="module")
def group_size_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("group_size")
    return group_size.main(["--quick", "--workers", "1", "--out", str(out)]), out


def _ok_ci(ci: dict) -> None:
    assert ci["n"] == 2
    assert ci["lo"] <= ci["mean"] <= ci["hi"]


def test_synthetic_files_and_structure(synthetic_result: tuple[dict, Path]) -> None:
    result, out = synthetic_result
    on_disk = json.loads((out / "synthetic_quick.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(result["summary"]))
    assert (out / "synthetic_quick.png").stat().st_size > 1000
    assert "| noise=0.1 | gspo_soft |" in (out / "synthetic_quick_tables.md").read_text()
    cfg = result["settings"]
    # one row per condition x seed x method x training length
    assert len(result["runs"]) == len(cfg["conditions"]) * len(cfg["seeds"]) * 5 * len(cfg["steps"])
    for cond in cfg["conditions"]:
        for step in cfg["steps"]:
            block = result["summary"][cond][str(step)]
            assert set(block["methods"]) == set(common.METHODS)
            assert set(block["vs_dpo_consensus"]) == set(common.METHODS) - {"dpo_consensus"}
            for m in common.METHODS:
                acc = block["methods"][m]["pair_accuracy"]
                assert 0.0 <= acc["mean"] <= 1.0 and acc["n"] == 2
                assert math.isfinite(block["methods"][m]["reward_gain"]["mean"])
                assert block["methods"][m]["kl"]["mean"] > 0  # the policy moved
            for d in block["vs_dpo_consensus"].values():
                _ok_ci(d["pair_accuracy"])


def test_synthetic_panel_and_noise(synthetic_result: tuple[dict, Path]) -> None:
    result, _ = synthetic_result
    runs = result["runs"]
    clean = next(r for r in runs if r["condition"] == "noise=0.1")
    # 3 annotators at flip rate 0.1: realised rates near 0.1, the estimate in a sane range
    assert all(0.0 <= f <= 0.25 for f in clean["realised_flip_rates"])
    assert 0.0 <= clean["noise_estimate"] <= 0.3
    adv = next(r for r in runs if r["condition"] == "adversarial")
    # panel: sim-1..3 (0.1), random, reversed: the reversed one votes against the truth always
    # a ratio of counts (all flipped): float64, a few operations: approx's default rel 1e-6 is ~1e9
    # eps64
    assert adv["realised_flip_rates"][4] == pytest.approx(1.0)
    assert adv["annotator_weights"][4] == 0.0  # and aggregation gives it no weight
    # the task is not solvable by a prompt-independent scorer
    assert 0.5 < clean["independent_ceiling"] < 1.0


def test_group_size_structure(group_size_result: tuple[dict, Path]) -> None:
    result, out = group_size_result
    assert (out / "group_size_quick.png").stat().st_size > 1000
    cfg = result["settings"]
    for k in cfg["ks"]:
        for step in cfg["steps"]:
            same = result["summary"]["equal_prompts"][str(k)][str(step)]
            budget = result["summary"]["equal_budget"][str(k)][str(step)]
            assert same["prompts"] == cfg["prompts"]
            assert budget["prompts"] == cfg["budget"] // k  # N * K fixed
            for block in (same, budget):
                for m in group_size.METHODS:
                    assert 0.0 <= block["methods"][m]["pair_accuracy"]["mean"] <= 1.0
                _ok_ci(block["gspo_soft_minus_dpo"]["pair_accuracy"])


@pytest.fixture(scope="module")
def curves_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("curves")
    return curves.main(["--quick", "--workers", "1", "--out", str(out)]), out


def test_curves_structure(curves_result: tuple[dict, Path]) -> None:
    result, out = curves_result
    cfg = result["settings"]
    for name in ("curves_quick.json", "curves_quick_tables.md", "curves_quick_k4_steps.png",
                 "curves_quick_k4_tokens.png", "curves_quick_group_size.png"):
        assert (out / name).stat().st_size > 500, name
    cell = result["summary"]["noise"]["4"]["noise=0.2"]
    last = str(cfg["steps"][-1])
    assert set(cell["steps"][last]["methods"]) == set(curves.METHODS)
    # equal tokens: DPO ran on to the group losses' token count at the last step
    tok = cell["tokens_per_step"]
    dpo_step = cell["steps"][last]["dpo_step_at_equal_tokens"]
    assert dpo_step == round(int(last) * tok["gspo_soft"] / tok["dpo_consensus"])
    # DPO stops at the step nearest the group losses' tokens: within one step's tokens (~1/steps, < 10%)
    assert cell["dpo_curve"][str(dpo_step)]["tokens"] == pytest.approx(
        int(last) * tok["gspo_soft"], rel=0.1)
    for m in set(curves.METHODS) - {"dpo_consensus"}:
        _ok_ci(cell["steps"][last]["equal_steps"][m]["pair_accuracy"])
    assert set(cell["steps"][last]["equal_tokens"]) == set(curves.METHODS) - set(curves.DPO)
    # calibrated targets fit the truth at least as well as the soft BT targets (log loss)
    assert cell["targets"]["cal"]["log_loss"]["mean"] <= cell["targets"]["soft"]["log_loss"]["mean"]
    assert cell["targets"]["hard"]["log_loss"]["mean"] > cell["targets"]["cal"]["log_loss"]["mean"]
    gs = result["summary"]["group_size"]
    assert gs["equal_budget"]["2"]["prompts"] == cfg["budget"] // 2
    assert gs["equal_prompts"]["2"]["prompts"] == cfg["prompts"]


def test_curves_collect_from_a_partial_cache(curves_result: tuple[dict, Path], tmp_path: Path) -> None:
    # two of the quick run's jobs finish into a cache; --collect reports on those, names the rest
    cfg = curves.settings(quick=True)
    jobs = curves.jobs_of(cfg)
    done = [j for j in jobs if j["experiment"] == "noise" and j["condition"] == "noise=0.2"]
    common.run_pool(curves.run_job, done, 1, tmp_path / "cache")
    part = curves.collect(cfg, jobs, tmp_path / "cache")
    assert part["settings"]["noise"] == {"4": {"seeds": [0, 1], "conditions": ["noise=0.2"]}}
    assert part["settings"]["group_size"]["equal_prompts"] == []
    assert len(part["missing_jobs"]) == len(jobs) - len(done)
    assert {(j["condition"], j["seed"]) for j in part["missing_jobs"]
            if j["experiment"] == "noise"} == {("adversarial", 0), ("adversarial", 1)}
    # same training as the full quick run: the collected rows carry its numbers
    full = {(r["seed"], r["method"], r["step"]): r["pair_accuracy"] for r in curves_result[0]["runs"]
            if r["condition"] == "noise=0.2"}
    assert {(r["seed"], r["method"], r["step"]): r["pair_accuracy"]
            # the same jobs rerun in another process pool (same seeds, same kernels, float32 tiny LM):
            # ~bit-identical; 1e-4 = MODEL_RTOL against the pool's thread count
            for r in part["runs"]} == pytest.approx(full, rel=1e-4)
    # the written JSON is packed and rounded; --replot from it gives the same tables
    out = tmp_path / "out"
    tables = report.write_outputs(part, out, "curves")
    written = json.loads((out / "curves.json").read_text(encoding="utf-8"))
    assert len(written["jobs"]) == len(done) and "targets" not in written["runs"][0]
    assert curves.main(["--replot", "--out", str(out)])["summary"]["noise"]["4"]["noise=0.2"]
    assert (out / "curves_tables.md").read_text(encoding="utf-8") == tables + "\n"
    assert (out / "curves_k4_steps.png").stat().st_size > 500
    # no group-size job finished: no group-size table or plot made of borrowed cells
    assert "Group size" not in tables and not (out / "curves_group_size.png").exists()


def test_posterior_targets_against_a_hand_computed_case() -> None:
    # one group, K = 3, two annotators with flip rates 0.1 and 0.2; a third slot unused
    ranks = torch.tensor([[[0, 1, 2], [1, 0, 2], [2, 1, 0]]])
    used = torch.tensor([[True, True, False]])
    flip = torch.tensor([[0.1, 0.2, 0.3]])
    p = common.posterior_targets(ranks, used, flip)
    l1, l2 = math.log(0.9 / 0.1), math.log(0.8 / 0.2)
    # float32 sigmoid vs float64 math: ~eps32 relative, inside approx's rel 1e-6 (~8 eps32)
    assert p[0, 0, 1].item() == pytest.approx(1 / (1 + math.exp(-(l1 - l2))))  # split vote
    assert p[0, 0, 2].item() == pytest.approx(1 / (1 + math.exp(-(l1 + l2))))  # both agree
    assert p[0, 2, 0].item() == pytest.approx(1 - p[0, 0, 2].item())
    assert p[0, 1, 1].item() == 0.5
