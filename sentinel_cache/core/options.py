"""The option names the adapters write (Django ``OPTIONS``, Flask ``CACHE_OPTIONS``), and the
``sentinel://`` URL form of them.

Each name says where its value goes (:data:`OPTION_NAMES`); :func:`parse_url` turns a URL into
the same names, so :func:`sentinel_cache.core.config.parse_cache_config` reads both alike.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from sentinel_cache.core.addresses import Address, bad_value, parse_sentinels
from sentinel_cache.exceptions import ConfigurationError

# Option name (as written in Django OPTIONS / Flask CACHE_OPTIONS) -> (where it goes, name there).
POOL, CONNECTION, SENTINEL, CACHE = "pool", "connection", "sentinel", "cache"
OPTION_NAMES: Mapping[str, tuple[str, str]] = {
    "MASTERS": ("masters", "masters"),
    "WEIGHTS": ("weights", "weights"),
    "DB": (CONNECTION, "db"),
    "USERNAME": (CONNECTION, "username"),
    "PASSWORD": (CONNECTION, "password"),
    "SOCKET_TIMEOUT": (CONNECTION, "socket_timeout"),
    "SOCKET_CONNECT_TIMEOUT": (CONNECTION, "socket_connect_timeout"),
    "SOCKET_KEEPALIVE": (CONNECTION, "socket_keepalive"),
    "SSL": ("ssl", "ssl"),
    "SSL_CA_CERTS": (CONNECTION, "ssl_ca_certs"),
    "SSL_CERTFILE": (CONNECTION, "ssl_certfile"),
    "SSL_KEYFILE": (CONNECTION, "ssl_keyfile"),
    "SSL_CERT_REQS": (CONNECTION, "ssl_cert_reqs"),
    "SSL_CHECK_HOSTNAME": (CONNECTION, "ssl_check_hostname"),
    "SENTINEL_USERNAME": (SENTINEL, "username"),
    "SENTINEL_PASSWORD": (SENTINEL, "password"),
    "SENTINEL_SOCKET_TIMEOUT": (SENTINEL, "socket_timeout"),
    "SENTINEL_SOCKET_CONNECT_TIMEOUT": (SENTINEL, "socket_connect_timeout"),
    "SENTINEL_SSL": ("sentinel_ssl", "ssl"),
    "SENTINEL_SSL_CA_CERTS": (SENTINEL, "ssl_ca_certs"),
    "SENTINEL_SSL_CERTFILE": (SENTINEL, "ssl_certfile"),
    "SENTINEL_SSL_KEYFILE": (SENTINEL, "ssl_keyfile"),
    "SENTINEL_SSL_CERT_REQS": (SENTINEL, "ssl_cert_reqs"),
    "SENTINEL_SSL_CHECK_HOSTNAME": (SENTINEL, "ssl_check_hostname"),
    "MAX_CONNECTIONS": (POOL, "max_connections"),
    "POOL_TIMEOUT": (POOL, "pool_timeout"),
    "HEALTH_CHECK_INTERVAL": (POOL, "health_check_interval"),
    "READ_FROM_REPLICAS": (POOL, "read_from_replicas"),
    "ASYNC_MULTIPLEX": (POOL, "async_multiplex"),
    "DISCOVERY_TIMEOUT": (POOL, "discovery_timeout"),
    "FAILOVER_HOLD": (POOL, "failover_hold"),
    "OUTAGE_READS": (POOL, "outage_reads"),
    "OUTAGE_READS_MAX_LAG": (POOL, "outage_reads_max_lag"),
    "OUTAGE_HOLD": (POOL, "outage_hold"),
    "LISTENERS": (POOL, "listeners"),
    "RERESOLVE_INTERVAL": (POOL, "reresolve_interval"),
    "METRICS": (POOL, "metrics"),
    "TRACING": (POOL, "tracing"),
    "NEAR_CACHE": (POOL, "near_cache"),
    "NEAR_CACHE_MAX_ENTRIES": (POOL, "near_cache_max_entries"),
    "NEAR_CACHE_MAX_BYTES": (POOL, "near_cache_max_bytes"),
    "NEAR_CACHE_TTL": (POOL, "near_cache_ttl"),
    "NEAR_CACHE_PREFIXES": (POOL, "near_cache_prefixes"),
    "NEAR_CACHE_PUSH": (POOL, "near_cache_push"),
    "PREVIOUS_MASTERS": (POOL, "previous_masters"),
    "PREVIOUS_WEIGHTS": (POOL, "previous_weights"),
    "CONNECTION_KWARGS": ("connection_kwargs", "connection_kwargs"),
    "SENTINEL_KWARGS": ("sentinel_kwargs", "sentinel_kwargs"),
    "SERIALIZER": (CACHE, "serializer"),
    "COMPRESSOR": (CACHE, "compressor"),
    "VALUE_FORMAT": (CACHE, "value_format"),
    "STAMPEDE_PROTECTION": (CACHE, "stampede_protection"),
    "STAMPEDE_LOCK_TIMEOUT": (CACHE, "stampede_lock_timeout"),
    "STAMPEDE_EARLY_REFRESH": (CACHE, "stampede_early_refresh"),
    "COMPRESS_MIN_LENGTH": (CACHE, "compress_min_length"),
    "SIGNING_KEY": (CACHE, "signing_key"),
    "IGNORE_EXCEPTIONS": (CACHE, "ignore_exceptions"),
    "LOG_IGNORED_EXCEPTIONS_INTERVAL": (CACHE, "log_ignored_exceptions_interval"),
    "DURABLE_REPLICAS": (CACHE, "durable_replicas"),
    "DURABLE_TIMEOUT_MS": (CACHE, "durable_timeout_ms"),
}


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 1, cutoff: float = 0.6) -> str:
    """``"; did you mean 'X'?"`` (or ``'X' or 'Y'``) with the closest of ``choices``, else "".

    The one wording of a suggestion, for option names, connection options and master names
    alike (the system checks and the errors at run time say the same). Case is ignored in
    comparing ("Shard1" is close to "shard1"); of up to ``n`` close ones, only those about as
    close as the closest are named."""
    by_folded = {choice.casefold(): choice for choice in sorted(set(choices), reverse=True)}
    folded = word.casefold()
    close = difflib.get_close_matches(folded, sorted(by_folded), n=n, cutoff=cutoff)
    if not close:
        return ""

    def ratio(choice: str) -> float:
        return difflib.SequenceMatcher(None, folded, choice).ratio()

    best = ratio(close[0])
    names = [repr(by_folded[c]) for c in close if ratio(c) >= best - 0.1]
    shown = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"; did you mean {shown}?"


def lookup_option(name: Any) -> tuple[str, str]:
    key = str(name).upper()
    if key in OPTION_NAMES:
        return OPTION_NAMES[key]
    # The closest names only: the whole list (about 60) on one line hides the one meant.
    suggestion = did_you_mean(key, OPTION_NAMES, n=3, cutoff=0.5)
    raise ConfigurationError(
        option="OPTIONS",
        value=str(name),
        reason=f"unknown option {name!r}"
        + (suggestion or " (docs/configuration.md lists every option)"),
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
        raise bad_value("LOCATION", type(url).__name__, "a URL must be a string")
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL"
        raise bad_value("LOCATION", redact_url(url), f"not a valid URL: {exc}") from None
    if parts.scheme not in ("sentinel", "sentinels"):
        raise bad_value("LOCATION", redact_url(url), 'a URL must use the "sentinel://" scheme')
    if parts.fragment or "@" in parts.path or any("@" in name for name, _ in query):
        # An unescaped "/", "?" or "#" in a password moves the rest of it (and the "@") into the
        # path, query or fragment, where it would end up as a master or option name.
        raise bad_value("LOCATION", redact_url(url), _URL_FORM)
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
        raise bad_value("LOCATION", redact_url(url), _URL_FORM) from None
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


def option_label(field: str) -> str:
    """``max_connections`` -> ``MAX_CONNECTIONS``; ``sentinel_kwargs.password`` -> ..."""
    side, dot, attr = field.partition(".")
    target = (
        {"connection_kwargs": CONNECTION, "sentinel_kwargs": SENTINEL}.get(side) if dot else None
    )
    wanted = (target, attr) if target else None
    for option, place in OPTION_NAMES.items():
        if place == wanted or (not dot and place[1] == field and place[0] in (POOL, field)):
            return option
    if dot and target:
        return f"{side.upper()}[{attr!r}]"
    return field.upper() if field.islower() and " " not in field else field
