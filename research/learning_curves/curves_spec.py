"""What the runner, report and plots of :mod:`research.learning_curves.curves` share: the
methods in table order, the DPO baseline every group loss is paired against, and whether a
result holds experiment 2's own group-size jobs (a module of its own, so the three import it
and not each other)."""

from __future__ import annotations

from typing import Any

METHODS = ("dpo_one", "dpo_consensus", "gspo_hard", "gspo_soft", "gspo_cal", "plackett_luce")
DPO = ("dpo_one", "dpo_consensus")
BASE = "dpo_consensus"  # the baseline of every paired difference


def has_group_size_runs(result: dict[str, Any]) -> bool:
    """Whether experiment 2's own jobs ran (without them its tables would hold only the K = 4
    and 8 cells borrowed from experiment 1)."""
    return any(r["experiment"] == "group_size" for r in result["runs"])
