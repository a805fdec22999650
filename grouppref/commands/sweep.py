"""Subcommand ``sweep``: the group-size and recipe ablation before the long run (docs/sweep.md),
a thin wrapper over :mod:`grouppref.sweep` (imported inside the command: ``--help`` loads
neither torch nor optuna)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypedDict

import typer
from rich.table import Table

from grouppref.commands.arguments import AllowStale
from grouppref.commands.options import Custom, Extra, config_command, help_of
from grouppref.commands.output import err, esc, out
from grouppref.commands.train import DataArg
from grouppref.config import read_config_file
from grouppref.errors import ConfigError, StageError
from grouppref.schemas.sweep import SweepSummary
from grouppref.sweep.config import SweepConfig, parse_param


def _params(values: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for text in values:
        try:
            key, spec = parse_param(text)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        found[key] = spec
    return found


def _train_file(path: str) -> dict[str, Any]:
    """A train config file (or a run config's ``train`` section) as the base settings."""
    data = read_config_file(path)
    return data["train"] if isinstance(data.get("train"), dict) and "lr" not in data else data


class _SweepExtras(TypedDict):
    data: str  # DataArg
    out: Path | None
    max_trials: int | None
    allow_stale: bool


def _run_sweep(config: SweepConfig, extras: _SweepExtras, force: bool) -> None:
    from grouppref.sweep.run import sweep_data

    summary = sweep_data(extras["data"], config, extras["out"], max_trials=extras["max_trials"],
                         allow_stale=extras["allow_stale"], force=force,
                         progress=lambda line: err.print(esc(line)))
    where = extras["out"]
    if where is None:  # a run: RUN/sweep
        from grouppref.runs.store import RunStore

        where = RunStore(extras["data"]).stage_dir("sweep")
    print_summary(summary, where)
    failed = [t for t in summary.trials if t.state == "failed"]
    if failed and not any(t.state in ("complete", "pruned") for t in summary.trials):
        raise StageError(f"every trial failed ({len(failed)}), e.g. trial {failed[0].number}: "
                         f"{failed[0].error}")


def print_summary(summary: SweepSummary, where: Path | None) -> None:
    """The settings (mean and interval over seeds), then the pruned and failed trials."""
    keys = sorted(summary.space)
    budget = {"steps": "equal steps", "tokens": "equal tokens",
              "annotation": "equal annotation cost"}[summary.budget]
    done = sum(t.state in ("complete", "pruned", "failed") for t in summary.trials)
    table = Table(title=f"sweep {summary.study}: held-out {summary.metric} at {budget}"
                  f"{'' if summary.amount is None else f' ({summary.amount})'}, "
                  f"{len(summary.seeds)} seed(s), {done} of {summary.total} trials")
    for key in keys:
        table.add_column(key, justify="right")
    for col in ("seeds", "mean", "95% interval", "trials"):
        table.add_column(col, justify="right")
    for s in summary.settings:
        ci = "" if s.low is None else f"[{s.low:.4g}, {s.high:.4g}]"
        table.add_row(*(esc(_fmt(s.params.get(k))) for k in keys), str(s.n), f"{s.mean:.4g}",
                      ci, ",".join(map(str, s.trials)))
    out.print(table)
    for t in summary.trials:
        if t.state in ("pruned", "failed", "interrupted"):
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in t.params.items())
            why = t.error or (f"last held-out {_fmt(t.last_intermediate)}"
                              if t.state == "pruned" else "")
            out.print(f"trial {t.number} {t.state}: {esc(shown)}" + (f" ({esc(why)})" if why
                                                                      else ""))
    if where is not None and summary.best is not None:
        out.print(f"best: {esc(' '.join(f'{k}={_fmt(v)}' for k, v in summary.best.items()))} "
                  f"-> {esc(str(where / 'best.yaml'))}")


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


sweep = config_command(
    SweepConfig, _run_sweep, name="sweep", section="sweep",
    doc="Group-size and recipe ablation on Optuna before the long run: short train + held-out "
    "eval trials over a search space (--param k=2,4,8 --param lr=loguniform:1e-6:1e-4), "
    "budgets that keep trials comparable, seeds per setting; writes a table, a plot and "
    "best.yaml. Reruns resume; --storage postgresql://... shares one study between machines.",
    extras=[
        Extra("data", DataArg),
        Extra("out", Annotated[Path | None, typer.Option(
            "--out", help="The sweep's folder: study.db, summary.json/.md, sweep.png, best.yaml, "
            "trials/ (default in a run: RUN/sweep; required otherwise).",
            show_default=False)], None),
        Extra("max_trials", Annotated[int | None, typer.Option(
            "--max-trials", help="Run at most this many trials now (a rerun goes on).",
            show_default=False)], None),
        Extra("allow_stale", AllowStale, False),
    ],
    custom={"params": Custom("--param", help_of(SweepConfig, "params") + " Repeat for several.",
                             _params, multiple=True, metavar="KEY=SPEC"),
            "train": Custom("--train-config", help_of(SweepConfig, "train"), _train_file,
                            metavar="FILE")},
    force_help="In a run: open RUN/sweep again even when it is complete (trials done stay "
    "done; another search space is another study anyway).")


def register(app: typer.Typer) -> None:
    app.command()(sweep)
