"""A stage's work spread over processes of this machine: how many, and a pool of them.

The processes are forked (Linux only; elsewhere a stage does its work in one process): they
start at once with everything the stage has loaded and read (a memory-mapped table is shared,
not copied), and are all started when the pool gets its first task, before the stage starts
a progress display's thread. A worker shows no warnings: it has no terminal of its own, and
the stage reports what its results say.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

MAX_WORKERS = 8


def default_workers() -> int:
    """One process per core this process may use, at most :data:`MAX_WORKERS`."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(usable or 1, MAX_WORKERS))


def workers_for(asked: int, tasks: int) -> int:
    """Processes for ``tasks`` independent tasks when ``asked`` were asked for (0: the default;
    1 where processes cannot be forked)."""
    if not sys.platform.startswith("linux"):
        return 1
    return max(1, min(asked or default_workers(), tasks))


def _quiet() -> None:
    warnings.simplefilter("ignore")


@contextmanager
def forked_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` forked processes, shut down (and waited for) on leaving."""
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=_quiet) as pool:
        yield pool
