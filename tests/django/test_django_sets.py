"""django-redis's set methods on the sharded backend (issue 24): each single-key method routed
to its key's shard, members through the cache's serializer, sync and async; the multi-key ones
(sdiff, sinter, sunion, their *store variants, smove) correct whether their keys share a shard
or not, the *store result on the destination's shard; ``match`` applied to decoded members;
bad input refused before anything is sent; fail-open; resharding. Real servers."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django_support import MakeCache, build_cache, cache_entry, remember, unique_prefix

from sentinel_cache import ArgumentTypeError, ArgumentValueError
from sentinel_cache.core.ops._sync.sets import glob_matcher
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster


def shard_of(cache: ShardedSentinelCache, name: str) -> int:
    return cache.core.shard_for(cache.make_key(name)).index


def names_on(cache: ShardedSentinelCache, shard: int, count: int, stem: str = "s") -> list[str]:
    found = [n for n in (f"{stem}{i}" for i in range(400)) if shard_of(cache, n) == shard]
    assert len(found) >= count
    return found[:count]


def raw(cache: ShardedSentinelCache, name: str) -> redis.Redis:
    """A plain client on the shard that holds ``name``."""
    return cache.core.client_for(cache.make_key(name))


def test_set_round_trip_on_every_shard(cache: ShardedSentinelCache) -> None:
    names = [*names_on(cache, 0, 3), *names_on(cache, 1, 3)]
    members = ["a", 7, b"\x00raw", ("t", 1)]
    for name in names:
        assert cache.sadd(name, *members) == 4
        assert cache.sadd(name, "a", "new") == 1  # "a" is there already
        assert cache.scard(name) == 5
        assert cache.smembers(name) == {*members, "new"}
        assert cache.sismember(name, ("t", 1)) and not cache.sismember(name, ("t", 2))
        assert cache.smismember(name, "a", "zz", 7) == [True, False, True]
        assert cache.srem(name, "new", "zz") == 1
        assert cache.sscan(name) == set(members)  # a small set: one batch holds it all
        assert sorted(map(repr, cache.sscan_iter(name))) == sorted(map(repr, members))
        assert cache.srandmember(name) in members
        assert len(cache.srandmember(name, 3)) == 3 and len(cache.srandmember(name, -9)) == 9
        popped = cache.spop(name)
        assert popped in members and not cache.sismember(name, popped)
        rest = cache.spop(name, 10)
        assert rest == set(members) - {popped} and cache.scard(name) == 0
        assert cache.spop(name) is None and cache.spop(name, 2) == set()
        assert cache.srandmember(name) is None and cache.srandmember(name, 2) == []
    # Stored under the cache's key, each member as the cache's serializer writes a value.
    cache.sadd("s0", "a", 7)
    assert raw(cache, "s0").type(cache.make_key("s0")) == b"set"
    stored = raw(cache, "s0").smembers(cache.make_key("s0"))
    assert stored == {cache.client.codec.dumps("a"), b"7"}
    assert cache.scard("s0", version=2) == 0


def test_sscan_iter_reads_every_batch(cache: ShardedSentinelCache) -> None:
    cache.sadd("big", *range(600), *(f"m{i}" for i in range(600)))
    assert raw(cache, "big").object("encoding", cache.make_key("big")) == b"hashtable"
    first = cache.sscan("big", count=20)
    assert 0 < len(first) < 1200  # django-redis's sscan: the first batch only
    members = list(cache.sscan_iter("big", count=50))
    assert set(members) == {*range(600), *(f"m{i}" for i in range(600))}
    assert set(cache.sscan_iter("big", match="m1?", count=50)) == {f"m1{i}" for i in range(10)}
    assert set(cache.sscan_iter("big", match="59[5-9]")) == {595, 596, 597, 598, 599}


def test_match_is_a_glob_on_the_decoded_members(cache: ShardedSentinelCache) -> None:
    cache.sadd("g", "bar1", "bar2", "zoo", "b*r", "x?", "[]", 12, b"bytes", ("tu", 1))
    assert cache.sscan("g", match="zoo") == {"zoo"}  # django-redis's own two cases
    assert set(cache.sscan_iter("g", match="bar*")) == {"bar1", "bar2"}
    assert cache.sscan("g", match="b?r*") == {"bar1", "bar2", "b*r"}
    assert cache.sscan("g", match="b\\*r") == {"b*r"}  # an escaped glob character
    assert cache.sscan("g", match="x\\?") == {"x?"}
    assert cache.sscan("g", match="bar[^1]") == {"bar2"}
    assert cache.sscan("g", match="[z]oo") == {"zoo"}
    assert cache.sscan("g", match="\\[\\]") == {"[]"}
    assert cache.sscan("g", match="1*") == {12}  # an int by its decimal form
    assert cache.sscan("g", match="byt*") == {b"bytes"}  # bytes as UTF-8 text
    assert cache.sscan("g", match="('tu'*") == {("tu", 1)}  # any other member by its str()
    assert cache.sscan("g", match="ba") == set()  # the whole member, not a part


GLOBS = [
    "*", "bar*", "b?r*", "b\\*r", "x\\?", "bar[^1]", "[z]oo", "\\[\\]", "[]", "[]x", "[^]",
    "[z-a]oo", "[a\\-z]", "[\\a-c]", "a[-]b", "a[b-]", "[\\]]", "*\\", "?", "??", "[!b]*", "[ab",
    "a[b-", "[^",
]  # fmt: skip
TEXTS = ["bar1", "bar2", "zoo", "b*r", "x?", "[]", "x", "a", "-", "b", "c", "m", "]", "a-b", "a-",
         "ab", "z\\", "ac", "!", "bz", "a]", "a^"]  # fmt: skip


def test_match_is_redis_glob(cache: ShardedSentinelCache) -> None:
    """The glob applied here is Redis's: the server's MATCH on plain text members agrees."""
    key = cache.make_key("plain-members")
    server = raw(cache, "plain-members")
    server.sadd(key, *TEXTS)
    for pattern in GLOBS:
        theirs = {m.decode() for m in server.sscan(key, 0, match=pattern, count=1000)[1]}
        ours = {text for text in TEXTS if glob_matcher(pattern).fullmatch(text)}
        assert ours == theirs, pattern


def two_sets(cache: ShardedSentinelCache, first: str, second: str) -> None:
    cache.sadd(first, "bar1", "bar2", 3)
    cache.sadd(second, "bar2", "bar3", 3, ("t",))


@pytest.mark.parametrize("across", [True, False], ids=["across-shards", "one-shard"])
def test_multi_key_operations(cache: ShardedSentinelCache, across: bool) -> None:
    (a, dest), (b, other) = names_on(cache, 0, 2, "k"), names_on(cache, 1 if across else 0, 2, "j")
    two_sets(cache, a, b)
    assert cache.sdiff(a, b) == {"bar1"} and cache.sdiff(b, a) == {"bar3", ("t",)}
    assert cache.sinter(a, b) == {"bar2", 3}
    assert cache.sunion(a, b) == {"bar1", "bar2", "bar3", 3, ("t",)}
    assert cache.sdiff(a, a) == set() and cache.sunion(a) == {"bar1", "bar2", 3}
    assert cache.sinter(a, b, "nosuchset") == set() and cache.sdiff(a, "nosuchset") == {
        "bar1",
        "bar2",
        3,
    }
    # *store writes on the destination's shard, replacing what it held, and returns the count.
    for target in (dest, other):
        cache.sadd(target, "old")
        assert cache.sunionstore(target, a, b) == 5
        assert cache.smembers(target) == {"bar1", "bar2", "bar3", 3, ("t",)}
        assert cache.sinterstore(target, a, b) == 2 and cache.smembers(target) == {"bar2", 3}
        assert cache.sdiffstore(target, a, b) == 1 and cache.smembers(target) == {"bar1"}
        assert raw(cache, target).type(cache.make_key(target)) == b"set"
        assert cache.sinterstore(target, a, "nosuchset") == 0  # empty: the destination deleted
        assert not raw(cache, target).exists(cache.make_key(target))
    # A source that is also the destination (Redis reads the sources first).
    assert cache.sunionstore(a, a, b) == 5 and cache.scard(a) == 5


def test_versions_of_the_store_variants(cache: ShardedSentinelCache) -> None:
    (a,), (b,) = names_on(cache, 0, 1, "v"), names_on(cache, 1, 1, "w")
    cache.sadd(a, "x", "y", version=2)
    cache.sadd(b, "y", version=2)
    assert cache.sdiffstore("d", a, b, version_keys=2) == 1  # dest at the default version
    assert cache.smembers("d") == {"x"} and cache.scard("d", version=2) == 0
    assert cache.sdiffstore("d", a, b, version_dest=3, version_keys=2) == 1
    assert cache.smembers("d", version=3) == {"x"}
    assert cache.sunionstore("u", a, b, version=2) == 2 and cache.scard("u", version=2) == 2


@pytest.mark.parametrize("across", [True, False], ids=["across-shards", "one-shard"])
def test_smove(cache: ShardedSentinelCache, across: bool) -> None:
    (a,), (b,) = names_on(cache, 0, 1, "k"), names_on(cache, 1 if across else 0, 2, "j")[-1:]
    two_sets(cache, a, b)
    assert cache.smove(a, b, "bar1") is True
    assert cache.smove(a, b, "bar4") is False
    assert cache.smembers(a) == {"bar2", 3}
    assert cache.smembers(b) == {"bar1", "bar2", "bar3", 3, ("t",)}
    assert cache.smove(a, b, "bar2") is True and cache.smembers(a) == {3}  # already there too
    cache.sadd(a, "v2", version=2)
    assert cache.smove(a, b, "v2", version=2) and cache.smembers(b, version=2) == {"v2"}


def test_smove_across_shards_puts_the_member_back_when_the_add_fails(
    cache: ShardedSentinelCache,
) -> None:
    (a,), (plain,) = names_on(cache, 0, 1, "k"), names_on(cache, 1, 1, "p")
    cache.sadd(a, "m")
    cache.set(plain, "a string")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        cache.smove(a, plain, "m")
    assert cache.smembers(a) == {"m"}  # not lost
    assert cache.get(plain) == "a string"


def test_async_twins(cache: ShardedSentinelCache) -> None:
    (a,), (b,) = names_on(cache, 0, 1, "k"), names_on(cache, 1, 1, "j")

    async def run() -> tuple[Any, ...]:
        added = await cache.asadd(a, "x", "y")
        await cache.asadd(b, "y", "z")
        found = (
            await cache.asmembers(a),
            await cache.ascard(a),
            await cache.asismember(a, "x"),
            await cache.asmismember(a, "x", "q"),
            await cache.asunion(a, b),
            await cache.asinter(a, b),
            await cache.asdiff(a, b),
            await cache.asunionstore("u", a, b),
            await cache.asinterstore("i", a, b),
            await cache.asdiffstore("d", a, b),
            await cache.asmove(a, b, "x"),
            await cache.asscan(b, match="[xz]"),
            {member async for member in cache.asscan_iter(b)},
            await cache.asrandmember("u", 3),
            await cache.asrem(b, "x"),
            await cache.aspop("i"),
            await cache.aspop("d", 5),
        )
        await cache.aclose()
        return added, *found

    (added, *found, randoms, removed, popped, many) = asyncio.run(run())
    assert added == 2
    assert found == [
        {"x", "y"},
        2,
        True,
        [True, False],
        {"x", "y", "z"},
        {"y"},
        {"x"},
        3,
        1,
        1,
        True,
        {"x", "z"},
        {"x", "y", "z"},
    ]
    assert sorted(randoms) == ["x", "y", "z"] and removed == 1
    assert popped == "y" and many == {"x"}


def test_bad_input_is_refused_before_sending(cache: ShardedSentinelCache) -> None:
    cases: list[tuple[type[Exception], str, Any]] = [
        (ArgumentValueError, "count", lambda: cache.spop("bad", -1)),
        (ArgumentTypeError, "count", lambda: cache.spop("bad", "1")),
        (ArgumentTypeError, "count", lambda: cache.spop("bad", True)),
        (ArgumentTypeError, "count", lambda: cache.srandmember("bad", 1.5)),
        (ArgumentValueError, "count", lambda: cache.sscan("bad", count=0)),
        (ArgumentValueError, "count", lambda: cache.sscan_iter("bad", count=-1)),
        (ArgumentTypeError, "match", lambda: cache.sscan_iter("bad", match=b"x*")),
        (ArgumentValueError, "keys", lambda: cache.sdiff()),
        (ArgumentValueError, "keys", lambda: cache.sunionstore("bad")),
        (ArgumentValueError, "client", lambda: cache.sadd("bad", 1, client=object())),
        (ArgumentValueError, "client", lambda: cache.sscan_iter("bad", client=object())),
    ]
    for error, argument, call in cases:
        with pytest.raises(error, match=argument):
            call()
    assert cache.sadd("bad") == 0 and cache.srem("bad") == 0 and cache.smismember("bad") == []
    assert not cache.has_key("bad") and cache.scard("bad") == 0


def test_a_string_key_is_a_wrong_type_error(cache: ShardedSentinelCache) -> None:
    (plain,), (other,) = names_on(cache, 0, 1, "p"), names_on(cache, 1, 1, "q")
    cache.set(plain, "v")
    cache.sadd(other, "m")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        cache.sadd(plain, "m")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        cache.sunion(plain, other)  # across shards, as Redis answers on one
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        cache.sunionstore(other, plain, other)
    assert cache.get(plain) == "v" and cache.smembers(other) == {"m"}


@pytest.fixture
def half_down(make_cache: MakeCache, cluster: LocalSentinelCluster) -> Iterator[Any]:
    down = make_cache(OPTIONS={"MASTERS": ["shard0", "nosuchmaster"], "IGNORE_EXCEPTIONS": True})
    yield down, names_on(down, 0, 2, "up"), names_on(down, 1, 2, "fo")


def test_fail_open_answers_as_if_absent(half_down: Any) -> None:
    down, (up, up2), (gone, gone2) = half_down
    assert down.sadd(gone, "m") == 0 and down.srem(gone, "m") == 0
    assert down.scard(gone) == 0 and down.smembers(gone) == set()
    assert not down.sismember(gone, "m") and down.smismember(gone, "m", "n") == [False, False]
    assert down.spop(gone) is None and down.spop(gone, 2) == set()
    assert down.srandmember(gone) is None and down.srandmember(gone, 2) == []
    assert down.sscan(gone) == set() and list(down.sscan_iter(gone)) == []
    assert down.sunion(gone, gone2) == set() and down.sunionstore(gone, gone2) == 0
    # Across shards the skipped shard's sets count as empty.
    down.sadd(up, "a", "b")
    assert down.sunion(up, gone) == {"a", "b"} and down.sinter(up, gone) == set()
    assert down.sunionstore(up2, up, gone) == 2 and down.smembers(up2) == {"a", "b"}
    assert down.sunionstore(gone, up) == 0  # not stored: its shard is skipped


def test_fail_open_smove_to_a_skipped_shard_keeps_the_member(half_down: Any) -> None:
    down, (up, _), (gone, _) = half_down
    down.sadd(up, "m")
    assert down.smove(up, gone, "m") is False
    assert down.smembers(up) == {"m"}


BEFORE, AFTER = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]


def test_resharding_moves_sets_and_a_removed_member_stays_removed(
    three: LocalSentinelCluster,
) -> None:
    prefix = unique_prefix()

    def backend(masters: list[str], **options: Any) -> ShardedSentinelCache:
        entry = cache_entry(three, KEY_PREFIX=prefix, OPTIONS={"MASTERS": masters, **options})
        return remember(build_cache(entry))

    old, new = backend(BEFORE), backend(AFTER, PREVIOUS_MASTERS=BEFORE)
    names = [f"m{i}" for i in range(400)]
    moving = [n for n in names if new.core.previous_shard_for(new.make_key(n))]
    staying = [n for n in names if n not in moving][:3]
    assert len(moving) >= 30
    for name in [*moving[:30], *staying]:
        old.sadd(name, "a", name)
        old.expire(name, 300)
    for name in moving[:10]:  # read where it lives now: moved, with its expiry
        assert new.smembers(name) == {"a", name}
        assert 0 < new.ttl(name) <= 300
    for name in moving[10:20]:  # emptied under the new placement: gone for good
        assert new.srem(name, "a", name) == 2
        assert new.scard(name) == 0 and old.scard(name) == 0
    # A multi-key read and store moves its sources (and its destination) first; the moving
    # keys all go to the new shard, the staying ones keep theirs: the sets are on several.
    sources, dest = [*moving[20:29], *staying], moving[29]
    assert len({new.core.shard_for(new.make_key(n)) for n in sources}) > 1
    expected = {"a", *sources}
    assert new.sunion(*sources) == expected
    assert new.sunionstore(dest, *sources) == len(expected)
    assert new.smembers(dest) == expected
    for name in [*moving[:10], *moving[20:30]]:
        assert old.scard(name) == 0  # moved: the previous owner holds no stale copy
    assert all(new.sismember(name, name) for name in moving[:10])


def test_members_written_by_django_redis(cache: ShardedSentinelCache) -> None:
    """django-redis stores a member as its plain pickle (an int as decimal): read back here, but
    membership by value compares stored bytes, which differ but for ints (docs/migration.md)."""
    name = cache.make_key("theirs")
    raw(cache, "theirs").sadd(name, pickle.dumps("x", pickle.HIGHEST_PROTOCOL), b"7")
    assert cache.smembers("theirs") == {"x", 7}
    assert cache.sismember("theirs", 7) and not cache.sismember("theirs", "x")
