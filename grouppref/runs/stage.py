"""The Stage contract: every stage of a run has one shape.

A stage is declared by a :class:`StageSpec` in its package's ``config`` module (light: it
imports no torch, so the CLI and ``grouppref run`` can list stages and build options without
loading models):

* ``name``: its folder in the run (``RUN/<name>/``);
* ``config``: its settings, a pydantic model with ``extra="forbid"`` whose fields are the CLI
  options (:mod:`grouppref.commands.options`) and the ``grouppref run`` config section;
* ``entry``: ``"module:function"`` of the function that runs it, always
  ``run(store: RunStore, config, *, force: bool = False) -> StageRun``;
* ``reads``: the stages of the run it reads (given its settings), which order the run and
  make it stale when they change.

The function opens the stage with :meth:`RunStore.open_stage` (which decides cached / resume /
fresh from the settings and the input), does its work in shards, and returns the
:class:`~grouppref.runs.store.StageRun`: ``cached``, ``manifest`` (counts, stats, outputs),
``records()``, ``rejects()``. Outputs that are not records (a model folder, an export, an
Argilla dataset) are ``finish(outputs=...)`` locations under the same manifest and cache rules.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from grouppref.runs.store import RunStore, StageRun

C = TypeVar("C", bound=BaseModel)


def _reads_nothing(config: Any) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class StageSpec(Generic[C]):
    """What every stage declares (see the module docstring)."""

    name: str
    config: type[C]
    entry: str
    summary: str
    reads: Callable[[C], tuple[str, ...]] = field(default=_reads_nothing)

    def function(self) -> Callable[..., StageRun[Any]]:
        """The run function, imported on first use (stages import torch; specs do not)."""
        module, _, attr = self.entry.partition(":")
        return getattr(importlib.import_module(module), attr)

    def run(self, store: RunStore, config: C, *, force: bool = False) -> StageRun[Any]:
        return self.function()(store, config, force=force)


class Waiting(Exception):  # noqa: N818 - a state, not an error
    """A stage stops the run to wait for work outside it (e.g. people ranking in Argilla); the
    run ends cleanly (exit code 0) with this message and goes on when run again."""
