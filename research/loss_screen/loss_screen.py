"""Every loss on the separating synthetic testbed (research/learning_curves/), issue 28's screen.

The testbed, data, panel, aggregation, training loop and metrics are section 6's
(:func:`research.learning_curves.curves.run_job`): K = 8 reference samples for 2,000 training
prompts, a rank-2 prompt x response reward, Adam at the section's constant lr 3e-4 for every
loss (no per-loss tuning here: the real-model study tunes), 1,000 steps of 32 groups evaluated
at 100, 250, 500, 750 and 1,000 steps; ``dpo_consensus`` runs on to 3,250 steps so it is also
measured at the group losses' token counts. New here: LiPO-λ, NCA and InfoNCA
(grouppref/train/objective/listwise.py) beside section 6's losses. Seeds 0-4 (task, candidates, panel and
batch order per seed, shared by every loss of a seed: paired), at flip rate 0.1.

    nice -n 19 .venv/bin/python -m research.loss_screen.loss_screen --workers 1
    .venv/bin/python -m research.loss_screen.loss_screen --table   # from results/loss_screen.json
"""

from __future__ import annotations

from typing import Any

from research import common as c
from research.learning_curves import curves

METHODS = ("dpo_consensus", "gspo_hard", "gspo_soft", "plackett_luce", "lipo", "nca", "infonca")
CONDITIONS = ("noise=0.1",)  # noise=0.0 next, when time allows
SEEDS = (0, 1, 2, 3, 4)


def jobs(quick: bool) -> list[dict[str, Any]]:
    cfg = curves.settings(quick)
    base = {k: cfg[k] for k in ("testbed", "steps", "eval_prompts", "eval_samples")}
    k = 2 if quick else 8
    seeds = (0, 1) if quick else SEEDS
    return [{**base, "experiment": "loss_screen", "setting": "equal_prompts", "k": k,
             "prompts": cfg["prompts"], "condition": cond, "seed": s, "methods": list(METHODS),
             "extend": ["dpo_consensus"]} for cond in CONDITIONS for s in seeds]


def table(result: dict[str, Any]) -> str:
    """Per condition and loss: mean pair accuracy and reward gain at 1,000 steps and best along
    the curve, with the paired difference against dpo_consensus (95% t-interval over seeds)
    at equal steps and at equal tokens."""
    rows = result["runs"]
    last = max(result["settings"]["steps"])
    out = ["| condition | loss | seeds | pair acc @ last | Δ vs DPO, equal steps | Δ vs DPO, "
           "equal tokens | best pair acc | reward gain @ last | Δ gain vs DPO, equal steps |",
           "|---|---|---|---|---|---|---|---|---|"]
    for cond in CONDITIONS:
        at = {(r["method"], r["seed"], r["step"]): r for r in rows if r["condition"] == cond}
        seeds = sorted({s for (_, s, _) in at})
        if not seeds:
            continue
        dpo_tokens = {s: {r["tokens"]: r for (m, s2, _), r in at.items()
                          if m == "dpo_consensus" and s2 == s} for s in seeds}
        for method in METHODS:
            finals = [at.get((method, s, last)) for s in seeds]
            if any(f is None for f in finals):
                continue
            acc = [f["pair_accuracy"] for f in finals]
            gain = [f["reward_gain"] for f in finals]
            d_steps = [at[("dpo_consensus", s, last)]["pair_accuracy"] for s in seeds]
            d_gain = [at[("dpo_consensus", s, last)]["reward_gain"] for s in seeds]
            tok = [dpo_tokens[s].get(f["tokens"]) for s, f in zip(seeds, finals, strict=True)]
            best = [max(r["pair_accuracy"] for (m, s2, _), r in at.items() if m == method and s2 == s)
                    for s in seeds]
            peer = method == "dpo_consensus"
            eq_tok = (_cell(acc, [t["pair_accuracy"] for t in tok], peer) if all(tok) else "-")
            out.append(f"| {cond} | {method} | {len(seeds)} | {c.mean_std(acc)['mean']:.4f} | "
                       f"{_cell(acc, d_steps, peer)} | {eq_tok} | {c.mean_std(best)['mean']:.4f} | "
                       f"{c.mean_std(gain)['mean']:+.3f} | {_cell(gain, d_gain, peer)} |")
    return "\n".join(out)


def _cell(a: list[float], b: list[float], peer: bool) -> str:
    return "-" if peer else _ci(c.paired_ci(a, b))


def _ci(ci: dict[str, float]) -> str:
    return f"{ci['mean']:+.4f} [{ci['lo']:+.4f}, {ci['hi']:+.4f}]"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return c.screen_main(argv, doc=__doc__, script=__file__, experiment="loss_screen", jobs=jobs,
                         run_job=curves.run_job, table=table, describe=lambda quick: {
                             "settings": curves.settings(quick), "methods": list(METHODS),
                             "conditions": list(CONDITIONS)})


if __name__ == "__main__":
    main()
