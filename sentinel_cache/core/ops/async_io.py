"""How the asyncio operations reach a shard and wait: the only async-specific part.

Connections belong to the core's per-event-loop clients (:class:`~sentinel_cache.core.ops.async_clients.
AsyncShardClients`, shared by every cache object of the core); blocking work of the core
(first discovery, the safety net's re-resolve) goes to a thread; a write fence is awaited by
polling, since the fence is a ``threading.Event`` set by a listener thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.async_clients import shared_async_clients
from sentinel_cache.core.ops.async_mux import Send, sender
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import FailoverInProgressError

T = TypeVar("T")

# Longest pause between two looks at a raised write fence.
_FENCE_POLL_MAX = 0.05


class AsyncShardIO:
    """The running event loop's connection pools to one core's shards."""

    def __init__(self, core: ShardedSentinelPool) -> None:
        self.clients = shared_async_clients(core)
        self.flights = AsyncFlights(core)
        self.turns = AsyncTurns(core)
        #: The running loop's client of a shard's master (bound once: every shard of every call).
        self.master: Callable[[Shard], Awaitable[Any]] = self.clients.master_of
        #: With ``ASYNC_MULTIPLEX``, the running loop's shared connection to a shard's master
        #: when a call may go on it at once (else None): the runner's direct round trip.
        self.mux_link: Callable[..., Any] | None = (
            self.clients.mux_link if self.clients.multiplexed else None
        )

    def __repr__(self) -> str:
        return f"<AsyncShardIO {self.clients!r}>"

    def sender(self, send: Send) -> Send | None:
        """With ``ASYNC_MULTIPLEX``, the runner's round trip on a client: the multiplexed
        connection's own (one coroutine per call; ``send`` where it does not apply). None
        otherwise: the runner's ``send``."""
        return sender(send) if self.clients.multiplexed else None

    async def reader(self, shard: Shard) -> tuple[Address | None, Any]:
        """A replica in the read rotation (its address and client), or (None, None)."""
        if not shard.serving_replicas:
            return None, None
        found = self.clients.reader(await self.clients.state(), shard)
        return (None, None) if found is None else found

    async def replica(self, shard: Shard, address: Address) -> Any:
        """This loop's client of one of the shard's replicas (for a read during an outage)."""
        return self.clients.replica(await self.clients.state(), address)

    def writer(self, shard: Shard, key: Any) -> Any:
        """The near cache's writer connection is a blocking socket: asyncio writes go through
        the loop's pool, and the server's echo of them evicts the key (see ``ShardIO.writer``)."""
        return None

    async def aclose(self) -> None:
        await self.clients.aclose()


async def run_blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call of the core (discovery, re-resolve) without blocking the loop."""
    return await asyncio.to_thread(function, *args, **kwargs)


async def wait_switch(shard: Shard, generation: int, hold: float) -> bool:
    """Wait up to ``hold`` seconds for the shard to leave the unreachable master of
    ``generation`` (or for its outage to end), as ``Shard.wait_change`` does, without blocking
    the loop; True if it did."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + hold
    delay = 0.002
    while shard.in_outage(generation):
        left = deadline - loop.time()
        if left <= 0:
            return False
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, _FENCE_POLL_MAX)
    return True


async def wait_fence(shard: Shard, hold: float) -> None:
    """Hold a write while a failover is announced, as ``Shard.wait_fence`` does, without
    blocking the loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + hold
    delay = 0.002
    while shard.fenced:
        left = deadline - loop.time()
        if left <= 0:
            raise FailoverInProgressError(
                f"shard {shard.label}: writes held for {hold:g}s while a failover is in "
                f"progress ({shard.fence_reason}); the new master was not confirmed in time"
            )
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, _FENCE_POLL_MAX)


async def pause(seconds: float) -> None:
    await asyncio.sleep(seconds)


# Per event loop: the (core, key) pairs being worked on, and the future their waiters await.
_loop_flights: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, asyncio.Future[Any]]]
_loop_flights = weakref.WeakKeyDictionary()


class AsyncFlights:
    """The running loop's callers of one piece of work per key of one core, coalesced: the first
    task runs it, the others await its outcome (value or exception). One table per event loop,
    shared by every cache object of the core (tasks of one loop coalesce; other loops and
    threads go to the server); another core's key of the same name is another key."""

    def __init__(self, core: ShardedSentinelPool) -> None:
        self.core = core

    def __repr__(self) -> str:
        return "<AsyncFlights>"

    async def once(self, key: Any, work: Callable[[], Awaitable[T]]) -> T:
        loop = asyncio.get_running_loop()
        running = _loop_flights.setdefault(loop, {})
        key = (self.core, key)
        future = running.get(key)
        if future is not None:
            return await asyncio.shield(future)
        future = running[key] = loop.create_future()
        future.add_done_callback(_retrieved)
        try:
            value = await work()
            future.set_result(value)
            return value
        except Exception as exc:
            future.set_exception(exc)
            raise
        except BaseException:  # cancelled: the waiters are too (each may call again)
            future.cancel()
            raise
        finally:
            del running[key]


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Nobody may be waiting: mark the exception seen (no "never retrieved" warning)."""
    if not future.cancelled():
        future.exception()


# Per event loop: the (core, key) pairs whose turn a task has, and the event its waiters await.
_loop_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, asyncio.Event]]
_loop_turns = weakref.WeakKeyDictionary()


class AsyncTurns:
    """The running loop's tasks taking turns on a key of one core: the first leads, the others
    wait, bounded, for its turn to end (other loops and threads go to the server's lock)."""

    def __init__(self, core: ShardedSentinelPool) -> None:
        self.core = core

    def __repr__(self) -> str:
        return f"<AsyncTurns {self.core!r}>"

    def _running(self) -> dict[Any, asyncio.Event]:
        return _loop_turns.setdefault(asyncio.get_running_loop(), {})

    def lead(self, key: Any) -> asyncio.Event | None:
        running, local = self._running(), (self.core, key)
        if local in running:
            return None
        turn = running[local] = asyncio.Event()
        return turn

    async def wait(self, key: Any, timeout: float) -> None:
        turn = self._running().get((self.core, key))
        if turn is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(turn.wait(), timeout)

    def end(self, key: Any, turn: asyncio.Event) -> None:
        running, local = self._running(), (self.core, key)
        if running.get(local) is turn:
            del running[local]
        turn.set()
