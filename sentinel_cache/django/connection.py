"""django-redis's ``get_redis_connection`` for a sharded cache: the raw client of one shard,
chosen by a key."""

from __future__ import annotations

import redis
from django.core.cache import caches

from sentinel_cache.django.cache import ShardedSentinelCache
from sentinel_cache.exceptions import ArgumentTypeError

__all__ = ["get_redis_connection"]


def get_redis_connection(
    alias: str = "default", *, key: str | bytes | None = None, write: bool = True
) -> redis.Redis:
    """The raw redis-py client of the shard that holds ``key`` on the sentinel cache ``alias``
    (django-redis's ``get_redis_connection``, which has one server to give).

    ``key`` is the name as sent to Redis, so ``get_redis_connection(key="board").zadd("board",
    ...)`` lands where the ring places ``"board"``; for a cache key, pass ``cache.make_key(k)``.
    It is the shard's current master, or a replica with ``write=False`` when replica reads are
    configured. It may be left out only when the cache has one shard. Raw commands bypass the
    safety net (no write fence during a failover, no fail-open).
    """
    cache = caches[alias]
    if not isinstance(cache, ShardedSentinelCache):
        raise TypeError(
            f"CACHES[{alias!r}] is a {type(cache).__module__}.{type(cache).__qualname__}, not a "
            "sentinel_cache.django.ShardedSentinelCache (for a django-redis cache, use "
            "django_redis.get_redis_connection)"
        )
    core = cache.core
    if key is None:
        if len(core.shards) != 1:
            raise ArgumentTypeError(
                "key",
                key,
                f"get_redis_connection({alias!r}) needs the key whose shard to connect to: "
                f"the cache has {len(core.shards)} shards, each with its own connections",
            )
        key = ""  # one shard: every key is on it
    return core.client_for(key, write=write)
