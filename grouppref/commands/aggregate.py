"""``grouppref aggregate RUN`` and ``grouppref simulate RUN``: thin wrappers with rich reports.

Options left out keep the settings' defaults (one source: the pydantic configs); every help
string is the config field's description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

from grouppref.commands.core import report_stage
from grouppref.commands.options import help_of
from grouppref.errors import ConfigError
from grouppref.pipeline.aggregate.stage import AggregateConfig, read_report, run_aggregate
from grouppref.pipeline.simulate.stage import AnnotatorSpec, SimulateConfig, run_simulate
from grouppref.runs.store import RunStore

console = Console()
Action = Literal["off", "flag", "drop"]
RunArg = Annotated[Path, typer.Argument(help="Run directory, e.g. runs/demo.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Re-run even when the cache is valid.")]


def _h(model: type[BaseModel], name: str) -> str:
    default = model.model_fields[name].get_default(call_default_factory=True)
    return f"{help_of(model, name)} [default: {default}]"


def _a(name: str) -> str:
    return _h(AggregateConfig, name)


def _s(name: str) -> str:
    return _h(SimulateConfig, name)


def _build(model: type[BaseModel], values: dict[str, Any]) -> Any:
    """The config from the options given (``None`` = not given, the default applies)."""
    try:
        return model(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"--{where.replace('_', '-')}: {first['msg']}") from e


def _kind_weights(items: list[str] | None) -> dict[str, float] | None:
    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        try:
            out[kind.strip()] = float(value)
        except ValueError as e:
            raise ConfigError(f"--kind-weight {item!r}: expected KIND=WEIGHT, e.g. "
                              "reward_model=0.5") from e
        if not sep:
            raise ConfigError(f"--kind-weight {item!r}: expected KIND=WEIGHT")
    return out


def aggregate(
    run: RunArg,
    input_stage: Annotated[str | None, typer.Option(help=_a("input_stage"))] = None,
    prior_strength: Annotated[float | None, typer.Option(help=_a("prior_strength"))] = None,
    kind_weight: Annotated[list[str] | None, typer.Option(
        help="KIND=WEIGHT (repeatable). " + _a("kind_weights"))] = None,
    reliability_iterations: Annotated[int | None, typer.Option(
        help=_a("reliability_iterations"))] = None,
    min_groups_for_reliability: Annotated[int | None, typer.Option(
        help=_a("min_groups_for_reliability"))] = None,
    unreliable_tau: Annotated[float | None, typer.Option(help=_a("unreliable_tau"))] = None,
    unreliable_z: Annotated[float | None, typer.Option(help=_a("unreliable_z"))] = None,
    drop_unreliable: Annotated[bool | None, typer.Option(
        "--drop-unreliable/--keep-unreliable", help=_a("drop_unreliable"))] = None,
    min_rankings: Annotated[int | None, typer.Option(help=_a("min_rankings"))] = None,
    too_few_rankings: Annotated[Action | None, typer.Option(help=_a("too_few_rankings"))] = None,
    min_kendall_w: Annotated[float | None, typer.Option(help=_a("min_kendall_w"))] = None,
    low_agreement: Annotated[Action | None, typer.Option(help=_a("low_agreement"))] = None,
    cycle: Annotated[Action | None, typer.Option(help=_a("cycle"))] = None,
    coin_flip_margin: Annotated[float | None, typer.Option(help=_a("coin_flip_margin"))] = None,
    coin_flip: Annotated[Action | None, typer.Option(help=_a("coin_flip"))] = None,
    no_rankings: Annotated[Literal["reject", "flag"] | None, typer.Option(
        help=_a("no_rankings"))] = None,
    tie_tolerance: Annotated[float | None, typer.Option(help=_a("tie_tolerance"))] = None,
    dpo_fallback_threshold: Annotated[float | None, typer.Option(
        help=_a("dpo_fallback_threshold"))] = None,
    batch_size: Annotated[int | None, typer.Option(help=_a("batch_size"))] = None,
    max_iter: Annotated[int | None, typer.Option(help=_a("max_iter"))] = None,
    shard_size: Annotated[int | None, typer.Option(help=_a("shard_size"))] = None,
    force: ForceOpt = False,
) -> None:
    """Fit consensus, strengths and pair preferences per group into RUN/aggregate."""
    values = dict(locals())
    values.pop("run"), values.pop("force")
    values["kind_weights"] = _kind_weights(values.pop("kind_weight"))
    config = _build(AggregateConfig, values)
    store = RunStore(run)
    stage = run_aggregate(store, config, force=force)
    report_stage(stage.manifest.stage, stage.cached, stage.manifest.counts.model_dump(),
                 stage.dir, [r.one_line() for r in stage.rejects()])
    print_aggregate_report(read_report(store))


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def print_aggregate_report(report: dict[str, Any]) -> None:
    """Rich tables: annotators, noise rules, agreement, noise and the recommendation."""
    table = Table(title="annotator reliability")
    for col in ("annotator", "kind", "groups", "votes", "tau (LOO)", "flip rate", "weight",
                "status"):
        table.add_column(col, justify="left" if col in ("annotator", "kind", "status")
                         else "right")
    for a in report["annotators"]:
        status = ("[red]dropped[/]" if a["dropped"] else "[yellow]unreliable[/]"
                  if a["unreliable"] else "ok")
        tau = "-" if a["tau"] is None else f"{a['tau']:.3f} ± {a['tau_se'] or 0:.3f}"
        table.add_row(a["id"], a["kind"], str(a["groups"]), str(a["votes"]), tau,
                      _num(a["flip_rate"]), f"{a['weight']:.3f}", status)
    console.print(table)
    rules = Table(title="noise rules")
    for col in ("rule", "action", "flagged", "dropped"):
        rules.add_column(col, justify="left" if col in ("rule", "action") else "right")
    for name, r in report["rules"].items():
        rules.add_row(name, r["action"], str(r["flagged"]), str(r["dropped"]))
    console.print(rules)
    kw = report["agreement"]["kendall_w"]
    if kw.get("count"):
        q = kw["quantiles"]
        console.print(f"Kendall's W over {kw['count']} groups: mean {kw['mean']:.3f}, "
                      f"p10 {q['p10']:.3f}, median {q['p50']:.3f}, p90 {q['p90']:.3f}")
    noise = report["noise"]
    console.print(f"estimated noise rate: {_num(noise['estimated'], '{:.1%}')} "
                  f"(votes against the consensus: {_num(noise['observed_against_consensus'], '{:.1%}')})")
    rec = report["recommendation"]
    colour = "yellow" if rec["loss"] == "dpo" else "green"
    console.print(f"recommendation: [{colour}]{rec['loss']}[/] ({rec['reason']}); {rec['note']}")


def _panel(items: list[str] | None) -> list[AnnotatorSpec] | None:
    if not items:
        return None
    panel = []
    for item in items:
        aid, sep, value = item.partition("=")
        if not sep or not aid:
            raise ConfigError(f"--annotator {item!r}: expected ID=FLIP_RATE, ID=random or "
                              "ID=reversed")
        try:
            panel.append(AnnotatorSpec(id=aid, behavior=value) if value in ("random", "reversed")
                         else AnnotatorSpec(id=aid, flip_rate=float(value)))
        except (ValueError, ValidationError) as e:
            raise ConfigError(f"--annotator {item!r}: {e}") from e
    return panel


def simulate(
    run: RunArg,
    annotator: Annotated[list[str] | None, typer.Option(
        help="ID=FLIP_RATE, ID=random or ID=reversed (repeatable). " + _s("annotators"))] = None,
    input_stage: Annotated[str | None, typer.Option(help=_s("input_stage"))] = None,
    per_group: Annotated[int | None, typer.Option(help=_s("per_group"))] = None,
    truth_kind: Annotated[list[str] | None, typer.Option(
        help="(repeatable) " + _s("truth_kinds"))] = None,
    truth_annotator: Annotated[str | None, typer.Option(help=_s("truth_annotator"))] = None,
    truth_use_scores: Annotated[bool | None, typer.Option(
        "--truth-scores/--truth-positions", help=_s("truth_use_scores"))] = None,
    seed: Annotated[int | None, typer.Option(help=_s("seed"))] = None,
    shard_size: Annotated[int | None, typer.Option(help=_s("shard_size"))] = None,
    force: ForceOpt = False,
) -> None:
    """Add a simulated annotator panel's rankings to the groups (RUN/simulate)."""
    config = _build(SimulateConfig, {
        "annotators": _panel(annotator), "input_stage": input_stage, "per_group": per_group,
        "truth_kinds": truth_kind or None, "truth_annotator": truth_annotator,
        "truth_use_scores": truth_use_scores, "seed": seed, "shard_size": shard_size})
    stage = run_simulate(RunStore(run), config, force=force)
    report_stage(stage.manifest.stage, stage.cached, stage.manifest.counts.model_dump(),
                 stage.dir, [r.one_line() for r in stage.rejects()])
    table = Table(title="simulated panel")
    for col in ("annotator", "behavior", "flip rate", "realised", "pairs"):
        table.add_column(col, justify="left" if col in ("annotator", "behavior") else "right")
    for aid, a in stage.manifest.stats.get("annotators", {}).items():
        table.add_row(aid, a["behavior"], f"{a['flip_rate']:.3f}",
                      _num(a["realised_flip_rate"]), str(a["pairs"]))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(aggregate)
    app.command()(simulate)
