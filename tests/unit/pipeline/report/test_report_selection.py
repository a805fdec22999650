"""The report's labeling section lists why each group was sent (its ``role``). The report
built from a real push with audit groups (real Argilla) is checked in
tests/system/test_label_audit_push.py with :func:`selection_rows`."""

from __future__ import annotations

from grouppref.pipeline.report.selection import SHOWN, selection_table
from grouppref.schemas.label_reports import LabelSelection, SelectedGroup


def _selection(uncertain: int, audit: int) -> LabelSelection:
    sent = [SelectedGroup(group_id=f"u{i}", uncertainty=1.0 - i / 100, role="uncertain")
            for i in range(uncertain)]
    sent += [SelectedGroup(group_id=f"a{i}", uncertainty=0.1 * i, role="audit")
             for i in range(audit)]
    return LabelSelection(select="uncertain", uncertainty="kendall_w", budget=len(sent),
                          audit_share=audit / len(sent), source_stage="rank", groups=100,
                          selected=sent)


def test_the_table_has_a_role_column_and_lists_the_audit_groups() -> None:
    # 25 uncertain groups, then 3 audit ones: the first SHOWN uncertain and every audit group
    header, rows = selection_table(_selection(25, 3))
    assert header == ["#", "group", "role", "uncertainty"]
    assert [r[2] for r in rows] == ["uncertain"] * SHOWN + ["audit"] * 3
    assert [r[0] for r in rows] == [*range(1, SHOWN + 1), 26, 27, 28]  # place in the push
    assert rows[SHOWN] == [26, "a0", "audit", 0.0]


def test_a_selection_recorded_before_roles_shows_no_role() -> None:
    old = _selection(2, 0).model_copy(update={"selected": [
        SelectedGroup(group_id="x", uncertainty=0.5), SelectedGroup(group_id="y", uncertainty=0.2)]})
    _, rows = selection_table(old)
    assert rows == [[1, "x", None, 0.5], [2, "y", None, 0.2]]  # rendered as "-"
