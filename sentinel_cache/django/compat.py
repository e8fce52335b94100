"""The settings a django-redis project brings along: translated into this library's, or refused
with the replacement named (``get_redis_connection`` is in :mod:`sentinel_cache.django.connection`).

django-redis takes ``IGNORE_EXCEPTIONS`` from a cache's ``OPTIONS`` or, when the cache does not
set it, from the global ``DJANGO_REDIS_IGNORE_EXCEPTIONS``; it logs every ignored exception
when the global ``DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS`` is true, on the logger named by
``DJANGO_REDIS_LOGGER``; ``delete_pattern`` scans ``DJANGO_REDIS_SCAN_ITERSIZE`` keys at a time.
Here, translated into this library's options before the core parses them:

* ``IGNORE_EXCEPTIONS``: the cache's option, else the global (django-redis's precedence).
* ``LOG_IGNORED_EXCEPTIONS`` (the cache's option, which django-redis's own tests set; else the
  global): True logs every ignored exception (``LOG_IGNORED_EXCEPTIONS_INTERVAL`` 0; a cache
  that sets an interval keeps it). False cannot silence them: they are always logged, at most
  once per shard every ``LOG_IGNORED_EXCEPTIONS_INTERVAL`` seconds, and the system check says
  so (``sentinel_cache.W005``).
* ``DJANGO_REDIS_LOGGER``: the logger the ignored exceptions are logged on.
* ``DJANGO_REDIS_SCAN_ITERSIZE``: ``delete_pattern``'s default ``itersize``.

Any other ``DJANGO_REDIS_*`` global is reported by the system check (``sentinel_cache.W004``);
django-redis's serializer and compressor classes become this library's names for the same
format; a django-redis-only option in ``OPTIONS`` is refused naming what replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sentinel_cache.exceptions import ConfigurationError

__all__ = [
    "HONOURED_GLOBALS",
    "NO_EFFECT_GLOBALS",
    "Translated",
    "log_every_ignored",
    "translate_options",
]

#: The django-redis globals this backend reads, as django-redis reads them.
HONOURED_GLOBALS = frozenset(
    {
        "DJANGO_REDIS_IGNORE_EXCEPTIONS",
        "DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS",
        "DJANGO_REDIS_LOGGER",
        "DJANGO_REDIS_SCAN_ITERSIZE",
    }
)

#: django-redis globals that mean nothing here, and why (the system check reports them, and
#: any other ``DJANGO_REDIS_*``).
NO_EFFECT_GLOBALS: Mapping[str, str] = {
    "DJANGO_REDIS_CLOSE_CONNECTION": (
        "close() does nothing per request: connections are pooled by the process-wide core"
    ),
    "DJANGO_REDIS_CONNECTION_FACTORY": (
        "connections are made by the sharded Sentinel pool; their keyword arguments go in "
        "OPTIONS['CONNECTION_KWARGS']"
    ),
    "CACHE_HERD_TIMEOUT": "it is django-redis's HerdClient's, and there is no herd client here",
}

_OWN_POOLS = (
    "the pools and clients are the sharded Sentinel pool's own; the connections' keyword "
    "arguments go in CONNECTION_KWARGS"
)
#: django-redis OPTIONS that have no meaning here -> what replaces them.
DJANGO_REDIS_OPTIONS: Mapping[str, str] = {
    "CLIENT_CLASS": "not needed: sharding and Sentinel are built in; remove it",
    "CONNECTION_POOL_KWARGS": (
        "give max_connections as MAX_CONNECTIONS and the other keyword arguments as "
        "CONNECTION_KWARGS"
    ),
    "CONNECTION_POOL_CLASS": _OWN_POOLS,
    "CONNECTION_FACTORY": _OWN_POOLS,
    "REDIS_CLIENT_CLASS": _OWN_POOLS,
    "REDIS_CLIENT_KWARGS": _OWN_POOLS,
    "PARSER_CLASS": _OWN_POOLS,
    "SENTINELS": "the sentinels are LOCATION here (and the master names MASTERS)",
    "CLOSE_CONNECTION": (
        "not needed: close() does nothing per request (the core's pools are shared by the "
        "process); remove it"
    ),
    "REPLICA_READ_ONLY": "replica reads are READ_FROM_REPLICAS here",
    "PICKLE_VERSION": (
        "not an option here: values are pickled with pickle.HIGHEST_PROTOCOL (those "
        "django-redis pickled are still read)"
    ),
}

#: django-redis's serializer and compressor classes -> this library's name for the same format
#: (None: no compression). The stored bytes are framed differently: a new KEY_PREFIX still
#: starts the cache cold (docs/migration.md).
DJANGO_REDIS_CODECS: Mapping[str, Mapping[str, str | None]] = {
    "SERIALIZER": {
        "django_redis.serializers.pickle.PickleSerializer": "pickle",
        "django_redis.serializers.json.JSONSerializer": "json",
        "django_redis.serializers.msgpack.MSGPackSerializer": "msgpack",
    },
    "COMPRESSOR": {
        "django_redis.compressors.zlib.ZlibCompressor": "zlib",
        "django_redis.compressors.zstd.ZStdCompressor": "zstd",
        "django_redis.compressors.identity.IdentityCompressor": None,
    },
}

_UNSET: Any = object()


@dataclass(frozen=True)
class Translated:
    """A cache's OPTIONS in this library's terms, and what the adapter itself takes from the
    django-redis globals."""

    options: dict[str, Any]
    logger: logging.Logger | None  # DJANGO_REDIS_LOGGER's; None: the adapter's own
    scan_itersize: int | None  # DJANGO_REDIS_SCAN_ITERSIZE; None: the core's SCAN_COUNT


def _find(options: Mapping[str, Any], name: str) -> str | None:
    """The key of ``options`` that names ``name`` (the core reads option names in any case)."""
    for key in options:
        if str(key).upper() == name:
            return str(key)
    return None


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(
            option=name, value=value, reason=f"must be True or False (got {value!r})"
        )
    return value


def log_every_ignored(options: Mapping[str, Any], settings: Any) -> tuple[bool, str] | None:
    """The django-redis logging switch that applies to a cache, and where it was set:
    ``OPTIONS["LOG_IGNORED_EXCEPTIONS"]``, else ``settings.DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS``;
    None when neither is set."""
    key = _find(options, "LOG_IGNORED_EXCEPTIONS")
    if key is not None:
        return _flag("LOG_IGNORED_EXCEPTIONS", options[key]), "OPTIONS['LOG_IGNORED_EXCEPTIONS']"
    value = getattr(settings, "DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS", _UNSET)
    if value is _UNSET:
        return None
    name = "DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS"
    return _flag(name, value), f"settings.{name}"


def translate_options(options: Mapping[str, Any], settings: Any) -> Translated:
    """``options`` (a cache's OPTIONS, Django's own already removed) with the django-redis
    settings made into this library's; ConfigurationError naming the setting for a bad value
    or a django-redis-only option."""
    translated = dict(options)
    for key in translated:
        hint = DJANGO_REDIS_OPTIONS.get(str(key).upper())
        if hint is not None:
            raise ConfigurationError(
                option=str(key), value=translated[key], reason=f"a django-redis option; {hint}"
            )
    for option, names in DJANGO_REDIS_CODECS.items():
        given = _find(translated, option)
        value = None if given is None else translated[given]
        if given is None or not isinstance(value, str) or not value.startswith("django_redis."):
            continue
        if value not in names:
            choices = " or ".join(f'"{n}"' for n in names.values() if n)
            raise ConfigurationError(
                option=given,
                value=value,
                reason=f"django-redis's {value.rpartition('.')[2]} has no equivalent here; "
                f"use {choices} (got {value!r})",
            )
        if names[value] is None:
            del translated[given]
        else:
            translated[given] = names[value]
    if _find(translated, "IGNORE_EXCEPTIONS") is None:
        ignore = getattr(settings, "DJANGO_REDIS_IGNORE_EXCEPTIONS", _UNSET)
        if ignore is not _UNSET:
            translated["IGNORE_EXCEPTIONS"] = _flag("DJANGO_REDIS_IGNORE_EXCEPTIONS", ignore)
    switch = log_every_ignored(translated, settings)
    own = _find(translated, "LOG_IGNORED_EXCEPTIONS")
    if own is not None:
        del translated[own]
    interval = _find(translated, "LOG_IGNORED_EXCEPTIONS_INTERVAL")
    if switch is not None and switch[0]:
        if own is not None and interval is not None:
            raise ConfigurationError(
                option="LOG_IGNORED_EXCEPTIONS",
                value=True,
                reason=(
                    "True logs every ignored exception, which contradicts "
                    f"LOG_IGNORED_EXCEPTIONS_INTERVAL={translated[interval]!r}; keep one"
                ),
            )
        if interval is None:
            translated["LOG_IGNORED_EXCEPTIONS_INTERVAL"] = 0
    name = getattr(settings, "DJANGO_REDIS_LOGGER", _UNSET)
    if name is not _UNSET and (not isinstance(name, str) or not name):
        raise ConfigurationError(
            option="DJANGO_REDIS_LOGGER",
            value=name,
            reason=f"must be a logger's name (got {name!r})",
        )
    itersize = getattr(settings, "DJANGO_REDIS_SCAN_ITERSIZE", _UNSET)
    if itersize is not _UNSET and (
        isinstance(itersize, bool) or not isinstance(itersize, int) or itersize < 1
    ):
        raise ConfigurationError(
            option="DJANGO_REDIS_SCAN_ITERSIZE",
            value=itersize,
            reason=f"must be a positive integer (got {itersize!r})",
        )
    return Translated(
        options=translated,
        logger=None if name is _UNSET else logging.getLogger(name),
        scan_itersize=None if itersize is _UNSET else itersize,
    )
