"""The report's sweep section: the settings of ``RUN/sweep`` with their mean and interval over
seeds, the budget that made them comparable, the pruned and failed trials, and the sweep's plot
(held-out metric against each swept setting, pruned trials shown), embedded as it was written."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from pydantic import ValidationError

from grouppref.pipeline.report.html_blocks import h2, img, table
from grouppref.runs.manifest import Manifest
from grouppref.schemas.sweep import SweepSummary

_BUDGETS = {"steps": "equal optimizer steps", "tokens": "equal trained tokens",
            "annotation": "equal annotation cost (a group of k costs k reads to rank)"}


def section_sweep(manifest: Manifest | None) -> str:
    """The section, or nothing when the run has no complete sweep stage."""
    if manifest is None or manifest.status != "complete":
        return ""
    try:
        summary = SweepSummary.model_validate(manifest.stats)
    except ValidationError:
        return ""
    keys = sorted(summary.space)
    amount = "" if summary.amount is None else f", {summary.amount} per seed"
    head = (f"<p class='muted'>Held-out {html.escape(summary.metric)} ({summary.direction}) "
            f"at {_BUDGETS[summary.budget]}{amount}; seeds {summary.seeds}; sampler "
            f"{summary.sampler}; study {html.escape(summary.study)}. Means and 95% intervals "
            "over seeds, never the best seed.</p>")
    rows = [[*(s.params.get(k) for k in keys), s.n, s.mean, s.low, s.high]
            for s in summary.settings]
    others = [[t.number, t.state, ", ".join(f"{k}={v}" for k, v in t.params.items()),
               t.error or (t.last_intermediate if t.state == "pruned" else None)]
              for t in summary.trials if t.state in ("pruned", "failed", "interrupted")]
    plot = ""
    png = Path(manifest.outputs.get("plot", ""))
    if png.is_file():
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        plot = img(f"data:image/png;base64,{data}", "held-out metric against each swept setting")
    best = ""
    if summary.best is not None:
        shown = ", ".join(f"{k}={v}" for k, v in summary.best.items())
        best = (f"<div class='box'>Best setting: {html.escape(shown)}; written as "
                f"{html.escape(manifest.outputs.get('best', 'best.yaml'))} for "
                "<code>grouppref train DATA --config best.yaml</code>.</div>")
    return (h2("Sweep: group size and recipe", "sweep") + head + best + plot
            + table([*keys, "seeds", "mean", "low", "high"], rows)
            + (table(["trial", "state", "setting", "why / last value"], others) if others
               else ""))
