"""Progress bars with a rate, shared by every stage (rich), always on stderr: stdout carries
results only, so ``> file`` and pipes stay clean. When stderr is not a terminal rich draws no
live bar; the finished bars are printed once, when the progress stops."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

WIDE = 100_000  # columns of a console that is not a terminal: nothing is wrapped or cut


def plain_width(stderr: bool) -> int | None:
    """The width for a console on stdout / stderr: the terminal's (``None``: rich measures it)
    on a terminal, else :data:`WIDE`, so tables and lines written to a file or a pipe keep
    option names, annotator ids and paths whole instead of folding them at 80 columns."""
    return None if Console(stderr=stderr).is_terminal else WIDE


def stderr_console() -> Console:
    """A console on stderr, for progress bars and notes."""
    return Console(stderr=True, width=plain_width(stderr=True))


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


REFRESH_PER_SECOND = 2


def stage_progress(console: Console | None = None, disable: bool = False) -> Progress:
    """A rich ``Progress`` with description, bar, count, rate, elapsed and remaining time, on
    ``console`` (default: a console on stderr).

    Example:
        >>> with stage_progress() as bar:                       # doctest: +SKIP
        ...     task = bar.add_task("generate", total=10, unit="prompts")
        ...     bar.advance(task, 1)
    """
    return _progress(MofNCompleteColumn(), RateColumn(), ExtraColumn(), console=console,
                     disable=disable)


def bytes_progress(console: Console | None = None) -> Progress:
    """:func:`stage_progress` for a file read by its bytes (a large file read in parts): bytes
    read of the total (``12.5/260.1 MB``), their rate, elapsed and remaining time."""
    return _progress(DownloadColumn(), TransferSpeedColumn(), console=console)


def _progress(*counts: ProgressColumn, console: Console | None, disable: bool = False
              ) -> Progress:
    """Description, bar, ``counts``, elapsed and remaining time, on ``console`` (default: a
    console on stderr)."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), *counts, TimeElapsedColumn(),
        TimeRemainingColumn(), console=console or stderr_console(), disable=disable,
        # rich redraws 10 times a second by default: ~27 ms of CPU per second on a terminal,
        # taken from an inference server sharing the cores (docs/benchmarks.md, generate
        # through a server); twice a second is enough for stages that take minutes
        refresh_per_second=REFRESH_PER_SECOND,
    )


T = TypeVar("T")
COUNT_EVERY = 1000  # items between two updates of a live count


@contextmanager
def live_count(name: str, unit: str, console: Console | None = None
               ) -> Iterator[Callable[[Iterable[T]], Iterator[T]]]:
    """A live count, with its rate, of the items a stage takes from an iterable whose length
    is not known (the rows of a file read in one process): the block gets a function that
    passes an iterable through, counted every :data:`COUNT_EVERY` items. Shown only where
    ``console`` (default: stderr) is a terminal: a count without a total tells a log nothing
    once it is over, and an error that ends the read stays the one line on stderr."""
    console = console or stderr_console()
    if not console.is_terminal:
        yield _passed
        return
    with stage_progress(console) as bar:
        task = bar.add_task(name, total=None, unit=unit)

        def counted(items: Iterable[T]) -> Iterator[T]:
            n = 0
            for n, item in enumerate(items, start=1):
                yield item
                if n % COUNT_EVERY == 0:
                    bar.update(task, completed=n)
            bar.update(task, completed=n)

        yield counted


def _passed(items: Iterable[T]) -> Iterator[T]:
    return iter(items)
