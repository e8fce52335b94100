"""django-redis's hash methods on the sharded backend, each a declaration: the hash's key is made
like every cache key (prefix, version), its fields are sent as they are, its values go through
the cache's serializer as django-redis's do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.cache.backends.base import BaseCache

from sentinel_cache.django.operations import operation
from sentinel_cache.exceptions import ArgumentValueError


def no_client(client: Any) -> None:
    """django-redis's ``client=`` picks a redis-py client; here the key picks its shard."""
    if client is not None:
        raise ArgumentValueError(
            "client", client, "is not supported: the key's shard is chosen by the ring"
        )


class HashMethods(BaseCache):
    """``hset``, ``hdel``, ``hlen``, ``hkeys``, ``hexists`` (django-redis's names, arguments
    and results) and ``hget``, ``hgetall``, with their ``a`` twins."""

    def _hset(
        self,
        key: Any,
        field: Any = None,
        value: Any = None,
        mapping: Mapping[Any, Any] | None = None,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        """Set ``field`` to ``value`` (and every field of ``mapping``); the fields added."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version), field, value, mapping)

    def _hdel(
        self, key: Any, field: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        """Remove ``field``; the number of fields removed."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version), field)

    def _hlen(self, key: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        no_client(client)
        return (self.make_and_validate_key(key, version=version),)

    def _hkeys(self, key: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        no_client(client)
        return (self.make_and_validate_key(key, version=version),)

    def _hexists(
        self, key: Any, field: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        no_client(client)
        return (self.make_and_validate_key(key, version=version), field)

    def _hget(
        self, key: Any, field: Any, default: Any = None, version: Any = None
    ) -> tuple[Any, ...]:
        return (self.make_and_validate_key(key, version=version), field, default)

    def _hgetall(self, key: Any, version: Any = None) -> tuple[Any, ...]:
        return (self.make_and_validate_key(key, version=version),)

    hset, ahset = operation(_hset)
    hdel, ahdel = operation(_hdel)
    hlen, ahlen = operation(_hlen)
    hkeys, ahkeys = operation(_hkeys)
    hexists, ahexists = operation(_hexists)
    hget, ahget = operation(_hget)
    hgetall, ahgetall = operation(_hgetall)
