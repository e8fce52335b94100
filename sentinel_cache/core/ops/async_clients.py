"""The asyncio side's own connections to the sharded core, on ``redis.asyncio``.

The sync core (:class:`~sentinel_cache.core.topology.sharded_pool.ShardedSentinelPool`) owns everything that is
shared: discovery, the sentinel listeners, each shard's current master and generation, and the
write fences. This module adds only what asyncio needs of its own, because asyncio connections
are bound to the event loop that opened them: per core and per running loop, one
``redis.asyncio`` client per shard (:class:`AsyncShardClients`, shared by every cache object of
the core). Its connections look up ``Shard.current()`` whenever they are checked out and
reconnect when the shard's generation moved, exactly like the sync ``ShardConnection``; so a
switch seen by the sync side is followed here without any coordination and without a thread
hop per call.

Only rare, blocking work goes to a thread: the very first discovery of a core nobody has used
yet, and the safety-net re-resolution after a connection error or a READONLY reply.

Per-loop clients are released when the loop shuts down its async generators (``asyncio.run``
and asgiref's ``async_to_sync`` both do), or by ``AsyncCacheClient.aclose`` in that loop
(:mod:`sentinel_cache.core.ops.aio`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection

from sentinel_cache.core.config import (
    Address,
    PoolConfig,
    connection_class_and_kwargs,
    connection_parameters,
)
from sentinel_cache.core.topology._async.connection import (
    AsyncShardConnection,
    AsyncShardSSLConnection,
)
from sentinel_cache.core.topology.fair_pool import AsyncFairBlockingConnectionPool
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

logger = logging.getLogger("sentinel_cache")

AsyncRedis = redis.asyncio.Redis


# The sync side validated the options; a few (OCSP stapling, command_packer) exist only there.
ASYNC_CONNECTION_PARAMETERS = connection_parameters(
    redis.asyncio.connection.Connection, redis.asyncio.connection.SSLConnection
) - {"host", "port"}


class _LoopState:
    """One event loop's clients: a master client per shard and a client per replica address."""

    __slots__ = ("masters", "replicas", "guard", "__weakref__")

    def __init__(self) -> None:
        self.masters: dict[int, AsyncRedis] = {}
        self.replicas: dict[Address, AsyncRedis] = {}
        self.guard: Any = None

    async def aclose(self) -> None:
        clients = [*self.masters.values(), *self.replicas.values()]
        self.masters = {}
        self.replicas = {}
        results = await asyncio.gather(
            *(client.connection_pool.disconnect() for client in clients), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception):
                logger.debug("closing an asyncio connection failed: %r", result)


class AsyncShardClients:
    """One core's asyncio clients: per running event loop, a client per shard master (and per
    replica address). Shared by every :class:`AsyncCacheClient` of the core, because Django
    builds a cache object per request under ASGI: per-object clients would mean new
    connections for every request."""

    def __init__(self, config: PoolConfig) -> None:
        self._max_connections = config.max_connections
        self._pool_timeout = config.pool_timeout
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._replica_turn = itertools.count()
        sync_class, kwargs = connection_class_and_kwargs(config.connection_options())
        if config.health_check_interval:
            kwargs.setdefault("health_check_interval", config.health_check_interval)
        dropped = sorted(set(kwargs) - ASYNC_CONNECTION_PARAMETERS)
        if dropped:
            logger.warning("redis.asyncio does not support %s; the async API ignores them", dropped)
        self._kwargs = {k: v for k, v in kwargs.items() if k in ASYNC_CONNECTION_PARAMETERS}
        self._ssl = issubclass(sync_class, redis.connection.SSLConnection)

    def __repr__(self) -> str:
        return f"<AsyncShardClients loops={len(self._loops)}>"

    @property
    def loop_count(self) -> int:
        """Event loops holding connections right now (for tests and status)."""
        return len(self._loops)

    async def state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = await self._new_state(loop)
        return state

    async def _new_state(self, loop: asyncio.AbstractEventLoop) -> _LoopState:
        with self._lock:
            for other in [other for other in self._loops if other.is_closed()]:
                # Closed without shutting down its async generators: nothing can be awaited.
                self._loops.pop(other, None)
            state = self._loops.get(loop)
            if state is not None:
                return state
            state = self._loops[loop] = _LoopState()
        # An async generator is finalized by the loop's shutdown_asyncgens(), while the loop
        # still runs: the one moment the loop's sockets can be closed cleanly.
        state.guard = self._guard(weakref.ref(loop), state)
        await state.guard.__anext__()
        return state

    async def _guard(
        self, loop_ref: weakref.ref[asyncio.AbstractEventLoop], state: _LoopState
    ) -> AsyncIterator[None]:
        try:
            yield
        finally:
            loop = loop_ref()
            with self._lock:
                if loop is not None and self._loops.get(loop) is state:
                    del self._loops[loop]
            await state.aclose()

    async def aclose(self) -> None:
        """Close the running loop's connections; they are reopened on next use."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._loops.pop(loop, None)
        if state is not None:
            guard, state.guard = state.guard, None
            await state.aclose()
            if guard is not None:
                await guard.aclose()

    def close_all(self) -> None:
        """Close every event loop's connections (the core was closed): each still running loop
        is asked to close its own, since asyncio sockets belong to their loop."""
        with self._lock:
            states = list(self._loops.items())
            self._loops.clear()
        for loop, state in states:
            if loop.is_closed():
                continue
            try:
                loop.call_soon_threadsafe(_spawn, loop, state.aclose())
            except RuntimeError:  # closed meanwhile: its sockets went with it
                continue

    def master(self, state: _LoopState, shard: Shard) -> AsyncRedis:
        client = state.masters.get(shard.index)
        if client is None:
            pool = AsyncFairBlockingConnectionPool(
                label=shard.label,
                connection_class=AsyncShardSSLConnection if self._ssl else AsyncShardConnection,
                max_connections=self._max_connections,
                timeout=self._pool_timeout,
                shard=shard,
                **self._kwargs,
            )
            client = state.masters[shard.index] = AsyncRedis(connection_pool=pool)
        return client

    def reader(self, state: _LoopState, shard: Shard) -> tuple[Address, AsyncRedis] | None:
        """A replica in the shard's read rotation (its address and client), or None."""
        replicas = shard.serving_replicas
        if not replicas:
            return None
        address = replicas[next(self._replica_turn) % len(replicas)]
        return address, self.replica(state, address)

    def replica(self, state: _LoopState, address: Address) -> AsyncRedis:
        """This loop's client of the replica at ``address`` (made on first use)."""
        client = state.replicas.get(address)
        if client is None:
            connection_class = (
                redis.asyncio.connection.SSLConnection
                if self._ssl
                else redis.asyncio.connection.Connection
            )
            pool = AsyncFairBlockingConnectionPool(
                host=address.host,
                port=address.port,
                connection_class=connection_class,
                max_connections=self._max_connections,
                timeout=self._pool_timeout,
                **self._kwargs,
            )
            client = state.replicas[address] = AsyncRedis(connection_pool=pool)
        return client


# Tasks started from another thread by close_all(): kept until done (a task only weakly held by
# its loop could be collected before it ran).
_closing: set[asyncio.Task[None]] = set()


def _spawn(loop: asyncio.AbstractEventLoop, closing: Any) -> None:
    task = loop.create_task(closing)
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_shared_clients: weakref.WeakKeyDictionary[ShardedSentinelPool, AsyncShardClients] = (
    weakref.WeakKeyDictionary()
)
_shared_clients_lock = threading.Lock()


def shared_async_clients(core: ShardedSentinelPool) -> AsyncShardClients:
    """The asyncio clients of ``core`` (one set per core, created on first request)."""
    with _shared_clients_lock:
        clients = _shared_clients.get(core)
        if clients is None:
            clients = _shared_clients[core] = AsyncShardClients(core.config)
            core.on_close(clients.close_all)
        return clients
