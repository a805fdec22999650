"""Experiment 1: group losses vs DPO on a synthetic task with a known true reward.

Per seed: one hidden reward, one tiny reference LM, ``--prompts`` training prompts with K
reference samples each, ranked by a simulated panel (3 annotators at flip rate 0 / 0.1 / 0.2
/ 0.3 / 0.4, or an adversarial panel: 3 at 0.1 + one random + one reversed). Five methods
train from the same initialisation, on the same prompts, for the same number of steps, with
the same batch order:

* ``dpo_one``: DPO on annotator sim-1's best vs worst candidate;
* ``dpo_consensus``: DPO on the consensus best vs worst;
* ``gspo_hard``: all consensus pairs, p = 1, w = 1;
* ``gspo_soft``: all pairs with the BT ``p_ij`` and confidence ``w_ij`` of aggregation;
* ``plackett_luce``: the consensus order.

Metrics on held-out prompts after each training length: pair accuracy of the implicit reward
against the truth, the policy's true-reward gain over the reference (reference-sample reward
std units), and KL(policy || reference).

    .venv/bin/python -m research.synthetic.synthetic            # full (about 12 CPU-minutes)
    .venv/bin/python -m research.synthetic.synthetic --quick    # smoke test (seconds)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from research import common as c

CONDITIONS = ("noise=0.0", "noise=0.1", "noise=0.2", "noise=0.3", "noise=0.4", "adversarial")
METRICS = ("pair_accuracy", "reward_gain", "kl")


def settings(quick: bool) -> dict[str, Any]:
    """Sizes of the full run and of ``--quick``."""
    if quick:
        return {"seeds": [0, 1], "prompts": 48, "k": 4, "steps": [6, 12],
                "conditions": ["noise=0.1", "adversarial"], "eval_prompts": 16, "eval_samples": 2}
    return {"seeds": [0, 1, 2, 3, 4], "prompts": 384, "k": 4, "steps": [40, 120],
            "conditions": list(CONDITIONS), "eval_prompts": 96, "eval_samples": 8}


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """All methods of one (condition, seed): the data is shared, so results are paired."""
    bed = c.Testbed(eval_prompts=job["eval_prompts"], eval_samples=job["eval_samples"])
    seed, cond = job["seed"], job["condition"]
    task = c.make_task(bed, seed)
    groups = c.make_groups(task, job["prompts"], job["k"], seed)
    ranks = c.annotate(groups["reward"], c.panel(cond), seed)
    agg = c.aggregate(ranks)
    flips = c.realised_flip_rates(ranks, groups["reward"])
    rows = []
    for method in c.METHODS:
        t0 = time.perf_counter()
        res = c.train_method(task, c.method_data(method, groups, agg, ranks), method,
                             job["steps"], seed)
        wall = time.perf_counter() - t0
        for step, metrics in res.items():
            rows.append({"condition": cond, "seed": seed, "method": method, "step": step,
                         **metrics, "noise_estimate": agg["noise"], "realised_flip_rates": flips,
                         "annotator_weights": agg["weights"], "wall_s": wall,
                         "independent_ceiling": c.independent_ceiling(task)})
    c.log(f"{cond} seed {seed} done")
    return rows


def summarise(rows: list[dict[str, Any]], conditions: list[str], steps: list[int],
              baseline: str = "dpo_consensus") -> dict[str, Any]:
    """Mean ± std per (condition, step, method) and paired differences vs ``baseline``."""
    out: dict[str, Any] = {}
    for cond in conditions:
        out[cond] = {}
        sel = [r for r in rows if r["condition"] == cond]
        first = [r for r in sel if r["method"] == baseline and r["step"] == steps[0]]
        known = [r["noise_estimate"] for r in first if r["noise_estimate"] is not None]
        # None: aggregation dropped every annotator as unreliable, so there is no estimate
        out[cond]["noise_estimate"] = {**(c.mean_std(known) if known else {"mean": None}),
                                       "seeds_without_estimate": len(first) - len(known)}
        out[cond]["realised_flip_rate"] = c.mean_std(
            [sum(r["realised_flip_rates"]) / len(r["realised_flip_rates"]) for r in first])
        for step in steps:
            at = {m: sorted((r for r in sel if r["step"] == step and r["method"] == m),
                            key=lambda r: r["seed"]) for m in c.METHODS}
            block: dict[str, Any] = {"methods": {}, "vs_" + baseline: {}}
            for m in c.METHODS:
                block["methods"][m] = {k: c.mean_std([r[k] for r in at[m]]) for k in METRICS}
                if m != baseline:
                    block["vs_" + baseline][m] = {
                        k: c.paired_ci([r[k] for r in at[m]], [r[k] for r in at[baseline]])
                        for k in METRICS}
            out[cond][str(step)] = block
    return out


def robustness(rows: list[dict[str, Any]], conditions: list[str], steps: list[int],
               clean: str = "noise=0.0") -> dict[str, Any]:
    """Per method and length, the paired change of each noisy condition against ``clean``
    (same seeds, so same task and candidates), in % of the clean mean."""
    at = {(r["condition"], r["seed"], r["method"], r["step"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    out: dict[str, Any] = {}
    for cond in (x for x in conditions if x != clean):
        for m in c.METHODS:
            for step in steps:
                for metric in ("pair_accuracy", "reward_gain"):
                    a = [at[(cond, s, m, step)][metric] for s in seeds]
                    b = [at[(clean, s, m, step)][metric] for s in seeds]
                    ci, base = c.paired_ci(a, b), sum(b) / len(b)
                    out.setdefault(cond, {}).setdefault(m, {}).setdefault(str(step), {})[metric] = {
                        k: 100 * ci[k] / base for k in ("mean", "lo", "hi")}
    return out


def robustness_table(rob: dict[str, Any], steps: list[int]) -> str:
    head = "| condition | method | " + " | ".join(
        f"{m} @ {s} steps" for s in steps for m in ("pair_accuracy", "reward_gain")) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(steps))]
    for cond, per in rob.items():
        for m, by_step in per.items():
            cells = [f"{by_step[str(s)][x]['mean']:+.1f}% [{by_step[str(s)][x]['lo']:+.1f}, "
                     f"{by_step[str(s)][x]['hi']:+.1f}]" for s in steps
                     for x in ("pair_accuracy", "reward_gain")]
            lines.append(f"| {cond} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(summary: dict[str, Any], conditions: list[str], steps: list[int], metric: str,
          baseline: str = "dpo_consensus") -> str:
    """A markdown table: rows condition x method, columns the training lengths."""
    head = "| condition | method | " + " | ".join(
        f"{metric} @ {s} steps | Δ vs {baseline} [95% CI]" for s in steps) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(steps))]
    for cond in conditions:
        for m in c.METHODS:
            cells = []
            for s in steps:
                b = summary[cond][str(s)]
                ms = b["methods"][m][metric]
                cells.append(f"{ms['mean']:.3f} ± {ms['std']:.3f}")
                if m == baseline:
                    cells.append("—")
                else:
                    d = b["vs_" + baseline][m][metric]
                    cells.append(f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]")
            lines.append(f"| {cond} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], conditions: list[str], steps: list[int], path: Path) -> None:
    """Pair accuracy and reward gain vs condition, one line per method, one column per length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(steps), figsize=(5.5 * len(steps), 7), squeeze=False)
    x = list(range(len(conditions)))
    for col, s in enumerate(steps):
        for row, metric in enumerate(("pair_accuracy", "reward_gain")):
            ax = axes[row][col]
            for i, m in enumerate(c.METHODS):
                ms = [summary[cond][str(s)]["methods"][m][metric] for cond in conditions]
                ax.errorbar([v + (i - 2) * 0.06 for v in x], [d["mean"] for d in ms],
                            yerr=[d["std"] for d in ms], marker="o", capsize=2, label=m)
            ax.set_xticks(x, [cond.replace("noise=", "f=") for cond in conditions], fontsize=8)
            ax.set_title(f"{metric} after {s} steps")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    c.save_figure(fig, path)


def plot_frontier(summary: dict[str, Any], conditions: list[str], steps: list[int], path: Path) -> None:
    """True-reward gain against KL(policy || reference), one panel per condition: each method's
    path from the reference (0, 0) through its training lengths (means over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(conditions), figsize=(3.3 * len(conditions), 3.4), squeeze=False)
    for ax, cond in zip(axes[0], conditions, strict=True):
        for m in c.METHODS:
            ms = [summary[cond][str(s)]["methods"][m] for s in steps]
            ax.plot([0] + [d["kl"]["mean"] for d in ms], [0] + [d["reward_gain"]["mean"] for d in ms],
                    marker="o", label=m)
        ax.set_title(cond, fontsize=9)
        ax.set_xlabel("KL (nats)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("true-reward gain (ref. std)")
    axes[0][0].legend(fontsize=7)
    c.save_figure(fig, path)


def write_outputs(result: dict[str, Any], out: Path, name: str) -> str:
    """JSON, markdown tables and plots of one run; returns the tables."""
    cfg, summary = result["settings"], result["summary"]
    c.write_json(out / f"{name}.json", result)
    tables = "\n\n".join(f"### {metric}\n\n" + table(summary, cfg["conditions"], cfg["steps"], metric)
                         for metric in METRICS)
    if "noise=0.0" in cfg["conditions"]:
        result["robustness"] = robustness(result["runs"], cfg["conditions"], cfg["steps"])
        tables += ("\n\n### change against noise=0.0 (paired by seed, % of the clean mean, 95% CI)\n\n"
                   + robustness_table(result["robustness"], cfg["steps"]))
        c.write_json(out / f"{name}.json", result)
    (out / f"{name}_tables.md").write_text(tables + "\n", encoding="utf-8")
    plot(summary, cfg["conditions"], cfg["steps"], out / f"{name}.png")
    plot_frontier(summary, cfg["conditions"], cfg["steps"], out / f"{name}_frontier.png")
    return tables


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = c.evidence_parser(__doc__, c.results_of(__file__), workers=2)
    ap.add_argument("--replot", action="store_true", help="redo tables and plots from the JSON")
    args = ap.parse_args(argv)
    cfg = settings(args.quick)
    name = "synthetic_quick" if args.quick else "synthetic"
    if args.replot:
        result = json.loads((args.out / f"{name}.json").read_text(encoding="utf-8"))
        result["summary"] = summarise(result["runs"], cfg["conditions"], cfg["steps"])
        print(write_outputs(result, args.out, name))
        return result
    shared = {k: v for k, v in cfg.items() if k not in ("seeds", "conditions")}
    jobs = [{**shared, "seed": s, "condition": cond} for cond in cfg["conditions"] for s in cfg["seeds"]]
    t0 = time.perf_counter()
    rows = c.pooled_rows(run_job, jobs, args.workers, c.job_cache("synthetic", args.quick))
    summary = summarise(rows, cfg["conditions"], cfg["steps"])
    result = {"experiment": "synthetic", "quick": args.quick, "settings": cfg,
              "testbed": vars(c.Testbed()), "methods": list(c.METHODS),
              "environment": c.environment(), "wall_s": time.perf_counter() - t0,
              "summary": summary, "runs": rows}
    print(write_outputs(result, args.out, name))
    c.log(f"wrote {args.out / name}.json in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
