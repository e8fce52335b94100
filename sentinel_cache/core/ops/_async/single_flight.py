"""One computation across processes of a result that its caller stores itself: a page that
Django's cache middleware stores, a value that Flask-Caching's ``@cached``/``@memoize`` store.
What ``get_or_set`` does with ``STAMPEDE_PROTECTION`` for a value it stores, for the
frameworks' own get, compute, set (they decide after the computation whether to store it).

After a miss, :meth:`AsyncSingleFlight.begin` gives an :class:`AsyncTicket` to one caller: it
holds the key's lock (the one ``get_or_set`` takes, ``lock_key``, ``SET NX PX``), computes,
stores, and ends the ticket (the lock is released only by its holder). Every other caller
waits until then (this process's threads, or tasks of one event loop, on the io's ``turns``;
other processes block until the ticket's end announces it, as ``get_or_set``'s waiters do:
``stampede.wait_released``) and gets None: it looks in the cache again,
and computes itself only if the result is still missing (it was not stored: an error, a
response not to be cached), never waiting twice. A holder that dies leaves its lock to expire
after ``lock_timeout`` seconds, which also bounds every wait. A shard that
``IGNORE_EXCEPTIONS`` skips coordinates nothing: everyone computes.

Early refresh (``STAMPEDE_EARLY_REFRESH``, as ``get_or_set``'s): a ticket's end also records
how long its computation took beside the stored key (``delta_key``, for as long as the key
lives); :meth:`AsyncSingleFlight.read` reads a key, its time left and that duration in one
round trip, and on a hit gives a ticket to recompute it when XFetch says so and nobody else
holds the lock (the other callers keep getting the current value).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from sentinel_cache.core.ops._async.runner import SKIPPED
from sentinel_cache.core.ops._async.stampede import (
    ANNOUNCE,
    WAKE_MS,
    delta_key,
    lock_key,
    refresh_due,
    release_command,
    take_lock,
    timed_reads,
    wait_released,
    wake_key,
)
from sentinel_cache.core.ops.plans import MISS, READ, WRITE, Command, is_ok, short_key

if TYPE_CHECKING:
    from sentinel_cache.core.ops._async.runner import AsyncRunner

logger = logging.getLogger("sentinel_cache")

#: KEYS: the lock, the stored key, its delta key, the lock's wake key; ARGV: the token, the
#: computation's ms, WAKE_MS. The lock released (and announced) if it is still the holder's;
#: the ms recorded beside the stored key for as long as it lives (nothing if it was not stored).
END_COMPUTATION = (
    """
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ttl)
elseif ttl == -1 then
    redis.call('SET', KEYS[3], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
"""
    + ANNOUNCE.format(wake=4, ms=3)
    + "return 1\n"
)


def end_command(key: Any, stored: Any, token: str, began: float) -> Command:
    """END_COMPUTATION for ``key``'s lock and ``stored``'s duration, both on one shard."""
    took = max(1, int((time.monotonic() - began) * 1000))
    keys = (lock_key(key), stored, delta_key(stored), wake_key(key))
    return ("EVAL", END_COMPUTATION, 4, *keys, token, took, WAKE_MS)


class AsyncTicket:
    """The right (and duty) to compute one key's result: end it once the result is stored,
    or once it is known it will not be (it may be ended again; only the first counts).
    ``stored``: the key the result was stored under, when not the ticket's own."""

    def __init__(
        self, flight: AsyncSingleFlight, key: Any, token: str | None, turn: Any = None
    ) -> None:
        self.flight: AsyncSingleFlight | None = flight
        self.key, self.token, self.turn = key, token, turn
        self.began = time.monotonic()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {short_key(self.key)} held={self.token is not None}>"

    async def end(self, stored: Any = None) -> None:
        flight, self.flight = self.flight, None
        if flight is not None:
            await flight.end(self, self.key if stored is None else stored)


class AsyncSingleFlight:
    """:meth:`begin`, :meth:`read` and :meth:`end` on a client (see the module)."""

    def __init__(self, client: AsyncRunner, lock_timeout: float) -> None:
        self.client, self.lock_timeout = client, lock_timeout

    def __repr__(self) -> str:
        return f"<{type(self).__name__} lock_timeout={self.lock_timeout} {self.client!r}>"

    async def begin(self, key: Any) -> AsyncTicket | None:
        """A ticket to compute ``key`` (a stored key), or None once another caller's
        computation has ended: look in the cache again."""
        turns = self.client.io.turns
        turn = turns.lead(key)
        if turn is None:  # a holder that never ends: look again after the lock's time
            await turns.wait(key, self.lock_timeout)
            return None
        try:
            token, take = take_lock(key, self.lock_timeout)
            (taken, ms_left, present), _ = await self.client.keyed(
                key, [take, ("PTTL", lock_key(key)), ("EXISTS", key)], [SKIPPED, -2, 0], WRITE
            )
            if taken is SKIPPED:  # IGNORE_EXCEPTIONS skipped the shard: no coordination
                return AsyncTicket(self, key, None, turn)
            if is_ok(taken):
                if not present:
                    return AsyncTicket(self, key, token, turn)
                # A holder stored and released between this caller's miss and its lock: the
                # value is there, read under the lock, so it is not computed a second time.
                await self.client.keyed(key, [release_command(key, token)], [0], WRITE)
            else:
                deadline = time.monotonic() + self.lock_timeout  # a longer lock: not waited out
                await wait_released(self.client, key, ms_left, None, deadline)
        except BaseException:
            turns.end(key, turn)
            raise
        turns.end(key, turn)
        return None

    async def read(self, key: Any, early: float) -> tuple[Any, AsyncTicket | None]:
        """The key's value (``MISS`` if absent) in one round trip with its time left and its
        last computation's duration; with a ticket to recompute it now when it is a hit that
        XFetch says to refresh (``early`` scales it) and the lock was free."""
        (data, ms_left, delta), _ = await self.client.keyed(
            key, timed_reads(key), [None, -2, None], READ, replicas=False
        )
        value = MISS if data is None else self.client.decode(data, key)
        if value is MISS or not refresh_due(ms_left, delta, early):
            return value, None
        token, take = take_lock(key, self.lock_timeout)
        (taken,), _ = await self.client.keyed(key, [take], [None], WRITE)
        return value, AsyncTicket(self, key, token) if is_ok(taken) else None

    async def end(self, ticket: AsyncTicket, stored: Any) -> None:
        key = ticket.key
        try:
            if ticket.token is not None:
                end = end_command(key, key, ticket.token, ticket.began)
                await self.client.keyed(key, [end], [0], WRITE)
                if stored != key:  # its duration on its own shard (no lock there: token "")
                    end = end_command(stored, stored, "", ticket.began)
                    await self.client.keyed(stored, [end], [0], WRITE)
        except Exception as exc:
            logger.warning(
                "the computation lock of key %s could not be released (%s); it expires on its own",
                short_key(key),
                exc,
            )
        finally:
            if ticket.turn is not None:
                self.client.io.turns.end(key, ticket.turn)
