"""The ``report`` stage: one self-contained HTML file describing a run.

Everything is inline (CSS, and matplotlib plots as base64 PNG), so the file makes no external
request and can be mailed or attached to a ticket. Sections appear for the stages that ran:
counts per stage with reject reasons, agreement histogram, annotator reliability, pair-weight
distribution, estimated (and, for simulated panels, true) noise with the DPO-fallback
recommendation, the reward model's curves and held-out accuracy, training curves and the before/after
evaluation.

It describes the run's current stages only (:func:`grouppref.runs.freshness.run_manifests`):
stages made before the last ``grouppref run`` by another config are left out. A stale stage
(an upstream stage changed after it ran) is refused unless ``allow_stale``; the report then
opens with a warning naming each stale stage and what changed.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from grouppref.errors import StageError
from grouppref.pipeline.report.config import STAGE, ReportConfig
from grouppref.pipeline.report.html_blocks import figure_png, fmt, h2, img, missing, table
from grouppref.pipeline.report.reward_model import section_reward_model
from grouppref.pipeline.report.selection import describe_selection, read_selection, selection_table
from grouppref.pipeline.report.sweep import section_sweep
from grouppref.pipeline.report.training_curves import MetricsRead, curves, read_metrics
from grouppref.runs.freshness import rerun_chain, run_manifests, stale_causes, stale_note, step_of
from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.runs.manifest import Manifest, read_rejects
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import ValidatedGroup  # noqa: E402
from grouppref.schemas.reports import AggregateReport, EvalReport, ServerUsage  # noqa: E402

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#1d232a;line-height:1.45;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;border-bottom:1px solid #d8dee4;
padding-bottom:.2rem;margin-top:2rem}table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{border:1px solid #d8dee4;padding:.3rem .6rem;text-align:left}th{background:#f3f5f7}
td.num{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#57606a;font-size:.9rem}
.box{background:#f6f8fa;border-left:4px solid #0969da;padding:.6rem 1rem;margin:.8rem 0}
.warn{border-left-color:#bf8700}img{max-width:100%;height:auto}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
"""


# Nothing outside the file may load: images are data: URIs, styles inline.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
NAV = (("stages", "Stages"), ("agreement", "Agreement"), ("noise", "Annotators and noise"),
       ("reward-model", "Reward model"), ("training", "Training"), ("evaluation", "Evaluation"))


# -- sections ---------------------------------------------------------------------------------
class RunView:
    """The stages a report describes: the run's current ones (see the module docstring)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.manifests = [m for m in run_manifests(store) if m.stage != STAGE]
        self._names = {m.stage for m in self.manifests}

    def has(self, stage: str) -> bool:
        return stage in self._names

    def manifest(self, stage: str) -> Manifest | None:
        return self.store.manifest(stage) if self.has(stage) else None

    def is_complete(self, stage: str) -> bool:
        m = self.manifest(stage)
        return m is not None and m.status == "complete"

    def stale(self) -> dict[str, list[str]]:
        """Complete stages described that are stale, with what changed."""
        found = {m.stage: stale_causes(self.store, m.stage) for m in self.manifests
                 if m.status == "complete"}
        return {name: causes for name, causes in found.items() if causes}


def section_counts(view: RunView, max_reasons: int) -> str:
    rows, reasons = [], []
    for m in view.manifests:
        c = m.counts
        rows.append([m.stage, m.status, c.inputs, c.outputs, c.rejected, c.partial,
                     m.seconds])
        rejects = read_rejects(view.store.stage_dir(m.stage) / "rejects.jsonl")
        common = Counter((r.scope, reject_kind(r.reason)) for r in rejects)
        reasons += [[m.stage, "whole row" if scope == "row" else "part of a row", reason, n]
                    for (scope, reason), n in common.most_common(max_reasons)]
    out = h2("Stages", "stages") + table(
        ["stage", "status", "in", "out", "rejected", "partly rejected", "seconds"], rows)
    out += section_servers(view.manifests)
    if reasons:
        out += "<h3>Most common reject reasons</h3>" + table(
            ["stage", "rejected", "reason", "count"], reasons)
    return out


def section_servers(manifests: list[Manifest]) -> str:
    """Requests and tokens per stage, server and model (stages of the run that used inference
    servers)."""
    rows = []
    for m in manifests:
        for item in m.stats.get("servers") or []:
            u = ServerUsage.model_validate(item)
            failed = ", ".join(f"{cause}: {n}" for cause, n in sorted(u.failures.items()))
            rows.append([m.stage, u.server, u.model, u.requests, u.retried, u.refused,
                         failed or "-", u.prompt_tokens, u.completion_tokens])
    if not rows:
        return ""
    return "<h3>Inference servers</h3>" + table(
        ["stage", "server", "model", "requests", "retried", "refused", "failed attempts",
         "prompt tokens", "completion tokens"], rows)


def reject_kind(reason: str) -> str:
    """A reject reason with its numbers blanked, so equal causes count together."""
    return re.sub(r"(?<![\w.-])\d+(\.\d+)?(?![\w-])", "#", reason)[:160]


def _validated(view: RunView) -> list[ValidatedGroup]:
    for stage in ("validate", "aggregate"):
        if view.is_complete(stage):
            return view.store.load_records(stage, ValidatedGroup)
    return []


def section_agreement(groups: list[ValidatedGroup]) -> str:
    ws = [g.agreement.kendall_w for g in groups if g.agreement.kendall_w is not None]
    weights = [p.weight for g in groups for p in g.pairs]
    probs = [p.p for g in groups for p in g.pairs]
    if not ws and not weights:
        return missing("Agreement and pair weights", "agreement",
                        "No aggregated groups yet (run the aggregate stage).")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
    axes[0].hist(ws, bins=20, range=(0, 1), color="#0969da")
    axes[0].set(title="Kendall's W per group", xlabel="W", ylabel="groups")
    axes[1].hist(weights, bins=20, range=(0, 1), color="#1a7f37")
    axes[1].set(title="pair confidence weight w_ij", xlabel="w", ylabel="pairs")
    axes[2].hist(probs, bins=20, range=(0.5, 1), color="#8250df")
    axes[2].set(title="pair probability p_ij", xlabel="p", ylabel="pairs")
    flags = Counter(f for g in groups for f in g.flags)
    flag_rows = [[f, n] for f, n in flags.most_common()]
    return (h2("Agreement and pair weights", "agreement") + img(figure_png(fig), "agreement histograms")
            + f"<p class='muted'>{len(groups)} groups, {len(weights)} pairs.</p>"
            + (table(["flag", "groups"], flag_rows) if flag_rows else ""))


def _aggregate_report(view: RunView) -> AggregateReport | None:
    path = view.store.stage_dir("aggregate") / "report.json"
    if not view.has("aggregate") or not path.exists():
        return None
    return AggregateReport.model_validate_json(path.read_text())


def _settings_box(report: AggregateReport) -> str:
    """The aggregate settings that shaped these numbers (reports written before they were
    recorded say so)."""
    if report.settings is None:
        return ("<p class='muted'>Aggregate settings: not in this report (written by an older "
                "version); see the aggregate manifest's config.</p>")
    return (f"<div class='box'><b>Aggregate settings.</b> "
            f"{html.escape(report.settings.describe())}</div>")


def section_noise(view: RunView) -> str:
    report = _aggregate_report(view)
    if report is None:
        return missing("Annotators and noise", "noise",
                        "No aggregate report yet (run the aggregate stage).")
    out = h2("Annotators and noise", "noise")
    sim = view.manifest("simulate")
    truth = (sim.stats.get("annotators") or {}) if sim is not None else {}
    if report.annotators:
        rows = [[a.id, a.kind, a.groups, a.tau, a.flip_rate,
                 (truth.get(a.id) or {}).get("realised_flip_rate"), a.annotator_weight,
                 "yes" if a.unreliable else "", "yes" if a.dropped else ""]
                for a in report.annotators]
        out += table(["annotator", "kind", "groups", "tau vs consensus", "estimated flip rate",
                       "true flip rate (simulated)", "annotator weight", "unreliable",
                       "dropped"], rows)
    noise, rec = report.noise, report.recommendation
    if noise.estimated is not None:
        kept_sim = [a for a in report.annotators if a.id in truth and not a.dropped]
        extra = ""
        if kept_sim:
            est = sum(a.flip_rate or 0.0 for a in kept_sim) / len(kept_sim)
            true = sum(truth[a.id]["realised_flip_rate"] for a in kept_sim) / len(kept_sim)
            extra = (f"<br>Simulated annotators kept in the fit: mean estimated flip rate "
                     f"<b>{est:.1%}</b>, mean true flip rate <b>{true:.1%}</b>.")
        warn = " warn" if rec.loss != "gspo" else ""
        loss = str(rec.loss or "none: do not train on these labels")
        out += (f"<div class='box{warn}'>Estimated label noise (all annotators in the fit): "
                f"<b>{noise.estimated:.1%}</b>; share of votes against the consensus: "
                f"{fmt(noise.observed_against_consensus)}; pairs some ranking ties (left out of "
                f"the estimate): {fmt(noise.tied_pair_share)}.{extra}<br>Pair targets: "
                f"<b>{html.escape(rec.pair_targets)}</b>. Recommended loss: "
                f"<b>{html.escape(loss)}</b> ({html.escape(rec.reason)})."
                f"<br><span class='muted'>{html.escape(rec.note)}</span></div>")
    out += _settings_box(report)
    if report.rules:
        out += "<h3>Noise rules</h3>" + table(
            ["rule", "action", "groups flagged", "groups dropped"],
            [[name, r.action, r.flagged, r.dropped] for name, r in report.rules.items()])
    return out


def _train_log(view: RunView) -> MetricsRead:
    if view.manifest("train") is None:
        return MetricsRead()
    return read_metrics(sorted(view.store.stage_dir("train").rglob("metrics.jsonl")))


def section_training(view: RunView) -> str:
    log = _train_log(view)
    train = [r for r in log.of("train") if r.loss is not None]
    held = log.of("eval")
    if not train:
        return missing("Training", "training", "No training in this run.") + log.note("training")
    last = train[-1]
    speed = (f"<p class='muted'>last logged step {last.step}: "
             f"{fmt(last.groups_per_s)} groups/s, {fmt(last.tokens_per_s)} "
             f"tokens/s, KL to reference {fmt(last.kl)}</p>")
    return (h2("Training", "training") + curves(train, held, "training curves") + speed
            + log.note("training"))


def section_eval(view: RunView) -> str:
    path = view.store.stage_dir("eval") / "metrics.json"
    if not view.is_complete("eval") or not path.exists():
        return missing("Evaluation on the held-out split", "evaluation",
                        "No evaluation in this run.")
    report = EvalReport.model_validate_json(path.read_text())
    before = report.metrics.get("baseline") or {}
    after = report.metrics.get("model") or {}
    keys = [k for k in before if isinstance(before.get(k), int | float) and k != "groups"]
    rows = [[k, before.get(k), after.get(k), _difference(after.get(k), before.get(k))]
            for k in keys]
    head = (f"<p class='muted'>{report.groups} held-out groups ({report.split} split); before "
            f"= {html.escape(str(report.baseline))}, after = {html.escape(str(report.model))}; "
            f"implicit reward beta = {fmt(report.beta)} against "
            f"{html.escape(str(report.ref_model))}.</p>")
    plot = _eval_plot(before, after, keys)
    return (h2("Evaluation on the held-out split", "evaluation") + head + plot
            + table(["metric", "before", "after", "change"], rows))


def _difference(after: float | None, before: float | None) -> float | None:
    """``after - before`` when both were measured."""
    return after - before if isinstance(after, int | float) and isinstance(before, int | float) \
        else None


def _eval_plot(before: dict[str, Any], after: dict[str, Any], keys: list[str]) -> str:
    """Bars before/after: accuracies (share of pairs ordered as the consensus) and margins."""
    both = [k for k in keys if isinstance(after.get(k), int | float)]
    groups = [[k for k in both if "accuracy" in k], [k for k in both if "accuracy" not in k]]
    groups = [g for g in groups if g]
    if not groups:
        return ""
    fig, axes = plt.subplots(1, len(groups), figsize=(6.2 * len(groups), 3.2), squeeze=False)
    for ax, names in zip(axes[0], groups, strict=True):
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [before[k] for k in names], 0.4, label="before",
               color="#8c959f")
        ax.bar([i + 0.2 for i in x], [after[k] for k in names], 0.4, label="after",
               color="#0969da")
        ax.set_xticks(list(x), [k.replace("_", " ") for k in names], rotation=15)
        ax.axhline(0, color="#57606a", linewidth=0.6)
        ax.legend()
    axes[0][0].set(title="pair accuracy vs the consensus" if "accuracy" in groups[0][0]
                   else "margins and rewards")
    if len(groups) > 1:
        axes[0][1].set(title="margins, rewards and KL")
    return img(figure_png(fig), "evaluation before and after training")


def section_selection(view: RunView) -> str:
    """Which groups people saw (only when the run labelled with a selection)."""
    sel = read_selection(view.store) if view.has("label") or view.has("label/push") else None
    if sel is None or sel.select == "all":
        return ""
    header, rows = selection_table(sel)
    return (h2("Human labeling: which groups people saw", "labeling")
            + f"<div class='box'>{html.escape(describe_selection(sel))}</div>"
            + table(header, rows))


def _stale_box(stale: dict[str, list[str]]) -> str:
    return f"<div class='box warn'><b>Stale input.</b> {html.escape(stale_note(stale))}</div>"


def render_report(store: RunStore, config: ReportConfig,
                  stale: dict[str, list[str]] | None = None) -> str:
    """The whole HTML page for a run (its current stages; a warning first when ``stale``)."""
    view = RunView(store)
    title = config.title or f"grouppref run {store.name}"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections = [_stale_box(stale) if stale else "", section_counts(view, config.max_reject_reasons)]
    groups = _validated(view)
    sections += [section_selection(view), section_agreement(groups), section_noise(view),
                 section_reward_model(view.manifest("train_rm")),
                 section_sweep(view.manifest("sweep")), section_training(view),
                 section_eval(view)]
    body = "".join(s for s in sections if s)
    nav = " &middot; ".join(f"<a href='#{a}'>{t}</a>" for a, t in NAV)
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<link rel='icon' href='data:,'>"  # no favicon request
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p class='muted'>{html.escape(store.name)} "
            f"&middot; generated {now}</p><nav class='muted'>{nav}</nav>{body}</body></html>")


def run_report(store: RunStore, config: ReportConfig | None = None,
               context: StageContext = StageContext()) -> StageRun[Any]:
    """Write the run's report; cached until a stage it describes changes.

    Args:
        store (RunStore): the run.
        config (ReportConfig | None): the settings.
        context (StageContext): ``force``: render again even when nothing changed;
            ``allow_stale``: render stale stages too, under a warning, instead of refusing.

    Returns:
        StageRun: ``manifest.outputs["html"]`` is the file written.

    Raises:
        StageError: a stage the report describes is stale (without ``allow_stale``).
    """
    config = config or ReportConfig()
    path = Path(config.output) if config.output else store.stage_dir(STAGE) / "report.html"
    view = RunView(store)
    stale = view.stale()
    if stale and not context.allow_stale:
        step = step_of(rerun_chain(store, next(iter(stale)))[0])
        raise StageError(
            f"{store.root}: {len(stale)} stage(s) the report would describe are stale: "
            + "; ".join(f"{s} (input changed: {', '.join(c)})" for s, c in stale.items())
            + f"; re-run them (`grouppref run CONFIG --from {step}`), or "
            "pass --allow-stale to report them under a warning")
    described = [m for m in view.manifests if m.status == "complete"]
    # any stage re-run (even with the same output: new timings) renders the report again
    when = sha256_text(canonical_json({"stages": [[m.stage, m.finished_at] for m in described],
                                       "stale": stale}))
    stage: StageRun[Any] = store.open_stage(STAGE, config, input_fingerprint=when,
                                            inputs=[m.stage for m in described], record_type=None,
                                            force=context.force)
    if stage.cached:
        return stage
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(store, config, stale), encoding="utf-8")
    return stage.finish(inputs=0, outputs={"html": str(path)})
