"""Django cache backend: one cache over a sharded set of Sentinel-managed Redis masters.

::

    CACHES = {
        "default": {
            "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
            # a list, "h1:26379,h2:26379", or "sentinel://[user:pass@]h1:26379,h2:26379/a,b?db=0"
            "LOCATION": ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"],
            "OPTIONS": {"MASTERS": ["shard_a", "shard_b"], "DB": 0},
            "KEY_PREFIX": "myapp",
        }
    }

Like Django's own ``RedisCache``, this class only makes keys (``make_and_validate_key``) and
timeouts (``get_backend_timeout``) and hands every call to a
:class:`~sentinel_cache.client.CacheClient` (sync) or
:class:`~sentinel_cache.aio.AsyncCacheClient` (async, native ``redis.asyncio``). Both run on the
process-wide shared core for this configuration, so several aliases with equal settings share one
set of pools, listeners and failover state; :meth:`close` never tears it down.

Keys are placed by the Jedis-compatible ring on the final key (``make_key`` output) exactly as it
is stored. Integers are stored raw, so ``incr``/``decr`` are atomic on the server and keep the TTL.

``OPTIONS["IGNORE_EXCEPTIONS"] = True`` makes the cache fail open when a shard is unavailable
(connection refused or lost, timeouts, READONLY, no master known, pool exhausted, writes held
too long during a failover): reads return the default (``get_many`` returns what the other shards
have), writes return False (``set_many`` returns the keys that were not stored), ``incr``/``decr``
raise ``ValueError`` as for a missing key, and the failure is logged on the
``sentinel_cache.django`` logger at most once per shard every ``LOG_IGNORED_EXCEPTIONS_INTERVAL``
seconds. Serialization errors and bad commands are never ignored.

``clear()`` with a ``KEY_PREFIX`` deletes only this cache's keys (``SCAN`` + ``UNLINK`` of the
prefix pattern on every shard). **Without a ``KEY_PREFIX`` it empties the whole configured
database on every shard** (``FLUSHDB ASYNC``), as Django's ``RedisCache`` does: set a prefix when
the database is shared with anything else.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import redis
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache, default_key_func
from django.core.exceptions import ImproperlyConfigured

from sentinel_cache.aio import AsyncCacheClient
from sentinel_cache.client import CacheClient, escape_pattern
from sentinel_cache.config import CacheOptions, PoolConfig, parse_cache_config
from sentinel_cache.exceptions import ConfigurationError
from sentinel_cache.pools import MASTER_ERRORS, Shard, ShardedSentinelPool, shared_pool
from sentinel_cache.serializers import Codec, PicklingError, build_codec

logger = logging.getLogger("sentinel_cache.django")

__all__ = ["CachePicklingError", "ShardedSentinelCache"]

# What "the shard is unavailable" looks like; our ShardUnavailableError, PoolExhaustedError,
# DiscoveryError and FailoverInProgressError are subclasses of the redis-py classes in here.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = MASTER_ERRORS

# BaseCache's own options: Redis evicts by its maxmemory-policy, so they are accepted and unused.
_DJANGO_OPTIONS = frozenset({"MAX_ENTRIES", "CULL_FREQUENCY"})

_SCAN_COUNT = 1000
# Keys that BaseCache.validate_key lets through without a CacheKeyWarning: at most 250
# characters (MEMCACHE_MAX_KEY_LENGTH), none of them a control character, space or DEL.
# One C-level match instead of Django's generator + lazy regex proxy (~2 us per key).
_QUIET_KEY = re.compile(r"[^\x00-\x20\x7f]{0,250}")
ClientT = TypeVar("ClientT", CacheClient, AsyncCacheClient)
_FAILED: Any = object()  # "the shard was unavailable and IGNORE_EXCEPTIONS is on"

# When each shard's ignored failure was last logged; shared by every alias and thread of a core,
# because Django makes one cache object per thread.
_last_logged: weakref.WeakKeyDictionary[Shard, float] = weakref.WeakKeyDictionary()
_last_logged_lock = threading.Lock()


CachePicklingError = PicklingError  # the name this module exported first


class ShardedSentinelCache(BaseCache):
    """Django ``BaseCache`` over :class:`~sentinel_cache.pools.ShardedSentinelPool`."""

    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(params)
        options = {
            name: value
            for name, value in (params.get("OPTIONS") or {}).items()
            if str(name).upper() not in _DJANGO_OPTIONS
        }
        self._config_error: str | None = None
        self._config: PoolConfig | None = None
        self._options: CacheOptions | None = None
        self._codec: Codec | None = None
        try:
            config, cache_options = parse_cache_config(server, options)
            self._codec = build_codec(cache_options)
            self._config, self._options = config, cache_options
        except ConfigurationError as exc:
            # Raised (as ImproperlyConfigured) on first use, not here: Django's own system
            # checks build every cache with caches[alias] and would crash before
            # sentinel_cache.checks reports this as sentinel_cache.E001.
            self._config_error = str(exc)
        self._ignore = self._options is not None and self._options.ignore_exceptions
        self._pool: ShardedSentinelPool | None = None
        self._client: CacheClient | None = None
        self._aclient: AsyncCacheClient | None = None

    def _improperly_configured(self) -> ImproperlyConfigured:
        return ImproperlyConfigured(self._config_error)

    @property
    def _pool_config(self) -> PoolConfig:
        """What the shared core needs, available without connecting (``sentinel_status`` and
        the system checks read it); ImproperlyConfigured naming the field if LOCATION/OPTIONS
        do not parse."""
        if self._config is None:
            raise self._improperly_configured()
        return self._config

    @property
    def _cache_options(self) -> CacheOptions:
        """The front-end options (serializer, IGNORE_EXCEPTIONS, ...)."""
        if self._options is None:
            raise self._improperly_configured()
        return self._options

    def _codec_or_raise(self) -> Codec:
        if self._codec is None:
            raise self._improperly_configured()
        return self._codec

    def __repr__(self) -> str:
        where = self._config_error if self._config is None else repr(self._config)
        return f"<ShardedSentinelCache prefix={self.key_prefix!r} {where}>"

    # -- the shared core and the clients (built on first use, never at import/settings time) ----
    @property
    def pool(self) -> ShardedSentinelPool:
        """The process-wide core for this configuration (replaced if someone closed it)."""
        pool = self._pool
        if pool is None or pool.closed:
            pool = self._pool = shared_pool(self._pool_config)
        return pool

    @property
    def client(self) -> CacheClient:
        """The sync operations, on :attr:`pool`."""
        client = self._client
        if client is None or client.pool is not self.pool:
            client = self._client = self._build(CacheClient)
        return client

    @property
    def aclient(self) -> AsyncCacheClient:
        """The native asyncio operations, on the same :attr:`pool`."""
        client = self._aclient
        if client is None or client.pool is not self.pool:
            client = self._aclient = self._build(AsyncCacheClient)
        return client

    def _build(self, kind: type[ClientT]) -> ClientT:
        options = self._cache_options
        return kind(
            self.pool,
            self._codec_or_raise(),
            durable_replicas=options.durable_replicas,
            durable_timeout_ms=options.durable_timeout_ms,
        )

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> float | None:
        """Seconds for the client: None never expires, zero or less expires at once.

        Unlike ``RedisCache`` a fractional timeout is kept (Redis gets milliseconds).
        """
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        return None if timeout is None else max(0, timeout)

    # -- failure policy ------------------------------------------------------------------------
    def _ignored(self, where: str | Shard | None, exc: BaseException, operation: str) -> None:
        """Log an ignored failure, at most once per shard per configured interval."""
        if where is None:  # a multi-shard call; its per-shard retry attributes the failure
            return
        shard = where if isinstance(where, Shard) else self.pool.shard_for(where)
        now = time.monotonic()
        with _last_logged_lock:
            last = _last_logged.get(shard)
            if (
                last is not None
                and now - last < self._cache_options.log_ignored_exceptions_interval
            ):
                return
            _last_logged[shard] = now
        logger.warning(
            "cache shard %s (%s) unavailable, %s() ignored (IGNORE_EXCEPTIONS): %s: %s",
            shard.label,
            shard.address,
            operation,
            type(exc).__name__,
            exc,
        )

    def _call(
        self, where: str | Shard | None, default: Any, method: Callable[..., Any], *args: Any
    ) -> Any:
        """``method(*args)``; on an unavailable shard return ``default`` if ignoring, else raise.

        The handler re-raises the original error as it is and the ignore path raises nothing,
        so no new chain, let alone a cycle, is created.
        """
        try:
            return method(*args)
        except UNAVAILABLE_ERRORS as exc:
            if not self._ignore:
                raise
            self._ignored(where, exc, method.__name__)
        return default

    async def _acall(
        self,
        where: str | Shard | None,
        default: Any,
        method: Callable[..., Awaitable[Any]],
        *args: Any,
    ) -> Any:
        """The async twin of :meth:`_call`."""
        try:
            return await method(*args)
        except UNAVAILABLE_ERRORS as exc:
            if not self._ignore:
                raise
            self._ignored(where, exc, method.__name__)
        return default

    def validate_key(self, key: Any) -> None:
        """Django's check (memcached-unsafe keys warn), with a fast path for the usual key."""
        if type(key) is str and _QUIET_KEY.fullmatch(key) is not None:
            return
        super().validate_key(key)

    def _key_map(self, keys: Iterable[Any], version: int | None) -> dict[str, Any]:
        """Stored key -> caller's key; with the default KEY_FUNCTION the prefix and version are
        formatted once per call, not once per key."""
        if self.key_func is not default_key_func:
            return {self.make_and_validate_key(key, version=version): key for key in keys}
        head = f"{self.key_prefix}:{self.version if version is None else version}:"
        quiet = _QUIET_KEY.fullmatch
        made: dict[str, Any] = {}
        for key in keys:
            final = head + (key if type(key) is str else str(key))
            if quiet(final) is None:
                self.validate_key(final)
            made[final] = key
        return made

    # -- BaseCache API ---------------------------------------------------------------------
    def add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        key = self.make_and_validate_key(key, version=version)
        timeout = self.get_backend_timeout(timeout)
        return bool(self._call(key, False, self.client.add, key, value, timeout))

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        key = self.make_and_validate_key(key, version=version)
        return self._call(key, default, self.client.get, key, default)

    def set(  # type: ignore[override]  # Django's result is None; True/False is more useful
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        """Returns True when stored (django-redis style; Django's API ignores the result)."""
        key = self.make_and_validate_key(key, version=version)
        timeout = self.get_backend_timeout(timeout)
        return bool(self._call(key, False, self.client.set, key, value, timeout))

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        timeout = self.get_backend_timeout(timeout)
        return bool(self._call(key, False, self.client.touch, key, timeout))

    def delete(self, key: Any, version: Any = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return bool(self._call(key, False, self.client.delete, key))

    def has_key(self, key: Any, version: Any = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return bool(self._call(key, False, self.client.has_key, key))

    def incr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        """Atomic on the server and TTL-preserving; ValueError if the key is missing."""
        key = self.make_and_validate_key(key, version=version)
        value = self._call(key, None, self.client.incr, key, delta)
        if value is None:  # only when IGNORE_EXCEPTIONS swallowed an unavailable shard
            raise ValueError(f"Key {key!r} not found (its shard is unavailable)")
        return int(value)

    def get_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        key_map = self._key_map(keys, version)
        if not key_map:
            return {}
        found = self._call(None, _FAILED, self.client.get_many, key_map)
        if found is _FAILED:  # some shard is down: take what the others have
            found = {}
            for shard, group in self.pool.group_by_shard(key_map).items():
                found.update(self._call(shard, {}, self.client.get_many, group))
        return {key_map[key]: value for key, value in found.items()}

    def set_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> list[Any]:
        """Returns the keys that were not stored (empty when all were)."""
        if not data:
            return []
        originals = self._key_map(data, version)
        safe = {made: data[key] for made, key in originals.items()}
        timeout = self.get_backend_timeout(timeout)
        failed = self._call(None, _FAILED, self.client.set_many, safe, timeout)
        if failed is _FAILED:
            failed = []
            for shard, group in self.pool.group_by_shard(safe).items():
                part = {key: safe[key] for key in group}
                failed.extend(self._call(shard, group, self.client.set_many, part, timeout))
        return [originals[key] for key in failed]

    def delete_many(self, keys: Iterable[Any], version: Any = None) -> None:
        safe = list(self._key_map(keys, version))
        if not safe:
            return
        if self._call(None, _FAILED, self.client.delete_many, safe) is _FAILED:
            for shard, group in self.pool.group_by_shard(safe).items():
                self._call(shard, 0, self.client.delete_many, group)

    def clear(self) -> bool:  # type: ignore[override]  # like RedisCache, which returns a bool
        """With KEY_PREFIX: delete this cache's keys on every shard. Without: FLUSHDB ASYNC of
        the configured database on every shard. False if a shard was skipped (ignored)."""
        pattern = self._clear_pattern()
        complete = True
        for shard in self.pool.shards:
            if pattern is None:
                outcome = self._call(shard, _FAILED, self._flush_shard, shard)
            else:
                outcome = self._call(shard, _FAILED, self._delete_pattern_on, shard, pattern)
            complete = complete and outcome is not _FAILED
        return complete

    def close(self, **kwargs: Any) -> None:
        """Nothing to do per request: connections are pooled by the shared core, which lives as
        long as the process (closing it here would cut off every other alias and thread)."""

    # -- django-redis style extras, routed to the right shard ---------------------------------
    def ttl(self, key: Any, version: Any = None) -> float | None:
        """Seconds left (fractional); None if the key never expires; 0 if it does not exist."""
        key = self.make_and_validate_key(key, version=version)
        return self._call(key, 0, self.client.ttl, key)

    def expire(self, key: Any, timeout: Any, version: Any = None) -> bool:
        """Set a new timeout (seconds; None makes the key persistent); False if missing."""
        return self.touch(key, timeout, version=version)

    def persist(self, key: Any, version: Any = None) -> bool:
        """Remove the key's expiry; False if the key does not exist."""
        return self.touch(key, None, version=version)

    def lock(self, key: Any, version: Any = None, **kwargs: Any) -> Any:
        """A redis-py ``Lock`` on the key's shard (its current master). Keyword arguments go to
        ``redis.Redis.lock`` (timeout, sleep, blocking, blocking_timeout, thread_local).
        Never fail-open: a lock that silently did nothing would be worse than an error."""
        key = self.make_and_validate_key(key, version=version)
        return self.client.lock(key, **kwargs)

    def get_client(self, key: Any, write: bool = True, version: Any = None) -> redis.Redis:
        """The redis-py client of the shard that holds ``key`` (made into the stored key).
        Use ``cache.make_key(key)`` for the name to send; it is the master unless
        ``write=False`` and replica reads are configured."""
        return self.client.get_client(self.make_key(key, version=version), write=write)

    def make_pattern(self, pattern: str, version: Any = None, prefix: str | None = None) -> str:
        """A glob for stored keys, built like ``make_key`` with the prefix and version escaped
        (as django-redis does), e.g. ``"session*"`` -> ``"myapp:1:session*"``."""
        prefix = self.key_prefix if prefix is None else prefix
        version = self.version if version is None else version
        return str(self.key_func(pattern, escape_pattern(prefix), escape_pattern(str(version))))

    def _clear_pattern(self) -> str | None:
        if not self.key_prefix:
            return None
        # Every version of this prefix and nothing else: "app" must not match "app2:1:x".
        return str(self.key_func("*", escape_pattern(self.key_prefix), "*"))

    def _reverse_key(self, stored: bytes) -> str:
        key = stored.decode("utf-8", "replace")
        if self.key_func is default_key_func:
            return key.split(":", 2)[2] if key.count(":") >= 2 else key
        return key  # a custom KEY_FUNCTION cannot be reversed: give the stored key

    def iter_keys(
        self, search: str, itersize: int | None = None, version: Any = None
    ) -> Iterator[str]:
        """Keys matching ``search`` (made into a full pattern) on every shard, via SCAN.
        Yields the keys as given to ``set`` (the stored key if KEY_FUNCTION is custom)."""
        pattern = self.make_pattern(search, version=version)
        for shard in self.pool.shards:
            client = self._call(shard, None, self._read_client_on, shard)
            if client is None:
                continue
            keys = iter(client.scan_iter(match=pattern, count=itersize or _SCAN_COUNT))
            while True:
                stored = self._call(shard, None, next, keys, None)
                if stored is None:
                    break
                yield self._reverse_key(stored)

    def delete_pattern(
        self,
        pattern: str,
        version: Any = None,
        prefix: str | None = None,
        itersize: int | None = None,
    ) -> int:
        """Delete every key matching ``pattern`` (made into a full pattern) on every shard."""
        full = self.make_pattern(pattern, version=version, prefix=prefix)
        count = itersize or _SCAN_COUNT
        return sum(
            self._call(shard, 0, self._delete_pattern_on, shard, full, count)
            for shard in self.pool.shards
        )

    def _read_client_on(self, shard: Shard) -> redis.Redis:
        return self.pool.execute(shard, lambda client: client, write=False)

    def _flush_shard(self, shard: Shard) -> None:
        self.client.clear_shard(shard, None)

    def _delete_pattern_on(self, shard: Shard, pattern: str, count: int = _SCAN_COUNT) -> int:
        return self.client.delete_pattern_on(shard, pattern, count=count)

    # -- native async API (redis.asyncio, no thread hop per call) -----------------------------
    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        key = self.make_and_validate_key(key, version=version)
        timeout = self.get_backend_timeout(timeout)
        return bool(await self._acall(key, False, self.aclient.add, key, value, timeout))

    async def aget(self, key: Any, default: Any = None, version: Any = None) -> Any:
        key = self.make_and_validate_key(key, version=version)
        return await self._acall(key, default, self.aclient.get, key, default)

    async def aset(  # type: ignore[override]  # see set()
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> bool:
        key = self.make_and_validate_key(key, version=version)
        timeout = self.get_backend_timeout(timeout)
        return bool(await self._acall(key, False, self.aclient.set, key, value, timeout))

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        timeout = self.get_backend_timeout(timeout)
        return bool(await self._acall(key, False, self.aclient.touch, key, timeout))

    async def adelete(self, key: Any, version: Any = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return bool(await self._acall(key, False, self.aclient.delete, key))

    async def ahas_key(self, key: Any, version: Any = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return bool(await self._acall(key, False, self.aclient.has_key, key))

    async def aincr(self, key: Any, delta: int = 1, version: Any = None) -> int:
        key = self.make_and_validate_key(key, version=version)
        value = await self._acall(key, None, self.aclient.incr, key, delta)
        if value is None:
            raise ValueError(f"Key {key!r} not found (its shard is unavailable)")
        return int(value)

    async def aget_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        key_map = self._key_map(keys, version)
        if not key_map:
            return {}
        aclient = self.aclient
        found = await self._acall(None, _FAILED, aclient.get_many, key_map)
        if found is _FAILED:
            found = {}
            for shard, group in self.pool.group_by_shard(key_map).items():
                found.update(await self._acall(shard, {}, aclient.get_many, group))
        return {key_map[key]: value for key, value in found.items()}

    async def aset_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> list[Any]:
        if not data:
            return []
        originals = self._key_map(data, version)
        safe = {made: data[key] for made, key in originals.items()}
        timeout = self.get_backend_timeout(timeout)
        aclient = self.aclient
        failed = await self._acall(None, _FAILED, aclient.set_many, safe, timeout)
        if failed is _FAILED:
            failed = []
            for shard, group in self.pool.group_by_shard(safe).items():
                part = {key: safe[key] for key in group}
                failed.extend(await self._acall(shard, group, aclient.set_many, part, timeout))
        return [originals[key] for key in failed]

    async def adelete_many(self, keys: Iterable[Any], version: Any = None) -> None:
        safe = list(self._key_map(keys, version))
        if not safe:
            return
        aclient = self.aclient
        if await self._acall(None, _FAILED, aclient.delete_many, safe) is _FAILED:
            for shard, group in self.pool.group_by_shard(safe).items():
                await self._acall(shard, 0, aclient.delete_many, group)

    async def aclear(self) -> bool:  # type: ignore[override]  # see clear()
        pattern = self._clear_pattern()
        aclient = self.aclient
        complete = True
        for shard in self.pool.shards:
            if pattern is None:
                outcome = await self._acall(shard, _FAILED, aclient.clear_shard, shard, None)
            else:
                outcome = await self._acall(
                    shard, _FAILED, aclient.delete_pattern_on, shard, pattern
                )
            complete = complete and outcome is not _FAILED
        return complete

    async def attl(self, key: Any, version: Any = None) -> float | None:
        key = self.make_and_validate_key(key, version=version)
        return await self._acall(key, 0, self.aclient.ttl, key)

    async def aexpire(self, key: Any, timeout: Any, version: Any = None) -> bool:
        return await self.atouch(key, timeout, version=version)

    async def apersist(self, key: Any, version: Any = None) -> bool:
        return await self.atouch(key, None, version=version)

    async def aiter_keys(
        self, search: str, itersize: int | None = None, version: Any = None
    ) -> AsyncIterator[str]:
        """The async twin of :meth:`iter_keys`."""
        pattern = self.make_pattern(search, version=version)
        aclient = self.aclient
        for shard in self.pool.shards:
            keys = aclient.iter_keys_on(shard, pattern, count=itersize or _SCAN_COUNT)
            while True:
                stored = await self._acall(shard, None, anext, keys, None)
                if stored is None:
                    break
                yield self._reverse_key(stored)

    async def adelete_pattern(
        self,
        pattern: str,
        version: Any = None,
        prefix: str | None = None,
        itersize: int | None = None,
    ) -> int:
        full = self.make_pattern(pattern, version=version, prefix=prefix)
        aclient = self.aclient
        deleted = 0
        for shard in self.pool.shards:
            deleted += await self._acall(
                shard, 0, aclient.delete_pattern_on, shard, full, itersize or _SCAN_COUNT
            )
        return deleted

    async def aclose(self, **kwargs: Any) -> None:
        """Close this event loop's asyncio connections to the core (shared with every cache on
        it; they reconnect on next use); the core stays up. Nothing calls this per request, and
        loops ended by ``asyncio.run``/``async_to_sync`` are cleaned up anyway."""
        if self._aclient is not None:
            await self._aclient.aclose()
