"""FIFO-fair blocking connection pools, drop-ins for redis-py's ``BlockingConnectionPool``.

Why: redis-py's blocking pools (a LIFO queue for threads, a condition for tasks) let whoever
releases a connection take it straight back. Under contention a few callers get all the work
and the rest time out with "No connection available." although no connection was ever stuck
(``max_connections=2``, 16 threads: 2 threads made ~12,000 calls each, 14 timed out). Here a
released connection goes directly to the oldest waiter, so a caller that releases and asks
again queues behind everyone already waiting, and the exhaustion error means that nothing was
handed to the caller for the whole ``timeout``.

Both pools create connections lazily, up to ``max_connections``; a connection that fails to
connect when checked out is dropped and its slot handed on (to the next waiter, or freed), so
a dead server never shrinks the pool. No network I/O happens under the pool's lock, except in
code inherited from redis-py that is not used by this project: ``re_auth_callback`` (AUTH on
idle connections, for streaming credential providers) and client-side caching's invalidation
drain (``CacheProxyConnection`` reads other connections under the pool lock).

The hand-off rules both pools follow (the ledger and its waiters) are in
:mod:`~sentinel_cache.core.topology.fair_ledger`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from typing import Any, Final

import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sentinel_cache.core.process import PROCESS
from sentinel_cache.core.topology.fair_ledger import (
    EMPTY,
    SLOT,
    FairPool,
    TaskWaiter,
    Waiter,
)
from sentinel_cache.core.topology.fair_ledger import EXHAUSTED as EXHAUSTED

__all__ = ["AsyncFairBlockingConnectionPool", "FairBlockingConnectionPool"]

logger = logging.getLogger("sentinel_cache")

_TIMED_OUT: Final[Any] = object()  # an async waiter's future when its timeout fired first

try:  # redis-py >= 5.1: streaming credentials re-authenticate a connection on release
    from redis import event as _redis_event
except ImportError:  # pragma: no cover - older redis-py
    _redis_event = None  # type: ignore[assignment]
_RELEASED: Any = getattr(_redis_event, "AfterConnectionReleasedEvent", None)
_ASYNC_RELEASED: Any = getattr(_redis_event, "AsyncAfterConnectionReleasedEvent", None)


def _should_reconnect(connection: Any) -> bool:
    """redis-py >= 6 marks connections for reconnection (maintenance notifications)."""
    check = getattr(connection, "should_reconnect", None)
    return bool(check()) if check is not None else False


class FairBlockingConnectionPool(FairPool, redis.ConnectionPool):
    """A thread-safe blocking pool whose waiters are served first come, first served.

    Same constructor and public methods as ``redis.BlockingConnectionPool``, plus ``label``
    (exhaustion then raises :class:`~sentinel_cache.PoolExhaustedError` naming it); the extras
    :meth:`retire_idle`, :meth:`in_use`, :meth:`idle` and :meth:`waiting` are for the core.
    Fork-safe through redis-py's pid check: a child starts with empty state and a new lock.
    """

    #: The connections answer ``ready_to_send()`` (connected to where they should be, nothing
    #: unread) in one call; True skips redis-py's check at checkout when they say so.
    lean_checkout = False

    def __init__(
        self,
        max_connections: int = 50,
        timeout: float | None = 20,
        connection_class: type[Any] = redis.connection.Connection,
        label: str | None = None,
        **connection_kwargs: Any,
    ) -> None:
        connection_kwargs.pop("queue_class", None)  # BlockingConnectionPool's; meaningless here
        self.timeout = timeout
        self.label = label
        # The release event's one listener (redis-py's own dispatcher) re-authenticates a
        # connection with a token pending, and finds nothing to do otherwise.
        self._quiet_releases = connection_kwargs.get("event_dispatcher") is None
        super().__init__(
            connection_class=connection_class,
            max_connections=max_connections,
            **connection_kwargs,
        )
        # Read once, not per release: the dispatcher of the release event, if it has one.
        dispatcher = getattr(self, "_event_dispatcher", None)
        self._release_dispatcher = None if _RELEASED is None else dispatcher

    def reset(self) -> None:
        """Start empty; after a fork nothing (not even a lock held by a parent thread) is shared."""
        self._lock = threading.RLock()
        self._new_ledger()
        # Last, as in redis-py: other threads compare pids without the lock.
        self.pid = PROCESS.pid

    # -- borrowing ----------------------------------------------------------------------------
    def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connected connection; waits in line up to ``timeout`` when all are checked out.

        Arguments are accepted and ignored (redis-py < 5.3 passes the command name).
        """
        if self.pid != PROCESS.pid:  # forked: redis-py's reset (the check it makes first)
            self._checkpid()
        waiter = None
        with self._lock:
            connection = self._ledger.take()
            if connection is EMPTY:
                waiter = Waiter()
                self._ledger.waiters.append(waiter)
        if waiter is not None:
            connection = self._wait(waiter)
        if connection is SLOT:
            connection = self._create()
        try:
            if not (self.lean_checkout and connection.ready_to_send()):
                self._ensure_connected(connection)
        except BaseException:
            self._discard(connection)
            raise
        return connection

    def _wait(self, waiter: Waiter) -> Any:
        timeout = self.timeout
        try:
            handed = waiter.signal.acquire(True, -1 if timeout is None else max(timeout, 0))
        except BaseException:  # KeyboardInterrupt and friends: do not lose what was handed
            with self._lock:
                if waiter.item is EMPTY:
                    self._ledger.forget(waiter)
                else:
                    self._ledger.give_back(waiter.item)
            raise
        if not handed:
            with self._lock:
                if waiter.item is EMPTY:
                    self._ledger.forget(waiter)
                    raise self._exhausted()
            # handed over just as the timeout fired: take it
        return waiter.item

    def _create(self) -> Any:
        """Make a connection for a slot this thread holds (constructors do no network I/O)."""
        try:
            connection = self._new_connection()
        except BaseException:
            with self._lock:
                self._ledger.free_slot()
            raise
        with self._lock:
            self._ledger.track(connection, checked_out=True)
        return connection

    def make_connection(self) -> Any:
        """A new, unconnected connection, tracked like ``BlockingConnectionPool`` does (callers
        outside :meth:`get_connection` bypass the slot count, as there)."""
        connection = self._new_connection()
        with self._lock:
            self._ledger.track(connection, checked_out=False)
        return connection

    def _new_connection(self) -> Any:
        connection = self.connection_class(**self.connection_kwargs)
        cache = getattr(self, "cache", None)
        if cache is not None:  # redis-py >= 5.1 client-side caching (RESP3)
            from redis.connection import CacheProxyConnection

            proxy: Any = CacheProxyConnection
            connection = proxy(connection, cache, self._lock)
        return connection

    def _check_unread(self) -> bool:
        """Whether data waiting on an idle connection makes the checkout reconnect: always,
        except with redis-py's client caching (its invalidations arrive there all the time).

        redis-py >= 6 also skips the check when maintenance notifications are on (the default
        with RESP3, which redis-py 8 negotiates), so that a push waiting there is read with the
        next reply; but so is a reply nobody read (a caller interrupted half way), and the next
        caller would take it for its own. A connection that has something waiting is made
        again instead: a push is lost with it, never a reply given to the wrong caller.
        """
        return getattr(self, "cache", None) is None

    def _ensure_connected(self, connection: Any) -> None:
        """Connect if needed and make sure no stale reply waits on the socket (as redis-py)."""
        connection.connect()
        try:
            if connection.can_read() and self._check_unread():
                raise RedisConnectionError("Connection has data")
        except (RedisConnectionError, RedisTimeoutError, OSError):
            connection.disconnect()
            connection.connect()
            if connection.can_read() and self._check_unread():
                raise RedisConnectionError("Connection not ready") from None

    def _discard(self, connection: Any) -> None:
        """Drop a connection that failed at checkout; its slot goes to the next waiter."""
        try:
            connection.disconnect()
        except Exception as exc:  # best effort: the connection is gone either way
            logger.debug("disconnecting a failed connection: %r", exc)
        with self._lock:
            self._ledger.drop(connection)

    # -- giving back --------------------------------------------------------------------------
    def release(self, connection: Any) -> None:
        """Hand the connection to the oldest waiter, or keep it idle if nobody waits."""
        if self.pid != PROCESS.pid:
            self._checkpid()
        if connection not in self._ledger.checked_out:
            return  # not ours (made before a fork, or another pool's), or released twice
        reconnect = getattr(connection, "should_reconnect", None)  # redis-py >= 6
        if reconnect is not None and reconnect():
            connection.disconnect()
        dispatcher = self._release_dispatcher
        if dispatcher is not None and not (
            self._quiet_releases and getattr(connection, "_re_auth_token", 0) is None
        ):
            # Re-authenticates if a new token is pending: network I/O, so before the lock and
            # while the connection is still ours.
            dispatcher.dispatch(_RELEASED(connection))
        with self._lock:
            ledger = self._ledger
            if connection not in ledger.checked_out:
                return
            foreign = connection.pid != self.pid  # redis-py's owns_connection, inline
            if foreign:
                ledger.drop(connection)
            else:
                ledger.give_back(connection)
        if foreign:
            connection.disconnect()

    # -- closing ------------------------------------------------------------------------------
    def retire_idle(self) -> int:
        """Close every idle connection now (each reconnects on its next use); returns how many.

        They are checked out while they close, so nobody can borrow a half-closed socket.
        """
        self._checkpid()
        with self._lock:
            taken = self._ledger.take_idle()
        try:
            for connection in taken:
                try:
                    connection.disconnect()
                except Exception as exc:
                    logger.debug("retiring an idle connection: %r", exc)
        finally:
            with self._lock:
                for connection in taken:
                    if connection in self._ledger.checked_out:
                        self._ledger.give_back(connection)
        return len(taken)

    def disconnect(self, inuse_connections: bool = True) -> None:
        """Close every connection (``inuse_connections=False``: only the idle ones)."""
        self._checkpid()
        if not inuse_connections:
            self.retire_idle()
            return
        with self._lock:
            connections = list(self._ledger.made)
        for connection in connections:
            connection.disconnect()

    # -- what redis-py's maintenance-notification and metrics code reads -----------------------
    def _get_pool_lock(self) -> threading.RLock:
        return self._lock

    def _get_free_connections(self) -> list[Any]:
        with self._lock:
            return list(self._ledger.idle)

    def _get_in_use_connections(self) -> set[Any]:
        with self._lock:
            return set(self._ledger.checked_out)


class AsyncFairBlockingConnectionPool(FairPool, redis.asyncio.ConnectionPool):
    """The asyncio flavour: waiting tasks are served first come, first served.

    Use it from one event loop (like redis-py's asyncio pools). Its state changes never await,
    so the event loop is its lock. A waiting task that is cancelled (or times out) gives back
    anything handed to it meanwhile, so no connection or slot is lost.
    """

    def __init__(
        self,
        max_connections: int = 50,
        timeout: float | None = 20,
        connection_class: type[Any] = redis.asyncio.connection.Connection,
        label: str | None = None,
        **connection_kwargs: Any,
    ) -> None:
        connection_kwargs.pop("queue_class", None)
        self.timeout = timeout
        self.label = label
        super().__init__(
            connection_class=connection_class,
            max_connections=max_connections,
            **connection_kwargs,
        )
        self.reset()

    def reset(self) -> None:
        """Start empty (also in a forked child: the parent's sockets are not ours)."""
        self._new_ledger()
        self.pid = PROCESS.pid

    def _checkpid(self) -> None:
        if self.pid != PROCESS.pid:
            self.reset()

    def can_get_connection(self) -> bool:
        ledger = self._ledger
        return bool(ledger.idle) or ledger.slots < self.max_connections

    # -- borrowing ----------------------------------------------------------------------------
    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connected connection; waits in line up to ``timeout`` when all are checked out."""
        self._checkpid()
        connection = self._ledger.take()
        if connection is EMPTY:
            connection = await self._wait()
        if connection is SLOT:
            connection = self._create()
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self._discard(connection)
            raise
        return connection

    def get_available_connection(self) -> Any:
        """Take an idle connection or a free slot without waiting (redis-py's hook)."""
        self._checkpid()
        connection = self._ledger.take()
        if connection is EMPTY:
            raise RedisConnectionError("Too many connections")
        return self._create() if connection is SLOT else connection

    async def _wait(self) -> Any:
        loop = asyncio.get_running_loop()
        waiter = TaskWaiter(loop.create_future())
        self._ledger.waiters.append(waiter)
        timer = (
            None if self.timeout is None else loop.call_later(self.timeout, self._expire, waiter)
        )
        try:
            item = await waiter.future
        except BaseException:  # cancelled: give back whatever was handed meanwhile
            if timer is not None:
                timer.cancel()
            future = waiter.future
            if future.done() and not future.cancelled():
                handed = future.result()
                if handed is not _TIMED_OUT:
                    self._ledger.give_back(handed)
            else:
                self._ledger.forget(waiter)
            raise
        if timer is not None:
            timer.cancel()
        if item is _TIMED_OUT:
            raise self._exhausted(", asyncio")
        return item

    def _expire(self, waiter: TaskWaiter) -> None:
        if not waiter.future.done():
            self._ledger.forget(waiter)
            waiter.future.set_result(_TIMED_OUT)

    def _create(self) -> Any:
        try:
            connection = self.connection_class(**self.connection_kwargs)
        except BaseException:
            self._ledger.free_slot()
            raise
        self._ledger.track(connection, checked_out=True)
        return connection

    def make_connection(self) -> Any:
        """A new, unconnected connection (tracked; constructors do no network I/O)."""
        connection = self.connection_class(**self.connection_kwargs)
        self._ledger.track(connection, checked_out=False)
        return connection

    async def _discard(self, connection: Any) -> None:
        """Drop a connection that failed at checkout; its slot goes to the next waiter."""
        self._ledger.drop(connection)
        try:
            await connection.disconnect()
        except Exception as exc:  # best effort: the connection is gone either way
            logger.debug("disconnecting a failed connection: %r", exc)

    # -- giving back --------------------------------------------------------------------------
    async def release(self, connection: Any) -> None:
        """Hand the connection to the oldest waiting task, or keep it idle."""
        if connection not in self._ledger.checked_out:
            return  # not ours, or released twice
        try:
            if _should_reconnect(connection):
                await connection.disconnect()
            dispatcher = getattr(self, "_event_dispatcher", None)
            if _ASYNC_RELEASED is not None and dispatcher is not None:
                # May re-authenticate (network I/O): while the connection is still ours.
                await dispatcher.dispatch_async(_ASYNC_RELEASED(connection))
        except BaseException:
            # Interrupted half way (cancelled, or the re-auth failed): do not pass on a
            # connection in an unknown state, but do not lose its slot either.
            self._ledger.drop(connection)
            raise
        if connection in self._ledger.checked_out:
            self._ledger.give_back(connection)

    # -- closing ------------------------------------------------------------------------------
    async def retire_idle(self) -> int:
        """Close every idle connection now (each reconnects on its next use); returns how many.

        They are checked out while they close, so no task borrows a half-closed socket.
        """
        self._checkpid()
        taken = self._ledger.take_idle()
        try:
            results = await asyncio.gather(
                *(connection.disconnect() for connection in taken), return_exceptions=True
            )
            for result in results:
                if isinstance(result, Exception):
                    logger.debug("retiring an idle connection: %r", result)
        finally:
            for connection in taken:
                if connection in self._ledger.checked_out:
                    self._ledger.give_back(connection)
        return len(taken)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """Close every connection (``inuse_connections=False``: only the idle ones)."""
        if not inuse_connections:
            await self.retire_idle()
            return
        connections: Iterable[Any] = list(self._ledger.made)
        results = await asyncio.gather(
            *(connection.disconnect() for connection in connections), return_exceptions=True
        )
        error = next((r for r in results if isinstance(r, BaseException)), None)
        if error is not None:
            raise error

    def _get_free_connections(self) -> list[Any]:
        return list(self._ledger.idle)

    def _get_in_use_connections(self) -> set[Any]:
        return set(self._ledger.checked_out)
