"""``get_or_set`` computed once (``STAMPEDE_PROTECTION``): on a miss, exactly one caller across
every process computes the value, under a lock key on the key's own shard; the others wait for
the value it stores. The asyncio source; ``_sync/stampede.py`` is generated from it.

- Threads (or tasks) of one process coalesce first (:class:`~sentinel_cache.core.ops.sync_io.
  Flights`): one of them goes to the server, the rest share its outcome.
- The lock is ``SET <lock> <token> NX PX <lock timeout>`` on the key's shard. Its holder computes,
  then stores the value only while it still holds the lock (:data:`PUBLISH_IF_HELD`, one script:
  the value written and the lock released at once). A holder that lost its lock (it expired
  during a long computation, or a failover lost it) stores nothing, and says so in the log: two
  computations never overwrite each other unnoticed.
- A waiter reads the value and the lock in one round trip, with a backoff from 5 to 50 ms; when
  the lock is gone and no value is there (the holder died, or failed), it takes the lock itself.
- A computation that raises releases the lock at once (the next caller computes) and raises in
  every caller coalesced with it.
- Early refresh (``early``, XFetch's beta): the store also records how long the computation
  took; a hit recomputes it before it expires with a probability that rises as its end nears,
  ``-delta * early * ln(random) >= seconds left``, under the same lock, while every other reader
  keeps getting the current value: a steadily read key never expires under its readers.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Callable
from time import monotonic
from typing import Any

from sentinel_cache.core.arguments import (
    MAX_TIMEOUT,
    MIN_LOCK_TIMEOUT,
    number_problem,
    valid_timeout,
)
from sentinel_cache.core.ops._async.client import AsyncCacheOperations
from sentinel_cache.core.ops._async.runner import SKIPPED
from sentinel_cache.core.ops.async_io import pause
from sentinel_cache.core.ops.plans import (
    MISS,
    READ,
    REPLACE,
    WRITE,
    Command,
    expiry_args,
    is_ok,
    short_key,
)
from sentinel_cache.core.ops.plans import logger as log
from sentinel_cache.exceptions import ArgumentValueError

#: Where a key's lock lives: this prefix and the key, on the key's own shard.
LOCK_PREFIX = "sentinel_cache:stampede:"
#: Where the last computation's duration (ms) is kept for early refresh, beside the value.
DELTA_PREFIX = "sentinel_cache:stampede:delta:"
#: KEYS: the key, its lock, its delta key; ARGV: the token, the data, the ms to live (0: none),
#: the computation's ms. 1 if stored (with its delta, for the same time), 0 if the lock is not
#: the holder's any more.
PUBLISH_IF_HELD = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if ARGV[3] == '0' then
    redis.call('SET', KEYS[1], ARGV[2])
    redis.call('SET', KEYS[3], ARGV[4])
else
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[3])
end
redis.call('DEL', KEYS[2])
return 1
"""
#: KEYS: the lock; ARGV: the token. Released only by its holder.
RELEASE_IF_HELD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
FIRST_WAIT, LONGEST_WAIT = 0.005, 0.05


def valid_lock_timeout(seconds: Any) -> float:
    """``lock_timeout``: how long a holder may compute, by ``STAMPEDE_LOCK_TIMEOUT``'s rule."""
    problem = number_problem(seconds, minimum=MIN_LOCK_TIMEOUT, maximum=MAX_TIMEOUT)
    if problem is not None:
        raise ArgumentValueError("lock_timeout", seconds, problem)
    return float(seconds)


def lock_key(key: Any) -> Any:
    return LOCK_PREFIX.encode() + key if isinstance(key, bytes) else LOCK_PREFIX + str(key)


def delta_key(key: Any) -> Any:
    return DELTA_PREFIX.encode() + key if isinstance(key, bytes) else DELTA_PREFIX + str(key)


def refresh_now(seconds_left: float, delta: float, early: float) -> bool:
    """XFetch: recompute a value ``seconds_left`` before its expiry, whose computation took
    ``delta`` seconds, with a probability that grows as the expiry nears (``early`` scales it)."""
    return -delta * early * math.log(1.0 - random.random()) >= seconds_left


def refresh_due(ms_left: Any, delta: Any, early: float) -> bool:
    """XFetch's verdict on a hit read by :func:`timed_reads`: never without a recorded
    duration or a time left."""
    return (
        delta is not None and ms_left > 0 and refresh_now(ms_left / 1000, int(delta) / 1000, early)
    )


def timed_reads(key: Any) -> list[Command]:
    """A key's value, its time left and its last computation's duration, in one round trip."""
    return [("GET", key), ("PTTL", key), ("GET", delta_key(key))]


def take_lock(key: Any, lock_timeout: float) -> tuple[str, Command]:
    """A new token and the command that takes ``key``'s computation lock with it (``SET NX
    PX``) for ``lock_timeout`` seconds; released only by its holder."""
    token = secrets.token_hex(16)
    return token, ("SET", lock_key(key), token, "NX", "PX", max(1, int(lock_timeout * 1000)))


class AsyncStampedeOperations(AsyncCacheOperations):
    """``get_or_set`` with one computation per miss across processes (``lock_timeout`` seconds:
    how long a holder may compute before another caller takes over)."""

    async def get_or_set(
        self,
        key: Any,
        default: Any,
        timeout: float | None,
        *,
        lock_timeout: float = 10.0,
        early: float = 0.0,
    ) -> Any:
        """The key's value; on a miss ``default`` (called if callable) computed by one caller
        and stored for ``timeout`` seconds, every other caller waiting for it. A timeout of zero
        or less stores nothing: each caller gets its own computation, as Django's. ``early``
        above 0: a hit may recompute the value shortly before it expires (see the module)."""
        if type(timeout) is not int or timeout > MAX_TIMEOUT:
            timeout = valid_timeout(timeout)
        lock_timeout = valid_lock_timeout(lock_timeout)
        if early and (type(early) not in (int, float) or not 0 < early < MAX_TIMEOUT):
            raise ArgumentValueError("early", early, "must be a finite number >= 0")
        refresh = early and callable(default) and timeout is not None and timeout > 0
        value = await (
            self._hit_or_refresh(key, default, timeout, lock_timeout, early)
            if refresh
            else self.get(key, MISS)
        )
        if value is not MISS:
            return value
        if (timeout is not None and timeout <= 0) or not callable(default):
            value = default() if callable(default) else default
            await self.add(key, value, timeout)
            got = await self.get(key, MISS)
            return value if got is MISS else got
        return await self.io.flights.once(
            key, lambda: self._computed_once(key, default, timeout, lock_timeout)
        )

    async def _hit_or_refresh(
        self,
        key: Any,
        compute: Callable[[], Any],
        timeout: float | None,
        lock_timeout: float,
        early: float,
    ) -> Any:
        """A hit, recomputed first if XFetch says so and nobody else is at it (the others keep
        the current value); MISS on a miss."""
        (data, ms_left, delta), _ = await self.keyed(
            key, timed_reads(key), [None, -2, None], READ, replicas=False
        )
        value = MISS if data is None else self.decode(data, key)
        if value is MISS or not refresh_due(ms_left, delta, early):
            return value
        token, take = take_lock(key, lock_timeout)
        (taken,), _ = await self.keyed(key, [take], [None], WRITE)
        if not is_ok(taken):
            return value  # someone else refreshes it: the current value is still good
        return await self._compute_and_store(key, compute, timeout, lock_key(key), token)

    async def _computed_once(
        self, key: Any, compute: Callable[[], Any], timeout: float | None, lock_timeout: float
    ) -> Any:
        lock = lock_key(key)
        token, take = take_lock(key, lock_timeout)
        while True:
            (taken,), _ = await self.keyed(key, [take], [SKIPPED], WRITE)
            if taken is SKIPPED:  # IGNORE_EXCEPTIONS skipped the shard: no lock, no store
                return compute()
            if is_ok(taken):
                return await self._compute_and_store(key, compute, timeout, lock, token)
            wait = FIRST_WAIT
            while True:  # another caller computes: wait for its value, or for its lock to go
                await pause(wait)
                wait = min(wait * 2, LONGEST_WAIT)
                (data, held), _ = await self.keyed(
                    key, [("GET", key), ("EXISTS", lock)], [None, 0], READ, replicas=False
                )
                if data is not None:
                    value = self.decode(data, key)
                    if value is not MISS:
                        return value
                if not held:
                    break  # the holder died or failed: take the lock

    async def _compute_and_store(
        self, key: Any, compute: Callable[[], Any], timeout: float | None, lock: Any, token: str
    ) -> Any:
        began = monotonic()
        try:
            value = compute()
        except BaseException:
            release: Command = ("EVAL", RELEASE_IF_HELD, 1, lock, token)
            await self.keyed(key, [release], [0], WRITE)
            raise
        took = max(1, int((monotonic() - began) * 1000))
        ms = expiry_args(timeout)[1] if timeout is not None else 0
        keys = (key, lock, delta_key(key))
        publish: Command = ("EVAL", PUBLISH_IF_HELD, 3, *keys, token, self.encode(value), ms, took)
        replies, _ = await self.keyed(key, self.durable([publish]), [0], REPLACE, idempotent=False)
        self.check_durable(key, replies)
        if replies[0] != 1:
            log.warning(
                "get_or_set of key %s: its lock expired or was lost while computing (%.2fs); "
                "the value was not stored, another caller may compute it",
                short_key(key),
                monotonic() - began,
            )
        return value
