"""The training sections' curves: the ``metrics.jsonl`` logs read as typed lines (a line that
is not valid is left out with a notice) and plotted by step."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from grouppref.pipeline.report.html_blocks import figure_png, img  # noqa: E402
from grouppref.schemas.reports import MetricsLine  # noqa: E402


@dataclass
class MetricsRead:
    """The valid lines of one or more ``metrics.jsonl`` files, and a notice per line left out."""

    lines: list[MetricsLine] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    def of(self, split: str) -> list[MetricsLine]:
        return [line for line in self.lines if line.split == split]

    def note(self, what: str) -> str:
        """An HTML paragraph listing the first notices (empty when every line was read)."""
        if not self.notices:
            return ""
        shown = "; ".join(self.notices[:SHOWN_NOTICES])
        more = (f" (and {len(self.notices) - SHOWN_NOTICES} more)"
                if len(self.notices) > SHOWN_NOTICES else "")
        return (f"<p class='muted'>{len(self.notices)} line(s) of the {html.escape(what)} "
                f"metrics log left out: {html.escape(shown)}{more}.</p>")


SHOWN_NOTICES = 5
CURVES = ("loss", "pair_accuracy", "margin")  # the training curves plotted, by step


def curves(train: list[MetricsLine], held: list[MetricsLine], alt: str) -> str:
    """An inline plot of each metric of :data:`CURVES` by step: train windows (lines) and
    held-out evaluations (dashed); empty when no line has any of them."""
    keys = [k for k in CURVES if any(getattr(r, k) is not None for r in train + held)]
    if not keys:
        return ""
    fig, axes = plt.subplots(1, len(keys), figsize=(4.3 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for rows, style, label in ((train, "o-", "train"), (held, "s--", "held out")):
            points = [(r.step, getattr(r, key)) for r in rows if getattr(r, key) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label)
        ax.set(title=key.replace("_", " "), xlabel="step")
        ax.legend()
    return img(figure_png(fig), alt)


def read_metrics(paths: list[Path]) -> MetricsRead:
    """Every line of the ``metrics.jsonl`` files ``paths`` (missing files: nothing), each
    validated as a :class:`~grouppref.schemas.reports.MetricsLine`; a line that is not a JSON
    object or not a valid line is left out with a notice naming file, line and reason."""
    out = MetricsRead()
    for path in paths:
        if not path.exists():
            continue
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not text.strip():
                continue
            try:
                out.lines.append(MetricsLine.model_validate_json(text))
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(x) for x in first["loc"]) or "line"
                out.notices.append(f"{path.name} line {number}: {where}: {first['msg']}")
    return out
