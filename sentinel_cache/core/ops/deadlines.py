"""One timer per event loop for the asyncio lean reads' socket timeouts
(:class:`ReadDeadlines`): :class:`~sentinel_cache.core.ops.async_clients.AsyncLeanIO` enters a
read that has to wait for its reply, and the timer cancels it at its deadline."""

from __future__ import annotations

import asyncio
import math
import sys
import weakref
from typing import Any

_UNCANCEL = sys.version_info >= (3, 11)  # Task.cancelling() and Task.uncancel()


class ReadDeadlines:
    """One event loop's lean reads waiting for a reply, each with its socket timeout's
    deadline, under one timer: at a deadline the waiting task is cancelled and its read raises
    ``asyncio.TimeoutError``, as ``asyncio.timeout`` would (a cancellation from anyone else
    stays one).

    Why: ``asyncio.timeout`` per read makes, schedules and cancels a timer each time (about 6%
    of an ``aget_many``'s profiled time); here a read that waits adds and removes a dict entry, and the
    one timer, armed at the earliest deadline, fires about once per socket timeout while reads
    keep coming. A read whose reply is already there waits for nothing and is not entered."""

    __slots__ = ("_loop", "waiting", "_at", "_handle", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # connections hold this; the loop must stay collectable
        # task -> [deadline (-1 once fired), its cancellation count when it began waiting]
        self.waiting: dict[asyncio.Task[Any], list[Any]] = {}
        self._at = math.inf
        self._handle: asyncio.TimerHandle | None = None

    def enter(self, timeout: float) -> asyncio.Task[Any] | None:
        """The running task, now waiting until ``timeout`` from now (None outside a task: the
        caller waits under its own timer)."""
        loop = self._loop()
        task = asyncio.current_task(loop)
        if task is None or loop is None:
            return None
        deadline = loop.time() + timeout
        cancelling = task.cancelling() if _UNCANCEL else 0  # type: ignore[attr-defined]
        self.waiting[task] = [deadline, cancelling]
        if deadline < self._at:
            self._arm(loop, deadline)
        return task

    def timed_out(self, task: asyncio.Task[Any]) -> bool:
        """Whether the cancellation ``task`` is handling came from its deadline alone (it is
        then taken back, as ``asyncio.timeout`` does)."""
        entry = self.waiting.get(task)
        if entry is None or entry[0] >= 0:
            return False
        return not _UNCANCEL or task.uncancel() <= entry[1]  # type: ignore[attr-defined]

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = when
        self._handle = loop.call_at(when, self._check)

    def _check(self) -> None:
        self._handle, self._at = None, math.inf
        loop = self._loop()
        if loop is None:
            return
        now = loop.time()
        following = math.inf
        for task, entry in self.waiting.items():
            deadline = entry[0]
            if deadline < 0:  # fired, its cancellation not delivered yet
                continue
            if deadline <= now:
                entry[0] = -1
                task.cancel()
            elif deadline < following:
                following = deadline
        if following < math.inf:
            self._arm(loop, following)


_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadDeadlines]
_deadlines = weakref.WeakKeyDictionary()


def read_deadlines(loop: asyncio.AbstractEventLoop) -> ReadDeadlines:
    """The loop's :class:`ReadDeadlines` (made on first use)."""
    found = _deadlines.get(loop)
    if found is None:
        found = _deadlines[loop] = ReadDeadlines(loop)
    return found
