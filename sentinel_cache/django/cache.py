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
:class:`~sentinel_cache.core.ops.client.CacheClient` (sync) or
:class:`~sentinel_cache.core.ops.aio.AsyncCacheClient` (async, native ``redis.asyncio``). Both run on the
process-wide shared core for this configuration, so several aliases with equal settings share one
set of pools, listeners and failover state; :meth:`close` never tears it down.

Keys are placed by the Jedis-compatible ring on the final key (``make_key`` output) exactly as it
is stored. Integers are stored raw, so ``incr``/``decr`` are atomic on the server and keep the TTL.

``OPTIONS["IGNORE_EXCEPTIONS"] = True`` makes the cache fail open when a shard is unavailable
(connection refused or lost, timeouts, READONLY, no master known, pool exhausted, writes held
too long during a failover): reads return the default (``get_many`` returns what the other shards
have), writes return False (``set_many`` returns the keys that were not stored), ``incr``/``decr``
raise ``ValueError`` as for a missing key, and the failure is logged on the
``sentinel_cache.django`` logger (or ``DJANGO_REDIS_LOGGER``'s) at most once per shard every
``LOG_IGNORED_EXCEPTIONS_INTERVAL`` seconds (the core's one fail-open rule,
:class:`~sentinel_cache.core.ops.plans.FailOpen`). Serialization errors and bad commands are never
ignored. django-redis's settings for this (``DJANGO_REDIS_IGNORE_EXCEPTIONS``,
``LOG_IGNORED_EXCEPTIONS``, ...) are translated by :mod:`sentinel_cache.django.compat`.

``clear()`` with a ``KEY_PREFIX`` deletes only this cache's keys (``SCAN`` + ``UNLINK`` of the
prefix pattern on every shard). **Without a ``KEY_PREFIX`` it empties the whole configured
database on every shard** (``FLUSHDB ASYNC``), as Django's ``RedisCache`` does: set a prefix when
the database is shared with anything else.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import redis
from django.conf import settings
from django.core.cache.backends.base import (
    DEFAULT_TIMEOUT,
    BaseCache,
)
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from sentinel_cache.core.admin.reshard.previous import refuse_with_resharding
from sentinel_cache.core.arguments import (
    MAX_TIMEOUT,
    valid_delta,
    valid_timeout,
)
from sentinel_cache.core.config import CacheOptions, PoolConfig, parse_cache_config
from sentinel_cache.core.memo import Memo, settings_key
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import SCAN_COUNT, CacheClient
from sentinel_cache.core.ops.plans import FailOpen
from sentinel_cache.core.options import did_you_mean
from sentinel_cache.core.serializers import Codec, build_codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool, shared_pool
from sentinel_cache.django.compat import HONOURED_GLOBALS, translate_options
from sentinel_cache.django.expiry import ExpiryMethods
from sentinel_cache.django.hashes import HashMethods, no_client
from sentinel_cache.django.keys import InvalidKeyError, KeyMethods
from sentinel_cache.django.operations import NOT_DONE, Call, operation
from sentinel_cache.django.previous import OPTION as PREVIOUS_CACHE
from sentinel_cache.django.previous import SETTING as PREVIOUS_SETTING
from sentinel_cache.django.previous import (
    AdoptingCache,
    adopting,
    check_alias,
    previous_option,
)
from sentinel_cache.django.sets import SetMethods
from sentinel_cache.django.sorted_sets import SortedSetMethods
from sentinel_cache.exceptions import (
    ArgumentTypeError,
    ConfigurationError,
    PicklingError,
)

logger = logging.getLogger("sentinel_cache.django")

__all__ = ["CachePicklingError", "InvalidKeyError", "ShardedSentinelCache"]

# BaseCache's own options: Redis evicts by its maxmemory-policy, so they are accepted and unused.
_DJANGO_OPTIONS = frozenset({"MAX_ENTRIES", "CULL_FREQUENCY"})
# What Django's cache handler passes on from a CACHES entry (it keeps BACKEND and LOCATION);
# django-redis's REVERSE_KEY_FUNCTION is accepted for system check W004 to explain.
_ENTRY_KEYS = frozenset(
    {"TIMEOUT", "OPTIONS", "KEY_PREFIX", "VERSION", "KEY_FUNCTION", "REVERSE_KEY_FUNCTION"}
)


def _check_entry(params: Mapping[str, Any]) -> None:
    """A misspelled key ("OPTION") would be ignored by Django, and the error would be about
    what it held ("MASTERS is required"): name the key instead."""
    for name in params:
        if name not in _ENTRY_KEYS:
            known = _ENTRY_KEYS | {"BACKEND", "LOCATION"}
            raise ConfigurationError(
                option="CACHES",
                value=str(name),
                reason=f"unknown key {name!r} in this cache's entry"
                f"{did_you_mean(str(name).upper(), known) or ' (Django would ignore it)'}",
            )


class _Parsed:
    """What a backend makes of LOCATION, OPTIONS and the django-redis globals: shared by every
    instance built from equal ones (Django builds one per ASGI request and per thread), with the
    clients built on first use (:meth:`ShardedSentinelCache._shared`)."""

    __slots__ = (
        "clients",
        "codec",
        "config",
        "logger",
        "options",
        "previous_alias",
        "scan_itersize",
    )

    def __init__(
        self,
        config: PoolConfig,
        options: CacheOptions,
        codec: Codec,
        log: logging.Logger,
        scan_itersize: int,
        previous_alias: str | None,
    ) -> None:
        self.config, self.options, self.codec = config, options, codec
        self.logger, self.scan_itersize = log, scan_itersize
        self.previous_alias = previous_alias
        self.clients: dict[type, Any] = {}

    def __repr__(self) -> str:
        return f"<_Parsed {self.config!r} clients={sorted(k.__name__ for k in self.clients)}>"


def _parse(cache: Any, server: Any, given: Mapping[str, Any]) -> _Parsed:
    """The one parse of a backend's settings; ConfigurationError naming the field. A cache that
    adopts another one (``PREVIOUS_CACHE``) is given its ``previous_alias`` as soon as the alias
    is known, as before a resharding setting is refused."""
    options = {
        name: value
        for name, value in given.items()
        if str(name).upper() not in _DJANGO_OPTIONS and str(name).upper() != PREVIOUS_CACHE
    }
    # django-redis's settings in this library's terms (see compat), then the core's.
    translated = translate_options(options, settings if settings.configured else None)
    config, cache_options = parse_cache_config(server, translated.options)
    previous_alias = None
    if previous_option(given) is not None:
        previous_alias = cache.previous_alias = check_alias(previous_option(given))
        refuse_with_resharding(config.previous_masters, PREVIOUS_SETTING, previous_alias)
    return _Parsed(
        config,
        cache_options,
        build_codec(cache_options),
        translated.logger or logger,
        translated.scan_itersize or SCAN_COUNT,
        previous_alias,
    )


# Settings are few: 64 covers every alias and test override, and bounds a program that builds
# caches from ever-new settings.
_PARSED: Memo[_Parsed] = Memo(64)
# The django-redis globals translate_options reads, read once per change, not per instance:
# a missing setting costs LazySettings an AttributeError, several microseconds each.
_GLOBALS = tuple(sorted(HONOURED_GLOBALS))
_globals_lock = threading.Lock()
_globals_read: list[Any] = [0, None]  # [generation, (configured, values) or None]
_MISSING: Any = object()


def _globals_key() -> tuple[Any, ...]:
    """Whether settings are configured, and the globals' values (a missing one apart from any
    value): part of the memo's key, so a change parses afresh. Read again after Django's
    ``setting_changed`` (``override_settings``, pytest-django's ``settings``) for one of them
    or ``settings.configure()``; a value assigned to ``settings`` directly, which sends no
    signal (and which Django says not to do), is not seen by settings already memoized."""
    configured = settings.configured
    generation, read = _globals_read
    if read is not None and read[0] == configured:
        return read
    found = [getattr(settings, name, _MISSING) if configured else _MISSING for name in _GLOBALS]
    read = (configured, *[() if value is _MISSING else (value,) for value in found])
    with _globals_lock:
        if _globals_read[0] == generation:  # no change signalled while these were read
            _globals_read[1] = read
    return read


@receiver(setting_changed)
def _forget_globals(*, setting: str, **kwargs: Any) -> None:
    """A django-redis global changed: read them again for the next instance."""
    if setting in HONOURED_GLOBALS:
        with _globals_lock:
            _globals_read[0] += 1
            _globals_read[1] = None


class DjangoCacheClient(CacheClient):
    """The sync client, with a clear error for ``django_redis.get_redis_connection(alias)``,
    which calls ``cache.client.get_client(write)``: a bool where the key goes."""

    def get_client(self, key: Any, *, write: bool = True) -> redis.Redis:
        if type(key) is bool:
            raise ArgumentTypeError(
                "key",
                key,
                "django_redis.get_redis_connection() cannot pick one connection of a sharded "
                "cache; use sentinel_cache.django.get_redis_connection(alias, key=...), the "
                "raw client of the shard that holds the key",
            )
        return super().get_client(key, write=write)


ClientT = TypeVar("ClientT", DjangoCacheClient, AsyncCacheClient)


CachePicklingError = PicklingError  # the name this module exported first


def _by_caller_key(key_map: Mapping[str, Any], found: Mapping[str, Any]) -> dict[Any, Any]:
    """A read's values under the keys the caller gave (``key_map``: stored key -> caller's)."""
    return {key_map[key]: value for key, value in found.items()}


class ShardedSentinelCache(SortedSetMethods, SetMethods, HashMethods, ExpiryMethods, KeyMethods):
    """Django ``BaseCache`` over :class:`~sentinel_cache.core.topology.sharded_pool.ShardedSentinelPool`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> ShardedSentinelCache:
        """With ``OPTIONS["PREVIOUS_CACHE"]`` the backend adopts the old cache's keys
        (:mod:`sentinel_cache.django.previous`); without it, this very class, untouched.
        (``*args``: ``copy`` and ``pickle`` make instances without arguments.)"""
        params = args[1] if len(args) > 1 else kwargs.get("params") or {}
        adopts = previous_option(params.get("OPTIONS") or {}) is not None
        if adopts and not issubclass(cls, AdoptingCache):
            cls = adopting(cls)
        return super().__new__(cls)

    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(params)
        self._config_error: str | None = None
        self._config: PoolConfig | None = None
        self._options: CacheOptions | None = None
        self._codec: Codec | None = None
        self._fail_open_logger = logger
        self._scan_itersize = SCAN_COUNT
        self._parsed: _Parsed | None = None
        try:
            _check_entry(params)
            given = params.get("OPTIONS") or {}
            # Settings already seen: what they parsed to, shared (a lookup, not a parse).
            key = settings_key(type(self), server, given, *_globals_key())
            parsed = None if key is None else _PARSED.get(key)
            if parsed is None:
                parsed = _parse(self, server, given)
                if key is not None:
                    parsed = self._parsed = _PARSED.put(key, parsed)
            else:
                self._parsed = parsed
            if parsed.previous_alias is not None:
                self.previous_alias = parsed.previous_alias
            self._fail_open_logger = parsed.logger
            self._scan_itersize = parsed.scan_itersize
            self._codec = parsed.codec
            self._config, self._options = parsed.config, parsed.options
        except ConfigurationError as exc:
            # Raised (as ImproperlyConfigured) on first use, not here: Django's own system
            # checks build every cache with caches[alias] and would crash before
            # sentinel_cache.django.checks reports this as sentinel_cache.E001. Never kept in
            # the memo: a bad configuration is parsed again, and fails the same way.
            self._config_error = str(exc)
        self._core: ShardedSentinelPool | None = None
        self._client: DjangoCacheClient | None = None
        self._aclient: AsyncCacheClient | None = None
        # No make_key/validate_key override: with the default KEY_FUNCTION (checked per call,
        # it may be replaced) keys are then formatted here, not through three calls per key.
        cls = type(self)
        self._own_key_rules = (
            cls.make_key is BaseCache.make_key
            and cls.validate_key is ShardedSentinelCache.validate_key
        )

    def _improperly_configured(self) -> ImproperlyConfigured:
        return ImproperlyConfigured(self._config_error)

    @property
    def pool_config(self) -> PoolConfig:
        """The parsed :class:`~sentinel_cache.core.config.PoolConfig` (what the shared core needs),
        available without connecting (``sentinel_status`` and the system checks read it);
        ImproperlyConfigured naming the field if LOCATION/OPTIONS do not parse."""
        if self._config is None:
            raise self._improperly_configured()
        return self._config

    @property
    def cache_options(self) -> CacheOptions:
        """The parsed front-end options (serializer, IGNORE_EXCEPTIONS, ...), without connecting."""
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
    def core(self) -> ShardedSentinelPool:
        """The process-wide core for this configuration (replaced if someone closed it)."""
        core = self._core
        if core is None or core.closed:
            core = self._core = shared_pool(self.pool_config)
        return core

    @property
    def client(self) -> DjangoCacheClient:
        """The sync operations, on :attr:`core` (a new client once that core is closed)."""
        client = self._client
        if client is None or client.core.closed:
            client = self._client = self._shared(DjangoCacheClient)
        return client

    @property
    def aclient(self) -> AsyncCacheClient:
        """The native asyncio operations, on the same :attr:`core`."""
        client = self._aclient
        if client is None or client.core.closed:
            client = self._aclient = self._shared(AsyncCacheClient)
        return client

    def _shared(self, kind: type[ClientT]) -> ClientT:
        """The client of this flavour shared by every instance built from these settings (it
        holds only what they determine: the core, codec, durability and fail-open rule; its
        connections and per-loop state are the core's); built here when there is none yet, or
        its core was closed. Settings that could not be keyed: this instance's own."""
        parsed = self._parsed
        if parsed is None:
            return self._build(kind)
        client = parsed.clients.get(kind)
        if client is None or client.core.closed:
            client = parsed.clients[kind] = self._build(kind)
        return client

    def _build(self, kind: type[ClientT]) -> ClientT:
        options = self.cache_options
        return kind(
            self.core,
            self._codec_or_raise(),
            durable_replicas=options.durable_replicas,
            durable_timeout_ms=options.durable_timeout_ms,
            fail_open=FailOpen(
                options.ignore_exceptions,
                options.log_ignored_exceptions_interval,
                self._fail_open_logger,
            ),
        )

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> float | None:
        """Seconds for the client: None never expires, zero or less expires at once.

        Unlike ``RedisCache`` a fractional timeout is kept (Redis gets milliseconds). Anything
        but an int in range goes through the core's rule first (a NaN must not become 0,
        "expire at once").
        """
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        if type(timeout) is not int or timeout > MAX_TIMEOUT:
            timeout = valid_timeout(timeout)
        return None if timeout is None else max(0, timeout)

    # -- the operations: each declared once, giving the sync method and its ``a`` twin ------
    def _add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> tuple[Any, ...]:
        key = self.make_and_validate_key(key, version=version)
        return (key, value, self.get_backend_timeout(timeout))

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        # Written out, not declared below: a near-cache hit is a few microseconds, and the
        # declared form's generic wrapper would add a fifth to it.
        client = self._client  # the ``client`` property, inline
        if client is None or client.core.closed:
            client = self.client
        return client.get(self.make_and_validate_key(key, version), default)

    async def aget(self, key: Any, default: Any = None, version: Any = None) -> Any:
        return await self.aclient.get(self.make_and_validate_key(key, version), default)

    def _set(
        self,
        key: Any,
        value: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: Any = None,
        client: Any = None,
        nx: bool = False,
        xx: bool = False,
    ) -> Call | tuple[Any, ...]:
        """Returns True when stored (django-redis style; Django's API ignores the result);
        ``nx``: only where the key is absent, ``xx``: only where it exists (django-redis's)."""
        key = self.make_and_validate_key(key, version=version)
        args = (key, value, self.get_backend_timeout(timeout))
        if client is None and not nx and not xx:
            return args  # the common call: no Call object made
        no_client(client)
        return Call("set", args, bool, {"nx": bool(nx), "xx": bool(xx)})

    def _delete(self, key: Any, version: Any = None) -> tuple[Any, ...]:
        return (self.make_and_validate_key(key, version=version),)

    def _has_key(self, key: Any, version: Any = None) -> tuple[Any, ...]:
        return (self.make_and_validate_key(key, version=version),)

    def _incr(
        self,
        key: Any,
        delta: int = 1,
        version: Any = None,
        client: Any = None,
        ignore_key_check: bool = False,
    ) -> Call | tuple[Any, ...]:
        """Atomic on the server and TTL-preserving; ValueError if the key is missing, unless
        ``ignore_key_check`` (django-redis's): then a missing key counts from 0, without expiry.
        Past 64 bits, django-redis's read-modify-write, made atomic."""
        no_client(client)
        key = self.make_and_validate_key(key, version=version)
        if not ignore_key_check:
            return (key, delta)
        return Call("incr", (key, delta), int, {"create": True})

    def _decr(
        self, key: Any, delta: int = 1, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        """``incr`` by ``-delta``, the delta checked first (``-True`` would pass as ``-1``)."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version), -valid_delta(delta))

    def get_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> Any:
        """Django's, with the timeout checked first: refused even when the key is there. With
        ``STAMPEDE_PROTECTION`` a miss is computed by one caller across every process, the
        others waiting for its value (:mod:`sentinel_cache.core.ops._async.stampede`)."""
        seconds = self.get_backend_timeout(timeout)
        options = self.cache_options
        if not options.stampede_protection:
            return super().get_or_set(key, default, timeout, version)
        made = self.make_and_validate_key(key, version=version)
        return self.client.get_or_set(
            made,
            default,
            seconds,
            lock_timeout=options.stampede_lock_timeout,
            early=options.stampede_early_refresh,
        )

    async def aget_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> Any:
        seconds = self.get_backend_timeout(timeout)
        options = self.cache_options
        if not options.stampede_protection:
            return await super().aget_or_set(key, default, timeout, version)
        made = self.make_and_validate_key(key, version=version)
        return await self.aclient.get_or_set(
            made,
            default,
            seconds,
            lock_timeout=options.stampede_lock_timeout,
            early=options.stampede_early_refresh,
        )

    # The multi-key calls written out, each with its async twin, as get is: the declared form's
    # Call, closure and wrapper were a few percent of a 10-key call's CPU. What a call makes of
    # its keys and timeout is still said once (_key_map, _to_set), as is what it gives back.
    def get_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        key_map = self._key_map(keys, version)
        if not key_map:
            return {}
        client = self._client  # the ``client`` property, inline
        if client is None or client.core.closed:
            client = self.client
        return _by_caller_key(key_map, client.get_many(key_map))

    async def aget_many(self, keys: Iterable[Any], version: Any = None) -> dict[Any, Any]:
        key_map = self._key_map(keys, version)
        if not key_map:
            return {}
        return _by_caller_key(key_map, await self.aclient.get_many(key_map))

    def _to_set(
        self, data: Mapping[Any, Any], timeout: Any, version: Any
    ) -> tuple[dict[str, Any], dict[str, Any], float | None]:
        """Stored key -> caller's key, stored key -> value, and the timeout of a ``set_many``."""
        originals = self._key_map(data, version)
        safe = {made: data[key] for made, key in originals.items()}
        return originals, safe, self.get_backend_timeout(timeout)

    def set_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> list[Any]:
        """Returns the keys that were not stored (empty when all were)."""
        originals, safe, seconds = self._to_set(data, timeout, version)
        if not data:
            return []
        client = self._client  # the ``client`` property, inline
        if client is None or client.core.closed:
            client = self.client
        failed = client.set_many(safe, seconds)
        return [originals[key] for key in failed] if failed else []

    async def aset_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> list[Any]:
        originals, safe, seconds = self._to_set(data, timeout, version)
        if not data:
            return []
        failed = await self.aclient.set_many(safe, seconds)
        return [originals[key] for key in failed] if failed else []

    def _get_or_set_many(
        self, defaults: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> Call:
        """``get_or_set`` for many keys: each missing key is added with its default (a
        concurrent writer's value wins); returns every key's value. Two round trips."""
        originals = self._key_map(defaults, version)
        made = {stored: defaults[key] for stored, key in originals.items()}
        return Call(
            "get_or_set_many",
            (made, self.get_backend_timeout(timeout)),
            lambda found: {originals[key]: value for key, value in found.items()},
            done={} if not made else NOT_DONE,
        )

    def delete_many(self, keys: Iterable[Any], version: Any = None) -> Any:
        """How many of the keys were deleted (django-redis's result); None for no keys, as
        Django's contract (and its own suite) has it, falsy like django-redis's 0."""
        safe = list(self._key_map(keys, version))
        if not safe:
            return None
        client = self._client  # the ``client`` property, inline
        if client is None or client.core.closed:
            client = self.client
        return client.delete_many(safe)

    async def adelete_many(self, keys: Iterable[Any], version: Any = None) -> Any:
        safe = list(self._key_map(keys, version))
        if not safe:
            return None
        return await self.aclient.delete_many(safe)

    def _clear(self) -> tuple[Any, ...]:
        """With KEY_PREFIX: delete this cache's keys on every shard. Without: FLUSHDB ASYNC of
        the configured database on every shard. False if a shard was skipped (ignored)."""
        return (self._clear_pattern(),)

    def _delete_pattern(
        self,
        pattern: str,
        version: Any = None,
        prefix: str | None = None,
        itersize: int | None = None,
    ) -> Call:
        """Delete every key matching ``pattern`` (made into a full pattern) on every shard,
        ``itersize`` (default: ``DJANGO_REDIS_SCAN_ITERSIZE``, else the core's) at a time."""
        full = self.make_pattern(pattern, version=version, prefix=prefix)
        return Call("delete_pattern", (full,), None, {"count": itersize or self._scan_itersize})

    add, aadd = operation(_add, finish=bool)
    set, aset = operation(_set, finish=bool)  # Django's result is None; a bool is more useful
    delete, adelete = operation(_delete, finish=bool)
    has_key, ahas_key = operation(_has_key, finish=bool)
    incr, aincr = operation(_incr, finish=int)
    decr, adecr = operation(_decr, "incr", int)
    get_or_set_many, aget_or_set_many = operation(_get_or_set_many)
    clear, aclear = operation(_clear)  # a bool, like RedisCache
    delete_pattern, adelete_pattern = operation(_delete_pattern)

    def close(self, **kwargs: Any) -> None:
        """Nothing to do per request: connections are pooled by the shared core, which lives as
        long as the process (closing it here would cut off every other alias and thread)."""

    # -- django-redis style extras ---------------------------------------------------------------
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

    def iter_keys(
        self, search: str, itersize: int | None = None, version: Any = None
    ) -> Iterator[str]:
        """Keys matching ``search`` (made into a full pattern) on every shard, via SCAN.
        Yields the keys as given to ``set`` (the stored key if KEY_FUNCTION is custom); a key
        may come more than once (SCAN's rule, and a shard's scan begins again on a new master
        so that none is missed: see docs/failover.md)."""
        pattern = self.make_pattern(search, version=version)
        for stored in self.client.iter_keys(pattern, count=itersize or SCAN_COUNT):
            yield self._reverse_key(stored)

    async def aiter_keys(
        self, search: str, itersize: int | None = None, version: Any = None
    ) -> AsyncIterator[str]:
        """The async :meth:`iter_keys`."""
        pattern = self.make_pattern(search, version=version)
        async for stored in self.aclient.iter_keys(pattern, count=itersize or SCAN_COUNT):
            yield self._reverse_key(stored)

    def keys(self, search: str, version: Any = None, client: Any = None) -> list[str]:
        """Every key matching ``search`` on every shard, each once, as a list (django-redis's
        ``keys``). It holds them all in memory: for many keys prefer :meth:`iter_keys`. Sent as
        ``SCAN`` batches, never ``KEYS``, which blocks a server while it walks every key."""
        no_client(client)
        return list(dict.fromkeys(self.iter_keys(search, version=version)))

    async def akeys(self, search: str, version: Any = None, client: Any = None) -> list[str]:
        """The async :meth:`keys`."""
        no_client(client)
        return list(dict.fromkeys([key async for key in self.aiter_keys(search, version=version)]))

    async def aclose(self, **kwargs: Any) -> None:
        """Close this event loop's asyncio connections to the core (shared with every cache on
        it; they reconnect on next use); the core stays up. Nothing calls this per request, and
        loops ended by ``asyncio.run``/``async_to_sync`` are cleaned up anyway."""
        if self._aclient is not None:
            await self._aclient.aclose()
