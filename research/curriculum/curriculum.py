"""Experiment 10 (research/curriculum/README.md): a human-to-automatic curriculum against an
all-mixed sampler and human labels only, at the same steps.

Per seed, on the separating testbed of experiment 6 (``curves.TESTBED``: rank-2 prompt x
response interaction carrying 9/10 of the reward variance, batches of 32 groups, Adam at a
constant 3e-4, K = 4 reference samples per prompt):

* ``human`` groups: ``human_prompts`` prompts ranked by a panel of 3 simulated annotators
  with flip rate ``human_flip`` (kind ``simulated``: human for ``--mix``);
* ``auto`` groups: ``auto_prompts`` other prompts ranked by one automatic ranker with flip
  rate ``auto_flip`` (the simulator's Mallows model, standing in for a noisy reward model);
* each source aggregated by the package's own math (:func:`common.aggregate`: reliability,
  Bradley-Terry ``p_ij`` / ``w_ij``), trained with the gspo loss (soft targets).

Methods (batches drawn by the package's :class:`grouppref.train.policy.mix_sampler.MixSampler`, same seed):

* ``curriculum``: ``human=0.8,auto=0.2 -> human=0,auto=1`` (linear over the run);
* ``all_mixed``: constant shares equal to the data's proportions;
* ``human_only``: ``human=1``;
* ``auto_only``: ``auto=1`` (what the humans add at all).

Each method runs ``steps`` updates and is evaluated at ``evals`` (the curriculum's schedule
spans the whole run, so only the last evaluation compares finished schedules): held-out
pair accuracy of the implicit reward against the truth, true-reward gain of policy samples in
reference-std units. Differences are paired by seed (same task, data, labels) with Student-t
95% intervals.

    nice -n 19 .venv/bin/python -m research.curriculum.curriculum --workers 2 [--regime equal_use]
    .venv/bin/python -m research.curriculum.curriculum --quick      # smoke test (seconds)
    .venv/bin/python -m research.curriculum.curriculum --replot     # tables/plot from the JSON
    .venv/bin/python -m research.curriculum.curriculum --collect    # the same from the seeds
                                                                    # finished in the cache
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from grouppref.api import MixConfig, MixSampler, Objective, run_steps
from research import common as c
from research.learning_curves.curves import TESTBED

METHODS = ("curriculum", "all_mixed", "human_only", "auto_only")
BASELINE = "all_mixed"
METRICS = ("pair_accuracy", "reward_gain")


REGIMES = {"few_human": (200, 1800), "equal_use": (800, 1200)}  # human, auto prompts


def settings(quick: bool, regime: str = "few_human") -> dict[str, Any]:
    """Sizes of the full run (``regime``: ``few_human``, 10% human groups, so the curriculum
    draws human groups 4x as often as the all-mixed sampler; ``equal_use``, 40% human, the
    curriculum's mean human share, so both use the same amount of human labels and differ
    only in their order) and of ``--quick``."""
    if quick:
        return {"quick": True, "testbed": {**TESTBED, "batch_groups": 8}, "human_prompts": 8,
                "auto_prompts": 24, "human_flip": 0.05, "auto_flip": 0.3, "steps": 6,
                "evals": [3, 6], "eval_prompts": 16, "eval_samples": 2, "seeds": [0, 1]}
    human, auto = REGIMES[regime]
    return {"quick": False, "testbed": TESTBED, "human_prompts": human, "auto_prompts": auto,
            "human_flip": 0.05, "auto_flip": 0.3, "steps": 500, "evals": [100, 250, 500],
            "eval_prompts": 300, "eval_samples": 4, "seeds": [0, 1, 2, 3, 4]}


def schedule(method: str, n_human: int, n_auto: int) -> str:
    """The ``--mix`` schedule of each method."""
    share = round(n_human / (n_human + n_auto), 6)
    return {"curriculum": "human=0.8,auto=0.2 -> human=0,auto=1",
            "all_mixed": f"human={share},auto={round(1 - share, 6)}",
            "human_only": "human=1", "auto_only": "auto=1"}[method]


def labelled(task: c.Task, cfg: dict[str, Any], seed: int
             ) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """Training data of both sources (gspo_soft targets), the source of each group, and the
    realised flip rates against the truth."""
    nh, na = cfg["human_prompts"], cfg["auto_prompts"]
    groups = c.make_groups(task, nh + na, 4, seed)
    human_panel = c.panel(f"noise={cfg['human_flip']}")
    auto_panel = c.panel(f"noise={cfg['auto_flip']}")[:1]
    parts, flips = [], {}
    for name, rows, specs in (("human", slice(0, nh), human_panel), ("auto", slice(nh, nh + na), auto_panel)):
        part = {k: v[rows] for k, v in groups.items()}
        ranks = c.annotate(part["reward"], specs, seed + (0 if name == "human" else 7))
        agg = c.aggregate(ranks)
        parts.append(c.method_data("gspo_soft", part, agg, ranks))
        flips[name] = c.realised_flip_rates(ranks, part["reward"])
        flips[f"{name}_consensus_accuracy"] = consensus_accuracy(agg["order"], part["reward"])
    data = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return data, ["human"] * nh + ["auto"] * na, flips


def consensus_accuracy(order: torch.Tensor, reward: torch.Tensor) -> float:
    """Share of pairs with distinct true rewards that the consensus order puts right."""
    k = reward.shape[1]
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(k).expand_as(order).clone())
    dr = reward[:, :, None] - reward[:, None, :]
    upper = torch.ones(k, k, dtype=torch.bool).triu(1) & (dr != 0)
    right = (rank[:, :, None] < rank[:, None, :]) == (dr > 0)
    return float(right[upper].float().mean())


def train_mix(task: c.Task, data: dict[str, Any], sources: list[str], mix: str,
              cfg: dict[str, Any], seed: int) -> tuple[dict[int, dict[str, float]], list[float]]:
    """Train a fresh copy of the reference on batches drawn by the package's sampler;
    evaluations at ``cfg['evals']`` and the realised human share of every batch."""
    model = copy.deepcopy(task.ref)
    for prm in model.parameters():
        prm.requires_grad_(True)
    opt = torch.optim.Adam(model.parameters(), lr=task.bed.lr)
    sampler = MixSampler(MixConfig(schedule=mix), sources, batch_size=task.bed.batch_groups,
                         total_steps=cfg["steps"], seed=50_000 + seed)
    picked = [sampler.batch(g) for g in range(cfg["steps"])]
    shares = [sum(sources[i] == "human" for i in b) / len(b) for b in picked]
    batches = (c.batch_of(data, torch.tensor(b)) for b in picked)
    out: dict[int, dict[str, float]] = {}

    def after(step: int, *_: Any) -> None:
        if step in cfg["evals"]:
            out[step] = c.evaluate(model, task)

    run_steps(model, opt, batches, Objective(loss="gspo", beta=task.bed.beta), after_step=after)
    return out, shares


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One (seed, method): its own copy of the seed's task and labels (deterministic)."""
    t0 = time.perf_counter()
    cfg, seed, method = job["cfg"], job["seed"], job["method"]
    bed = c.Testbed(eval_prompts=cfg["eval_prompts"], eval_samples=cfg["eval_samples"],
                    **cfg["testbed"])
    task = c.make_task(bed, seed)
    data, sources, flips = labelled(task, cfg, seed)
    mix = schedule(method, cfg["human_prompts"], cfg["auto_prompts"])
    res, shares = train_mix(task, data, sources, mix, cfg, seed)
    c.log(f"seed {seed} {method} done in {time.perf_counter() - t0:.0f} s "
          f"(load {os.getloadavg()[0]:.1f})")
    return [{"seed": seed, "method": method, "mix": mix, "step": step, **metrics,
             "human_share_realised": sum(shares[:step]) / step, "labels": flips,
             "independent_ceiling": c.independent_ceiling(task),
             "wall_s": time.perf_counter() - t0} for step, metrics in res.items()]


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per (method, step): mean ± std over seeds; Δ against all_mixed (paired, 95% CI)."""
    rows = result["runs"]
    out: dict[str, Any] = {}
    for method in METHODS:
        for step in result["settings"]["evals"]:
            mine = sorted((r for r in rows if r["method"] == method and r["step"] == step),
                          key=lambda r: r["seed"])
            base = sorted((r for r in rows if r["method"] == BASELINE and r["step"] == step),
                          key=lambda r: r["seed"])
            if not mine:
                continue
            cell = {m: c.mean_std([r[m] for r in mine]) for m in METRICS}
            cell |= {f"delta_{m}": c.paired_ci([r[m] for r in mine], [r[m] for r in base])
                     for m in METRICS}
            cell["human_share"] = c.mean_std([r["human_share_realised"] for r in mine])
            out.setdefault(method, {})[str(step)] = cell
    return out


def table(result: dict[str, Any]) -> str:
    """Markdown table of the last evaluation (and the middle one) per method."""
    summ = summary(result)
    lines = ["| method | step | human share (realised) | pair accuracy | Δ vs all_mixed [95% CI] "
             "| reward gain | Δ vs all_mixed [95% CI] |", "|---|---|---|---|---|---|---|"]
    for method in METHODS:
        for step, cell in summ.get(method, {}).items():
            cols = [method, step, f"{cell['human_share']['mean']:.3f}"]
            for m in METRICS:
                d = cell[f"delta_{m}"]
                cols += [f"{cell[m]['mean']:.3f} ± {cell[m]['std']:.3f}",
                         "—" if method == BASELINE else
                         f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"]
            lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Held-out pair accuracy and reward gain against steps, mean ± 95% CI over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, METRICS, strict=True):
        for method in METHODS:
            steps = result["settings"]["evals"]
            vals = [[r[metric] for r in result["runs"] if r["method"] == method and r["step"] == s]
                    for s in steps]
            mean = [sum(v) / len(v) for v in vals]
            half = [stats.sem(v) * stats.t.ppf(0.975, len(v) - 1) if len(v) > 1 else 0.0
                    for v in vals]
            ax.errorbar(steps, mean, yerr=half, marker="o", capsize=3, label=method)
        ax.set_xlabel("optimizer steps")
        ax.set_ylabel(metric.replace("_", " "))
        ax.grid(alpha=0.3)
    axes[0].legend()
    cfg = result["settings"]
    fig.suptitle(f"{cfg['human_prompts']} human + {cfg['auto_prompts']} automatic groups: "
                 "mean, 95% CI over seeds")
    c.save_figure(fig, path)


def write_outputs(result: dict[str, Any], out: Path, name: str) -> str:
    c.write_json(out / f"{name}.json", result)
    text = table(result)
    (out / f"{name}_table.md").write_text(text + "\n", encoding="utf-8")
    plot(result, out / f"{name}.png")
    return text


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = c.evidence_parser(__doc__, c.results_of(__file__), "JSON, table, plot", workers=2)
    ap.add_argument("--regime", choices=tuple(REGIMES), default="few_human",
                    help="human / automatic groups: 200 / 1800 or 800 / 1200")
    ap.add_argument("--replot", action="store_true", help="redo table and plot from the JSON")
    ap.add_argument("--collect", action="store_true", help="table and plot from the seeds "
                    "whose every method finished in the cache (trains nothing)")
    args = ap.parse_args(argv)
    cfg = settings(args.quick, args.regime)
    name = "curriculum_quick" if args.quick else f"curriculum_{args.regime}"
    if args.replot:
        result = json.loads((args.out / f"{name}.json").read_text(encoding="utf-8"))
        print(write_outputs(result, args.out, name))
        return result
    jobs = [{"cfg": cfg, "seed": s, "method": m} for s in cfg["seeds"] for m in METHODS]
    cache = c.job_cache("curriculum", args.quick)
    load0, t0 = os.getloadavg(), time.perf_counter()
    if args.collect and cache is not None:
        done = [j for j in jobs if c.cache_path(cache, j).exists()]
        seeds = [s for s in cfg["seeds"] if sum(j["seed"] == s for j in done) == len(METHODS)]
        cfg = {**cfg, "seeds": seeds}
        jobs = [j for j in done if j["seed"] in seeds]
    rows = c.pooled_rows(run_job, jobs, args.workers, cache)
    result = {"experiment": "curriculum", "settings": cfg, "methods": list(METHODS),
              "testbed": {**vars(c.Testbed()), **cfg["testbed"]}, "environment": c.environment(),
              "wall_s": time.perf_counter() - t0, "workers": args.workers,
              "training_s": sum({(r["seed"], r["method"]): r["wall_s"] for r in rows}.values()),
              "load_average_start": load0, "load_average_end": os.getloadavg(),
              "collected_from_cache": args.collect, "summary": None, "runs": rows}
    if args.collect:  # nothing was timed
        result |= {"wall_s": None, "training_s": None}
    result["summary"] = summary(result)
    print(write_outputs(result, args.out, name))
    c.log(f"wrote {args.out / name}.json" + ("" if args.collect else
                                             f" in {result['wall_s']:.0f} s"))
    return result


if __name__ == "__main__":
    main()
