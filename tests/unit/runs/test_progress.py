"""The live count of rows read in one process: counted on a terminal, nothing elsewhere, and
the items passed through unchanged either way."""

from __future__ import annotations

import io
import re

from rich.console import Console

from grouppref.runs.progress import COUNT_EVERY, live_count


def test_a_terminal_sees_the_count_and_the_items_pass_through() -> None:
    out = io.StringIO()
    items = list(range(2 * COUNT_EVERY + 7))
    with live_count("import", "rows", Console(file=out, force_terminal=True, width=120)) as counted:
        assert list(counted(items)) == items
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # colours, cursor moves
    last = [line for line in shown.splitlines() if line.strip()][-1]
    assert last.startswith("import") and f" {len(items)}/? " in last and "rows/s" in last, last


def test_a_log_sees_nothing_and_the_items_pass_through() -> None:
    out = io.StringIO()
    items = [("row", i) for i in range(3 * COUNT_EVERY)]
    with live_count("import", "rows", Console(file=out, force_terminal=False)) as counted:
        assert list(counted(items)) == items
    assert out.getvalue() == ""
