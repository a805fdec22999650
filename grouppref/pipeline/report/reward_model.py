"""The report's reward-model section (the ``train_rm`` stage): what was trained on what, the
training and held-out curves by step from the model folder's ``metrics.jsonl``, and the
held-out pair accuracy, loss and reward margin before and after training, read from the stage's
typed report (:class:`~grouppref.schemas.reports.RewardModelStats`)."""

from __future__ import annotations

import html
from pathlib import Path

from grouppref.pipeline.report.html_blocks import fmt, h2, missing, table
from grouppref.pipeline.report.training_curves import curves, read_metrics
from grouppref.runs.manifest import Manifest
from grouppref.schemas.reports import RewardModelStats

ANCHOR, TITLE = "reward-model", "Reward model"
HELD_OUT = ("pair_accuracy", "loss", "margin", "reward_mean", "reward_std")


def _summary(stats: RewardModelStats) -> str:
    g = stats.groups
    how = "LoRA adapters and the score head" if stats.lora else "every weight"
    resumed = (f"; resumed from the checkpoint of step {stats.resumed_from_step}"
               if stats.resumed_from_step else "")
    return (f"<p class='muted'>{html.escape(stats.base_model or 'base model')} with a 1-output "
            f"head, {html.escape(how)} trained with the {html.escape(stats.loss)} loss for "
            f"{stats.steps} steps ({fmt(stats.epochs)} epochs){resumed}: {g.train} groups "
            f"trained on, {g.held_out} held out, {g.rejected} rejected, "
            f"{g.dropped_candidates} candidates over max_length; {fmt(stats.pairs_per_s)} "
            f"pairs/s over {fmt(stats.seconds)} s.</p>")


def _held_out_table(stats: RewardModelStats) -> str:
    before, after = stats.eval_start, stats.eval
    if not after.measured():
        return "<p class='muted'>No held-out groups: nothing was evaluated.</p>"
    rows = []
    for name in HELD_OUT:
        b, a = getattr(before, name), getattr(after, name)
        change = a - b if isinstance(a, int | float) and isinstance(b, int | float) else None
        rows.append([name, b, a, change])
    return ("<p class='muted'>On the held-out groups: pair accuracy against the consensus "
            "(weighted by w_ij, a tie counting 1/2) and the margin (winner minus loser score "
            "of the decided pairs, weighted by w_ij).</p>"
            + table(["held-out metric", "before", "after", "change"], rows))


def section_reward_model(manifest: Manifest | None) -> str:
    """The section, or a line saying no reward model was trained in this run."""
    if manifest is None or manifest.status != "complete":
        return missing(TITLE, ANCHOR, "No reward model trained in this run.")
    stats = RewardModelStats.model_validate(manifest.stats)
    folder = manifest.outputs.get("model")
    log = read_metrics([Path(folder) / "metrics.jsonl"] if folder else [])
    plot = curves(log.of("train"), log.of("eval"), "reward model training curves")
    return (h2(TITLE, ANCHOR) + _summary(stats) + plot + log.note("reward model")
            + _held_out_table(stats)
            + f"<p class='muted'>Model folder: {html.escape(str(folder))} (ranks with "
            f"<code>--ranker reward:DIR</code>).</p>")
