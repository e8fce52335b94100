"""django-redis's hash methods on the sharded backend (issue 24): each routed to its key's shard,
values through the cache's serializer, sync and async, fail-open, bad input refused before
anything is sent, and (while resharding) a hash not moved yet found where it was, a removed
field never coming back from the previous owner's copy. Real servers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from django_support import MakeCache, build_cache, cache_entry, remember, unique_prefix

from sentinel_cache import ArgumentTypeError, ArgumentValueError
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster


def test_hash_round_trip_on_every_shard(cache: ShardedSentinelCache) -> None:
    names = [f"h{i}" for i in range(12)]
    assert {cache.core.shard_for(cache.make_key(n)).index for n in names} == {0, 1}
    for name in names:
        assert cache.hset(name, "a", {"deep": [1, 2]}) == 1
        assert cache.hset(name, "a", "again") == 0  # overwritten, not added
        assert cache.hset(name, mapping={"b": 2, "c": b"\x00bytes"}) == 2
        assert cache.hlen(name) == 3
        assert sorted(cache.hkeys(name)) == ["a", "b", "c"]
        assert cache.hexists(name, "b") and not cache.hexists(name, "zz")
        assert cache.hget(name, "a") == "again"
        assert cache.hgetall(name) == {"a": "again", "b": 2, "c": b"\x00bytes"}
        assert cache.hdel(name, "a") == 1 and cache.hdel(name, "a") == 0
        assert cache.hget(name, "a", "gone") == "gone"
    # The hash lives under the cache's key (prefix, version) on the ring's shard.
    raw = cache.core.client_for(cache.make_key("h0"))
    assert raw.type(cache.make_key("h0")) == b"hash"
    assert cache.hlen("h0", version=2) == 0


def test_async_twins(cache: ShardedSentinelCache) -> None:
    async def run() -> tuple[Any, ...]:
        added = await cache.ahset("ah", "x", 1)
        found = await cache.ahget("ah", "x"), await cache.ahkeys("ah"), await cache.ahlen("ah")
        removed = await cache.ahdel("ah", "x")
        await cache.aclose()
        return added, *found, removed

    assert asyncio.run(run()) == (1, 1, ["x"], 1, 1)


def test_bad_input_is_refused_before_sending(cache: ShardedSentinelCache) -> None:
    with pytest.raises(ArgumentTypeError, match="field"):
        cache.hset("bad", ["a"], 1)
    with pytest.raises(ArgumentTypeError, match="mapping"):
        cache.hset("bad", mapping={None: 1})
    with pytest.raises(ArgumentValueError, match="field or a mapping"):
        cache.hset("bad")
    with pytest.raises(ArgumentValueError, match="client"):
        cache.hlen("bad", client=object())
    assert not cache.has_key("bad") and cache.hlen("bad") == 0


def test_a_string_key_is_a_wrong_type_error(cache: ShardedSentinelCache) -> None:
    cache.set("plain", "v")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        cache.hset("plain", "f", 1)
    assert cache.get("plain") == "v"


def test_fail_open_answers_as_if_absent(
    make_cache: MakeCache, cluster: LocalSentinelCluster
) -> None:
    down = make_cache(OPTIONS={"MASTERS": ["shard0", "nosuchmaster"], "IGNORE_EXCEPTIONS": True})
    name = next(f"fo{i}" for i in range(100) if down.core.shard_for(down.make_key(f"fo{i}")).index)
    assert down.hset(name, "f", 1) == 0
    assert down.hlen(name) == 0 and down.hkeys(name) == [] and not down.hexists(name, "f")
    assert down.hget(name, "f", "d") == "d" and down.hgetall(name) == {}


BEFORE, AFTER = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]


def test_resharding_moves_a_hash_and_a_removed_field_stays_removed(
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
    assert len(moving) >= 20
    for name in moving[:20]:
        old.hset(name, mapping={"a": 1, "b": 2})
        old.expire(name, 300)
    for name in moving[:10]:  # read where it lives now: moved, with its expiry
        assert new.hgetall(name) == {"a": 1, "b": 2}
        assert 0 < new.ttl(name) <= 300
    for name in moving[10:20]:  # emptied under the new placement: gone for good
        assert new.hdel(name, "a") == 1 and new.hdel(name, "b") == 1
        assert new.hlen(name) == 0 and new.hgetall(name) == {}
        assert old.hlen(name) == 0  # the previous owner's copy was deleted, not left to return
    for name in moving[:10]:
        assert old.hlen(name) == 0  # moved: the previous owner holds no stale copy
        assert new.hget(name, "b") == 2
