"""Native asyncio cache operations over the same sharded core, on ``redis.asyncio``.

The sync core (:class:`~sentinel_cache.pools.ShardedSentinelPool`) owns everything that is
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
and asgiref's ``async_to_sync`` both do), or by :meth:`AsyncCacheClient.aclose` in that loop.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError

from sentinel_cache.client import (
    INCR_IF_EXISTS,
    INCR_IF_EXISTS_SHA,
    MISS,
    ClientBase,
    expiry_args,
    is_ok,
)
from sentinel_cache.config import (
    Address,
    PoolConfig,
    connection_class_and_kwargs,
    connection_parameters,
)
from sentinel_cache.exceptions import (
    FailoverInProgressError,
    PoolExhaustedError,
)
from sentinel_cache.fair_pool import EXHAUSTED, AsyncFairBlockingConnectionPool
from sentinel_cache.pools import MASTER_ERRORS, Shard, ShardBound, ShardedSentinelPool
from sentinel_cache.serializers import Codec

logger = logging.getLogger("sentinel_cache")

T = TypeVar("T")
Command = tuple[Any, ...]
AsyncRedis = redis.asyncio.Redis
Operation = Callable[[AsyncRedis], Awaitable[T]]

# Longest pause between two looks at a raised write fence (the fence is a threading.Event).
_FENCE_POLL_MAX = 0.05


# The sync side validated the options; a few (OCSP stapling, command_packer) exist only there.
ASYNC_CONNECTION_PARAMETERS = connection_parameters(
    redis.asyncio.connection.Connection, redis.asyncio.connection.SSLConnection
) - {"host", "port"}


class _AsyncShardConnectionMixin(ShardBound):
    """Looks up the shard's master whenever it is checked out; a stale socket is dropped first."""

    async def _follow(self) -> None:
        if self._stale():
            await self.disconnect()  # type: ignore[attr-defined]
            self._repoint()

    if hasattr(redis.asyncio.connection.AbstractConnection, "connect_check_health"):
        # redis-py >= 5.3: the pool calls connect() (hence this) on every checkout.
        async def connect_check_health(
            self, check_health: bool = True, retry_socket_connect: bool = True
        ) -> None:
            await self._follow()
            await super().connect_check_health(  # type: ignore[misc]
                check_health=check_health, retry_socket_connect=retry_socket_connect
            )

    else:  # pragma: no cover - older redis-py

        async def connect(self) -> None:
            await self._follow()
            await super().connect()  # type: ignore[misc]

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        self._note_sent()
        await super().send_packed_command(*args, **kwargs)  # type: ignore[misc]

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            reply = await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ReadOnlyError:
            # A demoted master: drop the socket so the next use goes where the shard points.
            await self.disconnect()  # type: ignore[attr-defined]
            raise
        untrusted = self._untrusted_reply()  # see ShardBound: no acknowledgement from the past
        if untrusted is not None:
            await self.disconnect()  # type: ignore[attr-defined]
            raise untrusted
        return reply


class AsyncShardConnection(_AsyncShardConnectionMixin, redis.asyncio.connection.Connection):
    pass


class AsyncShardSSLConnection(_AsyncShardConnectionMixin, redis.asyncio.connection.SSLConnection):
    pass


class AsyncShardConnectionPool(AsyncFairBlockingConnectionPool):
    """A fair blocking pool (like the sync side's) whose exhaustion names the shard."""

    def __init__(self, label: str, **kwargs: Any) -> None:
        self._label = label
        super().__init__(**kwargs)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)
        except RedisConnectionError as exc:
            if str(exc) == EXHAUSTED:
                raise PoolExhaustedError(
                    f"shard {self._label}: no free connection within {self.timeout}s "
                    f"(max_connections={self.max_connections}, asyncio)"
                ) from None
            raise


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

    def master(self, state: _LoopState, shard: Shard) -> AsyncRedis:
        client = state.masters.get(shard.index)
        if client is None:
            pool = AsyncShardConnectionPool(
                shard.label,
                connection_class=AsyncShardSSLConnection if self._ssl else AsyncShardConnection,
                max_connections=self._max_connections,
                timeout=self._pool_timeout,
                shard=shard,
                **self._kwargs,
            )
            client = state.masters[shard.index] = AsyncRedis(connection_pool=pool)
        return client

    def reader(
        self, state: _LoopState, shard: Shard, master: AsyncRedis
    ) -> tuple[Address | None, AsyncRedis]:
        """A replica in the shard's read rotation (its address and client), else the master."""
        replicas = shard.serving_replicas
        if not replicas:
            return None, master
        address = replicas[next(self._replica_turn) % len(replicas)]
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
        return address, client


_shared_clients: weakref.WeakKeyDictionary[ShardedSentinelPool, AsyncShardClients] = (
    weakref.WeakKeyDictionary()
)
_shared_clients_lock = threading.Lock()


def shared_async_clients(pool: ShardedSentinelPool) -> AsyncShardClients:
    """The asyncio clients of ``pool`` (one set per core, created on first request)."""
    with _shared_clients_lock:
        clients = _shared_clients.get(pool)
        if clients is None:
            clients = _shared_clients[pool] = AsyncShardClients(pool.config)
        return clients


class AsyncCacheClient(ClientBase):
    """The asyncio twin of :class:`~sentinel_cache.client.CacheClient`, same arguments and
    semantics: ``timeout`` in seconds, None never expires, zero or less expires at once.

    Cheap to create: connections belong to the core's :class:`AsyncShardClients`."""

    def __init__(self, pool: ShardedSentinelPool, codec: Codec, **durability: int) -> None:
        super().__init__(pool, codec, **durability)
        self.clients = shared_async_clients(pool)

    async def aclose(self) -> None:
        """Close this event loop's connections to the core's shards (shared by every cache
        on the core; they reconnect lazily). The core itself stays up."""
        await self.clients.aclose()

    # -- readiness, fence, safety net --------------------------------------------------------
    async def _ready(self, shard: Shard, write: bool) -> None:
        pool = self.pool
        # The core's first discovery (and a shard without a master yet) block: do them in a
        # thread, once. Afterwards everything needed is in memory.
        if not pool.started or shard.address is None:
            await asyncio.to_thread(pool.ready, shard, False)
        if write and shard.fenced:
            await self._wait_fence(shard)

    async def _wait_fence(self, shard: Shard) -> None:
        """Hold a write while a failover is announced, as ``Shard.wait_fence`` does, without
        blocking the loop."""
        hold = self.pool.config.failover_hold
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

    async def execute(
        self,
        shard: Shard,
        operation: Operation[T],
        *,
        write: bool = True,
        idempotent: bool = True,
    ) -> T:
        """Run ``await operation(client)`` on the shard with the same safety net as the sync
        ``ShardedSentinelPool.execute``: re-resolve on a connection error, timeout or READONLY,
        and retry an idempotent operation once if the master moved."""
        await self._ready(shard, write)
        clients = self.clients
        state = await clients.state()
        master = clients.master(state, shard)
        replica, client = (None, master) if write else clients.reader(state, shard, master)
        address, generation = shard.current()
        pool = self.pool
        try:
            return await operation(client)
        except PoolExhaustedError:
            raise
        except MASTER_ERRORS as exc:
            if replica is not None:  # a replica failed: the master still serves reads
                shard.set_replica_health(replica, False, f"{type(exc).__name__}: {exc}")
                return await operation(master)
            # The sync core's safety net, step by step; only the re-resolve goes to a thread.
            if pool.should_reresolve(shard, exc, generation):
                reason = f"{type(exc).__name__}: {exc}"
                await asyncio.to_thread(pool.reresolve, shard, reason=reason, suspect=address)
            pool.retry_or_raise(shard, exc, generation, idempotent=idempotent)
        if write and shard.fenced:
            await self._wait_fence(shard)
        return await operation(master)

    async def _run(
        self, key: Any, operation: Operation[T], *, write: bool, idempotent: bool = True
    ) -> T:
        shard = self.pool.shard_for(key)
        return await self.execute(shard, operation, write=write, idempotent=idempotent)

    async def scatter(
        self, plan: Mapping[Shard, Sequence[Command]], *, write: bool
    ) -> dict[Shard, list[Any]]:
        """Every shard's batch at once (one pipeline per shard, gathered)."""
        shards = list(plan)
        replies = await _gather(
            self.execute(shard, functools.partial(_pipeline, commands=plan[shard]), write=write)
            for shard in shards
        )
        return dict(zip(shards, replies, strict=True))

    async def _durable(self, client: AsyncRedis, *command: Any) -> Any:
        if not self.durable_replicas:
            return await client.execute_command(*command)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*command)
        pipe.execute_command("WAIT", self.durable_replicas, self.durable_timeout_ms)
        reply, acked = await pipe.execute()
        if acked < self.durable_replicas:
            logger.warning(
                "write to %r acknowledged by %d of %d replicas within %d ms",
                command[1] if len(command) > 1 else command,
                acked,
                self.durable_replicas,
                self.durable_timeout_ms,
            )
        return reply

    # -- single key --------------------------------------------------------------------------
    async def get(self, key: Any, default: Any = None) -> Any:
        data = await self._run(key, lambda c: c.execute_command("GET", key), write=False)
        value = MISS if data is None else self.decode(data, key)
        return default if value is MISS else value

    async def set(self, key: Any, value: Any, timeout: float | None, *, nx: bool = False) -> bool:
        if timeout is not None and timeout <= 0:
            if nx:  # "added" and expired at once: it succeeds only where the key was absent
                return not await self.has_key(key)
            await self.delete(key)
            return True
        command: Command = ("SET", key, self.encode(value), *expiry_args(timeout))
        if nx:
            command += ("NX",)
        reply = await self._run(
            key, lambda c: self._durable(c, *command), write=True, idempotent=not nx
        )
        return is_ok(reply)

    async def add(self, key: Any, value: Any, timeout: float | None) -> bool:
        return await self.set(key, value, timeout, nx=True)

    async def touch(self, key: Any, timeout: float | None) -> bool:
        """True if the key exists (PERSIST alone answers 0 for a key that had no expiry)."""
        if timeout is None:

            async def persist(client: AsyncRedis) -> Any:
                pipe = client.pipeline(transaction=False)
                pipe.execute_command("EXISTS", key)
                pipe.execute_command("PERSIST", key)
                return await pipe.execute()

            exists, _ = await self._run(key, persist, write=True)
            return bool(exists)
        if timeout <= 0:
            return await self.delete(key)
        ms = max(1, int(timeout * 1000))
        return bool(
            await self._run(key, lambda c: c.execute_command("PEXPIRE", key, ms), write=True)
        )

    async def delete(self, key: Any) -> bool:
        return bool(await self._run(key, lambda c: c.execute_command("DEL", key), write=True))

    async def has_key(self, key: Any) -> bool:
        return bool(await self._run(key, lambda c: c.execute_command("EXISTS", key), write=False))

    async def incr(self, key: Any, delta: int = 1) -> int:
        """Atomic and TTL-preserving (the sync client's script); ValueError if missing."""

        async def run(client: AsyncRedis) -> Any:
            try:
                return await client.execute_command("EVALSHA", INCR_IF_EXISTS_SHA, 1, key, delta)
            except NoScriptError:  # nothing ran: safe to send the body, which caches it
                return await client.execute_command("EVAL", INCR_IF_EXISTS, 1, key, delta)

        value = await self._run(key, run, write=True, idempotent=False)
        if value is None:
            raise ValueError(f"Key {key!r} not found")
        return int(value)

    async def ttl(self, key: Any) -> float | None:
        """Seconds left; None for no expiry; 0 for a missing key."""
        ms = await self._run(key, lambda c: c.execute_command("PTTL", key), write=False)
        if ms == -1:
            return None
        return 0 if ms < 0 else ms / 1000

    async def expire(self, key: Any, timeout: float) -> bool:
        return await self.touch(key, timeout)

    async def persist(self, key: Any) -> bool:
        return await self.touch(key, None)

    # -- many keys ---------------------------------------------------------------------------
    async def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        groups, plan = self.mget_plan(keys)
        return self.found(groups, await self.scatter(plan, write=False)) if plan else {}

    async def set_many(self, mapping: Mapping[Any, Any], timeout: float | None) -> list[Any]:
        """Returns the keys that failed (Django's contract)."""
        if not mapping:
            return []
        if timeout is not None and timeout <= 0:
            await self.delete_many(list(mapping))
            return []
        groups, plan = self.set_plan(mapping, timeout)
        return self.not_set(groups, await self.scatter(plan, write=True))

    async def delete_many(self, keys: Iterable[Any]) -> int:
        plan = self.del_plan(keys)
        if not plan:
            return 0
        return sum(int(r[0]) for r in (await self.scatter(plan, write=True)).values())

    # -- whole cache (per shard, so a caller can skip a shard that is down) ------------------
    async def flush_shard(self, shard: Shard) -> None:
        """``FLUSHDB ASYNC`` on one shard's master (the configured database only)."""
        await self.execute(shard, lambda c: c.execute_command("FLUSHDB", "ASYNC"), write=True)

    async def delete_pattern_on(self, shard: Shard, pattern: str, count: int = 1000) -> int:
        """``SCAN MATCH`` + ``UNLINK`` of one shard's matching keys; returns how many."""
        return await self.execute(shard, lambda c: _unlink_matching(c, pattern, count), write=True)

    async def delete_pattern(self, pattern: str, *, count: int = 1000) -> int:
        counts = await _gather(
            self.delete_pattern_on(shard, pattern, count) for shard in self.pool.shards
        )
        return sum(counts)

    async def iter_keys_on(
        self, shard: Shard, pattern: str, *, count: int = 1000
    ) -> AsyncIterator[bytes]:
        """Every key of one shard matching ``pattern`` (``SCAN``, never ``KEYS``)."""

        async def client_of(client: AsyncRedis) -> AsyncRedis:
            return client

        client = await self.execute(shard, client_of, write=False)
        async for key in client.scan_iter(match=pattern, count=count):
            yield key

    async def iter_keys(self, pattern: str, *, count: int = 1000) -> AsyncIterator[bytes]:
        for shard in self.pool.shards:
            async for key in self.iter_keys_on(shard, pattern, count=count):
                yield key


async def _gather(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """``asyncio.gather`` that waits for every shard and then raises the first failure, so no
    shard's error is left unretrieved (and logged as such) when another shard failed too."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


async def _pipeline(client: AsyncRedis, *, commands: Sequence[Command]) -> list[Any]:
    if len(commands) == 1:
        return [await client.execute_command(*commands[0])]
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return await pipe.execute()


async def _unlink_matching(client: AsyncRedis, pattern: str, count: int) -> int:
    deleted = 0
    batch: list[bytes] = []
    async for key in client.scan_iter(match=pattern, count=count):
        batch.append(key)
        if len(batch) >= count:
            deleted += await client.execute_command("UNLINK", *batch)
            batch.clear()
    if batch:
        deleted += await client.execute_command("UNLINK", *batch)
    return deleted


__all__ = [
    "AsyncCacheClient",
    "AsyncShardClients",
    "AsyncShardConnection",
    "AsyncShardConnectionPool",
    "AsyncShardSSLConnection",
    "shared_async_clients",
]
