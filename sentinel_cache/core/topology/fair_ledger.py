"""The hand-off rules both fair pools share (:mod:`~sentinel_cache.core.topology.fair_pool`):
who holds which connection, which slot is free, and the queue of waiters, served oldest first.

No I/O and no lock here: the thread pool calls the ledger under its lock, the asyncio pool from
its event loop, so the one definition of "who gets the next connection" reads on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import Any, Final

from redis.exceptions import ConnectionError as RedisConnectionError

from sentinel_cache.exceptions import PoolExhaustedError

#: The message redis-py's blocking pools raise on exhaustion (callers match on it).
EXHAUSTED: Final = "No connection available."

EMPTY: Final[Any] = object()  # a waiter that was handed nothing yet; take(): "queue up"
SLOT: Final[Any] = None  # handed instead of a connection: "create one, the slot is yours"


def _describe(pool: Any) -> str:
    kwargs = pool.connection_kwargs
    if "host" in kwargs:
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}"
    if "path" in kwargs:
        return str(kwargs["path"])
    return str(pool.connection_class.__name__)


class Ledger:
    """Who holds what: idle connections, checked-out ones, slots and the queue of waiters.

    The one definition of the hand-off rules, shared by both pools: it does no I/O and takes no
    lock (the thread pool calls it under its lock, the asyncio pool from its event loop). A
    waiter is anything with ``hand(item) -> bool`` (False: it left, hand it to the next one) and
    ``pending() -> bool``. The containers keep their identity for a ledger's life, so the pools
    expose them under redis-py's attribute names.
    """

    __slots__ = ("max_connections", "idle", "checked_out", "made", "waiters", "slots")

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self.idle: list[Any] = []  # most recently used last
        self.checked_out: set[Any] = set()  # borrowed (or being made ready, or retired)
        self.made: list[Any] = []  # every connection made, as BlockingConnectionPool
        self.waiters: deque[Any] = deque()
        self.slots = 0  # connections made plus ones being made

    def in_use(self) -> int:
        """Slots not free to borrow: checked-out connections and ones being made or retired."""
        return self.slots - len(self.idle)

    def waiting(self) -> int:
        return sum(1 for waiter in self.waiters if waiter.pending())

    def take(self) -> Any:
        """An idle connection, ``SLOT`` (make one) or ``EMPTY`` (queue up). Idle connections
        and free slots exist only while nobody waits, so taking one never jumps the queue."""
        if self.idle:
            connection = self.idle.pop()
            self.checked_out.add(connection)
            return connection
        if self.slots < self.max_connections:
            self.slots += 1
            return SLOT
        return EMPTY

    def track(self, connection: Any, *, checked_out: bool) -> None:
        self.made.append(connection)
        if checked_out:
            self.checked_out.add(connection)

    def give_back(self, item: Any) -> None:
        """Pass a checked-out connection (or a slot) on: oldest waiter first."""
        if item is SLOT:
            self.free_slot()
            return
        while self.waiters:
            if self.waiters.popleft().hand(item):  # stays checked out: it changes hands only
                return
        self.checked_out.discard(item)
        self.idle.append(item)

    def free_slot(self) -> None:
        while self.waiters:
            if self.waiters.popleft().hand(SLOT):
                return
        self.slots -= 1

    def drop(self, connection: Any) -> bool:
        """A checked-out connection leaves for good (it failed, or is not this pool's); its slot
        is passed on. False if it was not checked out here (reset meanwhile, or dropped)."""
        if connection not in self.checked_out:
            return False
        self.checked_out.discard(connection)
        with contextlib.suppress(ValueError):
            self.made.remove(connection)
        self.free_slot()
        return True

    def take_idle(self) -> list[Any]:
        """Check out every idle connection (to close them without anyone borrowing one)."""
        taken = list(self.idle)
        self.idle.clear()
        self.checked_out.update(taken)
        return taken

    def forget(self, waiter: Any) -> None:
        with contextlib.suppress(ValueError):  # handed meanwhile, or the pool was reset
            self.waiters.remove(waiter)


class Waiter:
    """One blocked thread: a lock it sleeps on (held until someone hands it something)."""

    __slots__ = ("signal", "item")

    def __init__(self) -> None:
        self.signal = threading.Lock()
        self.signal.acquire()
        self.item: Any = EMPTY

    def hand(self, item: Any) -> bool:
        self.item = item
        self.signal.release()
        return True

    def pending(self) -> bool:
        return self.item is EMPTY


class TaskWaiter:
    """One waiting task: a future (done already if the task was cancelled or timed out)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future

    def hand(self, item: Any) -> bool:
        if self.future.done():
            return False
        self.future.set_result(item)
        return True

    def pending(self) -> bool:
        return not self.future.done()


class FairPool:
    """What both pools share beyond the ledger: counters, repr and the exhaustion error."""

    _ledger: Ledger
    timeout: float | None
    max_connections: int
    label: str | None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {_describe(self)} max={self.max_connections} "
            f"timeout={self.timeout} in_use={self.in_use()} idle={self.idle()} "
            f"waiting={self.waiting()}>"
        )

    def __del__(self) -> None:
        """redis-py 8's ``__del__`` undoes pool metrics; this pool records none."""

    def _new_ledger(self) -> Ledger:
        ledger = self._ledger = Ledger(self.max_connections)
        # redis-py's names, read by its maintenance-notification and metrics code and by ours.
        self._available_connections = ledger.idle
        self._in_use_connections = ledger.checked_out
        self._connections = ledger.made
        return ledger

    def in_use(self) -> int:
        """Slots not free to borrow: checked-out connections and ones being made or retired."""
        return self._ledger.in_use()

    def idle(self) -> int:
        return len(self._ledger.idle)

    def waiting(self) -> int:
        return self._ledger.waiting()

    def connection_count(self) -> int:
        """Connections this pool has made and not dropped (open or to be reopened)."""
        return len(self._ledger.made)

    def _exhausted(self, flavour: str = "") -> RedisConnectionError:
        """redis-py's error, or (for a labelled pool) one that names the shard."""
        if self.label is None:
            return RedisConnectionError(EXHAUSTED)
        return PoolExhaustedError(
            f"shard {self.label}: no free connection within {self.timeout}s "
            f"(max_connections={self.max_connections}{flavour})"
        )
