"""The report's labeling section: which groups ``label push`` sent to people, and why
(``RUN/label/selection.json``, a :class:`~grouppref.schemas.reports.LabelSelection`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grouppref.runs.store import RunStore
from grouppref.schemas.reports import LabelSelection

SHOWN = 20  # selected groups listed


def selection_path(store: RunStore) -> Path:
    """``RUN/label/selection.json``, written by every ``label push``
    (:func:`grouppref.labeling.push.write_selection`)."""
    return store.stage_dir("label") / "selection.json"


def read_selection(store: RunStore) -> LabelSelection | None:
    """The selection of the run's last push, or ``None`` when none was recorded."""
    path = selection_path(store)
    if not path.exists():
        return None
    return LabelSelection.model_validate_json(path.read_text(encoding="utf-8"))


def describe_selection(sel: LabelSelection) -> str:
    """One paragraph: what was sent, by which rule."""
    sent = f"{len(sel.selected)} of the {sel.groups} groups of the {sel.source_stage} stage"
    if sel.dataset:
        sent += f" (Argilla datasets {sel.dataset}-k*)"
    if sel.select == "all":
        return f"All {sent} went to people (no --select)."
    if sel.select == "random":
        return f"{sent} went to people, drawn at random (seed {sel.seed}): the baseline."
    rest = (f"; the groups not sent average {sel.rest_mean:.3g}" if sel.rest_mean is not None
            else "")
    last = f" The last group sent has {sel.threshold:.3g}{rest}." if sel.threshold is not None \
        else ""
    audit = sum(g.role == "audit" for g in sel.selected)
    audited = (f" {audit} of them are audit groups drawn uniformly from all groups "
               f"(--audit-share {sel.audit_share:g}), on which annotators' reliability is "
               "measured." if audit else "")
    return (f"{sent} went to people: the least certain by {sel.uncertainty} ({sel.measure})."
            f"{last}{audited} Equal values were ordered at random (seed {sel.seed}).")


def selection_table(sel: LabelSelection) -> tuple[list[str], list[list[Any]]]:
    """Header and rows of the first :data:`SHOWN` groups sent (rank, group id, uncertainty)."""
    rows: list[list[Any]] = [[i + 1, g.group_id, g.uncertainty]
                             for i, g in enumerate(sel.selected[:SHOWN])]
    return ["#", "group", "uncertainty"], rows
