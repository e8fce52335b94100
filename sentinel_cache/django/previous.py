"""``OPTIONS["PREVIOUS_CACHE"] = "<alias>"``: adopt the cache a site runs today without a cold
start (issue 25).

The alias names the old backend's entry, left in ``CACHES`` as it was (django-redis's
``DefaultClient``, ``SentinelClient`` or ``ShardClient``, Django's ``RedisCache``, any
``BaseCache``). While it is set:

* a miss (``get``, ``get_many``, ``has_key``) is read from the old backend itself (its key
  function, serializer, compressor, sharding), copied to the key's shard with its remaining
  TTL (``PTTL`` on the old server; a backend that cannot tell: this cache's default timeout),
  and deleted there; a key the old cache no longer has is read here again (another reader
  moved it meanwhile) before it is reported missing;
* the operations on an existing value adopt a missing key first: :data:`ADOPT_TO_READ`
  (``ttl``, ``pttl``) and :data:`ADOPT_FIRST` (``add``, ``incr``, ``touch``, ... which then
  also delete an old copy that could not be moved);
* :data:`MOVE_FIRST` (``set``, ``set_many``) move the old copies here first, then delete them
  there (a read between the two finds the copy here: it never misses a key the write
  replaces); :data:`FORGET_FIRST` (``delete``, ``delete_many``) only delete them; both through
  the old servers' own clients (django-redis's ``IGNORE_EXCEPTIONS`` would hide a failure: it
  fails the write instead), and leave tombstones; ``set`` with
  ``nx``/``xx`` (:data:`CONDITIONAL`) adopts first instead, as ``add`` does (an old value this
  cache cannot store is present to them: :data:`WHERE_ABSENT`); ``clear`` and ``delete_pattern`` empty the old cache of
  those keys first; so no stale or deleted value comes back
  (:mod:`sentinel_cache.core.admin.reshard.previous` holds the rules).

Each rule is declared once, in those tables, and wraps the methods (and their ``a`` twins,
the rule run in a thread) of a subclass the backend becomes only when the option is set
(:func:`adopting`): without it the backend's class is the plain one.
``sentinel_reshard --from-previous-cache`` empties the old cache (:meth:`AdoptingCache.adoption`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.core.cache import caches
from django.core.cache.backends.base import BaseCache, default_key_func
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import ImproperlyConfigured

from sentinel_cache.core.admin.reshard.previous import KEPT, Adopter, pttls_on
from sentinel_cache.core.ops.client import escape_pattern
from sentinel_cache.exceptions import ConfigurationError

__all__ = [
    "ADOPT_FIRST",
    "ADOPT_TO_READ",
    "CONDITIONAL",
    "FORGET_FIRST",
    "MOVE_FIRST",
    "WHERE_ABSENT",
    "OPTION",
    "SETTING",
    "DjangoPrevious",
    "adopting",
    "previous_option",
]

OPTION = "PREVIOUS_CACHE"
SETTING = f"OPTIONS[{OPTION!r}]"
#: The reads of an existing key's state: a key missing here is adopted first.
ADOPT_TO_READ = ("ttl", "pttl")
#: The writes on an existing value: a key missing here is adopted first, then an old copy that
#: could not be moved (its copy refused or failed) is deleted: it never outlives the write.
ADOPT_FIRST = (
    "add",
    "get_or_set",
    "get_or_set_many",
    "incr",
    "decr",
    "touch",
    "expire",
    "persist",
    "pexpire",
    "expire_at",
    "pexpire_at",
)
#: The operations that replace values: each old copy is moved here (the adoption's copy, its
#: TTL, never over a value here), then deleted there, then the write lands: a read between two
#: steps finds the old value or the new one, never a miss
#: (:meth:`~sentinel_cache.core.admin.reshard.previous.Adopter.move_then_forget`).
MOVE_FIRST = ("set", "set_many")
#: The operations that delete values: the old copies go first.
FORGET_FIRST = ("delete", "delete_many")
#: Those that, given one of these arguments, write only where the key is absent or present:
#: the old copy counts as present (as for ``add``), so they adopt first (:data:`ADOPT_FIRST`).
CONDITIONAL = {"set": ("nx", "xx")}
#: The writes only where a key is absent (with ``set(nx=True)``): an old value this cache's
#: serializer cannot store (held there, served by ``get``) is present to them too, so they
#: answer as for a present key without writing (``add`` and ``set(nx=True)`` False, the
#: ``get_or_set`` twins that value) and leave it there; ``set(xx=True)`` stores over it
#: (:meth:`~sentinel_cache.core.admin.reshard.previous.Adopter.adopt_to_write`).
WHERE_ABSENT = ("add", "get_or_set", "get_or_set_many")
_MISSING: Any = object()


def previous_option(options: Mapping[str, Any]) -> Any:
    """The ``PREVIOUS_CACHE`` value in ``OPTIONS`` (any case), None when not set."""
    for name, value in options.items():
        if str(name).upper() == OPTION:
            return value
    return None


def check_alias(value: Any) -> str:
    """The alias, or a ConfigurationError naming the option and the value."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(
            option=SETTING,
            value=value,
            reason=f"must name another entry of settings.CACHES (got {value!r})",
        )
    return value


def _is_django_redis(cache: Any) -> bool:
    return type(cache).__module__.startswith("django_redis") and hasattr(cache, "client")


class DjangoPrevious:
    """The old backend as the adoption reads it (see
    :class:`~sentinel_cache.core.admin.reshard.previous.PreviousCache`), at one ``version``."""

    def __init__(self, alias: str, cache: BaseCache, version: Any, default_ms: int | None) -> None:
        self.label = f"CACHES[{alias!r}]"
        self.cache = cache
        self.version = version
        self.default_ms = default_ms

    def read(self, keys: Sequence[Any]) -> dict[Any, Any]:
        return dict(self.cache.get_many(keys, version=self.version))

    def _stored(self, keys: Sequence[Any]) -> list[tuple[Any, list[tuple[Any, Any]]]] | None:
        """``[(server, [(key, stored key)])]``: the old server's own redis-py client holding
        each key (its key function, a ShardClient's sharding), or None for a backend whose
        servers are not known (not Redis)."""
        cache: Any = self.cache
        if isinstance(cache, RedisCache):  # one server takes its writes (a new client per call)
            made = [(key, cache.make_key(key, version=self.version)) for key in keys]
            return [(cache._cache.get_client(None, write=True), made)]
        if not _is_django_redis(cache):
            return None
        client = cache.client
        by_key = getattr(client, "get_server", None)  # ShardClient: the key's server
        servers: dict[int, tuple[Any, list[tuple[Any, Any]]]] = {}
        for key in keys:
            made = client.make_key(key, version=self.version)
            server = by_key(made) if by_key else client.get_client(write=True)
            servers.setdefault(id(server), (server, []))[1].append((key, made))
        return list(servers.values())

    def pttls(self, keys: Sequence[Any]) -> dict[Any, int | None]:
        """``PTTL`` on the old server holding each key (its own connections and key function);
        any other backend cannot tell: this cache's default timeout."""
        servers = self._stored(keys)
        if servers is None:
            return dict.fromkeys(keys, self.default_ms)
        return pttls_on(servers)

    def remove(self, keys: Sequence[Any]) -> None:
        """``DEL`` through the old servers' own clients, not the backend's ``delete_many``:
        django-redis with ``IGNORE_EXCEPTIONS`` returns 0 for a server it cannot reach, and the
        copy it did not delete would come back after our write. Any other backend: its own
        ``delete_many`` (its errors are its own)."""
        servers = self._stored(keys)
        if servers is None:
            self.cache.delete_many(list(keys), version=self.version)
            return
        for server, pairs in servers:
            server.delete(*[made for _, made in pairs])

    def clear(self, pattern: str | None) -> None:
        """As :meth:`remove`, through the old servers' own clients for Redis backends."""
        cache: Any = self.cache
        if pattern is None and not _is_django_redis(cache):
            cache.clear()
        elif pattern is None:  # django-redis's clear() is FLUSHDB on each server
            for _, server in self.servers():
                server.flushdb()
        else:
            full = self._pattern(pattern)  # refused for a backend that cannot list its keys
            for _, server in self.servers():
                for stored in server.scan_iter(match=full, count=1000):
                    server.delete(stored)

    def servers(self) -> Sequence[tuple[str, Any]]:
        cache: Any = self.cache
        if _is_django_redis(cache):
            client = cache.client
            by_name = getattr(client, "_serverdict", None)  # ShardClient: every server
            if by_name is not None:
                return [(f"{self.label} {name}", server) for name, server in by_name.items()]
            return [(self.label, client.get_client(write=True))]
        if isinstance(cache, RedisCache):
            return [(self.label, cache._cache.get_client(None, write=True))]
        raise ConfigurationError(
            option=SETTING,
            value=self.label,
            reason=f"its backend {type(cache).__name__} cannot list its keys (only django-redis "
            "and django.core.cache.backends.redis.RedisCache can be migrated; any backend is "
            "read through)",
        )

    def _pattern(self, search: str) -> str:
        cache: Any = self.cache
        if _is_django_redis(cache):
            return str(cache.client.make_pattern(search, version=self.version))
        if cache.key_func is not default_key_func:
            raise ConfigurationError(
                option="KEY_FUNCTION",
                value=self.label,
                reason="the previous cache has a custom KEY_FUNCTION: its keys cannot be "
                "listed by pattern (use django-redis with its REVERSE_KEY_FUNCTION)",
            )
        version = cache.version if self.version is None else self.version
        self.servers()  # refused before anything is scanned
        return f"{escape_pattern(cache.key_prefix)}:{escape_pattern(str(version))}:{search}"

    def pattern(self) -> str:
        return self._pattern("*")

    def key_of(self, stored: bytes) -> Any:
        text = stored.decode() if isinstance(stored, bytes) else str(stored)
        cache: Any = self.cache
        if _is_django_redis(cache):
            return cache.client.reverse_key(text)
        return text.split(":", 2)[2]


class AdoptingCache:
    """What the backend gains while ``PREVIOUS_CACHE`` is set (mixed in before it)."""

    previous_alias: str
    key_prefix: str
    _plain: Any  # the backend's own class, whose methods the rules wrap
    _previous: BaseCache | None = None

    @property
    def previous_cache(self) -> BaseCache:
        """The old backend, ``caches[alias]``; ImproperlyConfigured naming the option if the
        alias is unknown or names a cache that adopts from another one itself."""
        if self._previous is None:
            cache: Any = self
            _ = cache.pool_config  # the settings' own error first (the alias is read after them)
            alias = self.previous_alias
            try:
                cache = caches[alias]
            except Exception as exc:  # InvalidCacheBackendError, or the backend's own error
                raise ImproperlyConfigured(
                    f"OPTIONS[{OPTION!r}] = {alias!r}: no usable cache of that alias ({exc})"
                ) from exc
            if isinstance(cache, AdoptingCache):
                raise ImproperlyConfigured(
                    f"OPTIONS[{OPTION!r}] = {alias!r} names a cache that adopts from "
                    f"{cache.previous_alias!r} itself: finish that adoption first"
                )
            self._previous = cache
        return self._previous

    def adoption(self, version: Any = None) -> tuple[Adopter, DjangoPrevious]:
        """The rules' engine and the old cache at ``version`` (``sentinel_reshard
        --from-previous-cache`` runs the migration on them)."""
        cache: Any = self
        adopter = Adopter(cache.client, lambda key: cache.make_and_validate_key(key, version))
        timeout = cache.default_timeout
        previous = DjangoPrevious(
            self.previous_alias,
            self.previous_cache,
            version,
            None if timeout is None else max(1, int(timeout * 1000)),
        )
        return adopter, previous

    def adopt(self, keys: Sequence[Any], version: Any = None) -> dict[Any, Any]:
        """Keys missing here, read from the previous cache and copied: the values found (a key
        the previous cache no longer has is read here again: a concurrent reader moved it)."""
        adopter, previous = self.adoption(version)
        found, _ = adopter.adopt(previous, keys, strict=False, recheck=True)
        return found

    def _missing(self, keys: Sequence[Any], version: Any) -> list[Any]:
        """The keys this cache does not have (its own reads, not the adopting ones)."""
        base: Any = self._plain
        if len(keys) == 1:
            return [] if base.has_key(self, keys[0], version) else list(keys)
        found = base.get_many(self, keys, version)
        return [key for key in keys if key not in found]

    def _adopt_missing(self, keys: Sequence[Any], version: Any) -> list[Any]:
        """The keys missing here adopted; returns those the old cache still holds (their copy
        was refused or failed)."""
        missing = self._missing(keys, version)
        if not missing:
            return []
        adopter, previous = self.adoption(version)
        _, outcomes = adopter.adopt(previous, missing, strict=False)
        return [key for key, (_, outcome) in outcomes.items() if outcome in KEPT]

    def _adopt_to_write(
        self, keys: Sequence[Any], version: Any, keep_held: bool = False
    ) -> dict[Any, Any]:
        """The keys missing here adopted, then the old copies that could not be moved deleted;
        returns the old values this cache cannot store (present; ``keep_held``: left there)."""
        missing = self._missing(keys, version)
        if not missing:
            return {}
        adopter, previous = self.adoption(version)
        return adopter.adopt_to_write(previous, missing, keep_held=keep_held)

    def _move_then_forget(self, keys: Sequence[Any], version: Any) -> None:
        adopter, previous = self.adoption(version)
        adopter.move_then_forget(previous, keys)

    def _forget(self, keys: Sequence[Any], version: Any) -> None:
        adopter, previous = self.adoption(version)
        adopter.forget(previous, keys)

    def _cleared(self, pattern: str | None, version: Any = None) -> None:
        adopter, previous = self.adoption(version)
        adopter.cleared(previous, pattern)

    # -- the reads: served from the previous cache on a miss ----------------------------------
    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        value = self._plain.get(self, key, _MISSING, version)
        if value is not _MISSING:
            return value
        return self.adopt([key], version).get(key, default)

    async def aget(self, key: Any, default: Any = None, version: Any = None) -> Any:
        value = await self._plain.aget(self, key, _MISSING, version)
        if value is not _MISSING:
            return value
        found = await sync_to_async(self.adopt)([key], version)
        return found.get(key, default)

    def get_many(self, keys: Any, version: Any = None) -> dict[Any, Any]:
        keys = list(keys)
        found: dict[Any, Any] = self._plain.get_many(self, keys, version)
        missing = [key for key in keys if key not in found]
        if missing:
            found.update(self.adopt(missing, version))
        return found

    async def aget_many(self, keys: Any, version: Any = None) -> dict[Any, Any]:
        keys = list(keys)
        found: dict[Any, Any] = await self._plain.aget_many(self, keys, version)
        missing = [key for key in keys if key not in found]
        if missing:
            found.update(await sync_to_async(self.adopt)(missing, version))
        return found

    def has_key(self, key: Any, version: Any = None) -> bool:
        if self._plain.has_key(self, key, version):
            return True
        return key in self.adopt([key], version)

    async def ahas_key(self, key: Any, version: Any = None) -> bool:
        if await self._plain.ahas_key(self, key, version):
            return True
        return key in await sync_to_async(self.adopt)([key], version)

    # -- the whole cache ----------------------------------------------------------------------
    def clear(self) -> Any:
        self._cleared(None)
        done = self._plain.clear(self)
        if not self.key_prefix:  # FLUSHDB took the mark too
            self.adoption()[0].mark_cleared()
        return done

    async def aclear(self) -> Any:
        return await sync_to_async(self.clear)()

    def delete_pattern(self, pattern: str, version: Any = None, **kwargs: Any) -> Any:
        self._cleared(pattern, version)
        return self._plain.delete_pattern(self, pattern, version, **kwargs)

    async def adelete_pattern(self, pattern: str, version: Any = None, **kwargs: Any) -> Any:
        await sync_to_async(self._cleared)(pattern, version)
        return await self._plain.adelete_pattern(self, pattern, version, **kwargs)


def _ruled(
    plain: type, name: str, rule: Callable[[Any, Sequence[Any], Any], object]
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``name`` and its ``a`` twin of ``plain``, with ``rule(self, keys, version)`` first (the
    twin runs the rule in a thread); a call given one of its :data:`CONDITIONAL` arguments
    adopts first instead, and a write only where absent (:data:`WHERE_ABSENT`) is answered
    without writing when the old value is present but cannot be stored here."""
    sync, asynchronous = getattr(plain, name), getattr(plain, f"a{name}")
    signature = inspect.signature(sync)
    first = list(signature.parameters)[1]  # key, keys, data or defaults

    def split(args: Any, kwargs: Any) -> tuple[list[Any], Any, inspect.BoundArguments]:
        bound = signature.bind(None, *args, **kwargs)
        given = bound.arguments[first]
        if first == "key":
            keys = [given]
        elif isinstance(given, Mapping):
            keys = list(given)
        else:  # an iterator is read once: the method gets the list
            keys = bound.arguments[first] = list(given)
        return keys, bound.arguments.get("version"), bound

    def before(
        self: Any, keys: list[Any], version: Any, bound: inspect.BoundArguments
    ) -> tuple[Any, dict[Any, Any]]:
        """The rule applied: (the call's answer, or _MISSING to run it; the held values)."""
        absent = name in WHERE_ABSENT or bool(bound.arguments.get("nx"))
        present = bool(bound.arguments.get("xx")) and not absent
        if not (absent or present):
            rule(self, keys, version)
            return _MISSING, {}
        held = AdoptingCache._adopt_to_write(self, keys, version, keep_held=absent)
        if not held:
            return _MISSING, held
        if present:  # set(xx=True): the key is present, its old copy deleted: stored
            bound.arguments["xx"] = False
            return _MISSING, held
        if name == "get_or_set":
            return held[keys[0]], held
        if name == "get_or_set_many":
            rest = {key: value for key, value in bound.arguments[first].items() if key not in held}
            if not rest:
                return {key: held[key] for key in keys}, held
            bound.arguments[first] = rest
            return _MISSING, held
        return False, held  # add, set(nx=True)

    def after(result: Any, keys: list[Any], held: dict[Any, Any]) -> Any:
        if name != "get_or_set_many" or not held:
            return result
        return {
            key: held[key] if key in held else result[key]
            for key in keys
            if key in result or key in held
        }

    @functools.wraps(sync)
    def ruled(self: Any, *args: Any, **kwargs: Any) -> Any:
        keys, version, bound = split(args, kwargs)
        answer, held = before(self, keys, version, bound)
        if answer is not _MISSING:
            return answer
        return after(sync(self, *bound.args[1:], **bound.kwargs), keys, held)

    @functools.wraps(asynchronous)
    async def aruled(self: Any, *args: Any, **kwargs: Any) -> Any:
        keys, version, bound = split(args, kwargs)
        answer, held = await sync_to_async(before)(self, keys, version, bound)
        if answer is not _MISSING:
            return answer
        return after(await asynchronous(self, *bound.args[1:], **bound.kwargs), keys, held)

    return ruled, aruled


_ADOPTING: dict[type, type] = {}


def adopting(plain: type) -> type:
    """``plain`` (the backend's class) with the two rules: what the backend becomes while
    ``PREVIOUS_CACHE`` is set."""
    namespace: dict[str, Any] = {"_plain": plain, "__module__": __name__}
    for names, rule in (
        (ADOPT_TO_READ, AdoptingCache._adopt_missing),
        (ADOPT_FIRST, AdoptingCache._adopt_to_write),
        (MOVE_FIRST, AdoptingCache._move_then_forget),
        (FORGET_FIRST, AdoptingCache._forget),
    ):
        for name in names:
            namespace[name], namespace[f"a{name}"] = _ruled(plain, name, rule)
    made = _ADOPTING.get(plain)
    if made is None:
        made = _ADOPTING[plain] = type(
            f"Adopting{plain.__name__}", (AdoptingCache, plain), namespace
        )
    return made
