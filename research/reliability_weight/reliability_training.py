"""Does the log-odds reliability weight train better than tau? (the open half of the issue-18
finding; :mod:`research.reliability_weight.reliability_weight` compared them on aggregation only).

The separating testbed of section 6 (``curves.TESTBED``: K = 4, 2,000 training prompts, rank-2
prompt x response interaction, 500 held-out prompts, batches of 32 groups, Adam lr 3e-4),
with its training groups ranked by the mixed crowd of ``reliability_weight.py``: five
annotators of kind ``simulated``, flip rates 0.05, 0.10, 0.20, 0.30 (Mallows) and a random
clicker, three of them drawn at random per group (its ``mixed3`` regime). Each arm
aggregates these rankings with the aggregate stage's own code
(:func:`~grouppref.pipeline.aggregate.core.fit_parsed`, default settings, so the pair
targets are what ``pair_targets=auto`` writes) and trains the package's ``gspo`` loss on the
written ``p_ij``/``w_ij`` and consensus order for 1,000 steps:

* ``tau``: ``--reliability-weight tau`` (the default);
* ``log_odds``: ``--reliability-weight log_odds``;
* ``tau_scaled``: tau with every kind weight times 2.2 (log_odds' scale, tau's relative
  weights; the control of ``reliability_weight.py``);
* ``uniform``: ``reliability_iterations=0``, ``drop_unreliable=False`` (kind weights only:
  the random clicker counts as much as the best annotator), the positive control: it shows
  whether this testbed can see an annotator weighting at all.

Every arm of a seed shares task, groups, rankings and batch order, so differences are paired
by seed. Metrics at 250, 500 and 1,000 steps: held-out pair accuracy of the implicit reward
and the true-reward gain (``common.evaluate``), plus the aggregation's consensus pair accuracy
and the targets' log loss against the truth on the training groups.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m research.reliability_weight.reliability_training
    .venv/bin/python -m research.reliability_weight.reliability_training --collect   # finished seeds
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from grouppref.api import (
    AggregateConfig,
    AnnotatedGroup,
    Candidate,
    CandidateSource,
    Prompt,
    collect_groups,
    fit_parsed,
    make_candidate_id,
    make_group_id,
    noise_rate,
)
from research import common as c
from research.learning_curves.curves import TESTBED
from research.reliability_weight.reliability_weight import SCALE, crowd_groups

ARMS = ("tau", "log_odds", "tau_scaled", "uniform")
K = 4


def config_of(arm: str) -> AggregateConfig:
    """The aggregate settings of an arm (defaults otherwise, ``pair_targets`` auto)."""
    if arm == "tau_scaled":
        return AggregateConfig(kind_weights={k: SCALE * w for k, w in
                                             AggregateConfig().kind_weights.items()})
    if arm == "uniform":
        return AggregateConfig(reliability_iterations=0, drop_unreliable=False)
    return AggregateConfig(reliability_weight=arm)


def base_groups(n: int, seed: int) -> list[AnnotatedGroup]:
    """``n`` groups of K placeholder candidates (the testbed's token sequences stand behind
    them by position), to carry the crowd's rankings through the aggregate stage's parser."""
    out = []
    for g in range(n):
        prompt = Prompt(prompt_id=f"t{seed}-{g}", text=f"testbed prompt {g}")
        gid = make_group_id(prompt)
        cands = [Candidate(candidate_id=make_candidate_id(gid, f"c{j}"), text=f"c{j}",
                           source=CandidateSource(kind="model", model="testbed"))
                 for j in range(K)]
        out.append(AnnotatedGroup(group_id=gid, prompt=prompt, candidates=cands, rankings=[]))
    return out


def aggregate_arm(groups: list[AnnotatedGroup], reward: torch.Tensor, arm: str
                  ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What the aggregate stage writes for ``arm`` (targets, order) and how it scores."""
    parsed = collect_groups(groups, "simulation", "aggregate")
    agg = fit_parsed(parsed, config_of(arm))
    fit = agg.fit
    tiers, theta = torch.from_numpy(fit.tiers), torch.from_numpy(fit.theta)
    order = torch.argsort(tiers.double() * 1e6 - theta, dim=1, stable=True)
    p, w = torch.from_numpy(fit.p).float(), torch.from_numpy(fit.w).float()
    y = (reward[:, :, None] > reward[:, None, :]).double()
    mask = (reward[:, :, None] != reward[:, None, :]) & torch.ones(K, K, dtype=torch.bool).triu(1)
    q = p.double().clamp(1e-6, 1 - 1e-6)
    cons = torch.sign(tiers[:, None, :] - tiers[:, :, None]).double()  # +1: i above j
    truth = torch.sign(reward[:, :, None] - reward[:, None, :])
    right = torch.where(cons == 0, 0.5, (cons == truth).double())[mask]
    stats = {"targets": agg.targets, "noise_estimate": noise_rate(agg.rel),
             "consensus_accuracy": float(right.mean()),
             "target_log_loss": float(-(y * q.log() + (1 - y) * (1 - q).log())[mask].mean()),
             "weights": {a: float(agg.rel.annotator_weight[i])
                         for i, a in enumerate(parsed.annotators)}}
    return {"order": order, "p": p, "w": w}, stats


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every arm of one seed on shared data."""
    t0 = time.perf_counter()
    bed = c.Testbed(eval_prompts=job["eval_prompts"], eval_samples=job["eval_samples"],
                    **job["testbed"])
    seed = job["seed"]
    task = c.make_task(bed, seed)
    data = c.make_groups(task, job["prompts"], K, seed)
    groups = crowd_groups(base_groups(job["prompts"], seed), data["reward"].numpy(), 3, seed)
    rows = []
    for arm in job["arms"]:
        t1 = time.perf_counter()
        targets, stats = aggregate_arm(groups, data["reward"], arm)
        train = {"prompts": data["prompts"], "cands": data["cands"],
                 "ref_logps": data["ref_logps"], **targets}
        res = c.train_method(task, train, "gspo_soft", job["steps"], seed)
        rows += [{"seed": seed, "arm": arm, "step": step, **metrics, **stats,
                  "wall_s": time.perf_counter() - t1} for step, metrics in res.items()]
        c.log(f"seed {seed} {arm}: {time.perf_counter() - t1:.0f} s "
              f"(load {os.getloadavg()[0]:.1f})")
    c.log(f"seed {seed} done in {time.perf_counter() - t0:.0f} s")
    return rows


def jobs_of(quick: bool, seeds: list[int]) -> list[dict[str, Any]]:
    if quick:
        base = {"testbed": {**TESTBED, "batch_groups": 8}, "prompts": 48, "steps": [4, 8],
                "eval_prompts": 16, "eval_samples": 2}
    else:
        base = {"testbed": TESTBED, "prompts": 2000, "steps": [250, 500, 1000],
                "eval_prompts": 500, "eval_samples": 4}
    return [{**base, "seed": s, "arms": list(ARMS)} for s in seeds]


def _col(rows: list[dict[str, Any]], arm: str, step: int, key: str) -> list[float]:
    return [r[key] for r in sorted(rows, key=lambda r: r["seed"])
            if r["arm"] == arm and r["step"] == step]


def _ci(a: list[float], b: list[float], fmt: str) -> str:
    d = c.paired_ci(a, b)
    return f"{d['mean']:{fmt}} [{d['lo']:{fmt}}, {d['hi']:{fmt}}]"


def tables(rows: list[dict[str, Any]]) -> str:
    """Mean ± std per arm and step, then each arm minus tau paired by seed (95% CI)."""
    steps = sorted({r["step"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    out = [f"Seeds {seeds}; each arm minus `tau`, paired by seed (Student-t 95% CI).", ""]
    for key, fmt in (("pair_accuracy", "+.4f"), ("reward_gain", "+.3f"), ("kl", "+.2f")):
        head = ["step", *(f"{a} (mean ± std)" for a in ARMS),
                *(f"{a} − tau" for a in ARMS if a != "tau")]
        out += [f"**{key}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for step in steps:
            cells = []
            for a in ARMS:
                ms = c.mean_std(_col(rows, a, step, key))
                cells.append(f"{ms['mean']:.4f} ± {ms['std']:.4f}")
            cells += [_ci(_col(rows, a, step, key), _col(rows, "tau", step, key), fmt)
                      for a in ARMS if a != "tau"]
            out.append(f"| {step} | " + " | ".join(cells) + " |")
        out.append("")
    last = max(steps)
    out += ["**aggregation** (training groups; mean over seeds)", "",
            "| arm | targets written | noise estimate | consensus pair acc. | target log loss | "
            "weights (a05 / a10 / a20 / a30 / random) |", "|---|---|---|---|---|---|"]
    for a in ARMS:
        at = [r for r in rows if r["arm"] == a and r["step"] == last]
        kinds = sorted({r["targets"] for r in at})
        w = " / ".join(f"{np.mean([r['weights'][n] for r in at]):.2f}"
                       for n in ("a05", "a10", "a20", "a30", "random"))
        out.append(f"| {a} | {', '.join(kinds)} | {np.mean([r['noise_estimate'] for r in at]):.3f} "
                   f"| {np.mean([r['consensus_accuracy'] for r in at]):.4f} "
                   f"| {np.mean([r['target_log_loss'] for r in at]):.4f} | {w} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = c.evidence_parser(__doc__, c.results_of(__file__), "JSON and table")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--collect", action="store_true", help="tables from the finished seeds")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    jobs = jobs_of(args.quick, args.seeds)
    cache = c.job_cache("reliability_training", args.quick)
    if args.collect and cache is not None:
        jobs = [j for j in jobs if c.cache_path(cache, j).exists()]
    load0, t0 = os.getloadavg(), time.time()
    rows = c.pooled_rows(run_job, jobs, 1, cache)
    name = "reliability_training_quick" if args.quick else "reliability_training"
    c.write_json(args.out / f"{name}.json", {
        "settings": {"jobs": jobs, "arms": list(ARMS), "scale": SCALE},
        "environment": c.environment(), "seconds": round(time.time() - t0, 1),
        "load_average_start": load0, "load_average_end": os.getloadavg(), "rows": rows})
    text = tables(rows)
    (args.out / f"{name}_table.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return rows


if __name__ == "__main__":
    main()
