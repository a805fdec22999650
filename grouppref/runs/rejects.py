"""What a stage's rejects say in short: their most common kinds, and the one-line error of a
stage that rejected every input row (``grouppref <stage>`` and ``grouppref run`` stop with it,
exit code 2; a stage that kept some rows goes on)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from grouppref.errors import StageError
from grouppref.schemas.records import Reject

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


def where(r: Reject) -> str:
    """``FILE, row N`` of a reject (what of it is known)."""
    return ", ".join(p for p in (r.source, f"row {r.row}" if r.row is not None else None) if p)


def all_rejected(stage: Any, label: str | None = None) -> StageError | None:
    """The error of a finished stage (a ``StageRun``) that rejected every input row, naming
    the most common reason; ``None`` when it kept some (or read none)."""
    c = stage.counts
    if not (c.inputs > 0 and c.outputs == 0 and c.rejected == c.inputs):
        return None
    top = reject_summary(stage.rejects(), "row", top=1)
    reason = ""
    if top:
        n, first = top[0]
        reason = (f"; most common reason ({n} of {c.inputs}): {first.reason} (first at "
                  f"{where(first) or 'the input'})")
    return StageError(f"{label or stage.name}: all {c.inputs} input rows were rejected{reason}; "
                      f"every reject is in {stage.dir / 'rejects.jsonl'}")
