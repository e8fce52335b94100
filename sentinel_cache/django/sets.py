"""django-redis's set methods on the sharded backend, each a declaration: a set's key is made
like every cache key (prefix, version), its members go through the cache's serializer as
django-redis's do. The multi-key methods work across shards (see
:mod:`sentinel_cache.core.ops._async.sets` for what is atomic there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from django.core.cache.backends.base import BaseCache

from sentinel_cache.django.hashes import no_client
from sentinel_cache.django.operations import operation

if TYPE_CHECKING:
    from sentinel_cache.core.ops.aio import AsyncCacheClient
    from sentinel_cache.core.ops.client import CacheClient


class SetMethods(BaseCache):
    """django-redis's set methods (its names, arguments and results), with their ``a`` twins."""

    if TYPE_CHECKING:  # the backend's clients (ShardedSentinelCache builds them on first use)

        @property
        def client(self) -> CacheClient: ...

        @property
        def aclient(self) -> AsyncCacheClient: ...

    def _keys(self, keys: tuple[Any, ...], version: Any) -> tuple[Any, ...]:
        return tuple(self.make_and_validate_key(key, version=version) for key in keys)

    def _sadd(self, key: Any, *members: Any, version: Any = None, client: Any = None) -> Any:
        no_client(client)
        return (self.make_and_validate_key(key, version=version), *members)

    def _srem(self, key: Any, *members: Any, version: Any = None, client: Any = None) -> Any:
        no_client(client)
        return (self.make_and_validate_key(key, version=version), *members)

    def _scard(self, key: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        no_client(client)
        return (self.make_and_validate_key(key, version=version),)

    def _smembers(self, key: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        no_client(client)
        return (self.make_and_validate_key(key, version=version),)

    def _sismember(
        self, key: Any, member: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        no_client(client)
        return (self.make_and_validate_key(key, version=version), member)

    def _smismember(
        self, key: Any, *members: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        no_client(client)
        return (self.make_and_validate_key(key, version=version), *members)

    def _spop(
        self, key: Any, count: int | None = None, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        """A random member removed (None if empty), or a set of up to ``count``."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version), count)

    def _srandmember(
        self, key: Any, count: int | None = None, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        """A random member (None if empty), or a list of ``count``."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version), count)

    def _sscan(
        self,
        key: Any,
        match: str | None = None,
        count: int | None = 10,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        """One ``SSCAN`` batch's members; ``match`` is applied to the decoded members."""
        no_client(client)
        return (self.make_and_validate_key(key, version=version), match, count)

    def sscan_iter(
        self,
        key: Any,
        match: str | None = None,
        count: int | None = 10,
        version: Any = None,
        client: Any = None,
    ) -> Iterator[Any]:
        """Every member (one may come more than once, as with ``SSCAN``)."""
        no_client(client)
        return self.client.sscan_iter(
            self.make_and_validate_key(key, version=version), match, count
        )

    def asscan_iter(
        self,
        key: Any,
        match: str | None = None,
        count: int | None = 10,
        version: Any = None,
        client: Any = None,
    ) -> AsyncIterator[Any]:
        """The async :meth:`sscan_iter`."""
        no_client(client)
        stored = self.make_and_validate_key(key, version=version)
        return self.aclient.sscan_iter(stored, match, count)

    def _sdiff(self, *keys: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        no_client(client)
        return self._keys(keys, version)

    def _sinter(self, *keys: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        no_client(client)
        return self._keys(keys, version)

    def _sunion(self, *keys: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        no_client(client)
        return self._keys(keys, version)

    def _sdiffstore(
        self,
        dest: Any,
        *keys: Any,
        version_dest: Any = None,
        version_keys: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        """``dest`` and the keys each with their own version, as django-redis's."""
        no_client(client)
        return (
            self.make_and_validate_key(dest, version=version_dest),
            *self._keys(keys, version_keys),
        )

    def _sinterstore(
        self, dest: Any, *keys: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        no_client(client)
        return self._keys((dest, *keys), version)

    def _sunionstore(
        self, destination: Any, *keys: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        no_client(client)
        return self._keys((destination, *keys), version)

    def _smove(
        self,
        source: Any,
        destination: Any,
        member: Any,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        """``version`` applies to both keys (django-redis's gives the destination the default
        version)."""
        no_client(client)
        return (*self._keys((source, destination), version), member)

    sadd, asadd = operation(_sadd)
    srem, asrem = operation(_srem)
    scard, ascard = operation(_scard)
    smembers, asmembers = operation(_smembers)
    sismember, asismember = operation(_sismember)
    smismember, asmismember = operation(_smismember)
    spop, aspop = operation(_spop)
    srandmember, asrandmember = operation(_srandmember)
    sscan, asscan = operation(_sscan)
    sdiff, asdiff = operation(_sdiff)
    sinter, asinter = operation(_sinter)
    sunion, asunion = operation(_sunion)
    sdiffstore, asdiffstore = operation(_sdiffstore)
    sinterstore, asinterstore = operation(_sinterstore)
    sunionstore, asunionstore = operation(_sunionstore)
    smove, asmove = operation(_smove)
