"""Where the CLI writes: results on stdout (``out``), progress, notes and errors on stderr
(``err``), so ``> file`` and pipes carry results only. Neither wraps or cuts text when stdout
is not a terminal (long option names, annotator ids and paths stay whole).

Every stage command ends in :func:`print_stage`: its rejects (stderr), the counts (stdout),
the most common reject reasons (stderr) and, when every input row was rejected, one line
naming the most common reason and exit code 2 (a stage that kept some rows exits 0).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from grouppref.errors import StageError
from grouppref.schemas.records import Reject

out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)

_ASIDE = re.compile(r"\s*\([^()]*\)")  # "(its columns: [...])" and other particulars
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])|0x[0-9A-Fa-f]+")


def reason_kind(reason: str) -> str:
    """A reject reason with its particulars (asides in parentheses, quoted names, numbers)
    blanked, so that rejects for the same cause count together: ``duplicate prompt_id 'a' ...
    row 3`` and ``duplicate prompt_id 'b' ... row 9`` are one kind."""
    return _NUMBER.sub("N", _QUOTED.sub("'…'", _ASIDE.sub("", reason)))


def reject_summary(rejects: list[Reject], scope: str = "row", top: int = 3
                   ) -> list[tuple[int, Reject]]:
    """The most common kinds of reject of ``scope``: ``(count, first reject of the kind)``."""
    kinds: Counter[str] = Counter()
    first: dict[str, Reject] = {}
    for r in rejects:
        if r.scope == scope:
            kind = reason_kind(r.reason)
            kinds[kind] += 1
            first.setdefault(kind, r)
    return [(n, first[kind]) for kind, n in kinds.most_common(top)]


def _where(r: Reject) -> str:
    parts = [r.source, f"row {r.row}" if r.row is not None else None]
    return ", ".join(p for p in parts if p)


def print_stage(stage: Any, *, max_rejects: int = 20, name: str | None = None) -> None:
    """What a stage did: cached or not, each reject on one line (stderr), then the counts and
    where the output is (stdout), then the most common reject reasons (stderr).

    Raises:
        StageError: every input row was rejected (one line naming the most common reason;
            the stage's folder keeps the manifest and ``rejects.jsonl``).
    """
    where: Path = stage.dir
    label = name or stage.name
    if stage.cached:
        err.print(f"[yellow]{label}: unchanged settings and input, skipped[/] (use --force to "
                  f"re-run) -> {where}")
    rejects = stage.rejects()
    for line in [r.one_line() for r in rejects][:max_rejects]:
        err.print(f"[red]reject[/] {escape(line)}")
    if len(rejects) > max_rejects:
        err.print(f"... and {len(rejects) - max_rejects} more in {where / 'rejects.jsonl'}")
    counts = stage.counts.model_dump()
    print_counts(label, counts, where)
    for scope, what in (("row", "rejected"), ("part", "partly rejected")):
        for n, r in reject_summary(rejects, scope):
            err.print(f"  {what}: {n} x {escape(r.reason)} (first: {escape(_where(r))})")
    if counts["inputs"] > 0 and counts["outputs"] == 0 and counts["rejected"] == counts["inputs"]:
        ((n, first),) = reject_summary(rejects, "row", top=1) or [(0, None)]
        reason = f"; most common reason ({n} of {counts['inputs']}): {first.reason} (first at " \
            f"{_where(first) or 'the input'})" if first is not None else ""
        raise StageError(f"{label}: all {counts['inputs']} input rows were rejected{reason}; "
                         f"every reject is in {where / 'rejects.jsonl'}")


def print_counts(label: str, counts: dict[str, int], where: Path | str) -> None:
    partial = f", {counts['partial']} partly rejected" if counts.get("partial") else ""
    out.print(f"[green]{label}[/]: {counts['inputs']} in, {counts['outputs']} out, "
              f"{counts['rejected']} rejected{partial} -> {where}")
