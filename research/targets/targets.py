"""Finding 1 of issue 16: are the aggregation's soft pair targets calibrated against the truth?

On the training groups of the separating testbed (``curves.py``: K = 4, 2,000 prompts, the
same seeds and panels), compare three targets for ``P(i truly beats j)``:

* ``soft``: the BT fit's ``p_ij`` with reliability weights (the aggregate stage's default
  until issue 16);
* ``cal``: the posterior from the estimated flip rates (:func:`common.posterior_targets`);
* ``hard``: 1 for the consensus winner (0.5 within a consensus tier).

For pairs with distinct true rewards: log loss, Brier score, and a reliability diagram (mean
target against the share of pairs whose target-favoured candidate truly wins, per bin of the
target in its favoured direction). No training, seconds per (condition, seed).

    .venv/bin/python -m research.targets.targets
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from research import common as c
from research.learning_curves.curves import CONDITIONS, TESTBED

BINS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
KINDS = {"soft": "p", "cal": "cal_p", "hard": "hard_p"}


def diagram(p: torch.Tensor, reward: torch.Tensor) -> dict[str, Any]:
    """Log loss, Brier score and per-bin (mean target, share right, pairs) of ``p`` (N, K, K)."""
    k = reward.shape[1]
    y = (reward[:, :, None] > reward[:, None, :]).double()
    mask = (reward[:, :, None] != reward[:, None, :]) & torch.ones(k, k, dtype=torch.bool).triu(1)
    q = p.double().clamp(1e-6, 1 - 1e-6)
    fav = torch.where(q >= 0.5, q, 1 - q)[mask]  # the target of the favoured candidate
    right = torch.where(q >= 0.5, y, 1 - y)[mask]
    bins = []
    for lo, hi in zip(BINS[:-1], BINS[1:], strict=True):
        sel = (fav >= lo) & ((fav < hi) if hi < 1 else (fav <= hi))
        if sel.any():
            bins.append({"lo": lo, "hi": hi, "mean_target": float(fav[sel].mean()),
                         "share_right": float(right[sel].mean()), "pairs": int(sel.sum())})
    return {"log_loss": float(-(y * q.log() + (1 - y) * (1 - q).log())[mask].mean()),
            "brier": float(((q - y) ** 2)[mask].mean()), "bins": bins}


def run(seeds: list[int], prompts: int) -> dict[str, Any]:
    bed = c.Testbed(eval_prompts=8, eval_samples=1, **TESTBED)
    out: dict[str, Any] = {}
    for seed in seeds:
        task = c.make_task(bed, seed)
        groups = c.make_groups(task, prompts, 4, seed)
        for cond in CONDITIONS:
            agg = c.aggregate(c.annotate(groups["reward"], c.panel(cond), seed))
            out.setdefault(cond, {})[seed] = {
                name: diagram(agg[key], groups["reward"]) for name, key in KINDS.items()}
        c.log(f"seed {seed} done")
    return out


def pooled(per_seed: dict[int, Any], kind: str) -> dict[str, Any]:
    """Bins pooled over seeds (pair-weighted), log loss and Brier as mean ± std over seeds."""
    bins: dict[float, dict[str, float]] = {}
    for res in per_seed.values():
        for b in res[kind]["bins"]:
            acc = bins.setdefault(b["lo"], {"t": 0.0, "r": 0.0, "n": 0})
            acc["t"] += b["mean_target"] * b["pairs"]
            acc["r"] += b["share_right"] * b["pairs"]
            acc["n"] += b["pairs"]
    return {"log_loss": c.mean_std([r[kind]["log_loss"] for r in per_seed.values()]),
            "brier": c.mean_std([r[kind]["brier"] for r in per_seed.values()]),
            "bins": {lo: (a["t"] / a["n"], a["r"] / a["n"], a["n"]) for lo, a in sorted(bins.items())}}


def table(result: dict[str, Any]) -> str:
    lines = ["| condition | target | log loss | Brier | reliability: mean target → share right (pairs) |",
             "|---|---|---|---|---|"]
    for cond, per_seed in result.items():
        for kind in KINDS:
            pool = pooled(per_seed, kind)
            diag = "; ".join(f"{t:.2f} → {r:.2f} ({n})" for t, r, n in pool["bins"].values())
            ll, br = pool["log_loss"], pool["brier"]
            lines.append(f"| {cond} | {kind} | {ll['mean']:.3f} ± {ll['std']:.3f} "
                         f"| {br['mean']:.3f} ± {br['std']:.3f} | {diag} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result), figsize=(3.0 * len(result), 3.2), squeeze=False)
    for ax, (cond, per_seed) in zip(axes[0], result.items(), strict=True):
        for kind, color in (("soft", "tab:green"), ("cal", "tab:red"), ("hard", "tab:orange")):
            pts = list(pooled(per_seed, kind)["bins"].values())
            ax.plot([t for t, _, _ in pts], [r for _, r, _ in pts], marker="o", color=color, label=kind)
        ax.plot([0.5, 1], [0.5, 1], color="black", lw=0.8, ls="--")
        ax.set_title(cond, fontsize=9)
        ax.set_xlabel("target of the favoured candidate", fontsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share that truly wins", fontsize=8)
    axes[0][0].legend(fontsize=7)
    c.save_figure(fig, path, dpi=100)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=c.results_of(__file__))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = run(args.seeds, args.prompts)
    c.write_json(args.out / "targets.json", {"settings": vars(args) | {"out": str(args.out)},
                                             "environment": c.environment(), "result": result})
    text = table(result)
    (args.out / "targets_table.md").write_text(text + "\n", encoding="utf-8")
    plot(result, args.out / "targets.png")
    print(text)
    return result


if __name__ == "__main__":
    main()
