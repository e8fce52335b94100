"""Configuration, parsed and validated in exactly one place into frozen, hashable objects.

Two front doors lead here: the core's Python constructor (redis-py style keyword arguments) and
the adapters' option mappings (Django ``OPTIONS`` / Flask ``CACHE_OPTIONS``, upper-case names).
Both end in :class:`PoolConfig` (what the shared core needs; it keys the process-wide registry)
and :class:`CacheOptions` (what a cache front end needs). Every error names the field and value,
also as its ``option``, ``value`` and ``reason`` attributes (:class:`ConfigurationError`).

Addresses, master names and weights are parsed in :mod:`~sentinel_cache.core.addresses`, the
option names and the URL form in :mod:`~sentinel_cache.core.options`; their public names are
also importable from here.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.connection

from sentinel_cache.core.addresses import MAX_WEIGHT as MAX_WEIGHT
from sentinel_cache.core.addresses import Address as Address
from sentinel_cache.core.addresses import bad_value, parse_masters, parse_sentinels, parse_weights
from sentinel_cache.core.addresses import parse_address as parse_address
from sentinel_cache.core.arguments import MAX_TIMEOUT, MIN_LOCK_TIMEOUT, number_problem
from sentinel_cache.core.options import (
    CACHE,
    CONNECTION,
    POOL,
    SENTINEL,
    did_you_mean,
    lookup_option,
    option_label,
)
from sentinel_cache.core.options import OPTION_NAMES as OPTION_NAMES
from sentinel_cache.core.options import parse_url as parse_url
from sentinel_cache.core.options import redact_url as redact_url
from sentinel_cache.core.serializers import (
    check_compress_min_length,
    check_signing_key,
    check_value_format,
)
from sentinel_cache.exceptions import ConfigurationError


def connection_parameters(*classes: type) -> frozenset[str]:
    """The keyword arguments that redis-py connection classes (and their bases) accept."""
    names: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            for parameter in inspect.signature(init).parameters.values():
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                    names.add(parameter.name)
    names.discard("self")
    return frozenset(names)


# What redis-py's Connection/SSLConnection accept; host and port come from the sentinels.
CONNECTION_PARAMETERS = (
    connection_parameters(redis.connection.Connection, redis.connection.SSLConnection)
    - {"host", "port", "connection_pool"}
) | {"ssl"}


def connection_class_and_kwargs(
    kwargs: Mapping[str, Any],
) -> tuple[type[redis.connection.Connection], dict[str, Any]]:
    """Turn our ``ssl`` flag into redis-py's connection class, as ``redis.Redis`` does."""
    options = dict(kwargs)
    if options.pop("ssl", False):
        return redis.connection.SSLConnection, options
    return redis.connection.Connection, options


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _check_connection_kwargs(kwargs: Mapping[str, Any], field_name: str) -> None:
    for name in kwargs:
        if name not in CONNECTION_PARAMETERS:
            suggestion = did_you_mean(name, CONNECTION_PARAMETERS)
            raise bad_value(field_name, name, f"unknown redis connection option{suggestion}")


def _check_hashable(side: str, values: Mapping[str, Any]) -> None:
    """Configurations key the process-wide registry: a set or bytearray value would only fail
    later, as a TypeError far from the setting."""
    for name, value in values.items():
        try:
            hash(_freeze(value))
        except TypeError:
            raise bad_value(
                f"{side}.{name}",
                f"a {type(value).__name__}",
                "must be hashable: a str, bytes, number, bool, None or a list/tuple/dict of them",
            ) from None


def _check_number(
    name: str,
    value: Any,
    *,
    minimum: float = 0.0,
    maximum: float | None = None,
    allow_none: bool = False,
    integer: bool = False,
) -> None:
    if value is None and allow_none:
        return
    problem = number_problem(value, minimum=minimum, maximum=maximum, integer=integer)
    if problem is not None:
        raise bad_value(name, value, problem)


def _prefixes(value: Any) -> Any:
    """NEAR_CACHE_PREFIXES as a tuple: a list of strings, or one comma-separated string (URL)."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value  # refused, with its value, by PoolConfig's check


DEFAULT_CONNECTION_KWARGS: Mapping[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 2.0,
}
DEFAULT_SENTINEL_KWARGS: Mapping[str, Any] = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}


#: Per shard and process; Redis itself accepts 10000 clients by default (``maxclients``).
MAX_CONNECTIONS_LIMIT = 10_000

#: Connection options whose values never appear in a repr or an error message.
SECRET_KWARGS = frozenset({"password", "ssl_password", "credential_provider"})


@dataclass(frozen=True)
class PoolConfig:
    """Everything the shared core needs; equal configurations share one core per process.

    ``connection_kwargs`` go to the data nodes, ``sentinel_kwargs`` to the sentinels: the two
    sides often have different passwords, ACL users and TLS settings.
    """

    masters: tuple[str, ...]
    sentinels: tuple[Address, ...]
    weights: tuple[int, ...]
    connection_kwargs: tuple[tuple[str, Any], ...] = ()
    sentinel_kwargs: tuple[tuple[str, Any], ...] = ()
    max_connections: int = 50
    pool_timeout: float = 2.0
    health_check_interval: float = 0.0
    read_from_replicas: bool = False
    async_multiplex: bool = True
    # Whether the user asked for ASYNC_MULTIPLEX (set by create): only then is falling back to
    # the pool (no hiredis, HEALTH_CHECK_INTERVAL) worth a warning; the default falls back quietly.
    async_multiplex_explicit: bool = False
    discovery_timeout: float = 5.0
    failover_hold: float = 2.0
    outage_reads: bool = True
    outage_reads_max_lag: float = 3.0
    outage_hold: float = 10.0
    listeners: bool = True
    reresolve_interval: float = 0.2
    metrics: bool = False
    tracing: bool = False
    near_cache: bool = False
    near_cache_max_entries: int = 10_000
    near_cache_max_bytes: int = 64 * 1024 * 1024
    near_cache_ttl: float = 60.0
    near_cache_prefixes: tuple[str, ...] = ()
    #: How the near cache hears invalidations: False (the RESP2 redirect: two connections per
    #: shard; the default, faster when this process writes kept keys from many threads),
    #: "auto" (RESP3 push on the one tracked connection where the server accepts ``HELLO 3``,
    #: else the redirect), True (push only).
    near_cache_push: bool | str = False
    previous_masters: tuple[str, ...] = ()
    previous_weights: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_number("max_connections", self.max_connections, minimum=1, integer=True)
        if self.max_connections > MAX_CONNECTIONS_LIMIT:
            # redis-py's blocking pool fills a queue with that many placeholders up front.
            raise bad_value(
                "max_connections",
                self.max_connections,
                f"must be at most {MAX_CONNECTIONS_LIMIT} (per shard and process)",
            )
        _check_number("pool_timeout", self.pool_timeout)
        _check_number("health_check_interval", self.health_check_interval)
        _check_number("discovery_timeout", self.discovery_timeout)
        _check_number("failover_hold", self.failover_hold)
        _check_number("outage_hold", self.outage_hold)
        _check_number("outage_reads_max_lag", self.outage_reads_max_lag, minimum=0.001)
        _check_number("reresolve_interval", self.reresolve_interval)
        _check_number(
            "near_cache_max_entries", self.near_cache_max_entries, minimum=1, integer=True
        )
        _check_number("near_cache_max_bytes", self.near_cache_max_bytes, minimum=1, integer=True)
        _check_number("near_cache_ttl", self.near_cache_ttl, minimum=0.001)
        if not isinstance(self.near_cache_prefixes, tuple) or not all(
            isinstance(p, str) and p for p in self.near_cache_prefixes
        ):
            raise bad_value(
                "near_cache_prefixes",
                self.near_cache_prefixes,
                "must be a list of non-empty strings (key prefixes as stored)",
            )
        # The server refuses BCAST prefixes of which one starts another (or repeats it): the
        # tracker could never start, so the near cache would never be used.
        for n, first in enumerate(self.near_cache_prefixes):
            for second in self.near_cache_prefixes[n + 1 :]:
                if first.startswith(second) or second.startswith(first):
                    raise bad_value(
                        "near_cache_prefixes",
                        self.near_cache_prefixes,
                        f"{first!r} and {second!r} overlap (one starts the other), which the "
                        "server refuses for tracking: keep the shorter one",
                    )
        if self.near_cache_push != "auto" and not isinstance(self.near_cache_push, bool):
            raise bad_value(
                "near_cache_push",
                self.near_cache_push,
                'must be "auto", True (RESP3 push only) or False (the RESP2 redirect)',
            )
        for name in (
            "read_from_replicas",
            "async_multiplex",
            "async_multiplex_explicit",
            "outage_reads",
            "listeners",
            "metrics",
            "tracing",
            "near_cache",
        ):
            if not isinstance(getattr(self, name), bool):
                raise bad_value(name, getattr(self, name), "must be True or False")

    @classmethod
    def create(
        cls,
        masters: Any,
        sentinels: Any,
        *,
        weights: Any = None,
        sentinel_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> PoolConfig:
        """Build from the core constructor's arguments: pool options, then redis-py kwargs."""
        master_names = parse_masters(masters)
        pool_fields = {f.name for f in dataclasses.fields(cls)} - {
            "masters",
            "sentinels",
            "weights",
            "connection_kwargs",
            "sentinel_kwargs",
            "async_multiplex_explicit",
        }
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in pool_fields}
        options["async_multiplex_explicit"] = options.get("async_multiplex") is True
        previous = options.pop("previous_masters", None)
        previous_weights = options.pop("previous_weights", None)
        if previous:
            options["previous_masters"] = parse_masters(previous, "previous_masters")
            options["previous_weights"] = parse_weights(
                previous_weights, options["previous_masters"], "previous_weights"
            )
        elif previous_weights is not None:
            raise bad_value(
                "previous_weights", previous_weights, "needs previous_masters (the old placement)"
            )
        if "near_cache_prefixes" in options:
            options["near_cache_prefixes"] = _prefixes(options["near_cache_prefixes"])
        _check_connection_kwargs(kwargs, "connection_kwargs")
        sentinel_kwargs = dict(sentinel_kwargs or {})
        _check_connection_kwargs(sentinel_kwargs, "sentinel_kwargs")
        connection = {**DEFAULT_CONNECTION_KWARGS, **kwargs}
        timeout = kwargs.get("socket_timeout")
        if "socket_connect_timeout" not in kwargs and isinstance(timeout, (int, float)):
            # SOCKET_TIMEOUT bounds a call: a black-holed master must not hold a new
            # connection longer than an established one.
            connection["socket_connect_timeout"] = min(
                DEFAULT_CONNECTION_KWARGS["socket_connect_timeout"], timeout
            )
        sentinel = {**DEFAULT_SENTINEL_KWARGS, **sentinel_kwargs}
        for side, values in (("connection_kwargs", connection), ("sentinel_kwargs", sentinel)):
            for name in ("socket_timeout", "socket_connect_timeout"):
                _check_number(f"{side}.{name}", values.get(name), minimum=0.001, allow_none=True)
            _check_side(side, values)
            _check_hashable(side, values)
        return cls(
            masters=master_names,
            sentinels=parse_sentinels(sentinels),
            weights=parse_weights(weights, master_names),
            connection_kwargs=_freeze(connection),
            sentinel_kwargs=_freeze(sentinel),
            **options,
        )

    def connection_options(self) -> dict[str, Any]:
        return _thaw(self.connection_kwargs)

    def sentinel_options(self) -> dict[str, Any]:
        return _thaw(self.sentinel_kwargs)

    def __repr__(self) -> str:
        conn = {k: ("***" if k in SECRET_KWARGS and v else v) for k, v in self.connection_kwargs}
        sent = {k: ("***" if k in SECRET_KWARGS and v else v) for k, v in self.sentinel_kwargs}
        return (
            f"PoolConfig(masters={list(self.masters)}, "
            f"sentinels={[str(a) for a in self.sentinels]}, weights={list(self.weights)}, "
            f"connection_kwargs={conn}, sentinel_kwargs={sent}, "
            f"max_connections={self.max_connections}, read_from_replicas={self.read_from_replicas})"
        )


def _check_side(side: str, values: Mapping[str, Any]) -> None:
    """Catch at configuration time what redis-py would only reject on the first connect."""
    if "db" in values:
        _check_number(f"{side}.db", values["db"], integer=True)
    for name in ("username", "password"):
        if values.get(name) is not None and not isinstance(values[name], str):
            raise bad_value(f"{side}.{name}", "***", "must be a string")
    if "ssl" in values and not isinstance(values["ssl"], bool):
        raise bad_value(f"{side}.ssl", values["ssl"], "must be True or False")
    needs_ssl = sorted(k for k in values if k.startswith("ssl_"))
    if needs_ssl and not values.get("ssl"):
        shown = "***" if needs_ssl[0] in SECRET_KWARGS else values[needs_ssl[0]]
        raise bad_value(
            f"{side}.{needs_ssl[0]}",
            shown,
            "is set but TLS is not enabled (ssl / SSL must be True)",
        )


def _thaw(items: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {k: (dict(v) if _looks_frozen_mapping(v) else v) for k, v in items}


def _looks_frozen_mapping(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and bool(value)
        and all(isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], str) for i in value)
    )


@dataclass(frozen=True)
class CacheOptions:
    """Front-end options shared by the Django and Flask adapters."""

    serializer: str = "pickle"
    compressor: str | None = None
    compress_min_length: int = 1024
    signing_key: bytes | None = None  # masked in the repr
    value_format: str = "framed"
    ignore_exceptions: bool = False
    log_ignored_exceptions_interval: float = 10.0
    durable_replicas: int = 0
    durable_timeout_ms: int = 100
    stampede_protection: bool = False
    stampede_lock_timeout: float = 10.0
    stampede_early_refresh: float = 0.0

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.signing_key:
            shown["signing_key"] = "***"
        return f"CacheOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def parse_cache_config(
    location: Any, options: Mapping[str, Any] | None
) -> tuple[PoolConfig, CacheOptions]:
    """The one parser of adapter settings (Django LOCATION/OPTIONS, Flask keys/CACHE_OPTIONS)."""
    merged: dict[str, Any] = {}
    url_given: frozenset[str] = frozenset()
    if isinstance(location, str) and "://" in location:
        sentinels, _masters, url_options = parse_url(location)
        merged.update(url_options)
        url_given = frozenset(url_options)
    else:
        sentinels = parse_sentinels(location, "LOCATION")
    given: dict[str, Any] = {}
    for name, value in (options or {}).items():
        lookup_option(name)
        key = str(name).upper()
        if key in given:
            raise ConfigurationError(
                option="OPTIONS",
                value=str(name),
                reason=f"{key} is given twice (as {given[key]!r} and {name!r})",
            )
        given[key] = name
        if key in merged:
            raise ConfigurationError(
                option="OPTIONS",
                value=str(name),
                reason=f"{key} is given both in the LOCATION URL and in OPTIONS",
            )
        merged[key] = value
    masters = merged.get("MASTERS")
    if isinstance(masters, str) and "," not in masters and "MASTERS" not in url_given:
        # "MASTERS": "shard_a" reads as one shard while the sentinels may monitor several.
        raise bad_value(
            option_label("masters"),
            masters,
            "must be a list of master names, one per shard in ring order: "
            f'"MASTERS": [{json.dumps(masters)}] for one shard, [{json.dumps(masters)}, ...] '
            "for every shard the sentinels monitor for this cache",
        )
    if "MASTERS" not in merged:
        raise ConfigurationError(
            option="OPTIONS", reason="MASTERS is required (the ordered list of master names)"
        )

    connection: dict[str, Any] = {}
    sentinel: dict[str, Any] = {}
    pool: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    for name, value in merged.items():
        target, attr = lookup_option(name)
        if target == CONNECTION:
            connection[attr] = value
        elif target == SENTINEL:
            sentinel[attr] = value
        elif target == POOL:
            pool[attr] = value
        elif target == CACHE:
            cache[attr] = value
        elif target in ("ssl", "sentinel_ssl"):
            if not isinstance(value, bool):
                raise bad_value(name, value, "must be True or False")
            (connection if target == "ssl" else sentinel)["ssl"] = value
        elif target in ("connection_kwargs", "sentinel_kwargs"):
            if not isinstance(value, Mapping):
                raise bad_value(name, value, "must be a dict of redis-py connection options")
            (connection if target == "connection_kwargs" else sentinel).update(value)
    try:
        config = PoolConfig.create(
            merged["MASTERS"],
            sentinels,
            weights=merged.get("WEIGHTS"),
            sentinel_kwargs=sentinel,
            **pool,
            **connection,
        )
    except ConfigurationError as exc:
        # Name the option as the user wrote it (MAX_CONNECTIONS), not the core's field.
        if exc.option is None:
            raise
        raise exc.renamed(option_label(exc.option)) from None
    return config, _cache_options(cache)


def _cache_options(values: dict[str, Any]) -> CacheOptions:
    serializer = values.get("serializer", "pickle")
    if not isinstance(serializer, str) and not callable(serializer):
        raise bad_value(
            "SERIALIZER",
            serializer,
            'expected "pickle", "json", "msgpack", "text", "bytes" or a dotted path',
        )
    compressor = values.get("compressor")
    if compressor is not None and not isinstance(compressor, str):
        raise bad_value("COMPRESSOR", compressor, 'expected "zlib", "zstd" or a dotted path')
    # The codec owns SIGNING_KEY and COMPRESS_MIN_LENGTH: its checks, also run by Codec(...).
    signing_key = check_signing_key(values.get("signing_key"))
    value_format = check_value_format(
        values.get("value_format", "framed"), compressor=compressor, signing_key=signing_key
    )
    ignore = values.get("ignore_exceptions", False)
    if not isinstance(ignore, bool):
        raise bad_value("IGNORE_EXCEPTIONS", ignore, "must be True or False")
    stampede = values.get("stampede_protection", False)
    if not isinstance(stampede, bool):
        raise bad_value("STAMPEDE_PROTECTION", stampede, "must be True or False")
    lock_timeout = values.get("stampede_lock_timeout", 10.0)
    _check_number(
        "STAMPEDE_LOCK_TIMEOUT", lock_timeout, minimum=MIN_LOCK_TIMEOUT, maximum=MAX_TIMEOUT
    )
    early = values.get("stampede_early_refresh", 0.0)
    _check_number("STAMPEDE_EARLY_REFRESH", early)
    compress_min_length = check_compress_min_length(values.get("compress_min_length", 1024))
    for name, integer in (
        ("durable_replicas", True),
        ("durable_timeout_ms", True),
        ("log_ignored_exceptions_interval", False),
    ):
        if name in values:
            _check_number(name.upper(), values[name], integer=integer)
    return CacheOptions(
        serializer=serializer,
        compressor=compressor,
        compress_min_length=compress_min_length,
        signing_key=signing_key,
        value_format=value_format,
        ignore_exceptions=ignore,
        log_ignored_exceptions_interval=values.get("log_ignored_exceptions_interval", 10.0),
        durable_replicas=values.get("durable_replicas", 0),
        durable_timeout_ms=values.get("durable_timeout_ms", 100),
        stampede_protection=stampede,
        stampede_lock_timeout=float(lock_timeout),
        stampede_early_refresh=float(early),
    )
