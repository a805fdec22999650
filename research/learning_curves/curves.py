"""Experiments 1 and 2 at a separating scale: learning curves at equal steps and equal tokens.

The short runs of ``synthetic.py`` / ``group_size.py`` (issue 8) left every method at the
prompt-independent ceiling of pair accuracy, so they could not separate the methods (issue
16). This experiment changes the testbed so that the prompt-dependent part of the reward is
learnable, and trains long enough to see it learnt:

* **reward**: the prompt x response interaction ``M`` has rank 2 (``M = A Bᵀ/√2``, a prompt
  acts through a 2-d "topic"), and carries 9/10 of the per-token reward variance
  (``r = (1/L) Σ_t [0.5·u[y_t] + 1.5·(1/√P) Σ_s M[x_s, y_t]]``), so the best
  prompt-independent scorer orders only ~64-68% of held-out pairs right;
* **scale**: 2,000 training prompts, 500 held-out, batches of 32 groups, Adam lr 3e-4,
  1,000 steps, evaluations at 100, 250, 500, 750 and 1,000 steps;
* **equal compute**: a step forwards ``32·(P + K_m·L)`` tokens (the prompt once per group,
  prefix sharing), ``K_m = 2`` for DPO and ``K`` for the group losses; ``dpo_consensus``
  runs on to the token count of the group losses' 1,000 steps (1,750 steps at K = 4, 3,250 at
  K = 8), evaluated at the same token counts as they are.

Methods: those of experiment 1 plus ``gspo_cal``, the soft loss with *calibrated* targets
(:func:`common.posterior_targets`: the posterior that ``i`` beats ``j`` given the votes and
the estimated flip rates) and the same BT pair weights ``w_ij`` as ``gspo_soft``.

Jobs (one per K, condition, seed, cached under ``$TMPDIR/grouppref-evidence/curves``):

* ``noise``: K = 4 (seeds 0-4) and K = 8 (seeds 0-2), conditions noise 0-0.4 and adversarial;
* ``group_size`` (noise 0.1, seeds 0-2): K = 2 and 16 at 2,000 prompts (equal prompts; K = 4
  and 8 come from ``noise``) and N·K = 8,000 (equal annotation budget: K = 2, 8, 16 with
  4,000, 1,000, 500 prompts).

    .venv/bin/python -m research.learning_curves.curves --workers 2      # full (hours of CPU)
    .venv/bin/python -m research.learning_curves.curves --quick          # smoke test (seconds)
    .venv/bin/python -m research.learning_curves.curves --replot         # tables/plots from the JSON
    .venv/bin/python -m research.learning_curves.curves --collect        # the same from the finished
                                                                    # cached jobs (a partial run)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from research import common as c
from research.learning_curves import curves_report as report
from research.learning_curves.curves_spec import DPO, METHODS

CONDITIONS = ("noise=0.0", "noise=0.1", "noise=0.2", "noise=0.3", "noise=0.4", "adversarial")
TESTBED = {"inter_rank": 2, "indep_weight": 0.5, "inter_weight": 1.5, "lr": 3e-4,
           "batch_groups": 32}


def settings(quick: bool) -> dict[str, Any]:
    """Sizes of the full run and of ``--quick``."""
    if quick:
        return {"quick": True, "testbed": {**TESTBED, "batch_groups": 8}, "prompts": 48,
                "budget": 192, "steps": [4, 8], "eval_prompts": 16, "eval_samples": 2,
                "noise": {"4": {"seeds": [0, 1], "conditions": ["noise=0.2", "adversarial"]}},
                "group_size": {"seeds": [0, 1], "equal_prompts": [2], "equal_budget": [2]}}
    return {"quick": False, "testbed": TESTBED, "prompts": 2000, "budget": 8000,
            "steps": [100, 250, 500, 750, 1000], "eval_prompts": 500, "eval_samples": 4,
            "noise": {"4": {"seeds": [0, 1, 2, 3, 4], "conditions": list(CONDITIONS)},
                      "8": {"seeds": [0, 1, 2], "conditions": list(CONDITIONS)}},
            "group_size": {"seeds": [0, 1, 2], "equal_prompts": [2, 16],
                           "equal_budget": [2, 8, 16]}}


def tokens_per_step(bed: c.Testbed, k: int) -> int:
    """Tokens forwarded per training step: the prompt once per group plus ``k`` responses."""
    return bed.batch_groups * (bed.prompt_len + k * bed.resp_len)


def jobs_of(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (experiment, setting, K, condition, seed) job; the slow ones (large K) first."""
    base = {k: cfg[k] for k in ("testbed", "steps", "eval_prompts", "eval_samples")}
    jobs = []
    for k, spec in cfg["noise"].items():
        methods = list(METHODS) if k == "4" else [m for m in METHODS if m != "dpo_one"]
        jobs += [{**base, "experiment": "noise", "setting": "equal_prompts", "k": int(k),
                  "prompts": cfg["prompts"], "condition": cond, "seed": s, "methods": methods,
                  "extend": ["dpo_consensus"]}
                 for cond in spec["conditions"] for s in spec["seeds"]]
    gs = cfg["group_size"]
    methods = ["dpo_consensus", "gspo_soft", "gspo_cal"]
    for setting in ("equal_prompts", "equal_budget"):
        for k in gs[setting]:
            n = cfg["prompts"] if setting == "equal_prompts" else cfg["budget"] // k
            jobs += [{**base, "experiment": "group_size", "setting": setting, "k": k,
                      "prompts": n, "condition": "noise=0.1", "seed": s, "methods": methods,
                      "extend": ["dpo_consensus"] if setting == "equal_prompts" else []}
                     for s in gs["seeds"]]
    # experiment 1 first (K = 4, then 8); then the group-size jobs, largest K first
    return sorted(jobs, key=lambda j: (j["experiment"] != "noise",
                                       j["k"] if j["experiment"] == "noise" else -j["k"]))


def method_steps(job: dict[str, Any], bed: c.Testbed, method: str) -> list[int]:
    """Evaluation steps: the common ones, plus for an extended DPO method the steps at which
    it has forwarded as many tokens as the group losses at each common step."""
    steps = set(job["steps"])
    if method in job["extend"] and method in DPO and job["k"] > 2:
        ratio = tokens_per_step(bed, job["k"]) / tokens_per_step(bed, 2)
        steps |= {round(s * ratio) for s in job["steps"]}
    return sorted(steps)


def target_stats(agg: dict[str, Any], reward: torch.Tensor) -> dict[str, Any]:
    """How each method's pair targets match the truth on the training groups: log loss and
    Brier score over pairs with distinct true rewards, and the mean target of the consensus
    best over worst."""
    k = reward.shape[1]
    y = (reward[:, :, None] > reward[:, None, :]).double()
    mask = (reward[:, :, None] != reward[:, None, :]) & torch.ones(k, k, dtype=torch.bool).triu(1)
    rows = torch.arange(reward.shape[0])
    best, worst = agg["order"][:, 0], agg["order"][:, -1]
    out = {}
    for name, p in (("soft", agg["p"]), ("cal", agg["cal_p"]), ("hard", agg["hard_p"])):
        q = p.double().clamp(1e-6, 1 - 1e-6)
        out[name] = {"log_loss": float(-(y * q.log() + (1 - y) * (1 - q).log())[mask].mean()),
                     "brier": float(((q - y) ** 2)[mask].mean()),
                     "p_best_worst": float(p[rows, best, worst].mean())}
    return out


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """All methods of one (setting, K, condition, seed): shared data, so results are paired."""
    t0 = time.perf_counter()
    bed = c.Testbed(eval_prompts=job["eval_prompts"], eval_samples=job["eval_samples"],
                    **job["testbed"])
    seed, k = job["seed"], job["k"]
    task = c.make_task(bed, seed)
    groups = c.make_groups(task, job["prompts"], k, seed)
    ranks = c.annotate(groups["reward"], c.panel(job["condition"]), seed)
    agg = c.aggregate(ranks)
    common = {key: job[key] for key in ("experiment", "setting", "k", "prompts", "condition", "seed")}
    common |= {"noise_estimate": agg["noise"], "annotator_weights": agg["weights"],
               "realised_flip_rates": c.realised_flip_rates(ranks, groups["reward"]),
               "independent_ceiling": c.independent_ceiling(task),
               "targets": target_stats(agg, groups["reward"])}
    rows = []
    for method in job["methods"]:
        t1 = time.perf_counter()
        res = c.train_method(task, c.method_data(method, groups, agg, ranks), method,
                             method_steps(job, bed, method), seed)
        wall = time.perf_counter() - t1
        per_step = tokens_per_step(bed, 2 if method in DPO else k)
        rows += [{**common, "method": method, "step": step, "tokens": step * per_step,
                  **metrics, "wall_s": wall} for step, metrics in res.items()]
    c.log(f"{job['experiment']} {job['setting']} K={k} {job['condition']} seed {seed} done "
          f"in {time.perf_counter() - t0:.0f} s (load {os.getloadavg()[0]:.1f})")
    return rows


def collect(cfg: dict[str, Any], jobs: list[dict[str, Any]], cache: Path) -> dict[str, Any]:
    """The result from the jobs already in ``cache`` (nothing is trained): ``settings`` keeps
    only the K, conditions and seeds that finished, ``missing_jobs`` names the others."""
    done = [j for j in jobs if c.cache_path(cache, j).exists()]
    rows = [r for j in done for r in json.loads(c.cache_path(cache, j).read_text(encoding="utf-8"))]
    cfg = json.loads(json.dumps(cfg))
    noise = [j for j in done if j["experiment"] == "noise"]
    cfg["noise"] = {k: {"seeds": sorted({j["seed"] for j in noise if j["k"] == int(k)}),
                        "conditions": [cond for cond in spec["conditions"]
                                       if any(j["k"] == int(k) and j["condition"] == cond for j in noise)]}
                    for k, spec in cfg["noise"].items() if any(j["k"] == int(k) for j in noise)}
    gs = [j for j in done if j["experiment"] == "group_size"]
    for setting in ("equal_prompts", "equal_budget"):
        cfg["group_size"][setting] = sorted({j["k"] for j in gs if j["setting"] == setting})
    missing = [{key: j[key] for key in ("experiment", "setting", "k", "condition", "seed")}
               for j in jobs if j not in done]
    return {"experiment": "curves", "settings": cfg, "methods": list(METHODS),
            "testbed": {**vars(c.Testbed()), **cfg["testbed"]}, "environment": c.environment(),
            "collected_from_cache": True, "missing_jobs": missing,
            "training_s": report.training_seconds(rows), "runs": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = c.evidence_parser(__doc__, c.results_of(__file__), workers=2)
    ap.add_argument("--replot", action="store_true", help="redo tables and plots from the JSON")
    ap.add_argument("--only", choices=("noise", "group_size"), help="run one experiment's jobs")
    ap.add_argument("--collect", action="store_true",
                    help="tables and plots from the finished jobs in the cache (trains nothing)")
    args = ap.parse_args(argv)
    cfg = settings(args.quick)
    name = "curves_quick" if args.quick else "curves"
    if args.replot:
        result = json.loads((args.out / f"{name}.json").read_text(encoding="utf-8"))
        print(report.write_outputs(result, args.out, name))
        return result
    jobs = [j for j in jobs_of(cfg) if args.only in (None, j["experiment"])]
    cache = c.job_cache("curves", args.quick)
    if args.collect and cache is not None:
        result = collect(cfg, jobs, cache)
        print(report.write_outputs(result, args.out, name))
        c.log(f"collected {len(result['runs'])} rows; {len(result['missing_jobs'])} jobs not run")
        return result
    load0, t0 = os.getloadavg(), time.perf_counter()
    rows = c.pooled_rows(run_job, jobs, args.workers, cache)
    result = {"experiment": "curves", "settings": cfg, "methods": list(METHODS),
              "testbed": {**vars(c.Testbed()), **cfg["testbed"]}, "environment": c.environment(),
              "wall_s": time.perf_counter() - t0, "workers": args.workers,
              "training_s": report.training_seconds(rows),
              "load_average_start": load0, "load_average_end": os.getloadavg(), "runs": rows}
    print(report.write_outputs(result, args.out, name))
    c.log(f"wrote {args.out / name}.json in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
