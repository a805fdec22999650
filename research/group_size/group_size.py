"""Experiment 2: group size K at equal prompts and at equal annotation budget.

Same synthetic testbed as experiment 1 (:mod:`research.synthetic.synthetic`), panel of 3
annotators at flip rate 0.1. For K in ``--ks``:

* ``equal_prompts``: the same N prompts for every K (more candidates, more annotation);
* ``equal_budget``: N·K fixed (candidate rankings per annotator), so larger groups mean
  fewer prompts.

Methods: ``gspo_soft`` (all pairs, BT-weighted) and ``dpo_consensus`` (best vs worst of the
same group), equal steps and batch size (in groups). Metrics as in experiment 1.

    .venv/bin/python -m research.group_size.group_size
    .venv/bin/python -m research.group_size.group_size --quick
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from research import common as c

METHODS = ("dpo_consensus", "gspo_soft")
METRICS = ("pair_accuracy", "reward_gain", "kl")


def settings(quick: bool) -> dict[str, Any]:
    """Sizes of the full run and of ``--quick``."""
    if quick:
        return {"seeds": [0, 1], "ks": [2, 4], "prompts": 32, "budget": 128, "steps": [10],
                "condition": "noise=0.1", "eval_prompts": 16, "eval_samples": 2}
    return {"seeds": [0, 1, 2, 3, 4], "ks": [2, 4, 8, 16], "prompts": 128, "budget": 512,
            "steps": [50, 150], "condition": "noise=0.1", "eval_prompts": 96, "eval_samples": 8}


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Both methods for one (seed, setting, K)."""
    bed = c.Testbed(eval_prompts=job["eval_prompts"], eval_samples=job["eval_samples"])
    seed, k, setting = job["seed"], job["k"], job["setting"]
    n = job["prompts"] if setting == "equal_prompts" else job["budget"] // k
    task = c.make_task(bed, seed)
    groups = c.make_groups(task, n, k, seed)
    ranks = c.annotate(groups["reward"], c.panel(job["condition"]), seed)
    agg = c.aggregate(ranks)
    rows = []
    for method in METHODS:
        t0 = time.perf_counter()
        res = c.train_method(task, c.method_data(method, groups, agg, ranks), method,
                             job["steps"], seed)
        wall = time.perf_counter() - t0
        rows += [{"setting": setting, "k": k, "prompts": n, "seed": seed, "method": method,
                  "step": step, **m, "noise_estimate": agg["noise"], "wall_s": wall}
                 for step, m in res.items()]
    c.log(f"{setting} K={k} seed {seed} done")
    return rows


def summarise(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, Any]:
    """Mean ± std per (setting, K, step, method); gspo_soft − dpo_consensus paired CIs."""
    out: dict[str, Any] = {}
    for setting in ("equal_prompts", "equal_budget"):
        out[setting] = {}
        for k in cfg["ks"]:
            out[setting][str(k)] = {}
            for step in cfg["steps"]:
                at = {m: sorted((r for r in rows if (r["setting"], r["k"], r["step"], r["method"])
                                 == (setting, k, step, m)), key=lambda r: r["seed"]) for m in METHODS}
                out[setting][str(k)][str(step)] = {
                    "prompts": at[METHODS[0]][0]["prompts"],
                    "methods": {m: {x: c.mean_std([r[x] for r in at[m]]) for x in METRICS}
                                for m in METHODS},
                    "gspo_soft_minus_dpo": {x: c.paired_ci([r[x] for r in at["gspo_soft"]],
                                                           [r[x] for r in at["dpo_consensus"]])
                                            for x in METRICS}}
    return out


def table(summary: dict[str, Any], cfg: dict[str, Any], metric: str) -> str:
    """Markdown: rows setting x K, columns per length: each method and the paired difference."""
    cols = [f"{m} @ {s}" for s in cfg["steps"] for m in (*METHODS, "Δ soft−dpo [95% CI]")]
    lines = ["| setting | K | prompts | " + " | ".join(cols) + " |", "|" + "---|" * (3 + len(cols))]
    for setting, per_k in summary.items():
        for k, per_step in per_k.items():
            cells = []
            for s in cfg["steps"]:
                b = per_step[str(s)]
                cells += [f"{b['methods'][m][metric]['mean']:.3f} ± {b['methods'][m][metric]['std']:.3f}"
                          for m in METHODS]
                d = b["gspo_soft_minus_dpo"][metric]
                cells.append(f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]")
            lines.append(f"| {setting} | {k} | {per_step[str(cfg['steps'][0])]['prompts']} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], cfg: dict[str, Any], path: Path) -> None:
    """Pair accuracy and reward gain vs K (log2 axis) at the longest length, both settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = str(cfg["steps"][-1])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, ("pair_accuracy", "reward_gain"), strict=True):
        for setting, style in (("equal_prompts", "-"), ("equal_budget", "--")):
            for m in METHODS:
                ms = [summary[setting][str(k)][step]["methods"][m][metric] for k in cfg["ks"]]
                ax.errorbar(cfg["ks"], [d["mean"] for d in ms], yerr=[d["std"] for d in ms],
                            linestyle=style, marker="o", capsize=2, label=f"{m}, {setting}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(cfg["ks"], [str(k) for k in cfg["ks"]])
        ax.set_xlabel("group size K")
        ax.set_title(f"{metric} after {step} steps")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    c.save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = c.evidence_parser(__doc__, c.results_of(__file__), workers=2).parse_args(argv)
    cfg = settings(args.quick)
    # largest K first so the slow jobs do not end up alone at the tail of the pool
    jobs = [{**cfg, "seed": s, "k": k, "setting": st} for k in sorted(cfg["ks"], reverse=True)
            for st in ("equal_prompts", "equal_budget") for s in cfg["seeds"]]
    t0 = time.perf_counter()
    rows = c.pooled_rows(run_job, jobs, args.workers, c.job_cache("group_size", args.quick))
    summary = summarise(rows, cfg)
    name = "group_size_quick" if args.quick else "group_size"
    result = {"experiment": "group_size", "quick": args.quick, "settings": cfg,
              "testbed": vars(c.Testbed()), "methods": list(METHODS),
              "environment": c.environment(), "wall_s": time.perf_counter() - t0,
              "summary": summary, "runs": rows}
    c.write_json(args.out / f"{name}.json", result)
    tables = "\n\n".join(f"### {metric}\n\n" + table(summary, cfg, metric) for metric in METRICS)
    (args.out / f"{name}_tables.md").write_text(tables + "\n", encoding="utf-8")
    plot(summary, cfg, args.out / f"{name}.png")
    print(tables)
    c.log(f"wrote {args.out / name}.json in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
