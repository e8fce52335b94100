"""How the sync operations reach a shard and wait: the only sync-specific part.

Each shard owns its fair connection pool (and one per replica); blocking work of the core
runs inline; a write fence is waited for on its ``threading.Event``.
"""

from __future__ import annotations

import operator
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from sentinel_cache.core.config import Address
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

T = TypeVar("T")


class ShardIO:
    """One core's shard pools, as the generated sync operations reach them."""

    def __init__(self, core: ShardedSentinelPool) -> None:
        self.core = core
        self.flights = shared_flights(core)
        self.turns = shared_turns(core)
        #: The client of a shard's master: its own (every shard of every call, so a getter made
        #: in C, no Python call; the asyncio twin binds the running loop's once as well).
        self.master: Callable[[Shard], Any] = operator.attrgetter("client")
        #: No multiplexed connection here (the asyncio twin's direct round trip).
        self.mux_link: Callable[..., Any] | None = None

    def __repr__(self) -> str:
        return f"<ShardIO {self.core!r}>"

    def sender(
        self, send: Callable[[Any, Any], list[Any]]
    ) -> Callable[[Any, Any], list[Any]] | None:
        """None: the runner's round trip is its ``send`` (the asyncio twin may replace it with
        the multiplexed connection's own)."""
        return None

    def reader(self, shard: Shard) -> tuple[Address | None, Any]:
        """A replica in the read rotation (its address and client), or (None, None)."""
        return shard.read_replica() or (None, None)

    def replica(self, shard: Shard, address: Address) -> Any:
        """The client of one of the shard's replicas (for a read during an outage)."""
        return shard.replica_client(address)

    def writer(self, shard: Shard, key: Any) -> Any:
        """The near cache's writer connection, leased for a write of ``key`` whose value may
        be kept (the server does not echo writes made on it), or None: see
        :meth:`~sentinel_cache.core.topology.near.NearCache.lease`."""
        near = self.core.near
        return None if near is None else near.lease(shard, key)

    def close(self) -> None:
        """Nothing to do: the shards' pools belong to the core (closed with it)."""


def run_blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return function(*args, **kwargs)


def wait_switch(shard: Shard, generation: int, hold: float) -> bool:
    return shard.wait_change(generation, hold)


def wait_fence(shard: Shard, hold: float) -> None:
    shard.wait_fence(hold)


def pause(seconds: float) -> None:
    time.sleep(seconds)


class _Flight:
    __slots__ = ("done", "value", "error", "waiting")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.waiting = 0


class Flights:
    """This process's callers of one piece of work per key, coalesced: the first one runs it,
    the others (other threads) wait for its outcome, and get its value or its exception. Shared
    by every cache object of a core (Django makes one per thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Any, _Flight] = {}

    def __repr__(self) -> str:
        return f"<Flights running={len(self._running)}>"

    def waiting(self, key: Any) -> int:
        """How many callers wait for the running flight of ``key`` (0: none runs)."""
        with self._lock:
            flight = self._running.get(key)
            return 0 if flight is None else flight.waiting

    def once(self, key: Any, work: Callable[[], T]) -> T:
        with self._lock:
            flight = self._running.get(key)
            leader = flight is None
            if flight is None:
                flight = self._running[key] = _Flight()
            else:
                flight.waiting += 1
        if not leader:
            flight.done.wait()  # the leader's work always ends: bounded by its lock and compute
            if flight.error is not None:
                raise flight.error
            return flight.value
        try:
            flight.value = work()
            return flight.value
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._running[key]
            flight.done.set()


_flights: weakref.WeakKeyDictionary[ShardedSentinelPool, Flights] = weakref.WeakKeyDictionary()
_flights_lock = threading.Lock()


def shared_flights(core: ShardedSentinelPool) -> Flights:
    with _flights_lock:
        flights = _flights.get(core)
        if flights is None:
            flights = _flights[core] = Flights()
        return flights


class Turns:
    """This process's threads taking turns on a key (one core's): the first leads, the others
    wait, bounded, for its turn to end (see :mod:`sentinel_cache.core.ops._sync.single_flight`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Any, threading.Event] = {}

    def __repr__(self) -> str:
        return f"<Turns running={len(self._running)}>"

    def lead(self, key: Any) -> threading.Event | None:
        """This caller's turn (end it with :meth:`end`), or None if another caller has one."""
        with self._lock:
            if key in self._running:
                return None
            turn = self._running[key] = threading.Event()
            return turn

    def wait(self, key: Any, timeout: float) -> None:
        turn = self._running.get(key)
        if turn is not None:
            turn.wait(timeout)

    def end(self, key: Any, turn: threading.Event) -> None:
        with self._lock:
            if self._running.get(key) is turn:
                del self._running[key]
        turn.set()


_turns: weakref.WeakKeyDictionary[ShardedSentinelPool, Turns] = weakref.WeakKeyDictionary()


def shared_turns(core: ShardedSentinelPool) -> Turns:
    with _flights_lock:
        turns = _turns.get(core)
        if turns is None:
            turns = _turns[core] = Turns()
        return turns
