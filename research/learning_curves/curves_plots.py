"""Plots of :mod:`research.learning_curves.curves`: learning curves against steps and against
tokens (mean over seeds, shaded 95% t-interval), and group size."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from scipy import stats

from research.learning_curves.curves_spec import BASE, METHODS, has_group_size_runs

COLORS = {"dpo_one": "tab:gray", "dpo_consensus": "tab:blue", "gspo_hard": "tab:orange",
          "gspo_soft": "tab:green", "gspo_cal": "tab:red", "plackett_luce": "tab:purple"}
LABELS = {"pair_accuracy": "held-out pair accuracy", "reward_gain": "true-reward gain (ref. std)"}


def save(fig: Any, path: Path) -> None:
    """Write ``fig`` as a small PNG (a 128-colour palette: the committed plots stay ~100 kB)."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=90, format="png")
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.open(buf).convert("RGB").quantize(colors=128).save(path, optimize=True)


def _half(d: dict[str, float]) -> float:
    n = d.get("n", 1)
    return float(stats.t.ppf(0.975, n - 1) * d["std"] / math.sqrt(n)) if n > 1 else 0.0


def _curve(cell: dict[str, Any], method: str, metric: str, x: str) -> tuple[list, list, list]:
    """x values, means and CI half-widths of one method's curve in one cell."""
    if method == BASE and "dpo_curve" in cell:
        pts = sorted((int(s), d) for s, d in cell["dpo_curve"].items())
        xs = [d["tokens"] if x == "tokens" else s for s, d in pts]
        if x == "steps":  # equal steps: only the common evaluation points
            keep = {int(s) for s in cell["steps"]}
            pts = [(s, d) for s, d in pts if s in keep]
            xs = [s for s, _ in pts]
        return xs, [d[metric]["mean"] for _, d in pts], [_half(d[metric]) for _, d in pts]
    pts = [(int(s), b["methods"][method][metric]) for s, b in cell["steps"].items()
           if method in b["methods"]]
    per = cell["tokens_per_step"][method]
    xs = [s * per if x == "tokens" else s for s, _ in pts]
    return xs, [d["mean"] for _, d in pts], [_half(d) for _, d in pts]


def plot_curves(cells: dict[str, dict[str, Any]], x: str, title: str, path: Path) -> None:
    """Rows pair accuracy / reward gain (against steps also: pair accuracy minus DPO's, paired
    by seed), one column per cell (condition)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 3 if x == "steps" else 2
    fig, axes = plt.subplots(rows, len(cells), figsize=(3.4 * len(cells), 3.2 * rows), squeeze=False,
                             sharex=True)
    for col, (name, cell) in enumerate(cells.items()):
        for row, metric in enumerate(("pair_accuracy", "reward_gain")):
            ax = axes[row][col]
            for m in METHODS:
                if m not in cell["tokens_per_step"]:
                    continue
                xs, ys, hs = _curve(cell, m, metric, x)
                ax.plot(xs, ys, marker="o", ms=3, color=COLORS[m], label=m)
                ax.fill_between(xs, [y - h for y, h in zip(ys, hs, strict=True)],
                                [y + h for y, h in zip(ys, hs, strict=True)], color=COLORS[m], alpha=0.12)
            if metric == "pair_accuracy":
                ax.axhline(cell["ceiling"]["mean"], color="black", ls="--", lw=1,
                           label="prompt-indep. ceiling")
            ax.set_title(name, fontsize=9) if row == 0 else None
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if col == 0:
                ax.set_ylabel(LABELS[metric], fontsize=8)
        if rows == 3:
            _delta_row(axes[2][col], cell, col == 0)
        axes[rows - 1][col].set_xlabel("training steps" if x == "steps" else "tokens forwarded",
                                       fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def _delta_row(ax: Any, cell: dict[str, Any], first: bool) -> None:
    """Pair accuracy minus dpo_consensus's at equal steps, paired by seed, 95% CI band."""
    for m in METHODS:
        pts = [(int(s), b["equal_steps"][m]["pair_accuracy"]) for s, b in cell["steps"].items()
               if m in b["equal_steps"]]
        if not pts or m == BASE:
            continue
        xs = [s for s, _ in pts]
        ax.plot(xs, [d["mean"] for _, d in pts], marker="o", ms=3, color=COLORS[m])
        ax.fill_between(xs, [d["lo"] for _, d in pts], [d["hi"] for _, d in pts], color=COLORS[m],
                        alpha=0.12)
    ax.axhline(0, color=COLORS[BASE], lw=1)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
    if first:
        ax.set_ylabel("pair accuracy − dpo_consensus\n(paired, 95% CI)", fontsize=8)


def plot_group_size(summary: dict[str, Any], step: int, path: Path) -> None:
    """Pair accuracy and reward gain after ``step`` steps against K, both settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, ("pair_accuracy", "reward_gain"), strict=True):
        for setting, style in (("equal_prompts", "-"), ("equal_budget", "--")):
            per_k = summary["group_size"][setting]
            ks = sorted(int(k) for k in per_k)
            for m in ("dpo_consensus", "gspo_soft", "gspo_cal"):
                ds = [per_k[str(k)]["steps"][str(step)]["methods"][m][metric] for k in ks]
                ax.errorbar(ks, [d["mean"] for d in ds], yerr=[_half(d) for d in ds], ls=style,
                            marker="o", capsize=2, color=COLORS[m], label=f"{m}, {setting}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group size K")
        ax.set_title(f"{LABELS[metric]} after {step} steps", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)


def plot_all(result: dict[str, Any], out: Path, name: str) -> None:
    summary, cfg = result["summary"], result["settings"]
    for k, cells in summary["noise"].items():
        for x in ("steps", "tokens"):
            plot_curves(cells, x, f"K = {k}: learning curves against {x} (mean over seeds "
                        f"{cells[next(iter(cells))]['seeds']}, 95% CI)", out / f"{name}_k{k}_{x}.png")
    gs = summary["group_size"]
    if has_group_size_runs(result) and gs["equal_prompts"] and gs["equal_budget"]:
        plot_group_size(summary, cfg["steps"][-1], out / f"{name}_group_size.png")
