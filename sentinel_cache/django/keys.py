"""How the backend makes, checks and reads back its keys (the prefix and version, Django's key
rules, the glob patterns of django-redis's extras), and the key functions for
``CACHES[...]["KEY_FUNCTION"]``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.cache.backends.base import BaseCache, InvalidCacheKey, default_key_func

from sentinel_cache.core.arguments import check_key
from sentinel_cache.core.ops.client import escape_pattern
from sentinel_cache.exceptions import ArgumentValueError


def plain_key(key: Any, key_prefix: str, version: Any) -> str:
    """The key as given, with neither prefix nor version: what another program (a Java service
    through Jedis) calls the same entry. ``KEY_PREFIX`` and ``VERSION`` then mean nothing, and
    ``clear()`` without a prefix empties every shard's database."""
    return str(key)


def _quiet(key: str) -> bool:
    """A key Django's ``validate_key`` would not warn about: at most 250 characters
    (MEMCACHE_MAX_KEY_LENGTH), none of them a control character, space or DEL. Three C calls
    instead of Django's generator (~2 us per key); ``isprintable`` also refuses a few characters
    Django accepts, which then take Django's own check."""
    return len(key) <= 250 and key.isprintable() and " " not in key


class InvalidKeyError(InvalidCacheKey, ArgumentValueError):
    """A key that cannot be stored (not valid Unicode): Django's ``InvalidCacheKey``, as its
    memcached backends raise for their keys, and the core's key error."""


class KeyMethods(BaseCache):
    """Keys made and checked once per call, with a fast path for the usual key."""

    #: Set by the backend: its class keeps Django's ``make_key`` and this ``validate_key``, so
    #: keys are formatted here (with the default KEY_FUNCTION, checked per call).
    _own_key_rules: bool

    def validate_key(self, key: Any) -> None:
        """Django's check (memcached-unsafe keys warn), with a fast path for the usual key."""
        if type(key) is str and _quiet(key):
            return
        super().validate_key(key)
        try:
            check_key(key)
        except ArgumentValueError as exc:
            raise InvalidKeyError(exc.argument, exc.value, exc.reason) from None

    def make_and_validate_key(self, key: Any, version: Any = None) -> str:
        """Django's, in one step for the usual key (a near-cache hit is a few microseconds)."""
        if type(key) is str and self._own_key_rules and self.key_func is default_key_func:
            made = f"{self.key_prefix}:{self.version if version is None else version}:{key}"
            if len(made) <= 250 and made.isprintable() and " " not in made:  # _quiet, inline
                return made
        return super().make_and_validate_key(key, version=version)

    def _key_map(self, keys: Iterable[Any], version: int | None) -> dict[str, Any]:
        """Stored key -> caller's key; with the default key rules the prefix and version are
        formatted once per call, not once per key."""
        if not (self._own_key_rules and self.key_func is default_key_func):
            return {self.make_and_validate_key(key, version=version): key for key in keys}
        head = f"{self.key_prefix}:{self.version if version is None else version}:"
        made: dict[str, Any] = {}
        for key in keys:
            final = head + (key if type(key) is str else str(key))
            # _quiet, inline: a call per key is a tenth of a 10-key get_many's Django work
            if not (len(final) <= 250 and final.isprintable() and " " not in final):
                self.validate_key(final)
            made[final] = key
        return made

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
