"""Issue 18's finding, fixed: audit groups for the reliability of humans who see uncertain groups.

The panel, budgets, seeds and scoring are those of :mod:`research.active_labeling.active_labeling`
(400 groups of K = 4, three automatic rankers at flip ``f_auto``, one human at ``f_human``,
the aggregate stage's own code with its default settings, consensus pair accuracy against the
truth). Each method sends ``n`` groups to the human:

* ``random``: ``label push --select random`` (human rankings marked ``selection: random``);
* ``uncertain_before``: ``--select uncertain`` (bt_posterior) with no selection marker on the
  human's rankings: the aggregate judges the human on every group it saw, as before the fix;
* ``uncertain_auditF``: ``--select uncertain --audit-share F``: ``round(F n)`` groups drawn
  uniformly from all groups (marked ``audit``), the rest the most uncertain of the others
  (marked ``uncertain``); the aggregate judges the human on the audit groups only, or on all
  its groups, as before, when it has fewer than ``min_groups_for_reliability`` (5) of them;
* ``oracle_before`` / ``oracle_audit20``: the groups whose machine-only consensus has the most
  wrong pairs (knows the truth; not a grouppref option), unmarked / with a 20 % audit share.

Every difference is paired by seed (the same panel and the same human answers per seed).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m research.active_labeling.active_labeling_audit
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from grouppref.api import AggregateConfig, PushConfig, select_groups, split_budget
from research import common as c
from research.active_labeling.active_labeling import (
    consensus_tiers,
    make_panel,
    pair_accuracy,
    panel_parser,
    with_humans,
    wrong_pairs,
)

SHARES = (0.1, 0.2, 0.4, 0.6)
AUDIT = (0.1, 0.2)
METHODS = ("random", "uncertain_before", *(f"uncertain_audit{round(100 * f)}" for f in AUDIT),
           "oracle_before", "oracle_audit20")


def roles_of(method: str, groups: list, n: int, seed: int, wrong: np.ndarray
             ) -> tuple[set[str], dict[str, str] | None]:
    """The groups ``method`` sends and the selection marker of each (None: unmarked)."""
    if method.startswith("oracle"):
        share = 0.2 if method.endswith("audit20") else 0.0
        gen = torch.Generator().manual_seed(seed)
        audit, worst = split_budget(torch.from_numpy(wrong.astype(float)), n, share, gen)
        roles = {groups[i].group_id: "uncertain" for i in worst}
        roles.update({groups[i].group_id: "audit" for i in audit})
        return set(roles), None if method == "oracle_before" else roles
    if method == "random":
        config = PushConfig(select="random", budget=n, seed=seed)
    else:
        share = float(method.removeprefix("uncertain_audit")) / 100 if "audit" in method else 0.0
        config = PushConfig(select="uncertain", budget=n, seed=seed, uncertainty="bt_posterior",
                            audit_share=share)
    sel = select_groups(groups, config, "rank")
    roles = {g.group_id: g.role for g in sel.selected if g.role is not None}
    return set(sel.ids), None if method == "uncertain_before" else roles


def run_seed(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    groups, truth = make_panel(args.groups, args.f_auto, seed)
    config = AggregateConfig()
    wrong = wrong_pairs(consensus_tiers(groups, config)[0], truth)  # machines only
    rows = []
    for share in SHARES:
        n = round(share * args.groups)
        for method in METHODS:
            chosen, roles = roles_of(method, groups, n, seed, wrong)
            humans = with_humans(groups, truth, chosen, args.f_human, seed, roles)
            tiers, weight = consensus_tiers(humans, config)
            rows.append({"seed": seed, "share": share, "budget": n, "method": method,
                         "accuracy": pair_accuracy(tiers, truth), "human_weight": weight,
                         "audit": sum(r == "audit" for r in (roles or {}).values())})
    return rows


def _col(rows: list[dict[str, Any]], share: float, method: str, key: str) -> list[float]:
    at = sorted((r for r in rows if r["share"] == share and r["method"] == method),
                key=lambda r: r["seed"])
    return [r[key] for r in at]


def _ci(d: dict[str, float], fmt: str = "+.3f") -> str:
    return f"{d['mean']:{fmt}} [{d['lo']:{fmt}}, {d['hi']:{fmt}}]"


def tables(rows: list[dict[str, Any]]) -> str:
    """Gain over random (paired), the fix's effect (after − before, paired) and the human's
    weight, each mean [95% CI over seeds]."""
    gain = [m for m in METHODS if m != "random"]
    head = ["human budget", "random accuracy", *(f"{m} − random" for m in gain)]
    out = ["Consensus pair accuracy: random, and each method minus random (paired by seed):",
           "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for share in SHARES:
        base = _col(rows, share, "random", "accuracy")
        cells = [_ci(c.paired_ci(base, [0.0] * len(base)), ".3f")]
        cells += [_ci(c.paired_ci(_col(rows, share, m, "accuracy"), base)) for m in gain]
        out.append(f"| {share:.0%} | " + " | ".join(cells) + " |")
    fixes = [("uncertain_audit10", "uncertain_before"), ("uncertain_audit20", "uncertain_before"),
             ("oracle_audit20", "oracle_before")]
    head = ["human budget", *(f"{a} − {b}" for a, b in fixes)]
    out += ["", "The fix's effect on accuracy (after − before, paired by seed):", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for share in SHARES:
        cells = [_ci(c.paired_ci(_col(rows, share, a, "accuracy"), _col(rows, share, b, "accuracy")))
                 for a, b in fixes]
        out.append(f"| {share:.0%} | " + " | ".join(cells) + " |")
    head = ["human budget", *METHODS]
    out += ["", "Weight the aggregate gave the human (kind weight 1 x reliability; 0 = dropped):",
            "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for share in SHARES:
        cells = []
        for m in METHODS:
            w = _col(rows, share, m, "human_weight")
            cells.append(_ci(c.paired_ci(w, [0.0] * len(w)), ".2f"))
        out.append(f"| {share:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = panel_parser(__doc__, "active_labeling_audit")
    return c.run_or_replot(ap.parse_args(argv), run_seed, tables)


if __name__ == "__main__":
    main()
