"""The Stage contract: every stage of a run has one shape.

A stage is declared by a :class:`StageSpec` in its package's ``config`` module (light: it
imports no torch, so the CLI and ``grouppref run`` can list stages and build options without
loading models):

* ``name``: its folder in the run (``RUN/<name>/``);
* ``config``: its settings, a pydantic model with ``extra="forbid"`` whose fields are the CLI
  options (:mod:`grouppref.commands.options`) and the ``grouppref run`` config section;
* ``reads``: the stages of the run it reads (given its settings), which order the run and
  make it stale when they change.

Its run function has one call shape, :class:`StageFunction`:
``run(store: RunStore, config, context: StageContext = StageContext()) -> StageRun``; the
:class:`StageContext` carries what is chosen at run time and never changes a cache key (force,
allow-stale, wait, console, resume). The registry of the stages, in order, with their
functions, is :mod:`grouppref.stages`.

The function opens the stage with :meth:`RunStore.open_stage` (which decides cached / resume /
fresh from the settings and the input), does its work in shards, and returns the
:class:`~grouppref.runs.store.StageRun`: ``cached``, ``manifest`` (counts, stats, outputs),
``records()``, ``rejects()``. Outputs that are not records (a model folder, an export, an
Argilla dataset) are ``finish(outputs=...)`` locations under the same manifest and cache rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel
from rich.console import Console

from grouppref.runs.store import RunStore, StageRun

C = TypeVar("C", bound=BaseModel)


def _reads_nothing(config: Any) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class StageSpec(Generic[C]):
    """What every stage declares (see the module docstring)."""

    name: str
    config: type[C]
    summary: str
    reads: Callable[[C], tuple[str, ...]] = field(default=_reads_nothing)


@dataclass(frozen=True)
class StageContext:
    """How a stage runs this time; none of it is a setting, so none of it changes a cache key.

    Attributes:
        force (bool): run again even when a complete result with the same key exists.
        allow_stale (bool): use a stale input (export, train_rm, sweep, train, eval, report;
            what they write says so) instead of refusing it.
        wait (bool): the label stage polls Argilla until enough rankings are in instead of
            stopping the run.
        console (Console | None): where a stage that talks while it works (label) prints;
            None: its own default.
        resume (bool | str | Path): train and train_rm continue from the newest checkpoint
            (True) or the given one instead of starting again (never answered from the cache).
    """

    force: bool = False
    allow_stale: bool = False
    wait: bool = False
    console: Console | None = None
    resume: bool | str | Path = False


class StageFunction(Protocol):
    """The one call shape of a stage's run function."""

    def __call__(self, store: RunStore, config: Any, context: StageContext = ...,
                 /) -> StageRun[Any]: ...


class Waiting(Exception):  # noqa: N818 - a state, not an error
    """A stage stops the run to wait for work outside it (e.g. people ranking in Argilla); the
    run ends cleanly (exit code 0) with this message and goes on when run again."""
