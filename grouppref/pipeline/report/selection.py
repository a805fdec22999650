"""The report's labeling section: which groups ``label push`` sent to people, and why
(``RUN/label/selection.json``, a :class:`~grouppref.schemas.label_reports.LabelSelection`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.runs.store import RunStore
from grouppref.schemas.label_reports import LabelSelection

SHOWN = 20  # selected groups listed per role


MIN_AUDIT = AggregateConfig.model_fields["min_groups_for_reliability"].default


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
    note = audit_note(sel)
    short = f" Note: {note}" if note else ""
    return (f"{sent} went to people: the least certain by {sel.uncertainty} ({sel.measure})."
            f"{last}{audited} Equal values were ordered at random (seed {sel.seed}).{short}")


def audit_note(sel: LabelSelection, min_groups: int = MIN_AUDIT) -> str | None:
    """What an uncertain selection's audit groups let the aggregate do, when it falls short:
    no audit groups, or fewer than ``min_groups`` (the aggregate's
    ``min_groups_for_reliability``) in all; None when there are enough, or for a uniform
    selection (random, all), which needs none."""
    if sel.select != "uncertain":
        return None
    audit = sum(g.role == "audit" for g in sel.selected)
    if audit >= min_groups:
        return None
    need = math.ceil(min_groups / sel.audit_share) if sel.audit_share else None
    fix = (f"a budget of {need} or more at --audit-share {sel.audit_share:g} gives "
           f"{min_groups}" if need else f"the default --audit-share 0.2 gives {min_groups} "
           f"from a budget of {math.ceil(min_groups / 0.2)}")
    what = "no audit groups" if not audit else \
        f"only {audit} audit group{'s' if audit > 1 else ''}"
    return (f"{what} in a budget of {sel.budget} (--audit-share {sel.audit_share:g}); the "
            f"aggregate needs {min_groups} per person, so it will judge these annotators on "
            "all their groups, mostly the hardest ones, which makes good ones look "
            f"unreliable; {fix} (docs/labeling-push-pull.md)")


def selection_table(sel: LabelSelection) -> tuple[list[str], list[list[Any]]]:
    """Header and rows of the groups sent (place in the push, group id, why it was sent,
    uncertainty): the first :data:`SHOWN` of each role, so the audit groups (sent after the
    most uncertain ones) are listed too. The role is ``-`` for a selection recorded before
    roles were."""
    shown: dict[str | None, int] = {}
    rows: list[list[Any]] = []
    for i, g in enumerate(sel.selected):
        shown[g.role] = shown.get(g.role, 0) + 1
        if shown[g.role] <= SHOWN:
            rows.append([i + 1, g.group_id, g.role, g.uncertainty])
    return ["#", "group", "role", "uncertainty"], rows
