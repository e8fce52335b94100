"""Run tasks at once, one daemon thread each, and collect what comes back before a deadline.

Discovery, the status report, the health probes and the deploy check all ask several nodes at
once and must answer within a time whatever the nodes do. This is their one fan-out, so the
rules hold everywhere: every thread is a daemon (a hung node never keeps the process alive) and
is counted until it ends (:attr:`Fanout.running`, :meth:`Fanout.join`); a task's exception is
its outcome, handed back to the caller, never lost on its thread; an outcome that arrives after
the caller stopped waiting is dropped with the inbox (the caller already reported that task as
unanswered), and the thread ends on its own sockets' timeouts.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

__all__ = ["Fanout", "run_all"]

K = TypeVar("K")
T = TypeVar("T")


class Fanout(Generic[K, T]):
    """Every task started at once on a daemon thread named ``name``; :meth:`collect` waits for
    their outcomes, in order of arrival, until a deadline (or until ``enough`` says so)."""

    def __init__(self, tasks: Mapping[K, Callable[[], T]], *, name: str) -> None:
        self.keys: tuple[K, ...] = tuple(tasks)
        self._inbox: queue.Queue[tuple[K, T | BaseException]] = queue.Queue()
        self._arrived: list[tuple[K, T | BaseException]] = []
        self._lock = threading.Lock()
        self._running = 0
        self._threads = [
            threading.Thread(target=self._run, args=(key, task), name=name, daemon=True)
            for key, task in tasks.items()
        ]
        with self._lock:
            self._running = len(self._threads)
        for (key, _task), thread in zip(tasks.items(), self._threads, strict=True):
            try:
                thread.start()
            except RuntimeError as exc:  # no thread left to start: that task's outcome
                self._inbox.put((key, exc))
                with self._lock:
                    self._running -= 1

    def __repr__(self) -> str:
        return f"<Fanout tasks={len(self.keys)} running={self.running}>"

    def _run(self, key: K, task: Callable[[], T]) -> None:
        try:
            outcome: T | BaseException = task()
        except BaseException as exc:  # the task's outcome: handed to the caller, never lost
            outcome = exc
        try:
            self._inbox.put((key, outcome))
        finally:
            with self._lock:
                self._running -= 1

    @property
    def running(self) -> int:
        """Threads whose task has not returned yet."""
        with self._lock:
            return self._running

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in all for every thread to end; True if all did."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads if thread.ident is not None)

    def collect(
        self,
        deadline: float,
        *,
        enough: Callable[[Sequence[tuple[K, T | BaseException]]], bool] | None = None,
    ) -> list[tuple[K, T | BaseException]]:
        """The outcomes so far, in order of arrival, waiting for the others until ``deadline``
        (``time.monotonic()``) or until ``enough(outcomes)`` is true. May be called again later
        for what arrived since (a task missing at the deadline is simply absent)."""
        while len(self._arrived) < len(self.keys):
            if enough is not None and enough(self._arrived):
                break
            remaining = deadline - time.monotonic()
            try:
                item = (
                    self._inbox.get(timeout=remaining)
                    if remaining > 0
                    else self._inbox.get_nowait()
                )
            except queue.Empty:
                break
            self._arrived.append(item)
        return list(self._arrived)

    def outcomes(
        self, deadline: float, missing: Callable[[K], BaseException]
    ) -> dict[K, T | BaseException]:
        """Every task's outcome by key, in the tasks' order; ``missing(key)`` (an exception) for
        one without an outcome by ``deadline``."""
        found = dict(self.collect(deadline))
        return {key: found[key] if key in found else missing(key) for key in self.keys}


def run_all(
    tasks: Mapping[K, Callable[[], T]], deadline: float, what: str
) -> dict[K, T | BaseException]:
    """Every task at once; by key, its result, its exception, or a TimeoutError for one still
    running at ``deadline`` (left to end on its own: its sockets have timeouts too)."""
    fanout = Fanout(tasks, name=f"sentinel_cache-{what}")
    return fanout.outcomes(
        deadline, lambda _key: TimeoutError(f"no answer before the deadline ({what})")
    )
