"""One computation across processes of a result that its caller stores itself: a page that
Django's cache middleware stores, a value that Flask-Caching's ``@cached``/``@memoize`` store.
What ``get_or_set`` does with ``STAMPEDE_PROTECTION`` for a value it stores, for the
frameworks' own get, compute, set (they decide after the computation whether to store it).

After a miss, :meth:`SingleFlight.begin` gives a :class:`Ticket` to one caller: it holds the
key's lock (the one ``get_or_set`` takes, :func:`~sentinel_cache.core.ops._sync.stampede.
lock_key`, ``SET NX PX``), computes, stores, and ends the ticket (the lock is released only
by its holder). Every other caller, a thread of this process or another process, waits until
then (threads on an event; other processes poll the lock, 5 to 50 ms apart) and gets None:
it looks in the cache again, and computes itself only if the result is still missing (it was
not stored: an error, a response not to be cached), never waiting twice. A holder that dies
leaves its lock to expire after ``lock_timeout`` seconds, which also bounds every wait.
A shard that ``IGNORE_EXCEPTIONS`` skips coordinates nothing: everyone computes.

Early refresh (``STAMPEDE_EARLY_REFRESH``, as ``get_or_set``'s): a ticket's end also records
how long its computation took beside the stored key (``delta_key``, for as long as the key
lives); :meth:`SingleFlight.read` reads a key, its time left and that duration in one round
trip, and on a hit gives a ticket to recompute it when XFetch says so and nobody else holds
the lock (the other callers keep getting the current value).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from typing import Any

from sentinel_cache.core.ops._async.stampede import (
    FIRST_WAIT,
    LONGEST_WAIT,
    delta_key,
    lock_key,
    refresh_now,
)
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ops.plans import MISS, READ, WRITE, Command, is_ok, short_key

logger = logging.getLogger("sentinel_cache")

_SKIPPED: Any = object()  # the reply of a shard IGNORE_EXCEPTIONS skipped

# This process's threads computing a key, per core: (core, key) -> the event its waiters wait on.
_running: dict[tuple[Any, Any], threading.Event] = {}
_running_lock = threading.Lock()
# The same for asyncio tasks, per event loop.
_loop_running: dict[tuple[Any, Any, Any], asyncio.Event] = {}


def _take(key: Any, lock_timeout: float) -> tuple[str, Command]:
    token = secrets.token_hex(16)
    return token, ("SET", lock_key(key), token, "NX", "PX", max(1, int(lock_timeout * 1000)))


#: KEYS: the lock, the stored key, its delta key; ARGV: the token, the computation's ms. The
#: lock released if it is still the holder's; the ms recorded beside the stored key for as long
#: as it lives (nothing if it was not stored).
END_COMPUTATION = """
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ttl)
elseif ttl == -1 then
    redis.call('SET', KEYS[3], ARGV[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _end(key: Any, stored: Any, token: str, began: float) -> Command:
    """END_COMPUTATION for ``key``'s lock and ``stored``'s duration, both on one shard."""
    took = max(1, int((time.monotonic() - began) * 1000))
    return ("EVAL", END_COMPUTATION, 3, lock_key(key), stored, delta_key(stored), token, took)


def _reads(key: Any) -> list[Command]:
    return [("GET", key), ("PTTL", key), ("GET", delta_key(key))]


def _due(ms_left: Any, delta: Any, early: float) -> bool:
    """XFetch's verdict on a hit (``refresh_now``); never without a recorded duration."""
    return (
        delta is not None and ms_left > 0 and refresh_now(ms_left / 1000, int(delta) / 1000, early)
    )


def _not_released(key: Any, exc: Exception) -> None:
    logger.warning(
        "the computation lock of key %s could not be released (%s); it expires on its own",
        short_key(key),
        exc,
    )


class Ticket:
    """The right (and duty) to compute one key's result: call :meth:`end` once it is stored,
    or once it is known it will not be (it may be called again; only the first counts).
    ``stored``: the key the result was stored under, when not the ticket's own."""

    def __init__(
        self, flight: SingleFlight, key: Any, token: str | None, event: threading.Event | None
    ) -> None:
        self.flight: SingleFlight | None = flight
        self.key, self.token, self.event = key, token, event
        self.began = time.monotonic()

    def end(self, stored: Any = None) -> None:
        flight, self.flight = self.flight, None
        if flight is not None:
            flight.end(self, self.key if stored is None else stored)


class SingleFlight:
    """:meth:`begin` and :meth:`end` on a sync client (see the module)."""

    def __init__(self, client: CacheClient, lock_timeout: float) -> None:
        self.client, self.lock_timeout = client, lock_timeout

    def begin(self, key: Any) -> Ticket | None:
        """A ticket to compute ``key`` (a stored key), or None once another caller's
        computation has ended: look in the cache again."""
        local = (self.client.core, key)
        with _running_lock:
            event = _running.get(local)
            leader = event is None
            if event is None:
                event = _running[local] = threading.Event()
        if not leader:
            event.wait(self.lock_timeout)
            return None
        try:
            token, take = _take(key, self.lock_timeout)
            (taken,), _ = self.client.keyed(key, [take], [_SKIPPED], WRITE)
            if taken is _SKIPPED:  # IGNORE_EXCEPTIONS skipped the shard: no coordination
                return Ticket(self, key, None, event)
            if is_ok(taken):
                return Ticket(self, key, token, event)
            self._wait_released(key)
        except BaseException:
            self._done(local, event)
            raise
        self._done(local, event)
        return None

    def read(self, key: Any, early: float) -> tuple[Any, Ticket | None]:
        """The key's value (``MISS`` if absent) in one round trip with its time left and its
        last computation's duration; with a ticket to recompute it now when it is a hit that
        XFetch says to refresh (``early`` scales it) and the lock was free."""
        (data, ms_left, delta), _ = self.client.keyed(
            key, _reads(key), [None, -2, None], READ, replicas=False
        )
        value = MISS if data is None else self.client.decode(data, key)
        if value is MISS or not _due(ms_left, delta, early):
            return value, None
        token, take = _take(key, self.lock_timeout)
        (taken,), _ = self.client.keyed(key, [take], [None], WRITE)
        return value, Ticket(self, key, token, None) if is_ok(taken) else None

    def end(self, ticket: Ticket, stored: Any) -> None:
        key = ticket.key
        try:
            if ticket.token is not None:
                self.client.keyed(key, [_end(key, key, ticket.token, ticket.began)], [0], WRITE)
                if stored != key:  # its duration on its own shard (no lock there: token "")
                    self.client.keyed(stored, [_end(stored, stored, "", ticket.began)], [0], WRITE)
        except Exception as exc:
            _not_released(key, exc)
        finally:
            if ticket.event is not None:
                self._done((self.client.core, key), ticket.event)

    def _wait_released(self, key: Any) -> None:
        wait, deadline = FIRST_WAIT, time.monotonic() + self.lock_timeout
        lock = lock_key(key)
        while time.monotonic() < deadline:
            time.sleep(wait)
            wait = min(wait * 2, LONGEST_WAIT)
            (held,), _ = self.client.keyed(key, [("EXISTS", lock)], [0], READ, replicas=False)
            if not held:
                return

    @staticmethod
    def _done(local: tuple[Any, Any], event: threading.Event | None) -> None:
        with _running_lock:
            if event is not None and _running.get(local) is event:
                del _running[local]
        if event is not None:
            event.set()


class AsyncTicket:
    """:class:`Ticket` for asyncio: ``await ticket.end()``."""

    def __init__(
        self, flight: AsyncSingleFlight, key: Any, token: str | None, event: asyncio.Event | None
    ) -> None:
        self.flight: AsyncSingleFlight | None = flight
        self.key, self.token, self.event = key, token, event
        self.began = time.monotonic()

    async def end(self, stored: Any = None) -> None:
        flight, self.flight = self.flight, None
        if flight is not None:
            await flight.end(self, self.key if stored is None else stored)


class AsyncSingleFlight:
    """:class:`SingleFlight` on the asyncio client; tasks of one event loop wait on an event,
    other loops, threads and processes on the lock."""

    def __init__(self, client: AsyncCacheClient, lock_timeout: float) -> None:
        self.client, self.lock_timeout = client, lock_timeout

    def _local(self, key: Any) -> tuple[Any, Any, Any]:
        return (asyncio.get_running_loop(), self.client.core, key)

    async def begin(self, key: Any) -> AsyncTicket | None:
        local = self._local(key)
        event = _loop_running.get(local)
        if event is not None:
            # a holder that never ends: look again after the lock's time, compute if missing
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), self.lock_timeout)
            return None
        event = _loop_running[local] = asyncio.Event()
        try:
            token, take = _take(key, self.lock_timeout)
            (taken,), _ = await self.client.keyed(key, [take], [_SKIPPED], WRITE)
            if taken is _SKIPPED:
                return AsyncTicket(self, key, None, event)
            if is_ok(taken):
                return AsyncTicket(self, key, token, event)
            await self._wait_released(key)
        except BaseException:
            self._done(local, event)
            raise
        self._done(local, event)
        return None

    async def read(self, key: Any, early: float) -> tuple[Any, AsyncTicket | None]:
        (data, ms_left, delta), _ = await self.client.keyed(
            key, _reads(key), [None, -2, None], READ, replicas=False
        )
        value = MISS if data is None else self.client.decode(data, key)
        if value is MISS or not _due(ms_left, delta, early):
            return value, None
        token, take = _take(key, self.lock_timeout)
        (taken,), _ = await self.client.keyed(key, [take], [None], WRITE)
        return value, AsyncTicket(self, key, token, None) if is_ok(taken) else None

    async def end(self, ticket: AsyncTicket, stored: Any) -> None:
        key = ticket.key
        try:
            if ticket.token is not None:
                end = _end(key, key, ticket.token, ticket.began)
                await self.client.keyed(key, [end], [0], WRITE)
                if stored != key:
                    end = _end(stored, stored, "", ticket.began)
                    await self.client.keyed(stored, [end], [0], WRITE)
        except Exception as exc:
            _not_released(key, exc)
        finally:
            if ticket.event is not None:
                self._done(self._local(key), ticket.event)

    async def _wait_released(self, key: Any) -> None:
        wait, deadline = FIRST_WAIT, time.monotonic() + self.lock_timeout
        lock = lock_key(key)
        while time.monotonic() < deadline:
            await asyncio.sleep(wait)
            wait = min(wait * 2, LONGEST_WAIT)
            (held,), _ = await self.client.keyed(key, [("EXISTS", lock)], [0], READ, replicas=False)
            if not held:
                return

    @staticmethod
    def _done(local: tuple[Any, Any, Any], event: asyncio.Event | None) -> None:
        if event is not None and _loop_running.get(local) is event:
            del _loop_running[local]
        if event is not None:
            event.set()
