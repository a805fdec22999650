"""Progress bars with a rate, shared by every stage (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    """Items per second, with the unit of the task (``prompts/s``, ``groups/s``, ...)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        unit = task.fields.get("unit", "it")
        return Text(f"{speed:,.1f} {unit}/s" if speed else f"- {unit}/s", style="progress.data.speed")


class ExtraColumn(ProgressColumn):
    """Free text a stage updates as it goes (``extra=...``), e.g. tokens/s."""

    def render(self, task: Task) -> Text:
        return Text(str(task.fields.get("extra", "")))


def stage_progress(console: Console | None = None, disable: bool = False) -> Progress:
    """A rich ``Progress`` with description, bar, count, rate, elapsed and remaining time.

    Example:
        >>> with stage_progress() as bar:                       # doctest: +SKIP
        ...     task = bar.add_task("generate", total=10, unit="prompts")
        ...     bar.advance(task, 1)
    """
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        ExtraColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),  # progress goes to stderr, results to stdout
        disable=disable,
    )
