"""Sorted-set operations (django-redis's 14: ``zadd``, ``zcard``, ``zcount``, ``zincrby``,
``zpopmax``, ``zpopmin``, ``zrange``, ``zrangebyscore``, ``zrank``, ``zrem``, ``zremrangebyscore``,
``zrevrange``, ``zrevrangebyscore``, ``zscore``), each routed to its key's shard; members go
through the cache's codec as every cached value does (so a tuple is a member), scores are sent
as numbers and come back as floats, as redis-py returns them to django-redis (from a reply of
either protocol, RESP2 or RESP3).

The asyncio source; ``_sync/sorted_sets.py`` is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sentinel_cache.core.arguments import valid_bound, valid_int, valid_score
from sentinel_cache.core.ops._async.client import AsyncCacheOperations
from sentinel_cache.core.ops.plans import MISS, READ_MOVED, UPDATE, Command
from sentinel_cache.exceptions import ArgumentTypeError, ArgumentValueError

Cast = Callable[[Any], Any]


def score_cast(cast: Any) -> Cast:
    """redis-py's ``score_cast_func``, checked before anything is sent: called on the score as
    a RESP2 server sends it (bytes; a RESP3 double is formatted back as redis-py does), and a
    cast that cannot read it (``int`` of ``b"1.5"``) is given the float instead, as redis-py
    does."""
    if cast is float:
        return float
    if not callable(cast):
        raise ArgumentTypeError("score_cast_func", cast, "must be callable, such as float")

    def safe(score: Any) -> Any:
        if not isinstance(score, bytes):
            score = format(float(score), ".17g").encode()
        try:
            return cast(score)
        except (ValueError, TypeError):
            return cast(float(score))

    return safe


def score_pairs(reply: Sequence[Any]) -> list[tuple[Any, Any]]:
    """A reply with scores as (member, score) pairs: RESP3 nests them (``[[member, 1.5], ...]``,
    but one popped member is flat), RESP2 sends them flat (``[member, b"1.5", ...]``)."""
    if reply and isinstance(reply[0], list):
        return [(member, score) for member, score in reply]
    return list(zip(reply[::2], reply[1::2], strict=True))


def limit(start: Any, num: Any) -> tuple[Any, ...]:
    """``LIMIT start num`` of a range by score, given both or neither (as redis-py requires)."""
    if start is None and num is None:
        return ()
    if start is None or num is None:
        missing = "start" if start is None else "num"
        raise ArgumentValueError(missing, None, "start and num must both be given, or neither")
    return ("LIMIT", valid_int("start", start), valid_int("num", num))


class AsyncSortedSetOperations(AsyncCacheOperations):
    """Sorted sets: one key's members on its shard (``UPDATE`` / ``READ_MOVED``)."""

    def _members(self, key: Any, reply: Sequence[Any]) -> list[Any]:
        """Members as stored, decoded (one that cannot be read is left out, logged)."""
        decoded = (self.decode(member, key) for member in reply)
        return [member for member in decoded if member is not MISS]

    def _scored(self, key: Any, reply: Sequence[Any], cast: Cast = float) -> list[tuple[Any, Any]]:
        """A reply with scores as (member, score) pairs, members decoded (one that cannot be
        read is left out, logged)."""
        pairs = []
        for member, score in score_pairs(reply):
            value = self.decode(member, key)
            if value is not MISS:
                pairs.append((value, cast(score)))
        return pairs

    async def _zrange(
        self, key: Any, command: Command, withscores: bool, score_cast_func: Any
    ) -> list[Any]:
        """What every range read shares: its members, or (member, score) pairs."""
        cast = score_cast(score_cast_func)
        if withscores:
            command += ("WITHSCORES",)
        (reply,), _ = await self.keyed(key, [command], [[]], READ_MOVED)
        return self._scored(key, reply, cast) if withscores else self._members(key, reply)

    async def zadd(
        self,
        key: Any,
        mapping: Mapping[Any, Any],
        nx: bool = False,
        xx: bool = False,
        ch: bool = False,
        incr: bool = False,
        gt: bool = False,
        lt: bool = False,
    ) -> int | float | None:
        """Add the members of ``mapping`` (member -> score); the number added (with ``ch``, also
        those whose score changed), or with ``incr`` the member's new score (None when ``nx``
        or ``xx`` stopped it). The flags are checked as redis-py checks them."""
        if not isinstance(mapping, Mapping):
            raise ArgumentTypeError("mapping", mapping, "must be a mapping of member to score")
        if not mapping:
            raise ArgumentValueError("mapping", mapping, "zadd needs at least one member")
        if nx and xx:
            raise ArgumentValueError("xx", xx, "nx and xx cannot both be given")
        if gt and lt:
            raise ArgumentValueError("lt", lt, "gt and lt cannot both be given")
        if nx and (gt or lt):
            raise ArgumentValueError("nx", nx, "nx cannot be given with gt or lt")
        if incr and len(mapping) != 1:
            raise ArgumentValueError("mapping", mapping, "incr takes exactly one member")
        pairs: list[Any] = []
        for member, score in mapping.items():
            pairs += (valid_score("mapping", score), self.encode(member))
        flags = [name for name, on in (("NX", nx), ("XX", xx), ("GT", gt), ("LT", lt)) if on]
        flags += [name for name, on in (("CH", ch), ("INCR", incr)) if on]
        command: Command = ("ZADD", key, *flags, *pairs)
        absent = None if incr else 0
        (reply,), _ = await self.keyed(key, [command], [absent], UPDATE, idempotent=not incr)
        if incr:
            return None if reply is None else float(reply)
        return int(reply)

    async def zcard(self, key: Any) -> int:
        (size,), _ = await self.keyed(key, [("ZCARD", key)], [0], READ_MOVED)
        return int(size)

    async def zcount(self, key: Any, min: Any, max: Any) -> int:
        """The members with a score from ``min`` to ``max`` (numbers, or ``"-inf"``, ``"(1"``)."""
        command = ("ZCOUNT", key, valid_bound("min", min), valid_bound("max", max))
        (count,), _ = await self.keyed(key, [command], [0], READ_MOVED)
        return int(count)

    async def zincrby(self, key: Any, amount: Any, value: Any) -> float | None:
        """Add ``amount`` to the member's score (a missing member counts from 0); the new score
        (None when IGNORE_EXCEPTIONS skipped the shard: nothing was added)."""
        command = ("ZINCRBY", key, valid_score("amount", amount), self.encode(value))
        (score,), _ = await self.keyed(key, [command], [None], UPDATE, idempotent=False)
        return None if score is None else float(score)

    async def _zpop(self, key: Any, command: str, count: Any) -> Any:
        """``zpopmax``/``zpopmin``: one (member, score) or None, or with ``count`` a list."""
        args = () if count is None else (valid_int("count", count, minimum=0),)
        (reply,), _ = await self.keyed(key, [(command, key, *args)], [[]], UPDATE, idempotent=False)
        popped = self._scored(key, reply)
        if count is None:
            return popped[0] if popped else None
        return popped

    async def zpopmax(self, key: Any, count: int | None = None) -> Any:
        """Remove and return the member with the highest score, or the ``count`` highest."""
        return await self._zpop(key, "ZPOPMAX", count)

    async def zpopmin(self, key: Any, count: int | None = None) -> Any:
        """Remove and return the member with the lowest score, or the ``count`` lowest."""
        return await self._zpop(key, "ZPOPMIN", count)

    async def zrange(
        self,
        key: Any,
        start: int,
        end: int,
        desc: bool = False,
        withscores: bool = False,
        score_cast_func: Any = float,
    ) -> list[Any]:
        """Members by rank from ``start`` to ``end`` (inclusive, negative from the end)."""
        name = "ZREVRANGE" if desc else "ZRANGE"  # ZRANGE ... REV needs Redis 6.2
        command = (name, key, valid_int("start", start), valid_int("end", end))
        return await self._zrange(key, command, withscores, score_cast_func)

    async def zrangebyscore(
        self,
        key: Any,
        min: Any,
        max: Any,
        start: int | None = None,
        num: int | None = None,
        withscores: bool = False,
        score_cast_func: Any = float,
    ) -> list[Any]:
        """Members with a score from ``min`` to ``max``, lowest first; ``start``/``num`` page."""
        bounds = (valid_bound("min", min), valid_bound("max", max))
        command = ("ZRANGEBYSCORE", key, *bounds, *limit(start, num))
        return await self._zrange(key, command, withscores, score_cast_func)

    async def zrevrange(
        self,
        key: Any,
        start: int,
        end: int,
        withscores: bool = False,
        score_cast_func: Any = float,
    ) -> list[Any]:
        """Members by rank, highest score first."""
        command = ("ZREVRANGE", key, valid_int("start", start), valid_int("end", end))
        return await self._zrange(key, command, withscores, score_cast_func)

    async def zrevrangebyscore(
        self,
        key: Any,
        max: Any,
        min: Any,
        start: int | None = None,
        num: int | None = None,
        withscores: bool = False,
        score_cast_func: Any = float,
    ) -> list[Any]:
        """Members with a score from ``max`` down to ``min``, highest first."""
        bounds = (valid_bound("max", max), valid_bound("min", min))
        command = ("ZREVRANGEBYSCORE", key, *bounds, *limit(start, num))
        return await self._zrange(key, command, withscores, score_cast_func)

    async def zrank(self, key: Any, value: Any, withscore: bool = False) -> Any:
        """The member's rank (0 for the lowest score), None if it is not there; with
        ``withscore`` [rank, score] (``ZRANK ... WITHSCORE``: Redis 7.2 or later, Valkey)."""
        command: Command = ("ZRANK", key, self.encode(value))
        if withscore:
            command += ("WITHSCORE",)
        (rank,), _ = await self.keyed(key, [command], [None], READ_MOVED)
        if rank is None or not withscore:
            return rank
        return [rank[0], float(rank[1])]

    async def zrem(self, key: Any, *values: Any) -> int:
        """Remove the members; the number removed."""
        if not values:
            return 0
        members = [self.encode(value) for value in values]
        (removed,), _ = await self.keyed(key, [("ZREM", key, *members)], [0], UPDATE)
        return int(removed)

    async def zremrangebyscore(self, key: Any, min: Any, max: Any) -> int:
        """Remove the members with a score from ``min`` to ``max``; the number removed."""
        command = ("ZREMRANGEBYSCORE", key, valid_bound("min", min), valid_bound("max", max))
        (removed,), _ = await self.keyed(key, [command], [0], UPDATE)
        return int(removed)

    async def zscore(self, key: Any, value: Any) -> float | None:
        """The member's score, None if it is not there."""
        command = ("ZSCORE", key, self.encode(value))
        (score,), _ = await self.keyed(key, [command], [None], READ_MOVED)
        return None if score is None else float(score)
