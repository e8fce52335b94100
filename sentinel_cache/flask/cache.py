"""Flask-Caching backend: one cache over a sharded set of Sentinel-managed Redis masters.

Configure it like any Flask-Caching backend; ``Cache(app)`` builds it through :meth:`factory`::

    app.config.update(
        CACHE_TYPE="sentinel_cache.flask.ShardedSentinelCache",
        CACHE_REDIS_SENTINELS=["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"],
        CACHE_REDIS_SENTINEL_MASTERS=["shard_a", "shard_b"],  # ordered: it defines placement
        CACHE_REDIS_PASSWORD="data-node-secret",
        CACHE_REDIS_SENTINEL_PASSWORD="sentinel-secret",
        CACHE_REDIS_DB=0,
        CACHE_KEY_PREFIX="myapp:",
        CACHE_DEFAULT_TIMEOUT=300,
        CACHE_OPTIONS={"WEIGHTS": [1, 2], "SERIALIZER": "json", "SIGNING_KEY": "..."},
    )
    cache = Cache(app)

* ``CACHE_REDIS_SENTINELS``: a list of ``"host:port"`` strings or ``(host, port)`` pairs, or one
  comma-separated string. Instead, ``CACHE_REDIS_URL`` may hold a
  ``sentinel://[user:pass@]h1:26379,h2:26379/shard_a,shard_b?db=0`` URL (``sentinels://`` for
  TLS); a non-sentinel ``CACHE_REDIS_URL`` is ignored when ``CACHE_REDIS_SENTINELS`` is set (it
  may belong to another extension), and rejected when it is the only address given.
* ``CACHE_REDIS_SENTINEL_MASTERS`` (``CACHE_REDIS_SENTINEL_MASTER`` is accepted for one master,
  as Flask-Caching's ``RedisSentinelCache`` spells it), ``CACHE_REDIS_PASSWORD``,
  ``CACHE_REDIS_SENTINEL_PASSWORD`` and ``CACHE_REDIS_DB`` are the ``MASTERS``, ``PASSWORD``,
  ``SENTINEL_PASSWORD`` and ``DB`` options; setting one both ways is an error.
  ``CACHE_REDIS_HOST``/``CACHE_REDIS_PORT`` are not used: the sentinels name the masters.
* ``CACHE_OPTIONS`` takes the option names of the Django backend (case-insensitive). Everything
  is parsed by :func:`sentinel_cache.core.config.parse_cache_config`, so a bad value raises
  :class:`~sentinel_cache.ConfigurationError` from ``Cache(app)`` naming the Flask setting.
  ``app.config`` is never modified.

Semantics (cachelib's ``RedisCache`` contract):

* Timeouts are seconds (or a ``timedelta``): ``None`` is ``CACHE_DEFAULT_TIMEOUT``, ``0`` never
  expires, a negative timeout stores nothing (the entry is already expired). NaN, infinity,
  more than ``MAX_TIMEOUT`` seconds, a bool or a string raise an ``ArgumentValueError`` or
  ``ArgumentTypeError`` naming the timeout before anything is sent (the core's rule).
* Keys are stored as ``CACHE_KEY_PREFIX + key``; the ring hashes that final key, so Java
  (Jedis) services with the same masters place it on the same shard. Multi-key calls send one
  batch per shard, all shards at once.
* ``inc``/``dec`` are one atomic ``INCRBY``; a missing key starts at 0 (as in cachelib), the
  TTL of an existing key is kept, and a value that is no integer raises
  :class:`~sentinel_cache.IncrementError` (a ``redis.ResponseError``) naming the key (past 64
  bits the sum is made in Python and written back atomically).
* ``unlink`` is ``delete_many`` with ``UNLINK`` (memory freed in the background) and returns the
  list of removed keys, as Flask-Caching's ``Cache.unlink`` promises (its ``RedisCache`` returns
  a count instead).
* ``clear()`` with a prefix ``SCAN``s and ``UNLINK``s that prefix's keys on every shard. Without
  a prefix the cache owns its database: ``clear()`` flushes ``DB`` on every shard's master
  (``FLUSHDB ASYNC``), as cachelib's ``RedisCache`` does. Give each app its own prefix (the
  Flask-Caching default is ``"flask_cache_"``) or its own ``DB`` when they share the masters.
* ``serializer`` is pluggable (Flask-Caching assigns ``CACHE_SERIALIZER`` to it). The default is
  the codec built from ``CACHE_OPTIONS`` (``SERIALIZER``/``COMPRESSOR``/``SIGNING_KEY``). Any
  object with ``dumps``/``loads`` (e.g. cachelib's ``JSONSerializer``) is used for every
  non-integer value, inside the same codec frame, so ``COMPRESSOR`` and ``SIGNING_KEY`` still
  apply; 64-bit integers are always stored as plain decimals so ``inc``/``dec`` work on them.
* With ``IGNORE_EXCEPTIONS`` an unavailable shard (connection refused or lost, timeout,
  READONLY, no master known, pool exhausted, writes held too long during a failover) fails open,
  as in the Django adapter: reads miss (``get_many`` still returns the other shards' values),
  writes return False (``set_many``/``delete_many`` leave that shard's keys out of their result,
  without ``RuntimeError``), ``inc``/``dec`` return None, ``clear`` returns False; the failure is
  logged on ``sentinel_cache.flask`` at most once per shard every
  ``LOG_IGNORED_EXCEPTIONS_INTERVAL`` seconds. Serialization errors and bad commands still raise.
* ``.core`` is the process-wide :class:`~sentinel_cache.core.topology.sharded_pool.ShardedSentinelPool` (shared by
  every cache with the same connection settings, never closed by a cache) and ``.client`` the
  :class:`~sentinel_cache.core.ops.client.CacheClient`.

Command line: building the backend for an app registers ``flask sentinel-status`` with it (so
``CACHE_TYPE`` is all a Flask user writes). It prints each shard's master, replicas, sentinel
agreement and failover state as a table (``--json`` for machines); exit code 0 when healthy, 1
when degraded, 2 when a shard is unavailable, 3 for a configuration error (``--fail-on down``
exits 0 while every shard can serve). :func:`init_app` registers it explicitly.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cachelib import BaseCache as CachelibBaseCache
from flask import Flask
from flask_caching.backends.base import BaseCache

from sentinel_cache.core.admin.reshard.previous import refuse_with_resharding
from sentinel_cache.core.arguments import MAX_TIMEOUT, valid_delta, valid_timeout
from sentinel_cache.core.config import CacheOptions, PoolConfig, parse_cache_config
from sentinel_cache.core.ops.client import CacheClient, escape_pattern
from sentinel_cache.core.ops.plans import FailOpen
from sentinel_cache.core.serializers import Codec, build_codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool, shared_pool
from sentinel_cache.exceptions import ConfigurationError
from sentinel_cache.flask.commands import init_app
from sentinel_cache.flask.previous import OPTION as PREVIOUS_CACHE
from sentinel_cache.flask.previous import SETTING as PREVIOUS_SETTING
from sentinel_cache.flask.previous import adopting, build_previous
from sentinel_cache.flask.settings import in_flask_terms, translate_settings

logger = logging.getLogger("sentinel_cache.flask")


def _whole_seconds(timeout: Any) -> int:
    """cachelib's rule: whole seconds or a timedelta, rounded up. cachelib >= 0.17 has it (and
    warns about floats); Flask-Caching 2.0 may come with an older cachelib that has not."""
    to_seconds = getattr(CachelibBaseCache, "_to_seconds", None)
    if to_seconds is not None:
        return int(to_seconds(timeout))
    if isinstance(timeout, dt.timedelta):
        return math.ceil(timeout.total_seconds())
    if isinstance(timeout, (int, float)):
        return math.ceil(timeout)
    raise TypeError(f"timeout must be an int or datetime.timedelta, got {type(timeout).__name__}")


class ShardedSentinelCache(BaseCache):
    """Flask-Caching/cachelib backend over :class:`~sentinel_cache.core.topology.sharded_pool.ShardedSentinelPool`.

    ``location`` and ``options`` are what :func:`~sentinel_cache.core.config.parse_cache_config`
    takes (sentinel addresses or a ``sentinel://`` URL, and upper-case option names), so the
    class can also be used without Flask. Flask apps build it from their config via
    :meth:`factory` (``CACHE_TYPE = "sentinel_cache.flask.ShardedSentinelCache"``).
    """

    def __init__(
        self,
        location: Any,
        options: Mapping[str, Any] | None = None,
        *,
        key_prefix: str | Callable[[], str] | None = None,
        default_timeout: int | dt.timedelta = 300,
        ignore_delete_many_errors: bool = False,
    ) -> None:
        try:
            if isinstance(default_timeout, bool):
                raise TypeError("a bool is not a timeout")
            seconds = _whole_seconds(default_timeout)
        except (TypeError, ValueError, OverflowError):
            raise ConfigurationError(
                option="CACHE_DEFAULT_TIMEOUT",
                value=default_timeout,
                reason=f"expected whole seconds or a timedelta (got {default_timeout!r})",
            ) from None
        if not 0 <= seconds <= MAX_TIMEOUT:
            raise ConfigurationError(
                option="CACHE_DEFAULT_TIMEOUT",
                value=default_timeout,
                reason=f"must be >= 0 (0: never expire) and at most {MAX_TIMEOUT} "
                f"(got {default_timeout!r})",
            )
        if key_prefix is not None and not isinstance(key_prefix, str) and not callable(key_prefix):
            raise ConfigurationError(
                option="CACHE_KEY_PREFIX",
                value=key_prefix,
                reason=f"expected a string or a callable returning one (got {key_prefix!r})",
            )
        if not isinstance(ignore_delete_many_errors, bool):
            raise ConfigurationError(
                option="CACHE_IGNORE_ERRORS",
                value=ignore_delete_many_errors,
                reason=f"must be True or False (got {ignore_delete_many_errors!r})",
            )
        super().__init__(
            default_timeout=seconds,
            ignore_delete_many_errors=ignore_delete_many_errors,
        )
        pool_config, cache_options = parse_cache_config(location, options)
        self.pool_config: PoolConfig = pool_config
        self.options: CacheOptions = cache_options
        self.key_prefix: str | Callable[[], str] = key_prefix or ""
        # The shared core: equal settings in this process share one set of pools and listeners.
        self.core: ShardedSentinelPool = shared_pool(pool_config)
        codec = build_codec(cache_options)
        self._serializer: Any = codec
        self.client = CacheClient(
            self.core,
            codec,
            durable_replicas=cache_options.durable_replicas,
            durable_timeout_ms=cache_options.durable_timeout_ms,
            fail_open=FailOpen(
                cache_options.ignore_exceptions,
                cache_options.log_ignored_exceptions_interval,
                logger,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} prefix={self._get_prefix()!r} "
            f"default_timeout={self.default_timeout} {self.core!r}>"
        )

    # -- Flask-Caching entry point -------------------------------------------------------------
    @classmethod
    def factory(
        cls,
        app: Flask,
        config: dict[str, Any],
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> ShardedSentinelCache:
        """Build from Flask settings (``kwargs`` holds the timeout, CACHE_IGNORE_ERRORS and
        CACHE_OPTIONS, merged by Flask-Caching); registers ``flask sentinel-status``."""
        if args:
            raise ConfigurationError(
                option="CACHE_ARGS",
                value=args,
                reason=f"{cls.__name__} takes no positional arguments; use the "
                f"CACHE_REDIS_* settings and CACHE_OPTIONS (got {args!r})",
            )
        options = dict(kwargs)
        default_timeout = options.pop("default_timeout", 300)
        ignore_delete_many_errors = options.pop("ignore_delete_many_errors", False)
        previous = [options.pop(n) for n in list(options) if str(n).upper() == PREVIOUS_CACHE]
        location, location_key, options, sources = translate_settings(config, options)
        try:
            # With PREVIOUS_CACHE: the class that adopts the old cache's keys (flask.previous).
            cache = (adopting(cls) if previous else cls)(
                location,
                options,
                key_prefix=config.get("CACHE_KEY_PREFIX"),
                default_timeout=default_timeout,
                ignore_delete_many_errors=ignore_delete_many_errors,
            )
        except ConfigurationError as exc:
            raise in_flask_terms(exc, location_key, sources, config) from exc
        if previous:
            kind = previous[0].get("CACHE_TYPE") if isinstance(previous[0], Mapping) else None
            refuse_with_resharding(cache.pool_config.previous_masters, PREVIOUS_SETTING, kind)
            cache.previous_cache = build_previous(previous[0])
        if app is not None:
            init_app(app)
        return cache

    # -- serializer ----------------------------------------------------------------------------
    @property
    def serializer(self) -> Any:
        """What turns values into bytes; assign a ``Codec``, a name (``"json"``) or any object
        with ``dumps``/``loads`` (cachelib serializers), as Flask-Caching does for
        CACHE_SERIALIZER. Integers bypass it so ``INCRBY`` can work on them."""
        return self._serializer

    @serializer.setter
    def serializer(self, value: Any) -> None:
        self.client.codec = self._codec_for(value)
        self._serializer = value

    def _codec_for(self, serializer: Any) -> Codec:
        if isinstance(serializer, Codec):
            return serializer
        if not isinstance(serializer, str) and not (
            callable(getattr(serializer, "dumps", None))
            and callable(getattr(serializer, "loads", None))
        ):
            raise ConfigurationError(
                option="CACHE_SERIALIZER",
                value=serializer,
                reason=f"expected an object with dumps() and loads(), a Codec or a "
                f"serializer name (got {serializer!r})",
            )
        options = self.options
        return Codec(
            serializer=serializer,
            compressor=options.compressor,
            compress_min_length=options.compress_min_length,
            signing_key=options.signing_key,
        )

    # -- keys and timeouts ---------------------------------------------------------------------
    def resolved_prefix(self) -> str:
        """The key prefix now (``CACHE_KEY_PREFIX`` may be a callable): what the operator
        commands' ``--cache`` matches."""
        prefix = self.key_prefix
        return prefix if isinstance(prefix, str) else prefix()

    def _get_prefix(self) -> str:
        return self.resolved_prefix()

    def _key(self, key: Any) -> str:
        return f"{self._get_prefix()}{key}"

    def _normalize_timeout(self, timeout: int | dt.timedelta | None) -> int:
        """None: the default timeout; otherwise whole seconds (timedelta accepted). A number
        other than an int goes through the core's rule first (NaN, infinity, a bool, a string:
        an error naming the timeout); the core checks an int's range."""
        if timeout is None:
            return self.default_timeout
        if type(timeout) is int or isinstance(timeout, dt.timedelta):
            return _whole_seconds(timeout)
        return _whole_seconds(valid_timeout(timeout))

    def _seconds(self, timeout: int | dt.timedelta | None) -> float | None:
        """Flask's convention (None: default, 0: forever) in CacheClient's (None: forever,
        <= 0: already expired)."""
        seconds = self._normalize_timeout(timeout)
        if seconds == 0:
            return None
        return max(seconds, 0)

    # -- single key (IGNORE_EXCEPTIONS is the client's: an unavailable shard answers as if the
    # key were absent) ----------------------------------------------------------------------
    def get(self, key: str) -> Any:
        return self.client.get(self._key(key))

    def set(self, key: str, value: Any, timeout: int | dt.timedelta | None = None) -> bool:
        return self.client.set(self._key(key), value, self._seconds(timeout))

    def add(self, key: str, value: Any, timeout: int | dt.timedelta | None = None) -> bool:
        seconds = self._seconds(timeout)
        if seconds is not None and seconds <= 0:
            return False  # cachelib: an entry that would expire at once is never added
        return self.client.add(self._key(key), value, seconds)

    def delete(self, key: str) -> bool:
        return self.client.delete(self._key(key))

    def has(self, key: str) -> bool:
        return self.client.has_key(self._key(key))

    def inc(self, key: str, delta: int = 1) -> int | None:
        """Atomic ``INCRBY`` on the key's shard; a missing key counts from 0 (no TTL)."""
        return self.client.incr(self._key(key), delta, create=True)

    def dec(self, key: str, delta: int = 1) -> int | None:
        """Atomic ``INCRBY -delta``; a missing key counts from 0."""
        return self.inc(key, -valid_delta(delta))

    # -- many keys (one batch per shard; with IGNORE_EXCEPTIONS a down shard only costs its
    # own keys) ----------------------------------------------------------------------------------
    def get_many(self, *keys: str) -> list[Any]:
        finals = [self._key(key) for key in keys]
        found = self.client.get_many(finals) if finals else {}
        return [found.get(final) for final in finals]

    def set_many(
        self, mapping: Mapping[str, Any], timeout: int | dt.timedelta | None = None
    ) -> list[Any]:
        """Returns the keys that were set, in ``mapping`` order."""
        finals = {key: self._key(key) for key in mapping}
        if not finals:
            return []
        values = {finals[key]: value for key, value in mapping.items()}
        not_set = set(self.client.set_many(values, self._seconds(timeout)))
        return [key for key in mapping if finals[key] not in not_set]

    def get_or_set_many(
        self, defaults: Mapping[str, Any], timeout: int | dt.timedelta | None = None
    ) -> dict[str, Any]:
        """Every key's value; a missing key is added with its default (a concurrent writer's
        value wins). Two round trips."""
        finals = {self._key(key): key for key in defaults}
        if not finals:
            return {}
        made = {final: defaults[key] for final, key in finals.items()}
        found = self.client.get_or_set_many(made, self._seconds(timeout))
        return {finals[final]: value for final, value in found.items()}

    def delete_many(self, *keys: str) -> list[Any]:
        """Returns the keys that are gone afterwards (absent ones count). RuntimeError for the
        others unless ``ignore_delete_many_errors``; keys on a shard that IGNORE_EXCEPTIONS
        skipped are left out of the result without an error."""
        return self._remove_many(keys, unlink=False)

    def unlink(self, *keys: str) -> list[Any]:
        """``delete_many`` with ``UNLINK``: the server frees the memory in the background."""
        return self._remove_many(keys, unlink=True)

    def _remove_many(self, keys: Iterable[str], *, unlink: bool) -> list[Any]:
        finals = {key: self._key(key) for key in keys}
        gone = self.client.remove_many(finals.values(), unlink=unlink)
        failed = [key for key, final in finals.items() if gone.get(final) is False]
        if failed and not self.ignore_delete_many_errors:
            raise RuntimeError(f"Failed to delete keys: {failed}")
        return [key for key, final in finals.items() if gone.get(final)]

    # -- whole cache ---------------------------------------------------------------------------
    def clear(self) -> bool:
        """Remove this prefix's keys on every shard (SCAN + UNLINK); without a prefix, flush
        ``DB`` on every shard (see the module docstring). False if IGNORE_EXCEPTIONS skipped a
        shard."""
        prefix = self._get_prefix()
        return self.client.clear(escape_pattern(prefix) + "*" if prefix else None)
