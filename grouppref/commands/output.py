"""Where the CLI writes: results on stdout (``out``), progress, notes and errors on stderr
(``err``), so ``> file`` and pipes carry results only. Neither wraps or cuts text when stdout
is not a terminal (long option names, annotator ids and paths stay whole).

Both consoles read rich markup (``[red]reject[/]``), so text that comes from data or the user
(a reject's ``[stage]``, a path, an id, an error message) goes through :func:`esc` first:
unescaped, ``[export]`` would vanish and ``[/tmp/x]`` would raise a ``MarkupError``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape as esc

from grouppref.runs.progress import plain_width

out = Console(soft_wrap=True, highlight=False, width=plain_width(stderr=False))
err = Console(stderr=True, soft_wrap=True, highlight=False, width=plain_width(stderr=True))


def print_stage(stage: Any, *, max_rejects: int = 20, name: str | None = None) -> None:
    """What a stage did: cached or not, each reject on one line (stderr), then the counts and
    where the output is (stdout)."""
    where: Path = stage.dir
    label = name or stage.name
    if stage.cached:
        err.print(f"[yellow]{esc(label)}: unchanged settings and input, skipped[/] (use --force "
                  f"to re-run) -> {esc(str(where))}")
    lines = [r.one_line() for r in stage.rejects()]
    for line in lines[:max_rejects]:
        err.print(f"[red]reject[/] {esc(line)}")
    if len(lines) > max_rejects:
        err.print(f"... and {len(lines) - max_rejects} more in {esc(str(where / 'rejects.jsonl'))}")
    print_counts(label, stage.counts.model_dump(), where)


def print_counts(label: str, counts: dict[str, int], where: Path | str) -> None:
    partial = f", {counts['partial']} partly rejected" if counts.get("partial") else ""
    out.print(f"[green]{esc(label)}[/]: {counts['inputs']} in, {counts['outputs']} out, "
              f"{counts['rejected']} rejected{partial} -> {esc(str(where))}")
