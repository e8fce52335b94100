"""Configuration, parsed and validated in exactly one place into frozen, hashable objects.

Two front doors lead here: the core's Python constructor (redis-py style keyword arguments) and
the adapters' option mappings (Django ``OPTIONS`` / Flask ``CACHE_OPTIONS``, upper-case names).
Both end in :class:`PoolConfig` (what the shared core needs; it keys the process-wide registry)
and :class:`CacheOptions` (what a cache front end needs). Every error names the field and value,
also as its ``option``, ``value`` and ``reason`` attributes (:class:`ConfigurationError`).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import ipaddress
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

import redis.connection

from sentinel_cache.core.ring import is_valid_weight
from sentinel_cache.core.serializers import (
    check_compress_min_length,
    check_signing_key,
    check_value_format,
)
from sentinel_cache.exceptions import ConfigurationError


class Address(NamedTuple):
    """A ``(host, port)`` pair; formats as ``host:port`` (``[v6]:port`` for IPv6)."""

    host: str
    port: int

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def _bad(field_name: str, value: Any, why: str) -> ConfigurationError:
    """``field_name: why (got value)``, with the three parts as the error's attributes."""
    return ConfigurationError(option=field_name, value=value, reason=f"{why} (got {value!r})")


def parse_address(value: Any, field_name: str = "sentinels") -> Address:
    """Parse ``"host:port"``, ``"[v6]:port"`` or a ``(host, port)`` pair."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise _bad(field_name, value, "an address pair must be (host, port)")
        host, port = value
        if not isinstance(host, str) or not host.strip():
            raise _bad(field_name, value, "the host must be a non-empty string")
        return Address(host.strip(), _parse_port(port, field_name, value))
    if not isinstance(value, str):
        raise _bad(field_name, value, 'expected "host:port" or (host, port)')
    text = value.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise _bad(field_name, value, 'an IPv6 address must look like "[::1]:26379"')
        host, port_text = text[1:end], text[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _bad(field_name, value, "not a valid IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise _bad(field_name, value, 'expected "host:port"')
        if ":" in host:
            raise _bad(field_name, value, 'write an IPv6 address as "[addr]:port"')
    return Address(host, _parse_port(port_text, field_name, value))


def _parse_port(port: Any, field_name: str, whole: Any) -> int:
    if isinstance(port, bool):
        raise _bad(field_name, whole, "the port must be an integer from 1 to 65535")
    try:
        number = int(port)
    except (TypeError, ValueError):
        raise _bad(field_name, whole, "the port must be an integer from 1 to 65535") from None
    if not 1 <= number <= 65535 or (isinstance(port, float) and port != number):
        raise _bad(field_name, whole, "the port must be an integer from 1 to 65535")
    return number


def parse_sentinels(value: Any, field_name: str = "sentinels") -> tuple[Address, ...]:
    """Accept a list of addresses, or one comma-separated string of them; no duplicates."""
    if isinstance(value, str):
        items: list[Any] = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
        items = [value]  # a single (host, port) pair
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        items = list(value)
    else:
        raise _bad(field_name, value, "expected a list of sentinel addresses")
    if not items:
        raise _bad(field_name, value, "at least one sentinel address is required")
    addresses = tuple(parse_address(item, field_name) for item in items)
    seen: set[Address] = set()
    for address in addresses:
        if address in seen:
            raise _bad(field_name, value, f"sentinel {address} is listed twice")
        seen.add(address)
    return addresses


def parse_masters(value: Any, field_name: str = "masters") -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, Iterable) or isinstance(value, (bytes, Mapping)):
        raise _bad(field_name, value, "expected an ordered list of master names")
    names = list(value)
    if not names:
        raise _bad(field_name, value, "at least one master name is required")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise _bad(field_name, value, f"every master name must be a non-empty string: {name!r}")
        if name != name.strip() or any(ch.isspace() for ch in name):
            raise _bad(field_name, value, f"master name {name!r} contains white space")
        if name in seen:
            raise _bad(field_name, value, f"master name {name!r} is listed twice")
        seen.add(name)
    return tuple(names)


MAX_WEIGHT = 1000


def parse_weights(
    value: Any, masters: Sequence[str], field_name: str = "weights"
) -> tuple[int, ...]:
    if value is None:
        return (1,) * len(masters)
    if isinstance(value, Mapping):
        unknown = set(value) - set(masters)
        if unknown:
            raise _bad(field_name, value, f"names no configured master: {sorted(unknown)}")
        value = [value.get(name, 1) for name in masters]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _bad(field_name, value, "expected a list of positive integers, one per master")
    weights = list(value)
    if len(weights) != len(masters):
        raise _bad(
            field_name, value, f"{len(weights)} weights for {len(masters)} masters; they must match"
        )
    for weight in weights:
        if not is_valid_weight(weight):  # the ring's rule; the count and bound are ours
            raise _bad(field_name, value, f"every weight must be a positive integer: {weight!r}")
        if weight > MAX_WEIGHT:
            # 160 virtual nodes per unit of weight: a typo here would stall start-up.
            raise _bad(field_name, value, f"every weight must be at most {MAX_WEIGHT}: {weight!r}")
    return tuple(weights)


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
            hint = difflib.get_close_matches(name, sorted(CONNECTION_PARAMETERS), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            raise _bad(field_name, name, f"unknown redis connection option{suggestion}")


def _check_hashable(side: str, values: Mapping[str, Any]) -> None:
    """Configurations key the process-wide registry: a set or bytearray value would only fail
    later, as a TypeError far from the setting."""
    for name, value in values.items():
        try:
            hash(_freeze(value))
        except TypeError:
            raise _bad(
                f"{side}.{name}",
                f"a {type(value).__name__}",
                "must be hashable: a str, bytes, number, bool, None or a list/tuple/dict of them",
            ) from None


def _check_number(
    name: str, value: Any, *, minimum: float = 0.0, allow_none: bool = False, integer: bool = False
) -> None:
    if value is None and allow_none:
        return
    kind = int if integer else (int, float)
    # NaN passes every comparison and an infinite wait overflows the thread and socket APIs.
    if (
        isinstance(value, bool)
        or not isinstance(value, kind)
        or not math.isfinite(value)
        or value < minimum
    ):
        what = "an integer" if integer else "a finite number"
        raise _bad(name, value, f"must be {what} >= {minimum:g}")


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
    discovery_timeout: float = 5.0
    failover_hold: float = 2.0
    outage_reads: bool = True
    outage_hold: float = 0.0
    listeners: bool = True
    reresolve_interval: float = 0.2
    metrics: bool = False
    tracing: bool = False
    near_cache: bool = False
    near_cache_max_entries: int = 10_000
    near_cache_max_bytes: int = 64 * 1024 * 1024
    near_cache_ttl: float = 60.0
    near_cache_prefixes: tuple[str, ...] = ()
    previous_masters: tuple[str, ...] = ()
    previous_weights: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_number("max_connections", self.max_connections, minimum=1, integer=True)
        if self.max_connections > MAX_CONNECTIONS_LIMIT:
            # redis-py's blocking pool fills a queue with that many placeholders up front.
            raise _bad(
                "max_connections",
                self.max_connections,
                f"must be at most {MAX_CONNECTIONS_LIMIT} (per shard and process)",
            )
        _check_number("pool_timeout", self.pool_timeout)
        _check_number("health_check_interval", self.health_check_interval)
        _check_number("discovery_timeout", self.discovery_timeout)
        _check_number("failover_hold", self.failover_hold)
        _check_number("outage_hold", self.outage_hold)
        _check_number("reresolve_interval", self.reresolve_interval)
        _check_number(
            "near_cache_max_entries", self.near_cache_max_entries, minimum=1, integer=True
        )
        _check_number("near_cache_max_bytes", self.near_cache_max_bytes, minimum=1, integer=True)
        _check_number("near_cache_ttl", self.near_cache_ttl, minimum=0.001)
        if not isinstance(self.near_cache_prefixes, tuple) or not all(
            isinstance(p, str) and p for p in self.near_cache_prefixes
        ):
            raise _bad(
                "near_cache_prefixes",
                self.near_cache_prefixes,
                "must be a list of non-empty strings (key prefixes as stored)",
            )
        # The server refuses BCAST prefixes of which one starts another (or repeats it): the
        # tracker could never start, so the near cache would never be used.
        for n, first in enumerate(self.near_cache_prefixes):
            for second in self.near_cache_prefixes[n + 1 :]:
                if first.startswith(second) or second.startswith(first):
                    raise _bad(
                        "near_cache_prefixes",
                        self.near_cache_prefixes,
                        f"{first!r} and {second!r} overlap (one starts the other), which the "
                        "server refuses for tracking: keep the shorter one",
                    )
        for name in (
            "read_from_replicas",
            "outage_reads",
            "listeners",
            "metrics",
            "tracing",
            "near_cache",
        ):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "must be True or False")

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
        }
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in pool_fields}
        previous = options.pop("previous_masters", None)
        previous_weights = options.pop("previous_weights", None)
        if previous:
            options["previous_masters"] = parse_masters(previous, "previous_masters")
            options["previous_weights"] = parse_weights(
                previous_weights, options["previous_masters"], "previous_weights"
            )
        elif previous_weights is not None:
            raise _bad(
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
            raise _bad(f"{side}.{name}", "***", "must be a string")
    if "ssl" in values and not isinstance(values["ssl"], bool):
        raise _bad(f"{side}.ssl", values["ssl"], "must be True or False")
    needs_ssl = sorted(k for k in values if k.startswith("ssl_"))
    if needs_ssl and not values.get("ssl"):
        shown = "***" if needs_ssl[0] in SECRET_KWARGS else values[needs_ssl[0]]
        raise _bad(
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


# Option name (as written in Django OPTIONS / Flask CACHE_OPTIONS) -> (where it goes, name there).
_POOL, _CONN, _SENT, _CACHE = "pool", "connection", "sentinel", "cache"
OPTION_NAMES: Mapping[str, tuple[str, str]] = {
    "MASTERS": ("masters", "masters"),
    "WEIGHTS": ("weights", "weights"),
    "DB": (_CONN, "db"),
    "USERNAME": (_CONN, "username"),
    "PASSWORD": (_CONN, "password"),
    "SOCKET_TIMEOUT": (_CONN, "socket_timeout"),
    "SOCKET_CONNECT_TIMEOUT": (_CONN, "socket_connect_timeout"),
    "SOCKET_KEEPALIVE": (_CONN, "socket_keepalive"),
    "SSL": ("ssl", "ssl"),
    "SSL_CA_CERTS": (_CONN, "ssl_ca_certs"),
    "SSL_CERTFILE": (_CONN, "ssl_certfile"),
    "SSL_KEYFILE": (_CONN, "ssl_keyfile"),
    "SSL_CERT_REQS": (_CONN, "ssl_cert_reqs"),
    "SSL_CHECK_HOSTNAME": (_CONN, "ssl_check_hostname"),
    "SENTINEL_USERNAME": (_SENT, "username"),
    "SENTINEL_PASSWORD": (_SENT, "password"),
    "SENTINEL_SOCKET_TIMEOUT": (_SENT, "socket_timeout"),
    "SENTINEL_SOCKET_CONNECT_TIMEOUT": (_SENT, "socket_connect_timeout"),
    "SENTINEL_SSL": ("sentinel_ssl", "ssl"),
    "SENTINEL_SSL_CA_CERTS": (_SENT, "ssl_ca_certs"),
    "SENTINEL_SSL_CERTFILE": (_SENT, "ssl_certfile"),
    "SENTINEL_SSL_KEYFILE": (_SENT, "ssl_keyfile"),
    "SENTINEL_SSL_CERT_REQS": (_SENT, "ssl_cert_reqs"),
    "SENTINEL_SSL_CHECK_HOSTNAME": (_SENT, "ssl_check_hostname"),
    "MAX_CONNECTIONS": (_POOL, "max_connections"),
    "POOL_TIMEOUT": (_POOL, "pool_timeout"),
    "HEALTH_CHECK_INTERVAL": (_POOL, "health_check_interval"),
    "READ_FROM_REPLICAS": (_POOL, "read_from_replicas"),
    "DISCOVERY_TIMEOUT": (_POOL, "discovery_timeout"),
    "FAILOVER_HOLD": (_POOL, "failover_hold"),
    "OUTAGE_READS": (_POOL, "outage_reads"),
    "OUTAGE_HOLD": (_POOL, "outage_hold"),
    "LISTENERS": (_POOL, "listeners"),
    "RERESOLVE_INTERVAL": (_POOL, "reresolve_interval"),
    "METRICS": (_POOL, "metrics"),
    "TRACING": (_POOL, "tracing"),
    "NEAR_CACHE": (_POOL, "near_cache"),
    "NEAR_CACHE_MAX_ENTRIES": (_POOL, "near_cache_max_entries"),
    "NEAR_CACHE_MAX_BYTES": (_POOL, "near_cache_max_bytes"),
    "NEAR_CACHE_TTL": (_POOL, "near_cache_ttl"),
    "NEAR_CACHE_PREFIXES": (_POOL, "near_cache_prefixes"),
    "PREVIOUS_MASTERS": (_POOL, "previous_masters"),
    "PREVIOUS_WEIGHTS": (_POOL, "previous_weights"),
    "CONNECTION_KWARGS": ("connection_kwargs", "connection_kwargs"),
    "SENTINEL_KWARGS": ("sentinel_kwargs", "sentinel_kwargs"),
    "SERIALIZER": (_CACHE, "serializer"),
    "COMPRESSOR": (_CACHE, "compressor"),
    "VALUE_FORMAT": (_CACHE, "value_format"),
    "STAMPEDE_PROTECTION": (_CACHE, "stampede_protection"),
    "STAMPEDE_LOCK_TIMEOUT": (_CACHE, "stampede_lock_timeout"),
    "STAMPEDE_EARLY_REFRESH": (_CACHE, "stampede_early_refresh"),
    "COMPRESS_MIN_LENGTH": (_CACHE, "compress_min_length"),
    "SIGNING_KEY": (_CACHE, "signing_key"),
    "IGNORE_EXCEPTIONS": (_CACHE, "ignore_exceptions"),
    "LOG_IGNORED_EXCEPTIONS_INTERVAL": (_CACHE, "log_ignored_exceptions_interval"),
    "DURABLE_REPLICAS": (_CACHE, "durable_replicas"),
    "DURABLE_TIMEOUT_MS": (_CACHE, "durable_timeout_ms"),
}


def _lookup_option(name: Any) -> tuple[str, str]:
    key = str(name).upper()
    if key in OPTION_NAMES:
        return OPTION_NAMES[key]
    hint = difflib.get_close_matches(key, sorted(OPTION_NAMES), n=1, cutoff=0.5)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    valid = ", ".join(sorted(OPTION_NAMES))
    raise ConfigurationError(
        option="OPTIONS",
        value=str(name),
        reason=f"unknown option {name!r}{suggestion} (valid: {valid})",
    )


def redact_url(url: str) -> str:
    """``url`` for error messages and logs: user info and secret query values become ``***``.

    Everything up to the last ``@`` is masked (a password may hold an unescaped ``/`` that
    hides where the user info ends), so is any query value of a secret option.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    head, question, query = rest.partition("?")
    if question:
        items = []
        for item in query.split("&"):
            name, equals, value = item.partition("=")
            if equals and unquote(name).upper() in _SECRET_OPTIONS:
                value = "***"
            items.append(f"{name}{equals}{value}")
        rest = f"{head}?{'&'.join(items)}"
    return f"{scheme}{sep}{rest}"


def parse_url(url: str) -> tuple[tuple[Address, ...], tuple[str, ...], dict[str, Any]]:
    """``sentinel://[user:pass@]h1:26379,h2:26379/shard_a,shard_b?db=0`` for twelve-factor apps.

    The credentials in the URL are the data nodes'; query parameters are option names. Error
    messages show the URL with its secrets masked (:func:`redact_url`).
    """
    if not isinstance(url, str):
        raise _bad("LOCATION", type(url).__name__, "a URL must be a string")
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL"
        raise _bad("LOCATION", redact_url(url), f"not a valid URL: {exc}") from None
    if parts.scheme not in ("sentinel", "sentinels"):
        raise _bad("LOCATION", redact_url(url), 'a URL must use the "sentinel://" scheme')
    if parts.fragment or "@" in parts.path or any("@" in name for name, _ in query):
        # An unescaped "/", "?" or "#" in a password moves the rest of it (and the "@") into the
        # path, query or fragment, where it would end up as a master or option name.
        raise _bad("LOCATION", redact_url(url), _URL_FORM)
    netloc = parts.netloc
    options: dict[str, Any] = {}
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, sep, password = userinfo.partition(":")
        if user:
            options["USERNAME"] = unquote(user)
        if sep:
            options["PASSWORD"] = unquote(password)
    try:
        sentinels = parse_sentinels(netloc, "LOCATION")
    except ConfigurationError:
        if "@" not in url:
            raise
        # The host part may hold a piece of the password (an unescaped "/" in it): name none.
        raise _bad("LOCATION", redact_url(url), _URL_FORM) from None
    masters_text = parts.path.lstrip("/")
    if masters_text:
        options["MASTERS"] = [unquote(m) for m in masters_text.split(",")]
    for name, value in query:
        key = name.upper()
        options[key] = value if key in _STRING_OPTIONS else _coerce_query_value(value)
    if parts.scheme == "sentinels":  # TLS on both sides: sentinels and data nodes
        options.setdefault("SSL", True)
        options.setdefault("SENTINEL_SSL", True)
    return sentinels, tuple(options.get("MASTERS", ())), options


_URL_FORM = (
    'expected "sentinel://[user:password@]host:port,...[/master,...][?option=value&...]" '
    '(percent-encode "/", "?", "#" and "@" in a user name or password)'
)
# Options whose values are secrets: masked in URLs shown in messages.
_SECRET_OPTIONS = frozenset({"PASSWORD", "SENTINEL_PASSWORD", "SIGNING_KEY"})
# Options that take text as written: "0123" as a password must not become the number 123.
_STRING_OPTIONS = _SECRET_OPTIONS | {
    "MASTERS",
    "USERNAME",
    "SENTINEL_USERNAME",
    "SSL_CA_CERTS",
    "SSL_CERTFILE",
    "SSL_KEYFILE",
    "SSL_CERT_REQS",
    "SENTINEL_SSL_CA_CERTS",
    "SENTINEL_SSL_CERTFILE",
    "SENTINEL_SSL_KEYFILE",
    "SENTINEL_SSL_CERT_REQS",
    "SERIALIZER",
    "COMPRESSOR",
    "VALUE_FORMAT",
}


def _coerce_query_value(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse_cache_config(
    location: Any, options: Mapping[str, Any] | None
) -> tuple[PoolConfig, CacheOptions]:
    """The one parser of adapter settings (Django LOCATION/OPTIONS, Flask keys/CACHE_OPTIONS)."""
    merged: dict[str, Any] = {}
    if isinstance(location, str) and "://" in location:
        sentinels, _masters, url_options = parse_url(location)
        merged.update(url_options)
    else:
        sentinels = parse_sentinels(location, "LOCATION")
    given: dict[str, Any] = {}
    for name, value in (options or {}).items():
        _lookup_option(name)
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
    if "MASTERS" not in merged:
        raise ConfigurationError(
            option="OPTIONS", reason="MASTERS is required (the ordered list of master names)"
        )

    connection: dict[str, Any] = {}
    sentinel: dict[str, Any] = {}
    pool: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    for name, value in merged.items():
        target, attr = _lookup_option(name)
        if target == _CONN:
            connection[attr] = value
        elif target == _SENT:
            sentinel[attr] = value
        elif target == _POOL:
            pool[attr] = value
        elif target == _CACHE:
            cache[attr] = value
        elif target in ("ssl", "sentinel_ssl"):
            if not isinstance(value, bool):
                raise _bad(name, value, "must be True or False")
            (connection if target == "ssl" else sentinel)["ssl"] = value
        elif target in ("connection_kwargs", "sentinel_kwargs"):
            if not isinstance(value, Mapping):
                raise _bad(name, value, "must be a dict of redis-py connection options")
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
        raise exc.renamed(_option_label(exc.option)) from None
    return config, _cache_options(cache)


def _option_label(field: str) -> str:
    """``max_connections`` -> ``MAX_CONNECTIONS``; ``sentinel_kwargs.password`` -> ..."""
    side, dot, attr = field.partition(".")
    target = {"connection_kwargs": _CONN, "sentinel_kwargs": _SENT}.get(side) if dot else None
    wanted = (target, attr) if target else None
    for option, place in OPTION_NAMES.items():
        if place == wanted or (not dot and place[1] == field and place[0] in (_POOL, field)):
            return option
    if dot and target:
        return f"{side.upper()}[{attr!r}]"
    return field.upper() if field.islower() and " " not in field else field


def _cache_options(values: dict[str, Any]) -> CacheOptions:
    serializer = values.get("serializer", "pickle")
    if not isinstance(serializer, str) and not callable(serializer):
        raise _bad(
            "SERIALIZER",
            serializer,
            'expected "pickle", "json", "msgpack", "text", "bytes" or a dotted path',
        )
    compressor = values.get("compressor")
    if compressor is not None and not isinstance(compressor, str):
        raise _bad("COMPRESSOR", compressor, 'expected "zlib", "zstd" or a dotted path')
    # The codec owns SIGNING_KEY and COMPRESS_MIN_LENGTH: its checks, also run by Codec(...).
    signing_key = check_signing_key(values.get("signing_key"))
    value_format = check_value_format(
        values.get("value_format", "framed"), compressor=compressor, signing_key=signing_key
    )
    ignore = values.get("ignore_exceptions", False)
    if not isinstance(ignore, bool):
        raise _bad("IGNORE_EXCEPTIONS", ignore, "must be True or False")
    stampede = values.get("stampede_protection", False)
    if not isinstance(stampede, bool):
        raise _bad("STAMPEDE_PROTECTION", stampede, "must be True or False")
    lock_timeout = values.get("stampede_lock_timeout", 10.0)
    _check_number("STAMPEDE_LOCK_TIMEOUT", lock_timeout, minimum=0.001)
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
