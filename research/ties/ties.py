"""Finding 2 of issue 16: the noise estimate when true scores tie.

Constructed tied panels: groups of K = 4 whose true scores take ``levels`` values (3 levels:
about a third of the pairs tie, as with a coarse rule ranker), three annotators with a flip
rate that must order tied candidates (at random, as the simulator does), and optionally a
rule-like ranking of the true tiers that *declares* the ties. Per setting, the vote-weighted
true flip rate on decided pairs beside the estimate with ties ignored (the estimator before
issue 16: every pair both rankings order counts) and the tie-aware estimate (pairs some used
ranking ties are left out, :func:`grouppref.stats.reliability.pairwise_agreement`).

    .venv/bin/python -m research.ties.ties
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grouppref.api import (
    AggregateConfig,
    TiedPanel,
    estimate_reliability,
    flip_rates_moment,
    noise_rate,
    pairwise_agreement,
    tied_panel,
)
from research import common as c


def estimates(p: TiedPanel) -> dict[str, float | None]:
    cfg = AggregateConfig()
    n = p.ann.shape[1]
    kind = torch.tensor([1.0] * 3 + [0.5] * (n - 3), dtype=torch.float64)
    rel = estimate_reliability(
        p.ranks, p.ann, kind, alpha=cfg.prior_strength, iterations=cfg.reliability_iterations,
        min_groups=cfg.min_groups_for_reliability, unreliable_tau=cfg.unreliable_tau,
        z=cfg.unreliable_z, drop=cfg.drop_unreliable, batch_size=cfg.batch_size,
        max_iter=cfg.max_iter, tie_tol=cfg.tie_tolerance)
    # ties ignored: no ranking counts as declaring a tie (every pair two rankings order counts)
    blind = pairwise_agreement(p.ranks, p.ann, n, cfg.batch_size, torch.zeros(n))
    f_blind = flip_rates_moment(blind.agree, blind.total)
    used = rel.annotator_weight > 0
    w = blind.votes * used
    return {"tie_aware": noise_rate(rel), "tie_blind": float((f_blind * w).sum() / w.sum()),
            "tied_share": rel.tied_share}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=1500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=c.results_of(__file__))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for levels in (3, 5, 0):
        for flip in (0.0, 0.1, 0.3):
            for declared in (True, False):
                for seed in args.seeds:
                    p = tied_panel(args.groups, flip, levels, declared, seed)
                    true = float(p.flips.sum() / p.votes.sum())
                    rows.append({"levels": levels or "continuous", "flip": flip, "declared": declared,
                                 "seed": seed, "true_decided": true, "tie_share": p.tie_share,
                                 **estimates(p)})
    c.write_json(args.out / "ties.json", {"settings": {"groups": args.groups, "seeds": args.seeds},
                                          "environment": c.environment(), "rows": rows})
    lines = ["| true score levels | flip rate | ties declared by a ranking | true share tied | "
             "true flip (decided pairs) | estimate, ties ignored | estimate, tie-aware | "
             "reported tied share | predicted if undeclared |", "|" + "---|" * 9]
    for key in dict.fromkeys((r["levels"], r["flip"], r["declared"]) for r in rows):
        sel = [r for r in rows if (r["levels"], r["flip"], r["declared"]) == key]

        def mean(x: str, sel: list[dict[str, Any]] = sel) -> float:
            return float(np.mean([r[x] for r in sel]))

        pred = (1 - math.sqrt(1 - mean("tie_share")) * (1 - 2 * mean("true_decided"))) / 2
        lines.append(f"| {key[0]} | {key[1]} | {'yes' if key[2] else 'no'} | {mean('tie_share'):.3f} | "
                     f"{mean('true_decided'):.3f} | {mean('tie_blind'):.3f} | {mean('tie_aware'):.3f} | "
                     f"{mean('tied_share'):.3f} | {'' if key[2] else f'{pred:.3f}'} |")
    text = "\n".join(lines)
    (args.out / "ties_table.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return rows


if __name__ == "__main__":
    main()
