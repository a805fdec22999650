"""A study turned into what the sweep writes: ``summary.json`` (:class:`SweepSummary`),
``summary.md`` (the table), ``sweep.png`` (the held-out metric against each swept setting,
pruned trials shown) and ``best.yaml`` (the best setting as a train config file)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import yaml

from grouppref.config import redact_credentials
from grouppref.runs.hashing import canonical_json
from grouppref.schemas.sweep import SweepSetting, SweepSummary, SweepTrial, TrialState
from grouppref.sweep.config import trial_train_config

# two-sided 95% quantiles of Student's t, by degrees of freedom (then the normal's 1.96)
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def interval(values: list[float]) -> tuple[float, float | None, float | None]:
    """Mean and 95% t-interval of ``values`` (no interval for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    t = _T95[len(values) - 2] if len(values) - 2 < len(_T95) else 1.96
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


_STATES: dict[str, TrialState] = {"COMPLETE": "complete", "PRUNED": "pruned", "RUNNING": "running",
           "WAITING": "waiting"}


def _trial(t: Any) -> SweepTrial:
    attrs = t.user_attrs
    state: TrialState = ("duplicate" if "duplicate_of" in attrs else _STATES.get(t.state.name)
             or ("failed" if "error" in attrs else "interrupted"))
    value = t.value if state == "complete" else None  # Optuna keeps a pruned one's last
    return SweepTrial(number=t.number, state=state, params=dict(t.params), value=value,
                      seed_values=list(attrs.get("seed_values", [])),
                      last_intermediate=attrs.get("last_intermediate"),
                      steps=attrs.get("steps"), groups=attrs.get("groups"),
                      tokens=attrs.get("tokens"), reads=attrs.get("reads"),
                      error=attrs.get("error"), seconds=attrs.get("seconds"),
                      duplicate_of=attrs.get("duplicate_of"))


def summarize(study: Any, sweep: Any) -> SweepSummary:
    """Every trial, and the settings of the complete ones over their seeds, best first."""
    config = sweep.config
    trials = [_trial(t) for t in study.get_trials(deepcopy=False)]
    by_setting: dict[str, list[SweepTrial]] = {}
    for t in trials:
        if t.state == "complete":
            by_setting.setdefault(canonical_json(t.params), []).append(t)
    settings = []
    for group in by_setting.values():
        values = [v for t in group for v in t.seed_values]
        mean, low, high = interval(values)
        settings.append(SweepSetting(params=group[0].params, n=len(values), mean=mean, low=low,
                                     high=high, trials=[t.number for t in group]))
    settings.sort(key=lambda s: -s.mean if config.direction == "maximize" else s.mean)
    return SweepSummary(
        study=sweep.name, storage=redact_credentials(sweep.url), key=sweep.key,
        metric=config.metric, direction=config.direction, budget=config.budget,
        amount=config.amount if config.budget != "steps" else config.default_amount(),
        sampler=config.sampler, seeds=sweep.seeds,
        space=config.params, total=sweep.total, settings=settings, trials=trials,
        best=settings[0].params if settings else None)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _budget_text(summary: SweepSummary) -> str:
    what = {"steps": "equal optimizer steps", "tokens": "equal trained tokens",
            "annotation": "equal annotation cost (a group of k costs k reads)"}[summary.budget]
    amount = "" if summary.amount is None else f" ({summary.amount} per seed)"
    return f"{what}{amount}"


def markdown(summary: SweepSummary) -> str:
    """The summary as markdown: the budget, settings with mean and interval, every trial."""
    keys = sorted(summary.space)
    lines = [f"# sweep {summary.study}", "",
             f"Held-out {summary.metric} ({summary.direction}), budget: {_budget_text(summary)}, "
             f"seeds {summary.seeds}, sampler {summary.sampler}, "
             f"{sum(t.state in ('complete', 'pruned', 'failed') for t in summary.trials)} of "
             f"{summary.total} trials done.", "",
             "## Settings (mean and 95% interval over seeds)", "",
             "| " + " | ".join([*keys, "n", "mean", "interval"]) + " |",
             "|" + "---|" * (len(keys) + 3)]
    for s in summary.settings:
        ci = "" if s.low is None else f"[{s.low:.4g}, {s.high:.4g}]"
        lines.append("| " + " | ".join([*(_fmt(s.params.get(k)) for k in keys), str(s.n),
                                        f"{s.mean:.4g}", ci]) + " |")
    lines += ["", "## Trials", "",
              "| " + " | ".join(["trial", "state", *keys, "value", "steps", "tokens", "reads",
                                 "note"]) + " |",
              "|" + "---|" * (len(keys) + 7)]
    for t in summary.trials:
        note = t.error or ""
        if t.state == "duplicate":
            note = f"the same grid point as trial {t.duplicate_of}"
        elif t.state == "pruned":
            note = f"last intermediate {_fmt(t.last_intermediate)}"
        lines.append("| " + " | ".join([str(t.number), t.state,
                                        *(_fmt(t.params.get(k)) for k in keys), _fmt(t.value),
                                        _fmt(t.steps), _fmt(t.tokens), _fmt(t.reads),
                                        note.replace("|", "/")]) + " |")
    if summary.best is not None:
        lines += ["", f"Best: {', '.join(f'{k}={_fmt(v)}' for k, v in summary.best.items())}"
                  " (written as best.yaml)."]
    return "\n".join(lines) + "\n"


def plot(summary: SweepSummary, path: Path) -> Path | None:
    """``path``: the held-out metric against each swept setting; every seed a dot, each
    setting's mean with its interval, pruned trials as crosses at their last value."""
    keys = sorted(summary.space)
    if not keys or not summary.trials:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        values = sorted({repr(t.params[key]): t.params[key]
                         for t in summary.trials if key in t.params}.values(),
                        key=lambda v: (isinstance(v, str), v))
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)

        def pos(v: Any, numeric: bool = numeric, values: list[Any] = values) -> Any:
            return v if numeric else values.index(v)

        for t in summary.trials:
            if key not in t.params:
                continue
            x = pos(t.params[key])
            if t.state == "complete":
                ax.scatter([x] * len(t.seed_values), t.seed_values, s=12, color="tab:blue",
                           alpha=0.5)
            elif t.state == "pruned" and t.last_intermediate is not None:
                ax.scatter([x], [t.last_intermediate], marker="x", color="tab:red",
                           label="pruned")
        for s in summary.settings:
            x = pos(s.params[key])
            err = (None if s.low is None or s.high is None
                   else [[s.mean - s.low], [s.high - s.mean]])
            ax.errorbar([x], [s.mean], yerr=err, fmt="o", color="black", capsize=3,
                        markersize=4)
        if numeric and key in ("lr", "beta") and min(values) > 0:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set_xlabel(key)
        ax.set_ylabel(f"held-out {summary.metric}")
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles[:1], labels[:1], fontsize=7)
    fig.suptitle(f"sweep: {_budget_text(summary)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def best_yaml(summary: SweepSummary, sweep: Any) -> str | None:
    """The best setting as a train config file: the base settings with the best swept values
    (the sweep's short budget left out); its group size and budget in comments."""
    if summary.best is None:
        return None
    config = trial_train_config(sweep.config.train, summary.best)
    data = config.model_dump(mode="json", exclude_defaults=True)
    best = summary.settings[0]
    head = [f"# grouppref sweep {summary.study}: the best of {len(summary.settings)} settings,",
            f"# held-out {summary.metric} {best.mean:.4g}"
            + ("" if best.low is None else f" [{best.low:.4g}, {best.high:.4g}]")
            + f" over {best.n} seeds, at {_budget_text(summary)}.",
            f"# swept: {', '.join(f'{k}={_fmt(v)}' for k, v in summary.best.items())}"]
    if "k" in summary.best:
        head.append(f"# group size k={summary.best['k']}: rank groups of that size for the "
                    "long run (train reads the groups as they are).")
    head.append("# use: grouppref train DATA --config best.yaml")
    body = yaml.safe_dump(data, sort_keys=True) if data else "{}\n"
    return "\n".join(head) + "\n" + body


def write_outputs(summary: SweepSummary, sweep: Any, out: Path) -> None:
    """``summary.json``, ``summary.md``, ``sweep.png`` and ``best.yaml`` into ``out``."""
    (out / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    plot(summary, out / "sweep.png")
    text = best_yaml(summary, sweep)
    if text is not None:
        (out / "best.yaml").write_text(text)
