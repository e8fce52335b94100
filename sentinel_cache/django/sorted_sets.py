"""django-redis's sorted-set methods on the sharded backend, each a declaration: the sorted set's
key is made like every cache key (prefix, version), its members go through the cache's
serializer as django-redis's do, its scores are numbers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.cache.backends.base import BaseCache

from sentinel_cache.django.hashes import no_client
from sentinel_cache.django.operations import operation


class SortedSetMethods(BaseCache):
    """django-redis's ``zadd``, ``zcard``, ``zcount``, ``zincrby``, ``zpopmax``, ``zpopmin``,
    ``zrange``, ``zrangebyscore``, ``zrank``, ``zrem``, ``zremrangebyscore``, ``zrevrange``,
    ``zrevrangebyscore``, ``zscore`` (its names, arguments and results), with their ``a``
    twins."""

    def _zkey(self, key: Any, version: Any, client: Any) -> Any:
        """The sorted set's cache key; django-redis's ``client=`` has no meaning here."""
        no_client(client)
        return self.make_and_validate_key(key, version=version)

    def _zadd(
        self,
        key: Any,
        mapping: Mapping[Any, float],
        nx: bool = False,
        xx: bool = False,
        ch: bool = False,
        incr: bool = False,
        gt: bool = False,
        lt: bool = False,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        """Add members with their scores; the number added (``ch``: or changed), or with
        ``incr`` the member's new score."""
        return (self._zkey(key, version, client), mapping, nx, xx, ch, incr, gt, lt)

    def _zcard(self, key: Any, version: Any = None, client: Any = None) -> tuple[Any, ...]:
        return (self._zkey(key, version, client),)

    def _zcount(
        self, key: Any, min: Any, max: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), min, max)

    def _zincrby(
        self, key: Any, amount: float, value: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), amount, value)

    def _zpopmax(
        self, key: Any, count: int | None = None, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), count)

    def _zpopmin(
        self, key: Any, count: int | None = None, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), count)

    def _zrange(
        self,
        key: Any,
        start: int,
        end: int,
        desc: bool = False,
        withscores: bool = False,
        score_cast_func: Any = float,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), start, end, desc, withscores, score_cast_func)

    def _zrangebyscore(
        self,
        key: Any,
        min: Any,
        max: Any,
        start: int | None = None,
        num: int | None = None,
        withscores: bool = False,
        score_cast_func: Any = float,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        made = self._zkey(key, version, client)
        return (made, min, max, start, num, withscores, score_cast_func)

    def _zrank(
        self,
        key: Any,
        value: Any,
        withscore: bool = False,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), value, withscore)

    def _zrem(
        self, key: Any, *values: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), *values)

    def _zremrangebyscore(
        self, key: Any, min: Any, max: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), min, max)

    def _zrevrange(
        self,
        key: Any,
        start: int,
        end: int,
        withscores: bool = False,
        score_cast_func: Any = float,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), start, end, withscores, score_cast_func)

    def _zrevrangebyscore(
        self,
        key: Any,
        max: Any,
        min: Any,
        start: int | None = None,
        num: int | None = None,
        withscores: bool = False,
        score_cast_func: Any = float,
        version: Any = None,
        client: Any = None,
    ) -> tuple[Any, ...]:
        made = self._zkey(key, version, client)
        return (made, max, min, start, num, withscores, score_cast_func)

    def _zscore(
        self, key: Any, value: Any, version: Any = None, client: Any = None
    ) -> tuple[Any, ...]:
        return (self._zkey(key, version, client), value)

    zadd, azadd = operation(_zadd)
    zcard, azcard = operation(_zcard)
    zcount, azcount = operation(_zcount)
    zincrby, azincrby = operation(_zincrby)
    zpopmax, azpopmax = operation(_zpopmax)
    zpopmin, azpopmin = operation(_zpopmin)
    zrange, azrange = operation(_zrange)
    zrangebyscore, azrangebyscore = operation(_zrangebyscore)
    zrank, azrank = operation(_zrank)
    zrem, azrem = operation(_zrem)
    zremrangebyscore, azremrangebyscore = operation(_zremrangebyscore)
    zrevrange, azrevrange = operation(_zrevrange)
    zrevrangebyscore, azrevrangebyscore = operation(_zrevrangebyscore)
    zscore, azscore = operation(_zscore)
