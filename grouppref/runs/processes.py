"""A stage's work spread over processes of this machine: how many, and a pool of them.

The processes are forked (Linux only; elsewhere a stage does its work in one process): they
start at once with everything the stage has loaded and read (a memory-mapped table is shared,
not copied), and are all started when the pool gets its first task, before the stage starts
a progress display's thread. A worker shows no warnings (the stage reports what its results
say) and is killed when the stage's process ends, however it ends.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Protocol, TypeVar

MAX_WORKERS = 8

A = TypeVar("A")
B = TypeVar("B")


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


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends


def _start_worker(parent: int) -> None:
    """A worker shows no warnings, and ends with its parent (killed with -9, say) instead of
    finishing a task nobody will read."""
    warnings.simplefilter("ignore")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl: the worker ends with its task
        pass
    if os.getppid() != parent:  # the parent ended before the line above
        os._exit(1)


@contextmanager
def forked_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` forked processes, shut down (and waited for) on leaving."""
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=_start_worker, initargs=(os.getpid(),)) as pool:
        yield pool


class MapFn(Protocol):
    """``map(fn, items)``: ``fn`` of each item, in the items' order (the builtin, or a pool's
    ``map``, whose ``fn`` must be a module-level function and whose items and results are
    pickled: numpy arrays, not tensors)."""

    def __call__(self, fn: Callable[[A], B], items: Iterable[A], /) -> Iterator[B]: ...


@contextmanager
def process_map(workers: int) -> Iterator[MapFn]:
    """A :class:`MapFn` run by ``workers`` forked processes (:func:`forked_pool`, started by
    the first call), or the builtin ``map`` in this process when ``workers`` is below 2."""
    if workers < 2:
        yield map
        return
    with forked_pool(workers) as pool:
        yield pool.map
