"""Issue 18 finding: the annotator reliability weight, ``clip(tau, 0, 1)`` against the log-odds
``log((1 - e) / e)`` of the share ``e`` of its votes against the consensus
(``aggregate --reliability-weight tau|log_odds``,
:func:`grouppref.stats.reliability.log_odds_weight`).

Three regimes, each ``groups`` groups of K = 4 with true scores ~ N(0, 1) per seed, aggregated
by the aggregate stage's own code (:func:`~grouppref.pipeline.aggregate.core.fit_parsed`,
default settings but for ``reliability_weight`` and soft pair targets, so that ``p_ij`` is
the Bradley-Terry fit's in both arms; the consensus order does not depend on the targets):

* ``mixed3``: a crowd of five annotators of kind ``simulated`` (kind weight 1) of mixed
  quality, flip rates 0.05, 0.10, 0.20, 0.30 (Mallows, the simulate stage's
  :func:`~grouppref.pipeline.simulate.core.simulate_order`) and one random clicker; each
  group is ranked by 3 of them drawn at random (``simulate --per-group 3``);
* ``mixed5``: the same crowd, every annotator ranks every group;
* ``active``: the panel of :mod:`research.active_labeling.active_labeling` (three automatic
  rankers at flip 0.3, kind weight 0.5) and one human at flip 0.05 on a budget of 20% or 40%
  of the groups, sent by ``label push --select random`` or ``--select uncertain``
  (bt_posterior) with the default audit share (:data:`grouppref.labeling.config.AUDIT_SHARE`).

A third arm, ``tau_scaled``, is ``tau`` with every kind weight times 2.2 (the ratio of the
log_odds to the tau weights seen in these regimes): it has log_odds' scale with tau's relative
weights, so log_odds − tau_scaled is what the log-odds' *shape* does, apart from its scale.

Scores, per seed: consensus pair accuracy against the truth over all pairs (a consensus tie
counts half) and the mean log loss ``-log p(true winner > loser)`` of the fit's ``p_ij``
over all pairs (``p`` clipped at 1e-6), and the overconfidence of ``p_ij``: the mean
probability the fit gives its favourite of each pair minus the share of pairs where that
favourite is the true winner (0: calibrated on average; > 0: too sure). Differences
log_odds − tau are paired by seed.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m research.reliability_weight.reliability_weight
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import numpy as np

from grouppref.api import (
    AggregateConfig,
    AnnotatedGroup,
    Annotator,
    AnnotatorSpec,
    PushConfig,
    Ranking,
    collect_groups,
    fit_parsed,
    select_groups,
    simulate_order,
)
from research import common as c
from research.active_labeling.active_labeling import (
    K,
    make_panel,
    pair_accuracy,
    panel_parser,
    with_humans,
)

WEIGHTS = ("tau", "tau_scaled", "log_odds")
SCALE = 2.2  # tau_scaled: every kind weight times this, the log_odds/tau weight ratio seen
CROWD = (AnnotatorSpec(id="a05", flip_rate=0.05), AnnotatorSpec(id="a10", flip_rate=0.10),
         AnnotatorSpec(id="a20", flip_rate=0.20), AnnotatorSpec(id="a30", flip_rate=0.30),
         AnnotatorSpec(id="random", behavior="random"))
ACTIVE = tuple(f"{sel}{round(100 * b)}" for sel in ("random", "uncertain") for b in (0.2, 0.4))


def crowd_groups(groups: list[AnnotatedGroup], truth: np.ndarray, per_group: int, seed: int
                 ) -> list[AnnotatedGroup]:
    """``groups`` with their rankings replaced by ``per_group`` crowd members' (drawn at
    random per group) strict Mallows orders of the truth."""
    rng = np.random.default_rng(20_000 + seed)
    out = []
    for g, group in enumerate(groups):
        ids = group.candidate_ids()
        who = rng.choice(len(CROWD), size=per_group, replace=False)
        rankings = [Ranking(annotator=Annotator(id=CROWD[a].id, kind="simulated"),
                            group_id=group.group_id,
                            tiers=[[ids[i]] for i in simulate_order(truth[g].tolist(),
                                                                    CROWD[a], rng)])
                    for a in sorted(who)]
        out.append(group.model_copy(update={"rankings": rankings}))
    return out


def config_of(weight: str) -> AggregateConfig:
    """The aggregate settings of an arm: ``tau_scaled`` is tau with every kind weight times
    :data:`SCALE`, a control with log_odds' scale and tau's relative weights."""
    if weight == "tau_scaled":
        kinds = {k: SCALE * w for k, w in AggregateConfig().kind_weights.items()}
        return AggregateConfig(pair_targets="soft", kind_weights=kinds)
    return AggregateConfig(reliability_weight=weight, pair_targets="soft")


def score(groups: list[AnnotatedGroup], truth: np.ndarray, weight: str) -> dict[str, Any]:
    """Accuracy, log loss and every annotator's weight from the aggregate's fit."""
    parsed = collect_groups(groups, "simulation", "aggregate")
    agg = fit_parsed(parsed, config_of(weight))
    p_true = np.stack([np.where(truth[:, i] > truth[:, j], agg.fit.p[:, i, j],
                                agg.fit.p[:, j, i])
                       for i, j in itertools.combinations(range(K), 2)])
    confidence = np.maximum(p_true, 1 - p_true)  # p of the fit's favourite of each pair
    return {"accuracy": pair_accuracy(agg.fit.tiers, truth),
            "log_loss": float(np.mean(-np.log(np.clip(p_true, 1e-6, 1.0)))),
            "overconfidence": float(confidence.mean() - (p_true > 0.5).mean()
                                    - 0.5 * (p_true == 0.5).mean()),
            "weights": {a: float(agg.rel.annotator_weight[i])
                        for i, a in enumerate(parsed.annotators)}}


def active_groups(groups: list[AnnotatedGroup], truth: np.ndarray, arm: str, n_groups: int,
                  seed: int, f_human: float) -> list[AnnotatedGroup]:
    """The active-labeling panel with the human's rankings of ``arm`` (e.g. ``uncertain20``)."""
    select = arm.rstrip("0123456789")
    budget = round(int(arm[len(select):]) / 100 * n_groups)
    config = PushConfig(select=select, budget=budget, seed=seed)  # default audit share
    sel = select_groups(groups, config, "rank")
    roles = {g.group_id: g.role for g in sel.selected if g.role is not None}
    return with_humans(groups, truth, set(sel.ids), f_human, seed, roles)


def run_seed(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    machines, truth = make_panel(args.groups, args.f_auto, seed)
    arms: dict[str, list[AnnotatedGroup]] = {
        "mixed3": crowd_groups(machines, truth, 3, seed),
        "mixed5": crowd_groups(machines, truth, len(CROWD), seed)}
    for arm in ACTIVE:
        arms[f"active_{arm}"] = active_groups(machines, truth, arm, args.groups, seed,
                                              args.f_human)
    rows = []
    for regime, groups in arms.items():
        for weight in WEIGHTS:
            rows.append({"seed": seed, "regime": regime, "weight": weight,
                         **score(groups, truth, weight)})
        c.log(f"seed {seed} {regime}")
    return rows


def _col(rows: list[dict[str, Any]], regime: str, weight: str, key: str) -> list[float]:
    at = sorted((r for r in rows if r["regime"] == regime and r["weight"] == weight),
                key=lambda r: r["seed"])
    return [r[key] for r in at]


def _ci(a: list[float], b: list[float] | None = None, fmt: str = ".3f") -> str:
    d = c.paired_ci(a, b if b is not None else [0.0] * len(a))
    return f"{d['mean']:{fmt}} [{d['lo']:{fmt}}, {d['hi']:{fmt}}]"


def tables(rows: list[dict[str, Any]]) -> str:
    """Per regime: accuracy, log loss and overconfidence of each arm, and log_odds minus each
    tau arm (paired by seed), then the mean weight of each annotator."""
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    out = []
    for key, title in (("accuracy", "Consensus pair accuracy"), ("log_loss", "Log loss of p_ij"),
                       ("overconfidence", "Overconfidence of p_ij")):
        head = ["regime", *WEIGHTS, "log_odds − tau", "log_odds − tau_scaled"]
        out += [f"{title} (mean [95% CI over seeds], differences paired by seed):", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for reg in regimes:
            cols = {w: _col(rows, reg, w, key) for w in WEIGHTS}
            cells = [_ci(cols[w]) for w in WEIGHTS]
            cells += [_ci(cols["log_odds"], cols[b], "+.4f") for b in ("tau", "tau_scaled")]
            out.append(f"| {reg} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["Annotator weight (kind weight x reliability; mean over seeds, "
            + " / ".join(WEIGHTS) + "):", ""]
    for reg in regimes:
        names = list(dict.fromkeys(a for r in rows if r["regime"] == reg for a in r["weights"]))
        cells = []
        for a in sorted(names):
            means = [np.mean([r["weights"][a] for r in rows if r["regime"] == reg
                              and r["weight"] == wt]) for wt in WEIGHTS]
            cells.append(f"{a} " + " / ".join(f"{m:.2f}" for m in means))
        out.append(f"* {reg}: " + ", ".join(cells))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = panel_parser(__doc__, "reliability_weight", seeds=20)
    return c.run_or_replot(ap.parse_args(argv), run_seed, tables)


if __name__ == "__main__":
    main()
