"""The HTML every section of the report is made of: headings, tables, inline plots (PNG as
data: URIs) and number formatting."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402


def figure_png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def img(src: str, alt: str) -> str:
    return f'<img src="{src}" alt="{html.escape(alt)}">'


def table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def cell(value: Any) -> str:
    """A table cell: numbers right-aligned, text left-aligned."""
    num = isinstance(value, int | float) and not isinstance(value, bool)
    return f"<td{' class=num' if num else ''}>{html.escape(fmt(value))}</td>"


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def h2(title: str, anchor: str) -> str:
    return f"<h2 id='{anchor}'>{html.escape(title)}</h2>"


def missing(title: str, anchor: str, why: str) -> str:
    return h2(title, anchor) + f"<p class='muted'>{html.escape(why)}</p>"
