"""A key's expiry on the sharded backend, each a declaration: Django's ``touch`` and
django-redis's ``ttl``, ``pttl``, ``expire``, ``pexpire``, ``expire_at``, ``pexpire_at`` and
``persist`` (their names, arguments and results), with their ``a`` twins."""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from sentinel_cache.core.arguments import epoch_ms
from sentinel_cache.django.hashes import no_client
from sentinel_cache.django.operations import operation


def _whole_seconds(seconds: float | None) -> int | None:
    """The core's seconds left (PTTL's milliseconds / 1000) rounded as Redis's ``TTL`` rounds
    them, ``(ms + 500) // 1000``: what django-redis returns."""
    return None if seconds is None else int(seconds + 0.5)


class ExpiryMethods(BaseCache):
    """How long a key lives: read it, set it, remove it."""

    def _touch(
        self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None
    ) -> tuple[Any, ...]:
        return (self.make_and_validate_key(key, version=version), self.get_backend_timeout(timeout))

    def _ttl(self, key: Any, version: Any = None) -> tuple[Any, ...]:
        """Whole seconds left, rounded as Redis's ``TTL`` rounds (django-redis returns that);
        None if the key never expires; 0 if it does not exist."""
        return (self.make_and_validate_key(key, version=version),)

    def _pttl(self, key: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        """Milliseconds left; None if the key never expires; 0 if it does not exist."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version),)

    def _pexpire(
        self, key: Any, timeout: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        """Expire in ``timeout`` milliseconds (django-redis's); False if the key is missing."""
        no_client(client)
        if timeout is DEFAULT_TIMEOUT:
            timeout = None if self.default_timeout is None else int(self.default_timeout * 1000)
        return (self.make_and_validate_key(key, version=version), timeout)

    def _expire_at(
        self, key: Any, when: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        """Expire at ``when``: a datetime (naive: local time, as redis-py takes it) or seconds
        since 1970; False if the key is missing."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version), epoch_ms("when", when, 1000))

    def _pexpire_at(
        self, key: Any, when: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        """Expire at ``when``: a datetime or milliseconds since 1970; False if missing."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version), epoch_ms("when", when, 1))

    def _expire(self, key: Any, timeout: Any, version: Any = None) -> tuple[Any, ...]:
        """Set a new timeout (seconds; None makes the key persistent); False if missing."""
        return self._touch(key, timeout, version=version)

    def _persist(self, key: Any, version: Any = None) -> tuple[Any, ...]:
        """Remove the key's expiry; False if the key does not exist."""
        return self._touch(key, None, version=version)

    touch, atouch = operation(_touch, finish=bool)
    ttl, attl = operation(_ttl, finish=_whole_seconds)
    pttl, apttl = operation(_pttl)
    pexpire, apexpire = operation(_pexpire)
    expire_at, aexpire_at = operation(_expire_at, "pexpire_at")
    pexpire_at, apexpire_at = operation(_pexpire_at)
    expire, aexpire = operation(_expire, "touch", bool)
    persist, apersist = operation(_persist, "touch", bool)
