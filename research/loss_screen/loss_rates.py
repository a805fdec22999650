"""Each loss at its own learning rate on the separating testbed: the check the recipe decision
names (research/ifeval_recipe/README.md, "The decision"): the loss screen ran every loss at one shared rate
(3e-4), which may handicap LiPO-λ, whose ΣΔ-normalised pair weights give it another scale.

The loss screen's jobs (:mod:`research.loss_screen.loss_screen`: section 6's testbed, K = 8,
2,000 prompts, flip rate 0.1, 1,000 steps of 32 groups, seeds 0-4) for ``gspo_soft`` and
``lipo`` at Adam rates 1e-4, 1e-3, 3e-3 and 1e-2; the 3e-4 runs are read from the screen's JSON (same jobs,
same seeds), so each loss has a 5-point grid. Each loss's rate is the one with the best mean
held-out pair accuracy at 1,000 steps over the 5 seeds (one choice per loss, the same selection
for both, on the metric being compared: it favours neither); then the losses are paired seed by
seed at their chosen rates (95% t-interval).

    nice -n 10 .venv/bin/python -m research.loss_screen.loss_rates --workers 1
    .venv/bin/python -m research.loss_screen.loss_rates --table
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from research import common as c
from research.loss_screen import loss_screen

METHODS = ("gspo_soft", "lipo")
NEW_RATES = (1e-4, 1e-3, 3e-3, 1e-2)  # 3e-3, then 1e-2: the best rate sat at the grid's edge
SHARED_RATE = 3e-4  # the loss screen's


def jobs(quick: bool) -> list[dict[str, Any]]:
    """The loss screen's jobs for METHODS at each rate of NEW_RATES."""
    out = []
    for job in loss_screen.jobs(quick):
        for lr in NEW_RATES:
            out.append({**job, "experiment": "loss_rates", "methods": list(METHODS), "extend": [],
                        "testbed": {**job["testbed"], "lr": lr}})
    return out


def finals(rows: list[dict[str, Any]], last: int) -> dict[tuple[str, float], dict[int, float]]:
    """Pair accuracy at step ``last``: (method, lr) -> seed -> accuracy."""
    out: dict[tuple[str, float], dict[int, float]] = {}
    for r in rows:
        if r["method"] in METHODS and r["step"] == last and r["condition"] == "noise=0.1":
            out.setdefault((r["method"], r["lr"]), {})[r["seed"]] = r["pair_accuracy"]
    return out


def table(result: dict[str, Any]) -> str:
    """Per loss and rate: mean pair accuracy at the last step (± std over seeds); then each
    loss at its best rate, and lipo − gspo_soft paired over seeds at those rates."""
    last = max(result["settings"]["steps"])
    acc = finals(result["runs"], last)
    out = [f"| loss | lr | seeds | pair acc @ {last:,} steps (mean ± std) |", "|---|---|---|---|"]
    best: dict[str, float] = {}
    for method in METHODS:
        rates = sorted(lr for (m, lr) in acc if m == method)
        for lr in rates:
            vals = list(acc[(method, lr)].values())
            ms = c.mean_std(vals)
            out.append(f"| {method} | {lr:g} | {ms['n']} | {ms['mean']:.4f} ± {ms['std']:.4f} |")
        best[method] = max(rates, key=lambda lr: c.mean_std(list(acc[(method, lr)].values()))["mean"])
    a, b = acc[("lipo", best["lipo"])], acc[("gspo_soft", best["gspo_soft"])]
    seeds = sorted(set(a) & set(b))
    ci = c.paired_ci([a[s] for s in seeds], [b[s] for s in seeds])
    out.append("")
    out.append(f"Chosen rates: gspo_soft {best['gspo_soft']:g}, lipo {best['lipo']:g}. "
               f"lipo − gspo_soft at those rates, paired over {ci['n']} seeds: "
               f"{ci['mean']:+.4f} [{ci['lo']:+.4f}, {ci['hi']:+.4f}].")
    return "\n".join(out)


def shared_rate_rows(path: Path) -> list[dict[str, Any]]:
    """The loss screen's runs of METHODS (at its shared rate), tagged with that rate; none when
    the screen has not run (a ``--quick`` smoke test)."""
    if not path.exists():
        return []
    screen = json.loads(path.read_text(encoding="utf-8"))
    return [{**r, "lr": SHARED_RATE} for r in screen["runs"] if r["method"] in METHODS]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    def screen_rows(args: Any) -> list[dict[str, Any]]:  # the screen's runs, in the same folder
        return shared_rate_rows(args.out / ("loss_screen_quick.json" if args.quick else "loss_screen.json"))

    return c.screen_main(argv, doc=__doc__, script=__file__, experiment="loss_rates", jobs=jobs,
                         run_job=loss_screen_run, table=table, prior_rows=screen_rows,
                         describe=lambda quick: {
                             "settings": loss_screen.curves.settings(quick), "methods": list(METHODS),
                             "rates": sorted([SHARED_RATE, *NEW_RATES])})


def loss_screen_run(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One job of the screen's runner, each row tagged with the job's learning rate."""
    return [{**r, "lr": job["testbed"]["lr"]} for r in loss_screen.curves.run_job(job)]


if __name__ == "__main__":
    main()
