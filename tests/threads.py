"""Threads a test starts, made accountable: a worker's exception fails the test, so does a worker
still running after the join's deadline.

An exception in a plain ``threading.Thread`` only reaches ``threading.excepthook``, which pytest
turns into a warning (an error under our ``filterwarnings``) at the end of whichever test phase
is running then, and not at all for a daemon thread still running when the session ends.
:class:`Workers` records each worker's exception itself and raises it from ``join``, in the test::

    with Workers(timeout=30) as workers:
        workers.spawn(read, name="reader")     # or workers.start(SomeThread(...))
        ...                                      # exercise the code under the workers
    # here every worker has returned (or the test failed) and its exception, if any, re-raised
    assert misses == []

Leaving the ``with`` block sets :attr:`Workers.stop` (for loops that run ``while not
workers.stop.is_set()``) and joins every worker within ``timeout`` seconds in all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any


class Workers:
    """A test's threads: started through it, joined by it, their exceptions raised by it."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.failures: list[tuple[str, BaseException]] = []
        self._lock = threading.Lock()

    def start(self, thread: threading.Thread) -> threading.Thread:
        """Start ``thread`` (a ``Thread`` subclass, a ``Timer``...) with its exception recorded."""
        run = thread.run

        def recorded() -> None:
            try:
                run()
            except BaseException as exc:  # recorded here, raised by join in the test's thread
                with self._lock:
                    self.failures.append((thread.name, exc))

        thread.run = recorded  # type: ignore[method-assign]
        with self._lock:
            self.threads.append(thread)
        thread.start()
        return thread

    def spawn(self, target: Callable[..., Any], *args: Any, name: str | None = None) -> threading.Thread:
        """Start ``target(*args)`` in a new daemon thread."""
        return self.start(threading.Thread(target=target, args=args, name=name, daemon=True))

    def after(self, delay: float, function: Callable[[], Any]) -> threading.Thread:
        """Run ``function`` once ``delay`` seconds from now (a ``threading.Timer``), accountably."""
        timer = threading.Timer(delay, function)
        timer.daemon = True
        return self.start(timer)

    def join(self, timeout: float | None = None) -> None:
        """Join every worker within ``timeout`` s in all (default: the constructor's); raise the
        first worker's exception, or AssertionError naming the workers still running."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        joined = 0
        while True:  # a worker may start another (a server's accept loop): join those too
            with self._lock:
                pending = self.threads[joined:]
            if not pending:
                break
            for thread in pending:
                thread.join(max(0.0, deadline - time.monotonic()))
            joined += len(pending)
        alive = [thread.name for thread in self.threads if thread.is_alive()]
        with self._lock:
            failures = list(self.failures)
        if failures:
            name, first = failures[0]
            others = [f"{n}: {e!r}" for n, e in failures[1:]]
            detail = f"; {len(others)} more: {others}" if others else ""
            running = f"; still running: {alive}" if alive else ""
            raise AssertionError(f"worker {name} raised {first!r}{detail}{running}") from first
        assert not alive, f"threads still running {timeout}s after the join began: {alive}"

    def __enter__(self) -> Workers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop.set()
        self.join()
