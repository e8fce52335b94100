"""``CACHE_OPTIONS={"PREVIOUS_CACHE": {...}}``: adopt the Flask-Caching cache an app runs today
without a cold start (issue 25), as the Django backend's ``PREVIOUS_CACHE`` does.

The value is the Flask-Caching configuration being replaced, as it was (``CACHE_TYPE``,
``CACHE_REDIS_URL`` or ``CACHE_REDIS_HOST``/``PORT``/``DB``/``PASSWORD``, ``CACHE_KEY_PREFIX``,
``CACHE_OPTIONS``, ...): the old backend is built from it by Flask-Caching itself, on an app of
its own (nothing of the app's config leaks in), so its key prefix and serializer are its own.
While it is set:

* a miss (``get``, ``get_many``, ``has``; and first, for ``add``, ``inc``, ``dec`` and
  ``get_or_set_many``, which then also delete an old copy that could not be moved) is read
  from the old backend, copied to the key's shard with its remaining TTL (a Redis backend's
  ``PTTL``; any other: ``CACHE_DEFAULT_TIMEOUT``), and deleted there; a key the old backend
  no longer has is read here again (another reader moved it meanwhile) before it is a miss;
* ``set`` and ``set_many`` (:data:`MOVE_FIRST`) move the old copies here first, then delete
  them there (a read between the two finds the copy here); ``delete``, ``delete_many`` and
  ``unlink`` (:data:`FORGET_FIRST`) only delete them; both through a Redis backend's own
  client (a failure fails the write), leaving tombstones; ``clear`` empties the old cache
  first.

``flask sentinel-reshard --from-previous-cache`` empties it. The rules are the core's
(:mod:`sentinel_cache.core.admin.reshard.previous`), declared once in :data:`ADOPT_FIRST`,
:data:`MOVE_FIRST` and :data:`FORGET_FIRST`; without the option the backend's class is the plain
one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sentinel_cache.core.admin.reshard.previous import Adopter, pttls_on
from sentinel_cache.core.ops.client import escape_pattern
from sentinel_cache.exceptions import ConfigurationError

__all__ = [
    "ADOPT_FIRST",
    "FORGET_FIRST",
    "MOVE_FIRST",
    "OPTION",
    "SETTING",
    "WHERE_ABSENT",
    "FlaskPrevious",
    "adopting",
    "build_previous",
]

OPTION = "PREVIOUS_CACHE"
#: The writes on an existing value: adopted first (see :meth:`AdoptingCache._adopt_to_write`).
ADOPT_FIRST = ("add", "inc", "dec", "get_or_set_many")
#: Those that write only where a key is absent: an old value this cache's serializer cannot
#: store (held there, served by ``get``) is present to them, so they answer without writing
#: (``add`` False, ``get_or_set_many`` that value) and leave it there.
WHERE_ABSENT = ("add", "get_or_set_many")
#: The writes that replace values: each old copy moved here first, then deleted there, then
#: the write (a read between two steps finds the old value or the new one, never a miss:
#: :meth:`~sentinel_cache.core.admin.reshard.previous.Adopter.move_then_forget`).
MOVE_FIRST = ("set", "set_many")
#: The deletes: the old copies deleted first (tombstones left).
FORGET_FIRST = ("delete", "delete_many", "unlink")
SETTING = f"CACHE_OPTIONS[{OPTION!r}]"


def build_previous(config: Any) -> Any:
    """The old Flask-Caching backend, built by Flask-Caching from its configuration on an app
    of its own; a ConfigurationError naming the setting if it cannot be."""
    if not isinstance(config, Mapping) or not config.get("CACHE_TYPE"):
        # Only the keys are shown: the values may hold passwords.
        shown = f"a dict of {sorted(map(str, config))}" if isinstance(config, Mapping) else config
        raise ConfigurationError(
            option=SETTING,
            value=shown,
            reason="must be the Flask-Caching configuration being replaced, a dict with its "
            f"CACHE_TYPE (got {shown!r})",
        )
    from flask import Flask
    from flask_caching import Cache

    app = Flask("sentinel_cache.previous")
    app.config.update(config)
    try:
        cache = Cache(app)
    except Exception as exc:  # whatever the old backend raises about its own settings
        raise ConfigurationError(
            option=SETTING, value=config.get("CACHE_TYPE"), reason=f"{type(exc).__name__}: {exc}"
        ) from exc
    backend = app.extensions["cache"][cache]
    if hasattr(backend, "core"):
        raise ConfigurationError(
            option=SETTING,
            value=config.get("CACHE_TYPE"),
            reason="names a sentinel_cache backend: move between shard sets with "
            "PREVIOUS_MASTERS instead",
        )
    return backend


def _is_redis(cache: Any) -> bool:
    """A cachelib/Flask-Caching Redis backend: its clients and key prefix are known."""
    return hasattr(cache, "_write_client") and hasattr(cache, "_get_prefix")


class FlaskPrevious:
    """The old backend as the adoption reads it (see
    :class:`~sentinel_cache.core.admin.reshard.previous.PreviousCache`)."""

    def __init__(self, cache: Any, default_ms: int | None) -> None:
        self.label = f"the previous {type(cache).__name__}"
        self.cache = cache
        self.default_ms = default_ms

    def read(self, keys: Sequence[Any]) -> dict[Any, Any]:
        values = self.cache.get_many(*keys)  # None: missing (cachelib's miss)
        return {key: value for key, value in zip(keys, values, strict=True) if value is not None}

    def pttls(self, keys: Sequence[Any]) -> dict[Any, int | None]:
        if not _is_redis(self.cache):
            return dict.fromkeys(keys, self.default_ms)
        prefix = self.cache._get_prefix()
        return pttls_on([(self.cache._write_client, [(key, f"{prefix}{key}") for key in keys])])

    def remove(self, keys: Sequence[Any]) -> None:
        """``DEL`` through the Redis backend's own client (cachelib's ``delete_many`` ignores
        errors by default, and a copy it did not delete would come back); any other backend:
        its own ``delete_many``."""
        if not _is_redis(self.cache):
            self.cache.delete_many(*keys)
            return
        prefix = self.cache._get_prefix()
        self.cache._write_client.delete(*[f"{prefix}{key}" for key in keys])

    def clear(self, pattern: str | None) -> None:
        self.cache.clear()

    def servers(self) -> Sequence[tuple[str, Any]]:
        if not _is_redis(self.cache):
            raise ConfigurationError(
                option=SETTING,
                value=type(self.cache).__name__,
                reason="this backend cannot list its keys (only the Redis backends can be "
                "migrated; any backend is read through)",
            )
        return [(self.label, self.cache._write_client)]

    def pattern(self) -> str:
        return f"{escape_pattern(self.cache._get_prefix())}*"

    def key_of(self, stored: bytes) -> Any:
        text = stored.decode() if isinstance(stored, bytes) else str(stored)
        return text[len(self.cache._get_prefix()) :]


class AdoptingCache:
    """What the Flask backend gains while ``PREVIOUS_CACHE`` is set (mixed in before it)."""

    previous_cache: Any
    _plain: Any

    def adoption(self) -> tuple[Adopter, FlaskPrevious]:
        """The rules' engine and the old cache (``flask sentinel-reshard
        --from-previous-cache`` runs the migration on them)."""
        cache: Any = self
        seconds = cache.default_timeout
        previous = FlaskPrevious(self.previous_cache, seconds * 1000 if seconds else None)
        return Adopter(cache.client, cache._key), previous

    def adopt(self, keys: Sequence[Any]) -> dict[Any, Any]:
        """Keys missing here, read from the previous cache and copied: the values found."""
        adopter, previous = self.adoption()
        return adopter.adopt(previous, keys, strict=False, recheck=True)[0]

    def _adopt_to_write(self, keys: Sequence[Any], keep_held: bool = False) -> dict[Any, Any]:
        """The keys missing here adopted, then the old copies that could not be moved (their
        copy refused or failed) deleted: none outlives the write that follows. Returns the old
        values this cache's serializer cannot store (present; ``keep_held``: left there)."""
        found = self._plain.get_many(self, *keys)
        missing = [key for key, value in zip(keys, found, strict=True) if value is None]
        if not missing:
            return {}
        adopter, previous = self.adoption()
        return adopter.adopt_to_write(previous, missing, keep_held=keep_held)

    def _move_then_forget(self, keys: Sequence[Any]) -> None:
        adopter, previous = self.adoption()
        adopter.move_then_forget(previous, keys)

    def _forget(self, keys: Sequence[Any]) -> None:
        adopter, previous = self.adoption()
        adopter.forget(previous, keys)

    def get(self, key: str) -> Any:
        value = self._plain.get(self, key)
        return self.adopt([key]).get(key) if value is None else value

    def get_many(self, *keys: str) -> list[Any]:
        values = self._plain.get_many(self, *keys)
        missing = [key for key, value in zip(keys, values, strict=True) if value is None]
        if not missing:
            return list(values)
        found = self.adopt(missing)
        return [
            found.get(key) if value is None else value
            for key, value in zip(keys, values, strict=True)
        ]

    def has(self, key: str) -> bool:
        return bool(self._plain.has(self, key)) or key in self.adopt([key])

    def clear(self) -> bool:
        adopter, previous = self.adoption()
        adopter.cleared(previous, None)
        done = bool(self._plain.clear(self))
        if not self._plain.resolved_prefix(self):  # FLUSHDB took the mark too
            adopter.mark_cleared()
        return done


def _keys_of(args: tuple[Any, ...], kwargs: Mapping[str, Any], name: str) -> list[Any]:
    """The keys a call names: ``*keys`` (delete_many, unlink), a mapping (set_many,
    get_or_set_many), or the one key."""
    if name in ("delete_many", "unlink"):
        return list(args)
    if name in ("set_many", "get_or_set_many"):
        given = args[0] if args else kwargs.get("mapping", kwargs.get("defaults", {}))
        return list(given)
    return [args[0] if args else kwargs["key"]]


def _ruled(plain: type, name: str, rule: Callable[[Any, Sequence[Any]], object]) -> Any:
    method = getattr(plain, name)

    @functools.wraps(method)
    def ruled(self: Any, *args: Any, **kwargs: Any) -> Any:
        keys = _keys_of(args, kwargs, name)
        if not keys:
            return method(self, *args, **kwargs)
        if name not in WHERE_ABSENT:
            rule(self, keys)
            return method(self, *args, **kwargs)
        held = AdoptingCache._adopt_to_write(self, keys, keep_held=True)
        if not held:
            return method(self, *args, **kwargs)
        if name == "add":
            return False
        defaults = args[0] if args else kwargs.pop("defaults")  # get_or_set_many
        rest = {key: value for key, value in defaults.items() if key not in held}
        found = method(self, rest, *args[1:], **kwargs) if rest else {}
        return {
            key: held[key] if key in held else found[key]
            for key in keys
            if key in held or key in found
        }

    return ruled


_ADOPTING: dict[type, type] = {}


def adopting(plain: type) -> type:
    """``plain`` (the Flask backend's class) with the two rules."""
    namespace: dict[str, Any] = {"_plain": plain, "__module__": __name__}
    for names, rule in (
        (ADOPT_FIRST, AdoptingCache._adopt_to_write),
        (MOVE_FIRST, AdoptingCache._move_then_forget),
        (FORGET_FIRST, AdoptingCache._forget),
    ):
        for name in names:
            namespace[name] = _ruled(plain, name, rule)
    made = _ADOPTING.get(plain)
    if made is None:
        made = _ADOPTING[plain] = type(
            f"Adopting{plain.__name__}", (AdoptingCache, plain), namespace
        )
    return made
