"""``get_or_set`` computed once (``STAMPEDE_PROTECTION``): on a miss, exactly one caller across
every process computes the value, under a lock key on the key's own shard; the others wait for
the value it stores. The asyncio source; ``_sync/stampede.py`` is generated from it.

- Threads (or tasks) of one process coalesce first (:class:`~sentinel_cache.core.ops.sync_io.
  Flights`), before the read: one of them reads the key, takes the lock and computes, the rest
  share its outcome without a round trip or a connection of their own. On a hit they share the
  stored bytes, each decoding its own copy (:class:`Stored`); a computed value is shared.
- The lock is ``SET <lock> <token> NX PX <lock timeout>`` on the key's shard. Its holder computes,
  then stores the value over what the key held when it was read (:data:`PUBLISH_IF_HELD`, one
  script: the value written and its lock released at once), so a value written meanwhile wins.
  The lock bounds how long the others wait for a holder, not whether it may store: one whose
  computation outlasted it (or whose lock a failover lost) still stores if nothing newer was
  written meanwhile (a second computation begun after the expiry then finds that value and
  returns it), and says so in the log: the lock timeout is too short for the computation.
- The lock's end is announced: the script that stores the value and releases the lock (or
  only releases it) also adds an entry to a stream beside the lock (:func:`wake_key`, one
  entry, gone :data:`WAKE_MS` after it). A waiter in another process blocks on that stream
  (``XREAD BLOCK``, from the entry it last saw) and then reads the lock's time left and the
  value, all in one round trip (:func:`wait_released`): it returns within a round trip of the
  store. The announcement only wakes; what counts is what the waiter reads after it, so a lost
  one (a failover, an entry already gone) costs one block, never correctness. A block never
  outlasts the lock's time left (less the server's timer granularity, :data:`TIMER_SLACK_MS`),
  so a holder that died is taken over as its lock expires; nor half the socket timeout.
- When the lock is gone and no value is there (the holder died, or failed), the waiter takes
  the lock itself.
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
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from sentinel_cache.core.arguments import (
    MAX_TIMEOUT,
    MIN_LOCK_TIMEOUT,
    number_problem,
    valid_timeout,
)
from sentinel_cache.core.ops._async.client import AsyncCacheOperations, non_string_miss
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

if TYPE_CHECKING:
    from sentinel_cache.core.ops._async.runner import AsyncRunner
    from sentinel_cache.core.topology.shard import Shard

#: Where a key's lock lives: this prefix and the key, on the key's own shard.
LOCK_PREFIX = "sentinel_cache:stampede:"
#: Where the last computation's duration (ms) is kept for early refresh, beside the value.
DELTA_PREFIX = "sentinel_cache:stampede:delta:"
#: Where a lock's end is announced to the waiters of other processes: this prefix and the key.
WAKE_PREFIX = "sentinel_cache:stampede:wake:"
#: How long the announcement stays after the lock's end (ms): long enough for a waiter between
#: two blocks to find it, and nothing left behind for longer.
WAKE_MS = 1000
#: Lua, shared by the scripts that end a lock: announce it on KEYS[wake] (one entry, MAXLEN 1),
#: for ARGV[ms] ms. Format with the indexes.
ANNOUNCE = """
redis.call('XADD', KEYS[{wake}], 'MAXLEN', '1', '*', 'end', '1')
redis.call('PEXPIRE', KEYS[{wake}], ARGV[{ms}])
"""
#: KEYS: the key, its lock, its delta key, its wake key; ARGV: the token, the data, the ms to
#: live (0: none), the computation's ms, WAKE_MS, and what the computation replaces: "0" (the
#: key was missing) or "1" and the bytes it held (a refresh, or a value this cache cannot
#: read). The bytes the key holds if it was written meanwhile: then nothing is stored (a write
#: made during the computation is never overwritten by it, as Django's get_or_set adds rather
#: than sets) and a lock still held stays held. Else the value is stored (with its delta, for
#: the same time) and announced: 1 if the lock was still the holder's (now released), 2 if not
#: (it expired during the computation, or a failover lost it; another caller's lock is left
#: alone, and that caller will find this value written meanwhile). A key that holds no string
#: (a list) counts as missing: computed over.
PUBLISH_IF_HELD = (
    """
local now = redis.pcall('GET', KEYS[1])
if type(now) == 'table' then now = false end
if now and (ARGV[6] == '0' or now ~= ARGV[7]) then return now end
if ARGV[3] == '0' then
    redis.call('SET', KEYS[1], ARGV[2])
    redis.call('SET', KEYS[3], ARGV[4])
else
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[3])
end
local held = 2
if redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
    held = 1
end
"""
    + ANNOUNCE.format(wake=4, ms=5)
    + "return held\n"
)
#: What :data:`PUBLISH_IF_HELD` answers when it stored the value without the lock.
STORED_UNLOCKED = 2
#: KEYS: the lock, its wake key; ARGV: the token, WAKE_MS. Released (and announced) only by
#: its holder.
RELEASE_IF_HELD = (
    """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
"""
    + ANNOUNCE.format(wake=2, ms=2)
    + "return 1\n"
)
#: A waiter that cannot block (see :func:`blocking_slot`) polls, this far apart, doubling.
FIRST_WAIT, LONGEST_WAIT = 0.005, 0.05
#: The longest block on a wake key (s); at most half the socket timeout too.
LONGEST_BLOCK = 1.0
#: How late a server may end a block (ms): it times blocked clients out on its timer (``hz``
#: 10: every 100 ms). A block stops this much before the lock expires; the rest is slept here.
TIMER_SLACK_MS = 100


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


def wake_key(key: Any) -> Any:
    return WAKE_PREFIX.encode() + key if isinstance(key, bytes) else WAKE_PREFIX + str(key)


def release_command(key: Any, token: str) -> Command:
    """Release ``key``'s lock if ``token`` still holds it, announcing it to the waiters."""
    return ("EVAL", RELEASE_IF_HELD, 2, lock_key(key), wake_key(key), token, WAKE_MS)


_blocked: weakref.WeakKeyDictionary[Shard, int] = weakref.WeakKeyDictionary()
_blocked_lock = threading.Lock()


@contextmanager
def blocking_slot(shard: Shard, limit: int) -> Iterator[bool]:
    """Whether this waiter may hold one of the shard's pooled connections in a block: at most
    ``limit`` at once per process (a quarter of the pool), so waiters on many cold keys never
    starve the other calls of connections; the others poll."""
    with _blocked_lock:
        taken = _blocked.get(shard, 0) < limit
        if taken:
            _blocked[shard] = _blocked.get(shard, 0) + 1
    try:
        yield taken
    finally:
        if taken:
            with _blocked_lock:
                _blocked[shard] -= 1


def last_entry(reply: Any) -> Any:
    """The id of the last entry of an ``XREAD`` reply on one stream (RESP2 or RESP3), or None
    if it timed out."""
    if not reply:
        return None
    entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    return entries[-1][0]


async def wait_released(
    client: AsyncRunner,
    key: Any,
    ms_left: int,
    decode: Callable[[Any, Any], Any] | None,
    deadline: float = math.inf,
) -> Any:
    """Wait for ``key``'s computation lock (``ms_left`` its time left, as ``PTTL`` says) to be
    gone, or for ``monotonic()`` to pass ``deadline``; with ``decode``, return the key's value
    as soon as a readable one is stored (MISS: none). Blocks on the key's wake key, each block
    followed by reads of the lock and the value in the same round trip (see the module). On
    the master only, even in an outage: a replica's copy of the lock may lag its holder's, and
    nothing announces a lock's end on a replica whose master is gone."""
    core = client.core
    timeout = core.config.connection_options().get("socket_timeout")
    longest = LONGEST_BLOCK if not timeout else min(LONGEST_BLOCK, timeout / 2)
    limit = max(1, core.config.max_connections // 4)
    lock, wake = lock_key(key), wake_key(key)
    reads: list[Command] = [("PTTL", lock), ("GET", key)] if decode else [("PTTL", lock)]
    seen: Any = "0-0"  # any entry: the stream is new, or one left by an earlier round
    poll = FIRST_WAIT
    while ms_left != -2 and (left := deadline - monotonic()) > 0:
        # -1: a lock without expiry (not one of ours): wait in blocks, each bounded anyway
        block = int(min(longest, left) * 1000)
        block = block if ms_left < 0 else min(block, ms_left)
        with blocking_slot(core.shard_for(key), limit) as blocking:
            if blocking and block > TIMER_SLACK_MS:
                xread: Command = ("XREAD", "BLOCK", block - TIMER_SLACK_MS, "STREAMS", wake, seen)
                try:
                    replies, _ = await client.keyed(
                        key, [xread, *reads], [None, -2, None], READ, replicas=False, outage=False
                    )
                except ResponseError as exc:  # UNBLOCKED: the node changed role mid-block
                    if not str(exc).startswith("UNBLOCKED"):
                        raise
                    continue
                seen = last_entry(replies[0]) or seen
                replies = replies[1:]
            else:  # the lock ends within the server's timer slack, or no slot: sleep here
                await pause(block / 1000 if blocking else min(poll, block / 1000))
                poll = min(poll * 2, LONGEST_WAIT)
                replies, _ = await client.keyed(
                    key, reads, [-2, None], READ, replicas=False, outage=False
                )
        if decode is not None and replies[1] is not None:
            value = decode(replies[1], key)
            if value is not MISS:  # an unreadable one is absent: wait on for the lock
                return value
        ms_left = replies[0]
    return MISS


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


class Stored:
    """A coalesced read's outcome when the key was there: its stored bytes, which each caller
    decodes into its own copy (a hit is never one object shared by callers who may mutate it)."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data


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
        if (timeout is not None and timeout <= 0) or not callable(default):
            value = await self.get(key, MISS)
            if value is not MISS:
                return value
            value = default() if callable(default) else default
            await self.add(key, value, timeout)
            got = await self.get(key, MISS)
            return value if got is MISS else got
        core, refresh = self.core, early and timeout is not None
        if not refresh and core.near is None and core.previous_ring is None:
            # the read coalesced too: a cold key costs a process one read, not one per caller
            work = lambda: self._read_or_computed(key, default, timeout, lock_timeout)  # noqa: E731
        else:  # early refresh, the near cache, a key moving between owners: read by get's rules
            value = await (
                self._hit_or_refresh(key, default, timeout, lock_timeout, early)
                if refresh
                else self.get(key, MISS)
            )
            if value is not MISS:
                return value
            work = lambda: self._computed_once(key, default, timeout, lock_timeout)  # noqa: E731
        # One flight per key, whichever work its leader does: a caller may join either kind.
        outcome = await self.io.flights.once(key, work)
        if not isinstance(outcome, Stored):
            return outcome
        value = self.decode(outcome.data, key)
        if value is not MISS:
            return value
        # bytes this cache cannot read: computed over, once (they are what the value replaces)
        return await self.io.flights.once(
            key, lambda: self._computed_once(key, default, timeout, lock_timeout, outcome.data)
        )

    async def _read_or_computed(
        self, key: Any, compute: Callable[[], Any], timeout: float | None, lock_timeout: float
    ) -> Any:
        """The key's stored bytes (:class:`Stored`), or on a miss its value computed once."""
        try:
            (data,), _ = await self.keyed(key, [("GET", key)], [None], READ)
        except ResponseError as exc:
            if not non_string_miss(exc, key):
                raise
            data = None
        if data is not None:
            return Stored(data)
        return await self._computed_once(key, compute, timeout, lock_timeout)

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
        return await self._compute_and_store(key, compute, timeout, token, data)

    async def _computed_once(
        self,
        key: Any,
        compute: Callable[[], Any],
        timeout: float | None,
        lock_timeout: float,
        replaces: bytes | None = None,
    ) -> Any:
        lock = lock_key(key)
        token, take = take_lock(key, lock_timeout)
        while True:
            (taken, ms_left), _ = await self.keyed(
                key, [take, ("PTTL", lock)], [SKIPPED, -2], WRITE
            )
            if taken is SKIPPED:  # IGNORE_EXCEPTIONS skipped the shard: no lock, no store
                return compute()
            if is_ok(taken):
                return await self._compute_and_store(key, compute, timeout, token, replaces)
            # another caller computes: wait for its value, or for its lock to go
            value = await wait_released(self, key, ms_left, self.decode)
            if value is not MISS:
                return value
            # the holder died or failed: take the lock

    async def _compute_and_store(
        self,
        key: Any,
        compute: Callable[[], Any],
        timeout: float | None,
        token: str,
        replaces: bytes | None,
    ) -> Any:
        """Compute under the lock ``token`` holds and store the value over ``replaces`` (the
        bytes the key held when it was read, None if it was missing): a value written
        meanwhile wins, as with Django's add, and is what the caller gets (the lock released)."""
        began = monotonic()
        try:
            value = compute()
        except BaseException:
            await self.keyed(key, [release_command(key, token)], [0], WRITE)
            raise
        took = max(1, int((monotonic() - began) * 1000))
        ms = expiry_args(timeout)[1] if timeout is not None else 0
        keys = (key, lock_key(key), delta_key(key), wake_key(key))
        data = self.encode(value)
        head = ("EVAL", PUBLISH_IF_HELD, 4, *keys, token, data, ms, took, WAKE_MS)
        over: tuple[Any, ...] = ("0",) if replaces is None else ("1", replaces)
        current = MISS
        for _ in range(2):  # over what it replaces; then once over bytes it cannot read
            (written,), _ = await self.keyed(key, [(*head, *over)], [0], REPLACE, idempotent=False)
            if type(written) is not bytes:
                break
            current = self.decode(written, key)  # written meanwhile: it wins if readable
            if current is not MISS:
                break
            over = ("1", written)
        if type(written) is bytes:  # written meanwhile: the lock is still held, release it
            await self.keyed(key, [release_command(key, token)], [0], WRITE)
            if current is not MISS:
                return current
            log.warning("get_or_set of key %s: written meanwhile, not stored", short_key(key))
        elif written == STORED_UNLOCKED:
            log.warning(
                "get_or_set of key %s: its lock expired or was lost while computing (%.2fs, "
                "more than STAMPEDE_LOCK_TIMEOUT?); stored, nothing newer having been written, "
                "but another caller may have computed it too",
                short_key(key),
                monotonic() - began,
            )
        return value
