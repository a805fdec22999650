"""``grouppref aggregate RUN`` and ``grouppref simulate RUN``: thin wrappers with rich reports."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from grouppref.commands.arguments import RunArg, RunExtras
from grouppref.commands.options import Custom, Extra, config_command, help_of
from grouppref.commands.output import esc, out, print_stage
from grouppref.errors import ConfigError
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.simulate.config import SimulateConfig
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas.reports import AggregateReport


def _pairs(items: list[str], option: str, example: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {item!r}: expected {example}")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _kind_weights(items: list[str]) -> dict[str, Any]:
    out_: dict[str, Any] = {}
    for kind, value in _pairs(items, "--kind-weight", "KIND=WEIGHT, e.g. reward_model=0.5"):
        try:
            out_[kind] = float(value)
        except ValueError as e:
            raise ConfigError(f"--kind-weight {kind}={value}: the weight must be a number") from e
    return out_


def _run_aggregate(config: AggregateConfig, extras: RunExtras, force: bool) -> None:
    from grouppref.pipeline.aggregate.stage import read_report, run_aggregate

    store = RunStore(extras["run"])
    print_stage(run_aggregate(store, config, StageContext(force=force)))
    print_aggregate_report(read_report(store))


aggregate = config_command(
    AggregateConfig, _run_aggregate, name="aggregate", section="aggregate",
    doc="Fit consensus, strengths and pair preferences per group into RUN/aggregate.",
    extras=[Extra("run", RunArg)],
    rename={"drop_unreliable": "--drop-unreliable"},
    custom={"kind_weights": Custom("--kind-weight", "KIND=WEIGHT (repeatable). "
                                   + help_of(AggregateConfig, "kind_weights"), _kind_weights,
                                   multiple=True, metavar="KIND=WEIGHT")})


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def print_aggregate_report(report: AggregateReport) -> None:
    """Rich tables: annotators, noise rules, agreement, noise and the recommendation."""
    table = Table(title="annotator reliability")
    for col in ("annotator", "kind", "groups", "votes", "tau (LOO)", "flip rate",
                "annotator weight", "status"):
        table.add_column(col, justify="left" if col in ("annotator", "kind", "status")
                         else "right", overflow="fold")
    for a in report.annotators:
        status = "[red]dropped[/]" if a.dropped else "[yellow]unreliable[/]" if a.unreliable else "ok"
        tau = "-" if a.tau is None else f"{a.tau:.3f} ± {a.tau_se or 0:.3f}"
        table.add_row(esc(a.id), a.kind, str(a.groups), str(a.votes), tau, _num(a.flip_rate),
                      f"{a.annotator_weight:.3f}", status)
    out.print(table)
    rules = Table(title="noise rules")
    for col in ("rule", "action", "flagged", "dropped"):
        rules.add_column(col, justify="left" if col in ("rule", "action") else "right")
    for name, r in report.rules.items():
        rules.add_row(name, r.action, str(r.flagged), str(r.dropped))
    out.print(rules)
    kw = report.agreement["kendall_w"]
    if kw.count:
        q = kw.quantiles
        out.print(f"Kendall's W over {kw.count} groups: mean {kw.mean:.3f}, p10 {q['p10']:.3f}, "
                  f"median {q['p50']:.3f}, p90 {q['p90']:.3f}")
    noise = report.noise
    out.print(f"estimated noise rate: {_num(noise.estimated, '{:.1%}')} on pairs no ranking ties "
              f"(votes against the consensus: {_num(noise.observed_against_consensus, '{:.1%}')}; "
              f"pairs some ranking ties: {_num(noise.tied_pair_share, '{:.1%}')})")
    rec = report.recommendation
    colour = "yellow" if rec.loss == "dpo" else "green"
    out.print(f"pair targets: {rec.pair_targets} (soft: the BT fit's p and confidence; hard: "
              "the consensus order, p = 1)")
    out.print(f"recommendation: [{colour}]{rec.loss}[/] ({rec.reason}); {rec.note}")
    if report.settings is not None:
        out.print(f"settings: {esc(report.settings.describe())}")


def _panel(items: list[str]) -> list[dict[str, Any]]:
    panel: list[dict[str, Any]] = []
    for aid, value in _pairs(items, "--annotator", "ID=FLIP_RATE, ID=random or ID=reversed"):
        if value in ("random", "reversed"):
            panel.append({"id": aid, "behavior": value})
            continue
        try:
            panel.append({"id": aid, "flip_rate": float(value)})
        except ValueError as e:
            raise ConfigError(f"--annotator {aid}={value}: expected a flip rate, 'random' or "
                              "'reversed'") from e
    return panel


def _run_simulate(config: SimulateConfig, extras: RunExtras, force: bool) -> None:
    from grouppref.pipeline.simulate.stage import run_simulate

    stage = run_simulate(RunStore(extras["run"]), config, StageContext(force=force))
    print_stage(stage)
    table = Table(title="simulated panel")
    for col in ("annotator", "behavior", "flip rate", "realised", "pairs"):
        table.add_column(col, justify="left" if col in ("annotator", "behavior") else "right",
                         overflow="fold")
    for aid, a in stage.manifest.stats.get("annotators", {}).items():
        table.add_row(esc(aid), a["behavior"], f"{a['flip_rate']:.3f}", _num(a["realised_flip_rate"]),
                      str(a["pairs"]))
    out.print(table)


simulate = config_command(
    SimulateConfig, _run_simulate, name="simulate", section="simulate",
    doc="Add a simulated annotator panel's rankings to the groups (RUN/simulate).",
    extras=[Extra("run", RunArg)],
    rename={"truth_use_scores": "--truth-scores", "truth_kinds": "--truth-kind"},
    custom={"annotators": Custom("--annotator", "ID=FLIP_RATE, ID=random or ID=reversed "
                                 "(repeatable). " + help_of(SimulateConfig, "annotators"),
                                 _panel, multiple=True, metavar="ID=BEHAVIOUR")})


def register(app: typer.Typer) -> None:
    app.command()(aggregate)
    app.command()(simulate)
