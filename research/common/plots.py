"""Figures: the one way experiments save a matplotlib figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Lay out ``fig``, write it to ``path`` as a PNG (its folder made if missing), close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
