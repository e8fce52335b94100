"""The sync cache client: the operations generated from their asyncio source, plus the two
sync-only escape hatches (a raw redis-py client, a lock).

Adapters make keys and timeouts and hand every call here (as Django's ``RedisCache`` hands them
to its client). See :mod:`sentinel_cache.core.ops._async.client` for the operations, and
:mod:`sentinel_cache.core.ops.plans` for their commands and replies.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import redis
import redis.lock

from sentinel_cache.core.ops._sync.client import SCAN_COUNT
from sentinel_cache.core.ops._sync.hashes import HashOperations
from sentinel_cache.core.ops._sync.sets import SetOperations
from sentinel_cache.core.ops._sync.single_flight import SingleFlight, Ticket
from sentinel_cache.core.ops._sync.sorted_sets import SortedSetOperations
from sentinel_cache.core.ops._sync.stampede import StampedeOperations
from sentinel_cache.core.ops.plans import (
    INCR_IF_EXISTS,
    INCR_IF_EXISTS_SHA,
    MISS,
    ClientBase,
    escape_pattern,
    expiry_args,
    is_ok,
    short_key,
)
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

T = TypeVar("T")


class CacheClient(StampedeOperations, SortedSetOperations, SetOperations, HashOperations):
    """Framework-free cache operations; ``timeout`` is seconds, None means never expire, and
    zero or less means the value expires at once (as in Django)."""

    def get_client(self, key: Any, *, write: bool = True) -> redis.Redis:
        """A redis-py client on the key's shard (its master, or a replica for reads if set):
        raw commands on it bypass the safety net."""
        return self.core.client_for(key, write=write)

    def lock(self, key: Any, **kwargs: Any) -> Any:
        """A redis-py lock held on the key's shard (its current master), its token written in
        the cache's format (:class:`CacheLock`)."""
        kwargs.setdefault("lock_class", CacheLock)
        lock = self.core.client_for(key, write=True).lock(key, **kwargs)
        if isinstance(lock, CacheLock):
            lock.codec = self.codec
        return lock


class CacheLock(redis.lock.Lock):
    """redis-py's lock with a token the cache can read: a key held by a lock is then present to
    every read alike (``get`` returns the token, ``has_key`` is True), where redis-py's bare
    token would be a value the codec cannot read, which the cache treats as absent."""

    codec: Codec

    def acquire(
        self,
        sleep: float | None = None,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        if token is None:
            token = self.codec.dumps(uuid.uuid4().hex)  # type: ignore[assignment]
        return bool(super().acquire(sleep, blocking, blocking_timeout, token))  # type: ignore[arg-type]


_raw: weakref.WeakKeyDictionary[ShardedSentinelPool, CacheClient] = weakref.WeakKeyDictionary()


def execute(
    pool: ShardedSentinelPool,
    shard: Shard,
    operation: Callable[[redis.Redis], T],
    *,
    write: bool = True,
    idempotent: bool = True,
) -> T:
    """Run ``operation(client)`` on the shard (a ``redis.Redis`` on its master, or for a read on
    a replica in rotation) with the cache operations' safety net, the one definition of it
    (:meth:`CacheClient.run`): re-resolve on a connection error, timeout or READONLY, one retry
    of an idempotent operation if the master moved, :class:`~sentinel_cache.StaleReplyError`
    for a non-idempotent one whose reply came from a replaced master, and the write fence."""
    client = _raw.get(pool)
    if client is None:
        client = _raw[pool] = CacheClient(pool, Codec())
    return client.run(shard, operation, write=write, idempotent=idempotent)


__all__ = [
    "INCR_IF_EXISTS",
    "INCR_IF_EXISTS_SHA",
    "MISS",
    "SCAN_COUNT",
    "CacheClient",
    "CacheLock",
    "SingleFlight",
    "Ticket",
    "ClientBase",
    "escape_pattern",
    "execute",
    "expiry_args",
    "is_ok",
    "short_key",
]
