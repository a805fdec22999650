"""Running coroutines for :class:`~grouppref.models.served.pool.ServerPool`: :func:`gather` (a
``TaskGroup`` that raises the first failure as itself) and :class:`Background` (a coroutine on
the pool's event loop in a thread of its own, while the caller works)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any


class Background:
    """A coroutine running on a pool's event loop in a thread of its own (:meth:`ServerPool.start`).

    The event loop is used by that thread only while the coroutine runs; the caller's thread
    keeps the GIL only between its own Python steps (torch releases it while computing), so the
    requests go out and their answers are read while it works.
    """

    def __init__(self, runner: asyncio.Runner, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._runner = runner
        self._task: asyncio.Task[Any] | None = None
        self._outcome: tuple[Any, BaseException | None] = (None, None)
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(coroutine,), daemon=True,
                                        name="grouppref-server-requests")
        self._thread.start()

    def _main(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        async def tracked() -> Any:
            self._task = asyncio.current_task()
            self._started.set()
            return await coroutine

        try:
            self._outcome = (self._runner.run(tracked()), None)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            self._outcome = (None, error)
        finally:
            self._started.set()

    def cancel(self) -> None:
        """Cancel the coroutine (its requests in flight are dropped); :meth:`result` then
        raises ``CancelledError``."""
        self._started.wait()
        task = self._task
        if task is not None and not task.done():
            self._runner.get_loop().call_soon_threadsafe(task.cancel)

    def result(self) -> Any:
        """Wait for the coroutine; its result, or its exception raised here."""
        self._thread.join()
        value, error = self._outcome
        if error is not None:
            raise error
        return value


async def gather(coroutines: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run ``coroutines`` concurrently (a ``TaskGroup``); their results in order. The first
    that fails cancels the others and is raised as itself (not as an exception group)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coroutines]
    except BaseExceptionGroup as eg:
        raise _first(eg) from None
    return [t.result() for t in tasks]


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first leaf exception of a (possibly nested) exception group."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
