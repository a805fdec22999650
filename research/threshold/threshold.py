"""Experiment 5: at which estimated label noise (if any) does DPO beat the group losses?

Reads the results of experiments 1 and 3 (research/synthetic/results/synthetic.json,
research/real_model/results/real_model*.json) and, per
panel condition, puts the noise the aggregate stage *estimates* (what its report shows a
user) beside the paired difference ``gspo_soft − dpo_consensus`` (and the best other group
loss) on held-out pair accuracy and true-reward gain. DPO "wins" a (condition, length,
metric) when the difference's whole 95% CI is below 0. The threshold the data supports: the
lowest estimated noise from which on DPO wins (some metric or length) at *every* noisier
synthetic condition; the suggested setting is the midpoint between it and the noisiest
condition below it where DPO does not win.

    .venv/bin/python -m research.threshold.threshold
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from research import common as c

GROUP = ("gspo_soft", "gspo_hard", "plackett_luce")
RESEARCH = Path(__file__).resolve().parents[1]
SYNTHETIC = RESEARCH / "synthetic" / "results"  # experiment 1's results
REAL = RESEARCH / "real_model" / "results"  # experiment 3's


def synthetic_rows(syn: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for cond, per in syn["summary"].items():
        for step in syn["settings"]["steps"]:
            vs = per[str(step)]["vs_dpo_consensus"]
            for metric in ("pair_accuracy", "reward_gain"):
                d = {m: vs[m][metric] for m in GROUP}
                rows.append({"source": "synthetic", "condition": cond, "step": step, "metric": metric,
                             "noise_estimate": per["noise_estimate"]["mean"],
                             "realised_flip_rate": per["realised_flip_rate"]["mean"],
                             "gspo_soft_minus_dpo": d["gspo_soft"],
                             "best_group_minus_dpo": max(d.values(), key=lambda x: x["mean"]),
                             "dpo_wins": d["gspo_soft"]["hi"] < 0,
                             "dpo_beats_every_group_loss": all(x["hi"] < 0 for x in d.values())})
    return rows


def real_rows(real: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for cond, per in real["conditions"].items():
        diff = (per["gspo_soft"]["held_out_pair_accuracy"]
                - per["dpo_consensus"]["held_out_pair_accuracy"])
        rows.append({"source": f"real_model (seed {real['settings']['seed']})", "condition": cond,
                     "metric": "pair_accuracy",
                     "noise_estimate": per["aggregation"]["noise_estimate"],
                     "gspo_soft_minus_dpo": {"mean": diff, "n": 1},
                     "greedy_correct": {m: per[m]["greedy_correct"] for m in ("gspo_soft", "dpo_consensus")},
                     "dpo_wins": None})  # one seed: no interval, not decisive
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synthetic", type=Path, default=SYNTHETIC,
                    help="folder with experiment 1's synthetic.json")
    ap.add_argument("--real", type=Path, default=REAL,
                    help="folder with experiment 3's real_model.json (and real_model_seed*.json)")
    ap.add_argument("--out", type=Path, default=c.results_of(__file__),
                    help="folder for threshold.json and its table")
    args = ap.parse_args(argv)
    syn = json.loads((args.synthetic / "synthetic.json").read_text(encoding="utf-8"))
    rows = synthetic_rows(syn)
    for real_path in [args.real / "real_model.json", *sorted(args.real.glob("real_model_seed*.json"))]:
        if real_path.exists():
            rows += real_rows(json.loads(real_path.read_text(encoding="utf-8")))
    wins = [r["noise_estimate"] for r in rows if r["dpo_wins"]]
    per_cond: dict[float, bool] = {}
    for r in rows:
        if r["source"] == "synthetic" and r["noise_estimate"] is not None:
            per_cond[r["noise_estimate"]] = per_cond.get(r["noise_estimate"], False) or r["dpo_wins"]
    levels = sorted(per_cond)
    consistent = next((t for i, t in enumerate(levels) if all(per_cond[u] for u in levels[i:])), None)
    below = [t for t in levels if consistent is not None and t < consistent and not per_cond[t]]
    suggested = (consistent + max(below)) / 2 if consistent is not None and below else consistent
    result = {"experiment": "threshold", "rows": rows,
              "lowest_estimated_noise_where_dpo_wins": min(wins) if wins else None,
              "dpo_wins_consistently_from": consistent, "suggested_threshold": suggested,
              "highest_estimated_noise_tested": max(r["noise_estimate"] for r in rows
                                                    if r["noise_estimate"] is not None)}
    c.write_json(args.out / "threshold.json", result)
    lines = ["| source | condition | length | metric | estimated noise | gspo_soft − dpo [95% CI] | "
             "best group loss − dpo | DPO wins |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["gspo_soft_minus_dpo"]
        ci = f"[{d['lo']:+.3f}, {d['hi']:+.3f}]" if "lo" in d else "(1 seed)"
        best = r.get("best_group_minus_dpo")
        lines.append(f"| {r['source']} | {r['condition']} | {r.get('step', '—')} | {r['metric']} | "
                     f"{'none' if r['noise_estimate'] is None else format(r['noise_estimate'], '.3f')} | "
                     f"{d['mean']:+.3f} {ci} | "
                     f"{'—' if best is None else format(best['mean'], '+.3f')} | "
                     f"{'—' if r['dpo_wins'] is None else ('yes' if r['dpo_wins'] else 'no')} |")
    (args.out / "threshold_table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    for key in ("lowest_estimated_noise_where_dpo_wins", "dpo_wins_consistently_from", "suggested_threshold"):
        print(f"{key}: {result[key]}")
    return result


if __name__ == "__main__":
    main()
