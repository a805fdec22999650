"""Issue 18, "humans where it matters": consensus accuracy against the truth as a function of
the human budget, groups chosen by ``label push --select uncertain`` (each criterion) or at
random.

Simulated panel (one per seed): ``groups`` groups of K = 4 with true scores ~ N(0, 1); three
automatic rankers with the same known flip rate ``f_auto`` (expected share of pairwise votes
against the truth): a reward model ``rm`` scoring truth + N(0, sigma^2) with
``sigma = tan(pi f_auto)`` (for a pair of N(0, 1) scores the flip probability is
``arctan(sigma) / pi``), and a rule and an LLM judge ranking by Mallows around the truth
(:func:`grouppref.pipeline.simulate.core.simulate_order`). A budget of ``n`` groups gets one
human ranking each (Mallows, flip rate ``f_human``), chosen by
:func:`grouppref.labeling.select.select_groups` (the code behind ``label push --select``).
Every group is then aggregated by the aggregate stage's own code
(:func:`~grouppref.pipeline.aggregate.core.collect_groups` and
:func:`~grouppref.pipeline.aggregate.core.fit_parsed`, default settings: human weight 1,
automatic kinds 0.5, annotator reliability), and the consensus order of every group is
compared with the truth: pair accuracy over all pairs of all groups (a consensus tie counts
half). ``oracle`` is not an option of grouppref: it sends the groups whose machine-only
consensus has the most wrong pairs (it knows the truth), the ceiling of any selection.
Uncertain selection here spends the whole budget on uncertain groups (``--audit-share 0``,
the only choice when this ran; the default 0.2 is measured in
:mod:`research.active_labeling.active_labeling_audit`).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m research.active_labeling.active_labeling
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np

from grouppref.api import (
    AggregateConfig,
    AnnotatedGroup,
    Annotator,
    AnnotatorSpec,
    Candidate,
    CandidateSource,
    Prompt,
    PushConfig,
    Ranking,
    collect_groups,
    fit_parsed,
    make_candidate_id,
    make_group_id,
    select_groups,
    simulate_order,
)
from research import common as c

K = 4
METHODS = ("random", "kendall_w", "bt_posterior", "rm_margin", "oracle")
UNCERTAIN = ("kendall_w", "bt_posterior", "rm_margin")
SHARES = (0.0, 0.1, 0.2, 0.4, 0.6, 1.0)
KINDS = {"rule": "rule", "judge": "llm_judge"}


def _ranking(group: str, ids: list[str], order: list[int], who: str, kind: str,
             scores: list[float] | None = None) -> Ranking:
    return Ranking(annotator=Annotator(id=who, kind=kind), group_id=group,
                   tiers=[[ids[i]] for i in order],
                   scores={ids[i]: s for i, s in enumerate(scores)} if scores else None)


def make_panel(groups: int, f_auto: float, seed: int
               ) -> tuple[list[AnnotatedGroup], np.ndarray]:
    """The groups with their three automatic rankings, and the true scores ``(G, K)``."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=(groups, K))
    sigma = math.tan(math.pi * f_auto)
    spec = AnnotatorSpec(id="auto", flip_rate=f_auto)
    out = []
    for g in range(groups):
        prompt = Prompt(prompt_id=f"p{seed}-{g}", text=f"Prompt {g} of seed {seed}.")
        gid = make_group_id(prompt)
        cands = [Candidate(candidate_id=make_candidate_id(gid, f"answer {j}"), text=f"answer {j}",
                           source=CandidateSource(kind="model", model="sim")) for j in range(K)]
        ids = [x.candidate_id for x in cands]
        rm = (truth[g] + sigma * rng.normal(size=K)).tolist()
        rankings = [_ranking(gid, ids, sorted(range(K), key=lambda i: -rm[i]), "rm",
                             "reward_model", rm)]
        rankings += [_ranking(gid, ids, simulate_order(truth[g].tolist(), spec, rng), who, kind)
                     for who, kind in KINDS.items()]
        out.append(AnnotatedGroup(group_id=gid, prompt=prompt, candidates=cands,
                                  rankings=rankings))
    return out, truth


def with_humans(groups: list[AnnotatedGroup], truth: np.ndarray, chosen: set[str],
                f_human: float, seed: int, roles: dict[str, str] | None = None
                ) -> list[AnnotatedGroup]:
    """``groups`` with one human ranking (Mallows, ``f_human``) in each chosen group; with
    ``roles``, the ranking's metadata ``selection`` says why its group was sent (as ``label
    pull`` copies it from the pushed record)."""
    rng = np.random.default_rng(10_000 + seed)
    spec = AnnotatorSpec(id="human", flip_rate=f_human)
    out = []
    for g, group in enumerate(groups):
        order = simulate_order(truth[g].tolist(), spec, rng)  # drawn for all: same per group
        if group.group_id in chosen:
            human = _ranking(group.group_id, group.candidate_ids(), order, "human", "human")
            if roles is not None:
                human = human.model_copy(update={"metadata": {"selection": roles[group.group_id]}})
            group = group.model_copy(update={"rankings": [*group.rankings, human]})
        out.append(group)
    return out


def pair_accuracy(tiers: np.ndarray, truth: np.ndarray) -> float:
    """Share of all pairs the consensus orders as the truth does (a tie counts half)."""
    return 1.0 - float(wrong_pairs(tiers, truth).sum()) / (truth.shape[0] * K * (K - 1) / 2)


def consensus_tiers(groups: list[AnnotatedGroup], config: AggregateConfig
                    ) -> tuple[np.ndarray, float | None]:
    """The aggregate stage's consensus tier index per candidate ``(G, K)``, and the weight
    its reliability step gave the human (``None``: no human ranking; 0: dropped)."""
    parsed = collect_groups(groups, "simulation", "aggregate")
    agg = fit_parsed(parsed, config)
    human = parsed.index.get("human")
    return agg.fit.tiers, None if human is None else float(agg.rel.annotator_weight[human])


def wrong_pairs(tiers: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Pairs per group the consensus orders against the truth (a tie counts half), ``(G,)``."""
    wrong = np.zeros(truth.shape[0])
    for i, j in itertools.combinations(range(K), 2):
        cons = np.sign(tiers[:, j] - tiers[:, i])
        wrong += np.where(cons == 0, 0.5, cons != np.sign(truth[:, i] - truth[:, j]))
    return wrong


def chosen_by(method: str, groups: list[AnnotatedGroup], n: int, seed: int,
              wrong: np.ndarray) -> set[str]:
    """The ``n`` groups ``method`` sends to people."""
    if n in (0, len(groups)):  # every method sends the same groups
        return {g.group_id for g in groups} if n else set()
    if method == "oracle":
        order = np.argsort(-wrong, kind="stable")[:n]
        return {groups[i].group_id for i in order}
    config = PushConfig(select="random" if method == "random" else "uncertain", budget=n,
                        seed=seed, **({} if method == "random" else
                                      {"uncertainty": method, "audit_share": 0.0}))
    return set(select_groups(groups, config, "rank").ids)


def run_seed(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    groups, truth = make_panel(args.groups, args.f_auto, seed)
    config = AggregateConfig(reliability_iterations=args.reliability_iterations)
    wrong = wrong_pairs(consensus_tiers(groups, config)[0], truth)  # machines only
    rows = []
    for share in SHARES:
        n = round(share * args.groups)
        for method in METHODS:
            chosen = chosen_by(method, groups, n, seed, wrong)
            tiers, weight = consensus_tiers(
                with_humans(groups, truth, chosen, args.f_human, seed), config)
            rows.append({"seed": seed, "share": share, "budget": n, "method": method,
                         "accuracy": pair_accuracy(tiers, truth), "human_weight": weight})
    return rows


def _by_method(rows: list[dict[str, Any]], share: float) -> dict[str, list[float]]:
    at = sorted((r for r in rows if r["share"] == share), key=lambda r: r["seed"])
    return {m: [r["accuracy"] for r in at if r["method"] == m] for m in METHODS}


def table(rows: list[dict[str, Any]]) -> str:
    """Accuracy per method (mean [95% CI over seeds]), then each criterion minus random
    (paired over seeds)."""
    head = ["human budget", *METHODS, *(f"{m} - random" for m in UNCERTAIN)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for share in SHARES:
        by = _by_method(rows, share)
        n = next(r["budget"] for r in rows if r["share"] == share)
        cells = []
        for m in METHODS:
            ci = c.paired_ci(by[m], [0.0] * len(by[m]))
            cells.append(f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]")
        for m in UNCERTAIN:
            d = c.paired_ci(by[m], by["random"])
            cells.append(f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]")
        lines.append(f"| {share:.0%} ({n} groups) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def weight_table(rows: list[dict[str, Any]]) -> str:
    """Mean weight the aggregate's reliability step gave the human, per budget and method."""
    lines = ["| human budget | " + " | ".join(METHODS) + " |", "|" + "---|" * (len(METHODS) + 1)]
    for share in SHARES[1:]:
        at = [r for r in rows if r["share"] == share]
        cells = [f"{np.mean([r['human_weight'] for r in at if r['method'] == m]):.2f}"
                 for m in METHODS]
        lines.append(f"| {share:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(rows: list[dict[str, Any]]) -> str:
    """The accuracy table, then the human's weight."""
    return table(rows) + "\n\nWeight of the human's rankings after the reliability step " \
        "(mean over seeds; 0 = dropped as unreliable):\n\n" + weight_table(rows)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for m in METHODS:
        cis = [c.paired_ci(*[[r["accuracy"] for r in rows if r["share"] == s and
                              r["method"] == m], [0.0] * len({r["seed"] for r in rows})])
               for s in SHARES]
        x = [100 * s for s in SHARES]
        ax.plot(x, [ci["mean"] for ci in cis], "o-", label=m, ms=4)
        ax.fill_between(x, [ci["lo"] for ci in cis], [ci["hi"] for ci in cis], alpha=0.15)
    ax.set(xlabel="human budget (% of groups with one human ranking)",
           ylabel="consensus pair accuracy vs truth", title=title)
    ax.legend(title="selection")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def panel_parser(doc: str, name: str, seeds: int = 5) -> argparse.ArgumentParser:
    """The options of a simulation on this panel: ``--groups``, ``--f-auto``, ``--f-human``,
    ``--seeds`` (default ``0 .. seeds - 1``), ``--out``, ``--name`` (default ``name``) and
    ``--replot`` (what :func:`research.common.run_or_replot` reads)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--groups", type=int, default=400)
    ap.add_argument("--f-auto", type=float, default=0.3, help="automatic rankers' flip rate")
    ap.add_argument("--f-human", type=float, default=0.05, help="the human's flip rate")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(seeds)))
    ap.add_argument("--out", type=Path, default=c.results_of(__file__))
    ap.add_argument("--name", default=name)
    ap.add_argument("--replot", action="store_true", help="tables (and plot) from the JSON")
    return ap


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = panel_parser(__doc__, "active_labeling")
    ap.add_argument("--reliability-iterations", type=int,
                    default=AggregateConfig().reliability_iterations,
                    help="the aggregate's reliability rounds (0: kind weights only)")
    args = ap.parse_args(argv)
    rows = c.run_or_replot(args, run_seed, report)
    plot(rows, args.out / f"{args.name}.png",
         f"automatic flip {args.f_auto:g}, human flip {args.f_human:g}, "
         f"{args.groups} groups, {len(args.seeds)} seeds")
    return rows


if __name__ == "__main__":
    main()
