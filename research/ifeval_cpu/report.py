"""Tables (markdown) and the learning-curve plot of an IFEval experiment's ``results.json``
(:mod:`research.ifeval_cpu.experiment`).

Rates are instruction-level (the share of a prompt's constraints met, averaged over prompts)
and prompt-level ("all met"), for the greedy answer and averaged over the S samples. Intervals
(95%): over seeds, a t-interval of the per-seed means (needs >= 2 seeds); over prompts, a
normal interval of the per-prompt values averaged over seeds; the change against the untrained
model is paired by prompt.

    python -m research.ifeval_cpu.report runs/ifeval-exp/results.json [--png curve.png]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from research.common.intervals import T975, half_width, mean
from research.ifeval_cpu.build import HELD_OUT_PAIRS

METRICS = ("greedy", "greedy_all", "sampled", "sampled_all", "kl")
def prompt_values(p: dict[str, Any]) -> dict[str, float]:
    """One prompt's rates from its compact result (``g``, ``s``, ``kl``); with no samples
    (greedy only), the KL is the one along the greedy answer (``kl_g``)."""
    return {"greedy": mean(p["g"]), "greedy_all": float(all(p["g"])),
            "sampled": mean([mean(s) for s in p["s"]]),
            "sampled_all": mean([float(all(s)) for s in p["s"]]),
            "kl": mean(p["kl"]) if p["kl"] else p.get("kl_g", float("nan"))}


def run_summary(run: dict[str, Any]) -> dict[str, float]:
    """A run's rates: means over prompts."""
    values = [prompt_values(p) for p in run["per_prompt"]]
    return {m: mean([v[m] for v in values]) for m in METRICS}


def final_runs(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per method, its runs at the full step count (the untrained model as ``base``)."""
    steps = results["scale_settings"]["steps"]
    out: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        if run["method"] == "base" or run["steps"] == steps:
            out.setdefault(run["method"], []).append(run)
    return out


def method_stats(runs: list[dict[str, Any]], base: dict[str, Any] | None) -> dict[str, Any]:
    """Mean, seed interval, prompt interval and paired change vs ``base`` of every metric."""
    per_seed = [run_summary(r) for r in runs]
    per_prompt = [[prompt_values(p) for p in r["per_prompt"]] for r in runs]
    n = len(per_prompt[0])
    stats: dict[str, Any] = {"seeds": len(runs)}
    base_values = [prompt_values(p) for p in base["per_prompt"]] if base else None
    for m in METRICS:
        seed_means = [s[m] for s in per_seed]
        by_prompt = [mean([pp[i][m] for pp in per_prompt]) for i in range(n)]
        stats[m] = {"mean": mean(seed_means),
                    "seed_ci": half_width(seed_means, T975.get(len(runs) - 1, 1.96)),
                    "prompt_ci": half_width(by_prompt, 1.96)}
        if base_values is not None:
            diff = [by_prompt[i] - base_values[i][m] for i in range(n)]
            stats[m]["delta"] = mean(diff)
            stats[m]["delta_ci"] = half_width(diff, 1.96)
    stats["tokens_trained"] = mean([float(r["tokens_trained"]) for r in runs])
    return stats


def by_kind(results: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per constraint type: (greedy, sampled) share met, over prompts that ask for it and seeds."""
    acc: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        for prompt, p in zip(results["prompts"], run["per_prompt"], strict=True):
            for i, kind in enumerate(prompt["kinds"]):
                acc.setdefault(kind, []).append((p["g"][i], mean([s[i] for s in p["s"]])))
    return {k: (mean([g for g, _ in v]), mean([s for _, s in v])) for k, v in sorted(acc.items())}


def by_split(results: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, float]:
    """Greedy rate on held-out prompts whose constraint pair never occurs in training, vs the rest."""
    groups: dict[str, list[float]] = {"unseen pair": [], "seen pair or single": []}
    for run in runs:
        for prompt, p in zip(results["prompts"], run["per_prompt"], strict=True):
            unseen = frozenset(prompt["kinds"]) in HELD_OUT_PAIRS
            groups["unseen pair" if unseen else "seen pair or single"].append(mean(p["g"]))
    return {k: mean(v) for k, v in groups.items()}


def fmt_ci(x: dict[str, float], key: str = "mean", ci: str = "seed_ci") -> str:
    """``value ± half-width``; ``-`` for a metric not measured (sampled rates at samples=0)."""
    value, half = x[key], x.get(ci, float("nan"))
    if math.isnan(value):
        return "-"
    return f"{value:.3f}" if math.isnan(half) else f"{value:.3f} ± {half:.3f}"


def _pair(a: float, b: float, digits: int = 2) -> str:
    """``greedy / sampled`` cell (``-`` for the sampled rate when there were no samples)."""
    return f"{a:.{digits}f} / " + ("-" if math.isnan(b) else f"{b:.{digits}f}")


def markdown(results: dict[str, Any]) -> str:
    """The main table, per-constraint table, seen/unseen split and learning curve."""
    finals = final_runs(results)
    base = finals.get("base", [None])[0]
    lines = [f"IFEval-style held-out prompts: {len(results['prompts'])}; scale "
             f"{results['scale']}; {results['scale_settings']}; elapsed "
             f"{results.get('elapsed_s')} s; finished: {results.get('finished', False)}; "
             f"skipped: {results.get('skipped', [])}", "",
             "| method | seeds | greedy (± seeds) | ± prompts | Δ vs untrained (± prompts) | "
             "sampled | greedy all-met | sampled all-met | KL to start | tokens trained |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    stats = {m: method_stats(r, None if m == "base" else base) for m, r in finals.items()}
    for method, s in stats.items():
        g = s["greedy"]
        delta = (f"{g['delta']:+.3f} ± {g['delta_ci']:.3f}" if "delta" in g else "-")
        lines.append(f"| {method} | {s['seeds']} | {fmt_ci(g)} | {g['prompt_ci']:.3f} | {delta} | "
                     f"{fmt_ci(s['sampled'])} | {fmt_ci(s['greedy_all'])} | "
                     f"{fmt_ci(s['sampled_all'])} | {fmt_ci(s['kl'])} | {s['tokens_trained']:.0f} |")
    kinds = {m: by_kind(results, r) for m, r in finals.items()}
    names = sorted({k for v in kinds.values() for k in v})
    lines += ["", "Per constraint type, greedy / sampled share met (mean over seeds):", "",
              "| method | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for method, v in kinds.items():
        cells = [_pair(*v[k]) if k in v else "-" for k in names]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "Greedy rate by held-out prompt kind:", "",
              "| method | unseen pair | seen pair or single |", "|---|---|---|"]
    for method, r in finals.items():
        split = by_split(results, r)
        lines.append(f"| {method} | {split['unseen pair']:.3f} | "
                     f"{split['seen pair or single']:.3f} |")
    lines += ["", "Paired greedy difference row − column (mean over seeds per prompt; ± 95% over "
              "prompts):", ""] + paired_table(finals)
    lines += ["", "Learning curve (seed 0; greedy / sampled):", ""] + curve_table(results)
    return "\n".join(lines)


def paired_table(finals: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every trained method against every other, paired by held-out prompt (greedy rate)."""
    greedy = {m: [mean([mean(r["per_prompt"][i]["g"]) for r in runs])
                  for i in range(len(runs[0]["per_prompt"]))]
              for m, runs in finals.items() if m != "base"}
    names = list(greedy)
    lines = ["| row \\ column | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for a in names:
        cells = []
        for b in names:
            diff = [x - y for x, y in zip(greedy[a], greedy[b], strict=True)]
            cells.append("-" if a == b else f"{mean(diff):+.3f} ± {half_width(diff, 1.96):.3f}")
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return lines


def curve(results: dict[str, Any]) -> dict[str, list[tuple[int, float, float]]]:
    """Per method: (steps, greedy, sampled) of seed 0, from the untrained model (steps 0) on."""
    base = [r for r in results["runs"] if r["method"] == "base"]
    start = [(0, run_summary(base[0])["greedy"], run_summary(base[0])["sampled"])] if base else []
    out: dict[str, list[tuple[int, float, float]]] = {}
    for run in results["runs"]:
        if run["method"] != "base" and run["seed"] == 0:
            s = run_summary(run)
            out.setdefault(run["method"], list(start)).append((run["steps"], s["greedy"], s["sampled"]))
    return {m: sorted(v) for m, v in out.items()}


def curve_table(results: dict[str, Any]) -> list[str]:
    points = curve(results)
    steps = sorted({s for v in points.values() for s, _, _ in v})
    lines = ["| method | " + " | ".join(f"{s} steps" for s in steps) + " |",
             "|---" * (len(steps) + 1) + "|"]
    for method, v in points.items():
        at = {s: _pair(g, x, 3) for s, g, x in v}
        lines.append(f"| {method} | " + " | ".join(at.get(s, "-") for s in steps) + " |")
    return lines


def plot(results: dict[str, Any], path: Path) -> None:
    """The learning curve (greedy rate over steps, seed 0) as a small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    for method, v in curve(results).items():
        ax.plot([s for s, _, _ in v], [g for _, g, _ in v], marker="o", label=method)
    ax.set_xlabel("optimizer steps")
    ax.set_ylabel("held-out constraints met (greedy)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="results.json of research.ifeval_cpu.experiment")
    ap.add_argument("--png", type=Path, default=None, help="Also plot the learning curve here.")
    args = ap.parse_args()
    results = json.loads(args.results.read_text())
    print(markdown(results))
    if args.png:
        plot(results, args.png)


if __name__ == "__main__":
    main()
