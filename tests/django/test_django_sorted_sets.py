"""django-redis's sorted-set methods on the sharded backend (issue 24): each routed to its key's
shard, members through the cache's serializer, scores as floats, sync and async, fail-open, bad
input refused before anything is sent, and (while resharding) a sorted set not moved yet found
where it was, a removed or popped member never coming back from the previous owner's copy.
Real servers."""

from __future__ import annotations

import asyncio
import logging
import math
import pickle
import re
from typing import Any

import pytest
import redis
from django_support import MakeCache, build_cache, cache_entry, remember, unique_prefix

from sentinel_cache import ArgumentTypeError, ArgumentValueError
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster


def test_sorted_set_round_trip_on_every_shard(cache: ShardedSentinelCache) -> None:
    names = [f"z{i}" for i in range(12)]
    assert {cache.core.shard_for(cache.make_key(n)).index for n in names} == {0, 1}
    for name in names:
        assert cache.zadd(name, {"a": 1, ("t", 2): 2.5, 7: -3.0, "7": 10}) == 4
        assert cache.zadd(name, {"a": 1.5}) == 0  # its score changed, nothing added
        assert cache.zcard(name) == 4
        assert cache.zscore(name, "a") == 1.5 and cache.zscore(name, "zz") is None
        assert cache.zscore(name, 7) == -3.0 and cache.zscore(name, "7") == 10.0  # distinct
        assert cache.zrange(name, 0, -1) == [7, "a", ("t", 2), "7"]
        assert cache.zrange(name, 0, 1, desc=True, withscores=True) == [
            ("7", 10.0),
            (("t", 2), 2.5),
        ]
        assert cache.zrevrange(name, -2, -1, withscores=True) == [("a", 1.5), (7, -3.0)]
        assert cache.zrank(name, ("t", 2)) == 2 and cache.zrank(name, "zz") is None
        assert cache.zcount(name, 1.5, 10) == 3 and cache.zcount(name, "(1.5", "+inf") == 2
        assert cache.zrangebyscore(name, "-inf", 2.5) == [7, "a", ("t", 2)]
        assert cache.zrangebyscore(name, "-inf", "+inf", start=1, num=2) == ["a", ("t", 2)]
        assert cache.zrevrangebyscore(name, 10, "(1.5", withscores=True) == [
            ("7", 10.0),
            (("t", 2), 2.5),
        ]
        assert cache.zincrby(name, 0.25, "a") == 1.75 and cache.zincrby(name, 4, "new") == 4.0
        assert cache.zpopmin(name) == (7, -3.0)
        assert cache.zpopmax(name, count=2) == [("7", 10.0), ("new", 4.0)]
        assert cache.zrem(name, "a", "zz") == 1 and cache.zrem(name) == 0
        assert cache.zremrangebyscore(name, 2, 3) == 1
        assert cache.zcard(name) == 0 and cache.zpopmax(name) is None
        assert cache.zpopmin(name, count=3) == []
    # The sorted set lives under the cache's key (prefix, version) on the ring's shard.
    cache.zadd("z0", {"m": 1})
    raw = cache.core.client_for(cache.make_key("z0"))
    assert raw.type(cache.make_key("z0")) == b"zset"
    assert cache.zcard("z0", version=2) == 0 and cache.zrange("z0", 0, -1, version=2) == []


def test_zadd_flags_as_redis_takes_them(cache: ShardedSentinelCache) -> None:
    cache.zadd("f", {"a": 10, "b": 20})
    assert cache.zadd("f", {"a": 1, "c": 3}, nx=True) == 1 and cache.zscore("f", "a") == 10
    assert cache.zadd("f", {"a": 11, "d": 4}, xx=True) == 0 and cache.zscore("f", "d") is None
    assert cache.zscore("f", "a") == 11
    assert cache.zadd("f", {"a": 12, "b": 20, "e": 5}, ch=True) == 2  # a changed, e added
    assert cache.zadd("f", {"a": 5, "b": 30}, gt=True, ch=True) == 1  # only b goes up
    assert cache.zscore("f", "a") == 12 and cache.zscore("f", "b") == 30
    assert cache.zadd("f", {"a": 5, "b": 40}, lt=True, ch=True) == 1  # only a goes down
    assert cache.zscore("f", "a") == 5 and cache.zscore("f", "b") == 30
    assert cache.zadd("f", {"a": 0.5}, incr=True) == 5.5
    assert cache.zadd("f", {"a": 1}, incr=True, nx=True) is None  # stopped by nx
    assert cache.zadd("f", {"inf": math.inf}) == 1 and cache.zscore("f", "inf") == math.inf


def test_score_cast_func_as_redis_py_calls_it(cache: ShardedSentinelCache) -> None:
    cache.zadd("c", {"a": 2, "b": 1.5})
    seen: list[Any] = []

    def cast(score: Any) -> Any:
        seen.append(score)
        return float(score) * 10

    assert cache.zrange("c", 0, -1, withscores=True, score_cast_func=cast) == [
        ("b", 15.0),
        ("a", 20.0),
    ]
    assert all(isinstance(score, bytes) for score in seen) and len(seen) == 2  # as RESP2 sends
    # int cannot read b"1.5": given the float instead, as redis-py does.
    assert cache.zrevrangebyscore("c", "+inf", "-inf", withscores=True, score_cast_func=int) == [
        ("a", 2),
        ("b", 1),
    ]


def test_zrank_withscore_as_the_server_answers_redis_py(cache: ShardedSentinelCache) -> None:
    """``WITHSCORE`` is the server's (Redis 7.2 or later, Valkey): where it has it, [rank, score] as
    redis-py returns it; where not, the server's error, as django-redis gets it."""
    cache.zadd("r", {"a": 1, "b": 2.5})
    key = cache.make_key("r")
    raw = cache.core.client_for(key)
    try:
        expected: Any = raw.zrank(key, cache.client.encode("b"), withscore=True)
    except redis.ResponseError as exc:
        expected = exc
    if isinstance(expected, Exception):
        with pytest.raises(redis.ResponseError, match=re.escape(str(expected))):
            cache.zrank("r", "b", withscore=True)
    else:
        assert cache.zrank("r", "b", withscore=True) == expected == [1, 2.5]
        assert cache.zrank("r", "zz", withscore=True) is None


def django_redis_dumps(value: Any) -> bytes:
    """What django-redis's default ``PickleSerializer`` stores (``pickle.DEFAULT_PROTOCOL``;
    tests/django_redis_suite/test_django_redis_members.py checks it against the real one, where
    django-redis is installed: this folder also runs in matrix cells without it)."""
    return pickle.dumps(value, pickle.DEFAULT_PROTOCOL)


def test_a_sorted_set_django_redis_wrote_is_read_but_its_members_not_found(
    cache: ShardedSentinelCache,
) -> None:
    """What docs/migration.md says: django-redis's members are unframed pickles, which this
    cache reads (so ranges list them) but does not send (its members are its codec's), so a
    lookup by member misses them and a zadd adds a second one."""
    dumps = django_redis_dumps
    key = cache.make_key("old")
    cache.core.client_for(key).zadd(key, {dumps("ada"): 1, dumps(("t", 1)): 2})
    assert cache.zrange("old", 0, -1, withscores=True) == [("ada", 1.0), (("t", 1), 2.0)]
    assert cache.zscore("old", "ada") is None and cache.zrem("old", "ada") == 0
    assert cache.zadd("old", {"ada": 3}) == 1
    assert cache.zrange("old", 0, -1) == ["ada", ("t", 1), "ada"]


def test_with_the_plain_format_django_redis_members_are_shared(make_cache: MakeCache) -> None:
    """``VALUE_FORMAT = "plain"`` with pickle is django-redis's own format: members either side
    wrote are found by the other's lookups (both pickle with the highest protocol)."""
    cache = make_cache(OPTIONS={"MASTERS": ["shard0", "shard1"], "VALUE_FORMAT": "plain"})
    dumps, loads = django_redis_dumps, pickle.loads
    key = cache.make_key("shared")
    raw = cache.core.client_for(key)
    raw.zadd(key, {dumps("ada"): 1, dumps(("t", 1)): 2})  # what django-redis writes
    assert cache.zscore("shared", "ada") == 1.0 and cache.zrank("shared", ("t", 1)) == 1
    assert cache.zadd("shared", {"ada": 5, "bob": 3}) == 1  # ada found: updated, not doubled
    assert [loads(m) for m in raw.zrange(key, 0, -1)] == [("t", 1), "bob", "ada"]
    assert cache.zrem("shared", "ada") == 1


def test_async_twins(cache: ShardedSentinelCache) -> None:
    async def run() -> tuple[Any, ...]:
        added = await cache.azadd("az", {"x": 1, "y": 2})
        found = (
            await cache.azrange("az", 0, -1, withscores=True),
            await cache.azscore("az", "y"),
            await cache.azrank("az", "y"),
            await cache.azcount("az", 0, 1),
            await cache.azincrby("az", 2, "x"),
            await cache.azrevrangebyscore("az", 3, 0),
            await cache.azpopmax("az"),
            await cache.azrem("az", "y"),
            await cache.azcard("az"),
        )
        await cache.aclose()
        return added, *found

    assert asyncio.run(run()) == (
        2,
        [("x", 1.0), ("y", 2.0)],
        2.0,
        1,
        1,
        3.0,
        ["x", "y"],
        ("x", 3.0),
        1,
        0,
    )


@pytest.mark.parametrize(
    ("call", "error", "named"),
    [
        (lambda c: c.zadd("bad", {"a": math.nan}), ArgumentValueError, "mapping"),
        (lambda c: c.zadd("bad", {"a": True}), ArgumentTypeError, "mapping"),
        (lambda c: c.zadd("bad", {"a": "1"}), ArgumentTypeError, "mapping"),
        (lambda c: c.zadd("bad", {"a": 1, "b": None}), ArgumentTypeError, "mapping"),
        (lambda c: c.zadd("bad", [("a", 1)]), ArgumentTypeError, "mapping"),
        (lambda c: c.zadd("bad", {}), ArgumentValueError, "mapping"),
        (lambda c: c.zadd("bad", {"a": 1}, nx=True, xx=True), ArgumentValueError, "xx"),
        (lambda c: c.zadd("bad", {"a": 1}, gt=True, lt=True), ArgumentValueError, "lt"),
        (lambda c: c.zadd("bad", {"a": 1}, nx=True, gt=True), ArgumentValueError, "nx"),
        (lambda c: c.zadd("bad", {"a": 1, "b": 2}, incr=True), ArgumentValueError, "mapping"),
        (lambda c: c.zincrby("bad", math.nan, "a"), ArgumentValueError, "amount"),
        (lambda c: c.zincrby("bad", "1", "a"), ArgumentTypeError, "amount"),
        (lambda c: c.zpopmax("bad", count=-1), ArgumentValueError, "count"),
        (lambda c: c.zpopmin("bad", count=1.0), ArgumentTypeError, "count"),
        (lambda c: c.zremrangebyscore("bad", math.nan, 1), ArgumentValueError, "min"),
        (lambda c: c.zremrangebyscore("bad", 0, None), ArgumentTypeError, "max"),
        (lambda c: c.zcount("bad", [1], 2), ArgumentTypeError, "min"),
        (lambda c: c.zrange("bad", 0, "1"), ArgumentTypeError, "end"),
        (lambda c: c.zrange("bad", 2**63, 1), ArgumentValueError, "start"),
        (lambda c: c.zrevrange("bad", True, 1), ArgumentTypeError, "start"),
        (lambda c: c.zrangebyscore("bad", 0, 1, start=0), ArgumentValueError, "num"),
        (lambda c: c.zrevrangebyscore("bad", 1, 0, num=2), ArgumentValueError, "start"),
        (
            lambda c: c.zrange("bad", 0, 1, withscores=True, score_cast_func=1),
            ArgumentTypeError,
            "score_cast_func",
        ),
        (lambda c: c.zcard("bad", client=object()), ArgumentValueError, "client"),
    ],
)
def test_bad_input_is_refused_before_sending(
    cache: ShardedSentinelCache, call: Any, error: type[Exception], named: str
) -> None:
    cache.zadd("bad", {"kept": 1})
    with pytest.raises(error) as raised:
        call(cache)
    assert raised.value.argument == named
    assert cache.zrange("bad", 0, -1, withscores=True) == [("kept", 1.0)]


def test_a_string_key_is_a_wrong_type_error(cache: ShardedSentinelCache) -> None:
    cache.set("plain", "v")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        cache.zadd("plain", {"m": 1})
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        cache.zrange("plain", 0, -1)
    assert cache.get("plain") == "v"


def test_an_unreadable_member_is_left_out_and_logged(
    cache: ShardedSentinelCache, caplog: pytest.LogCaptureFixture
) -> None:
    cache.zadd("u", {"good": 1})
    key = cache.make_key("u")
    cache.core.client_for(key).zadd(key, {b"\xfe\x10not a pickle": 2})  # not our codec's
    with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
        assert cache.zrange("u", 0, -1, withscores=True) == [("good", 1.0)]
        assert cache.zpopmax("u") is None  # popped, unreadable: nothing to return
    assert sum("unreadable value" in r.getMessage() for r in caplog.records) == 2
    assert cache.zrange("u", 0, -1) == ["good"]


def test_fail_open_answers_as_if_absent(
    make_cache: MakeCache, cluster: LocalSentinelCluster
) -> None:
    down = make_cache(OPTIONS={"MASTERS": ["shard0", "nosuchmaster"], "IGNORE_EXCEPTIONS": True})
    name = next(f"fo{i}" for i in range(100) if down.core.shard_for(down.make_key(f"fo{i}")).index)
    assert down.zadd(name, {"m": 1}) == 0 and down.zadd(name, {"m": 1}, incr=True) is None
    assert down.zincrby(name, 1, "m") is None and down.zrem(name, "m") == 0
    assert down.zcard(name) == 0 and down.zcount(name, "-inf", "+inf") == 0
    assert down.zscore(name, "m") is None and down.zrank(name, "m") is None
    assert down.zrange(name, 0, -1, withscores=True) == [] and down.zrevrange(name, 0, -1) == []
    assert down.zrangebyscore(name, 0, 1) == [] and down.zrevrangebyscore(name, 1, 0) == []
    assert down.zpopmax(name) is None and down.zpopmin(name, count=2) == []
    assert down.zremrangebyscore(name, 0, 1) == 0


BEFORE, AFTER = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]


def test_resharding_moves_a_sorted_set_and_a_removed_member_stays_removed(
    three: LocalSentinelCluster,
) -> None:
    prefix = unique_prefix()

    def backend(masters: list[str], **options: Any) -> ShardedSentinelCache:
        entry = cache_entry(three, KEY_PREFIX=prefix, OPTIONS={"MASTERS": masters, **options})
        return remember(build_cache(entry))

    old, new = backend(BEFORE), backend(AFTER, PREVIOUS_MASTERS=BEFORE)
    moving = [
        n for n in (f"m{i}" for i in range(400)) if new.core.previous_shard_for(new.make_key(n))
    ]
    assert len(moving) >= 30
    for name in moving[:30]:
        old.zadd(name, {"a": 1, "b": 2})
        old.expire(name, 300)
    for name in moving[:10]:  # read where it lives now: moved, with its expiry
        assert new.zrange(name, 0, -1, withscores=True) == [("a", 1.0), ("b", 2.0)]
        assert 0 < new.ttl(name) <= 300
    for name in moving[10:20]:  # a member removed under the new placement: gone for good
        assert new.zrem(name, "a") == 1
        assert new.zrange(name, 0, -1) == ["b"]
        assert old.zcard(name) == 0  # the previous owner's copy was deleted, not left to return
    for name in moving[20:30]:  # popped empty: the sorted set stays gone
        assert new.zpopmin(name, count=5) == [("a", 1.0), ("b", 2.0)]
        assert new.zcard(name) == 0 and old.zcard(name) == 0
        assert new.zpopmax(name) is None
    for name in moving[:10]:
        assert old.zcard(name) == 0  # moved: the previous owner holds no stale copy
        assert new.zscore(name, "b") == 2.0
