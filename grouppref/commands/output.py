"""Where the CLI writes: results on stdout (``out``), progress, notes and errors on stderr
(``err``), so ``> file`` and pipes carry results only. Neither wraps or cuts text when stdout
is not a terminal (long option names, annotator ids and paths stay whole).

Every stage command ends in :func:`print_stage`: its rejects (stderr), the counts (stdout),
the most common reject reasons (stderr) and, when every input row was rejected, one line
naming the most common reason and exit code 2 (a stage that kept some rows exits 0).

Both consoles read rich markup (``[red]reject[/]``), so text that comes from data or the user
(a reject's ``[stage]``, a path, an id, an error message) goes through :func:`esc` first:
unescaped, ``[export]`` would vanish and ``[/tmp/x]`` would raise a ``MarkupError``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape as esc

from grouppref.runs.progress import plain_width
from grouppref.runs.rejects import all_rejected, reject_summary, where

out = Console(soft_wrap=True, highlight=False, width=plain_width(stderr=False))
err = Console(stderr=True, soft_wrap=True, highlight=False, width=plain_width(stderr=True))


def print_stage(stage: Any, *, max_rejects: int = 20, name: str | None = None) -> None:
    """What a stage did: cached or not, each reject on one line (stderr), then the counts and
    where the output is (stdout), then the most common reject reasons (stderr).

    Raises:
        StageError: every input row was rejected (one line naming the most common reason;
            the stage's folder keeps the manifest and ``rejects.jsonl``).
    """
    folder: Path = stage.dir
    label = name or stage.name
    if stage.cached:
        err.print(f"[yellow]{esc(label)}: unchanged settings and input, skipped[/] (use --force to "
                  f"re-run) -> {esc(str(folder))}")
    rejects = stage.rejects()
    for line in [r.one_line() for r in rejects][:max_rejects]:
        err.print(f"[red]reject[/] {esc(line)}")
    if len(rejects) > max_rejects:
        err.print(f"... and {len(rejects) - max_rejects} more in {esc(str(folder / 'rejects.jsonl'))}")
    print_counts(label, stage.counts.model_dump(), folder)
    for scope, what in (("row", "rejected"), ("part", "partly rejected")):
        for n, r in reject_summary(rejects, scope):
            err.print(f"  {what}: {n} x {esc(r.reason)} (first: {esc(where(r))})")
    if (problem := all_rejected(stage, label)) is not None:
        raise problem


def print_counts(label: str, counts: dict[str, int], where: Path | str) -> None:
    partial = f", {counts['partial']} partly rejected" if counts.get("partial") else ""
    out.print(f"[green]{esc(label)}[/]: {counts['inputs']} in, {counts['outputs']} out, "
              f"{counts['rejected']} rejected{partial} -> {esc(str(where))}")


def print_server_usage(stats: dict[str, Any]) -> None:
    """One line per served model from a manifest's ``stats["servers"]`` (stdout)."""
    from grouppref.schemas.reports import ServerUsage

    for item in stats.get("servers") or []:
        u = ServerUsage.model_validate(item)
        failed = ", ".join(f"{n}x {cause}" for cause, n in sorted(u.failures.items()))
        out.print(f"  {esc(u.model)} at {esc(u.server)}: {u.requests} requests ({u.retried} retried, "
                  f"{u.refused} refused{'; failures: ' + failed if failed else ''}), "
                  f"{u.prompt_tokens} prompt + {u.completion_tokens} completion tokens")
