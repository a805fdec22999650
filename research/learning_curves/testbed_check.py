"""Which testbed lets the policy learn the prompt-dependent part of the reward?

Pilot for issue 16: per testbed variant, one seed, noise-free panel, ``gspo_hard`` and
``dpo_consensus`` trained for ``--steps`` steps with evaluations along the way, against the
variant's prompt-independent ceiling. A variant *separates* when some method's held-out pair
accuracy clearly exceeds that ceiling.

    .venv/bin/python -m research.learning_curves.testbed_check --workers 2

Default plan: every variant on seed 0, the two rank-2 variants at lr 3e-4 also on seeds 1, 2.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from research import common as c

VARIANTS: dict[str, dict[str, Any]] = {
    "full_lr1e-3": {},
    "full_lr1e-4": {"lr": 1e-4},
    "rank2_lr1e-3": {"inter_rank": 2},
    "rank2_lr3e-4": {"inter_rank": 2, "lr": 3e-4},
    "rank2_inter2_lr3e-4": {"inter_rank": 2, "indep_weight": 0.5, "inter_weight": 1.5, "lr": 3e-4},
    "full_h128_lr3e-4": {"hidden": 128, "lr": 3e-4},
}


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    bed = c.Testbed(eval_prompts=job["eval_prompts"], eval_samples=job["eval_samples"],
                    batch_groups=job["batch"], **VARIANTS[job["variant"]])
    seed = job["seed"]
    t0 = time.perf_counter()
    task = c.make_task(bed, seed)
    groups = c.make_groups(task, job["prompts"], job["k"], seed)
    ranks = c.annotate(groups["reward"], c.panel("noise=0.0"), seed)
    agg = c.aggregate(ranks)
    ceiling = c.independent_ceiling(task)
    rows = []
    for method in job["methods"]:
        res = c.train_method(task, c.method_data(method, groups, agg, ranks), method,
                             job["steps"], seed)
        rows += [{"variant": job["variant"], "seed": seed, "method": method, "step": s, **m,
                  "independent_ceiling": ceiling} for s, m in res.items()]
    c.log(f"{job['variant']} seed {seed} done in {time.perf_counter() - t0:.0f} s")
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--more-seeds", type=int, nargs="*", default=[1, 2],
                    help="extra seeds for the rank-2 variants")
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--steps", type=int, nargs="+", default=[100, 250, 500, 1000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=c.results_of(__file__) / "testbed_check.json")
    args = ap.parse_args(argv)
    jobs = [{"variant": v, "seed": s, "prompts": args.prompts, "k": 4, "batch": 32,
             "steps": args.steps, "eval_prompts": 200, "eval_samples": 4,
             "methods": ["gspo_hard", "dpo_consensus"]}
            for v in args.variants
            for s in [*args.seeds, *(args.more_seeds if v.startswith("rank2_") and "1e-3" not in v else [])]]
    t0 = time.perf_counter()
    rows = c.pooled_rows(run_job, jobs, args.workers, c.job_cache("testbed_check", quick=False))
    for r in rows:
        print(f"{r['variant']:24s} s{r['seed']} {r['method']:14s} {r['step']:5d} "
              f"acc {r['pair_accuracy']:.3f} (ceiling {r['independent_ceiling']:.3f}) "
              f"gain {r['reward_gain']:.2f} kl {r['kl']:.2f}")
    c.write_json(args.out, {"variants": VARIANTS, "jobs": jobs, "rows": rows,
                            "wall_s": time.perf_counter() - t0, "environment": c.environment()})
    return rows


if __name__ == "__main__":
    main()
