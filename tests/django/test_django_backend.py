"""The whole BaseCache API and the django-redis extras against the real 2-shard topology."""

from __future__ import annotations

import pickle
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from django.core.cache import CacheKeyWarning
from django_support import DJANGO_DB, MakeCache, unique_prefix
from threads import Workers

from sentinel_cache import SerializationError
from sentinel_cache.core.ring import HashRing
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster


class Unpicklable:
    def __getstate__(self) -> Any:
        raise pickle.PickleError("no")


def both_shards(cache: ShardedSentinelCache, count: int = 40, stem: str = "k") -> list[str]:
    keys = [f"{stem}{i}" for i in range(count)]
    shards = {cache.core.shard_for(cache.make_key(k)).index for k in keys}
    assert shards == {0, 1}, "the sample must span both shards"
    return keys


def test_basic_api(cache: ShardedSentinelCache) -> None:
    assert cache.get("missing") is None
    assert cache.get("missing", "dflt") == "dflt"
    assert cache.set("a", {"x": [1, 2]}) is True
    assert cache.get("a") == {"x": [1, 2]}
    assert cache.add("a", "other") is False
    assert cache.add("b", "first") is True
    assert cache.get("b") == "first"
    assert cache.has_key("a") and "a" in cache
    assert not cache.has_key("missing") and "missing" not in cache
    cache.set("none", None)
    assert cache.get("none", "dflt") is None and cache.has_key("none")
    assert cache.delete("a") is True
    assert cache.delete("a") is False
    assert cache.get_or_set("gos", lambda: 7) == 7
    assert cache.get_or_set("gos", 8) == 7
    cache.set("v", "value", version=2)
    assert cache.get("v") is None
    assert cache.incr_version("v", version=2) == 3
    assert cache.get("v", version=3) == "value" and cache.get("v", version=2) is None
    assert cache.decr_version("v", version=3) == 2
    assert cache.get("v", version=2) == "value"
    with pytest.raises(ValueError):
        cache.incr_version("missing")


def test_many_keys_across_shards(cache: ShardedSentinelCache) -> None:
    keys = both_shards(cache)
    data = {k: {"value": i} for i, k in enumerate(keys)}
    assert cache.set_many(data) == []
    assert cache.set_many({}) == []
    assert cache.get_many([*keys, "absent"]) == data
    assert cache.get_many(iter(keys[:3])) == {k: data[k] for k in keys[:3]}
    assert cache.get_many([]) == {}
    assert cache.delete_many(keys[:20]) == 20  # the count, as django-redis returns
    assert cache.delete_many([]) is None
    assert cache.get_many(keys) == {k: data[k] for k in keys[20:]}


def test_timeouts(cache: ShardedSentinelCache) -> None:
    cache.set("zero", 1, 0)
    assert cache.get("zero") is None
    assert cache.add("zero-add", 1, 0) is True  # Django: added, then expired at once
    assert cache.get("zero-add") is None
    cache.set("present", 1)
    assert cache.add("present", 2, 0) is False
    assert cache.get("present") == 1
    cache.set("negative", 1, -3)
    assert cache.get("negative") is None
    cache.set_many({"m1": 1, "m2": 2}, 0)
    assert cache.get_many(["m1", "m2"]) == {}
    cache.set("forever", 1, None)
    assert cache.ttl("forever") is None
    cache.set("short", 1, 0.3)  # fractional seconds are honoured (PX)
    assert cache.get("short") == 1
    time.sleep(0.45)
    assert cache.get("short") is None
    cache.set("default", 1)
    assert 299 < cache.ttl("default") <= 300  # type: ignore[operator]


def test_touch(cache: ShardedSentinelCache) -> None:
    assert cache.touch("missing") is False
    assert cache.touch("missing", None) is False
    cache.set("t", 1, 10)
    assert cache.touch("t", 100) is True
    assert 99 < cache.ttl("t") <= 100  # type: ignore[operator]
    assert cache.touch("t", None) is True
    assert cache.ttl("t") is None
    assert cache.touch("t", None) is True  # already persistent: still True, as Django wants
    assert cache.touch("t", 0) is True
    assert cache.get("t") is None


def test_validate_key_warns_for_every_operation(cache: ShardedSentinelCache) -> None:
    bad = "key with spaces"
    cache.set("b", 1)
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("add", (bad, 1)),
        ("get", (bad,)),
        ("set", (bad, 1)),
        ("incr", (bad,)),
        ("decr", (bad,)),
        ("touch", (bad,)),
        ("has_key", (bad,)),
        ("ttl", (bad,)),
        ("delete", (bad,)),
        ("get_many", ([bad, "b"],)),
        ("set_many", ({bad: 1, "b": 2},)),
        ("delete_many", ([bad, "b"],)),
    ]
    for name, args in calls:
        with pytest.warns(CacheKeyWarning, match="memcached"):
            getattr(cache, name)(*args)
    with pytest.warns(CacheKeyWarning, match="longer than 250"):
        cache.get("x" * 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.get("fine_key")


def test_placement_is_the_ring_of_the_stored_key(
    cache: ShardedSentinelCache, cluster: LocalSentinelCluster, masters: dict[str, redis.Redis]
) -> None:
    ring = HashRing([1, 1])
    keys = both_shards(cache, 60, "placed:")
    for key in keys:
        cache.set(key, key)
    for key in keys:
        stored = cache.make_key(key)
        owner = cluster.master_names[ring.shard_index(stored)]
        assert cache.core.shard_for(stored).name == owner
        for name, client in masters.items():
            assert client.exists(stored) == (1 if name == owner else 0), (key, name)


def test_integers_are_stored_raw(
    cache: ShardedSentinelCache, cluster: LocalSentinelCluster, masters: dict[str, redis.Redis]
) -> None:
    cache.set("n", 42)
    stored = cache.make_key("n")
    owner = cache.core.shard_for(stored).name
    assert masters[owner].get(stored) == b"42"
    cache.set("b", True)  # bool is not an int here: it must come back as True
    assert cache.get("b") is True


@contextmanager
def counting_batches(cache: ShardedSentinelCache) -> Iterator[dict[int, int]]:
    """Counts packed sends (one per batch, i.e. per network write) on each shard's pool."""
    sends: dict[int, int] = {}
    patched: list[Any] = []
    for shard in cache.core.shards:
        for connection in [*shard.pool._connections]:
            original = connection.send_packed_command

            def send(command: Any, *args: Any, _i: int = shard.index, _o: Any = original) -> Any:
                sends[_i] = sends.get(_i, 0) + 1
                return _o(command, *args)

            connection.send_packed_command = send
            patched.append(connection)
    try:
        yield sends
    finally:
        for connection in patched:
            del connection.send_packed_command


def commandstats(masters: dict[str, redis.Redis]) -> dict[str, dict[str, int]]:
    stats: dict[str, dict[str, int]] = {}
    for name, client in masters.items():
        info = client.info("commandstats")
        stats[name] = {k: int(v["calls"]) for k, v in info.items()}
    return stats


def delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], command: str
) -> dict[str, int]:
    key = f"cmdstat_{command}"
    return {name: after[name].get(key, 0) - before[name].get(key, 0) for name in after}


def test_multi_key_calls_send_one_batch_per_shard(
    cache: ShardedSentinelCache, cluster: LocalSentinelCluster, masters: dict[str, redis.Redis]
) -> None:
    keys = both_shards(cache, 50, "batch:")
    per_shard = {name: 0 for name in cluster.master_names}
    for key in keys:
        per_shard[cache.core.shard_for(cache.make_key(key)).name] += 1
    cache.set("warm", 1)
    # Open a connection per shard so the spy can wrap them; the first set_many with a timeout
    # also asks each master once whether it has MSETEX.
    cache.set_many({k: k for k in keys})
    cache.get_many(keys)
    for client in masters.values():
        client.ping()

    before = commandstats(masters)
    with counting_batches(cache) as sends:
        assert cache.set_many({k: k for k in keys}) == []
    after = commandstats(masters)
    if all(shard.allows("MSETEX") for shard in cache.core.shards):  # one MSETEX per shard
        assert delta(before, after, "msetex") == {name: 1 for name in cluster.master_names}
    else:  # the script: one SET per key
        assert delta(before, after, "set") == per_shard
    assert sends == {0: 1, 1: 1}  # all of a shard's keys in one batch

    before = after
    with counting_batches(cache) as sends:
        assert len(cache.get_many(keys)) == len(keys)
    after = commandstats(masters)
    assert delta(before, after, "mget") == {name: 1 for name in cluster.master_names}
    assert sends == {0: 1, 1: 1}

    before = after
    with counting_batches(cache) as sends:
        cache.delete_many(keys)
    after = commandstats(masters)
    assert delta(before, after, "del") == {name: 1 for name in cluster.master_names}
    assert sends == {0: 1, 1: 1}


def test_incr_decr_atomic_keep_ttl(cache: ShardedSentinelCache) -> None:
    cache.set("n", 1, 100)
    assert cache.incr("n") == 2
    assert cache.incr("n", 10) == 12
    assert cache.decr("n", 2) == 10
    assert cache.decr("n") == 9
    assert 99 < cache.ttl("n") <= 100  # type: ignore[operator]
    cache.set("forever", 5, None)
    assert cache.incr("forever") == 6
    assert cache.ttl("forever") is None
    with pytest.raises(ValueError):
        cache.incr("missing")
    with pytest.raises(ValueError):
        cache.decr("missing")
    assert not cache.has_key("missing")  # incr must not create it
    cache.set("text", "abc")
    with pytest.raises(redis.ResponseError):
        cache.incr("text")

    cache.set("race", 0)

    def bump() -> None:
        for _ in range(25):
            cache.incr("race")

    with Workers(timeout=60) as workers:
        for n in range(8):
            workers.spawn(bump, name=f"bump-{n}")
    assert cache.get("race") == 200


def test_ttl_expire_persist(cache: ShardedSentinelCache) -> None:
    assert cache.ttl("missing") == 0
    assert cache.expire("missing", 10) is False
    assert cache.persist("missing") is False
    cache.set("k", 1, 30)
    assert 29 < cache.ttl("k") <= 30  # type: ignore[operator]
    assert cache.expire("k", 500) is True
    assert 499 < cache.ttl("k") <= 500  # type: ignore[operator]
    assert cache.persist("k") is True
    assert cache.ttl("k") is None
    assert cache.expire("k", 0) is True
    assert not cache.has_key("k")


def test_lock_lives_on_the_keys_shard(
    cache: ShardedSentinelCache, masters: dict[str, redis.Redis]
) -> None:
    stored = cache.make_key("resource")
    owner = cache.core.shard_for(stored).name
    with cache.lock("resource", timeout=5):
        assert masters[owner].exists(stored) == 1
        other = cache.lock("resource", timeout=5)
        assert other.acquire(blocking=False) is False
    assert masters[owner].exists(stored) == 0


def test_get_client_routes_by_key(
    cache: ShardedSentinelCache, masters: dict[str, redis.Redis]
) -> None:
    cache.set("routed", 5)
    client = cache.get_client("routed")
    assert client.get(cache.make_key("routed")) == b"5"
    stored = cache.make_key("routed")
    assert client is cache.core.shard_for(stored).client


def test_iter_keys_and_delete_pattern(cache: ShardedSentinelCache) -> None:
    users = both_shards(cache, 30, "user:")
    cache.set_many({k: 1 for k in users})
    cache.set_many({"other:1": 1, "other:2": 1})
    cache.set("user:v2", 1, version=2)
    assert sorted(cache.iter_keys("user:*")) == sorted(users)
    assert sorted(cache.iter_keys("user:*", version=2)) == ["user:v2"]
    assert sorted(cache.iter_keys("*", itersize=5)) == sorted([*users, "other:1", "other:2"])
    assert cache.delete_pattern("user:*") == 30
    assert list(cache.iter_keys("user:*")) == []
    assert cache.get_many(["other:1", "other:2"]) == {"other:1": 1, "other:2": 1}
    assert cache.has_key("user:v2", version=2)


def test_glob_characters_in_the_prefix_are_escaped(make_cache: MakeCache) -> None:
    odd = make_cache(KEY_PREFIX=f"{unique_prefix()}[ab]*?")
    plain = make_cache(KEY_PREFIX=odd.key_prefix.replace("[ab]*?", "a"))
    odd.set("k", 1)
    plain.set("k", 2)
    assert list(odd.iter_keys("*")) == ["k"]
    assert odd.delete_pattern("*") == 1
    assert plain.get("k") == 2


def test_clear_is_scoped_to_the_prefix(make_cache: MakeCache) -> None:
    stem = unique_prefix()
    app, app2 = make_cache(KEY_PREFIX=stem), make_cache(KEY_PREFIX=stem + "2")
    keys = both_shards(app, 20)
    app.set_many({k: 1 for k in keys})
    app.set("old", 1, version=7)
    app2.set_many({k: 2 for k in keys})
    assert app.clear() is True
    assert app.get_many(keys) == {} and app.get("old", version=7) is None
    assert app2.get_many(keys) == {k: 2 for k in keys}  # "app" must not match "app2:..."


def test_clear_without_prefix_flushes_the_database(
    make_cache: MakeCache, cluster: LocalSentinelCluster
) -> None:
    unprefixed = make_cache(KEY_PREFIX="")
    keys = both_shards(unprefixed, 20)
    unprefixed.set_many({k: 1 for k in keys})
    other_db = cluster.node_client(cluster.master_address(cluster.master_names[0]), db=0)
    try:
        other_db.set("django-tests-db0-canary", 1)
        assert unprefixed.clear() is True
        assert unprefixed.get_many(keys) == {}
        assert other_db.get("django-tests-db0-canary") == b"1"  # only the configured DB
        other_db.delete("django-tests-db0-canary")
    finally:
        other_db.close()
    assert unprefixed.pool_config.connection_options()["db"] == DJANGO_DB


def test_serialization_errors_are_not_swallowed(make_cache: MakeCache) -> None:
    cache = make_cache(OPTIONS={"IGNORE_EXCEPTIONS": True})
    with pytest.raises(pickle.PickleError) as raised:
        cache.set("bad", Unpicklable())
    assert isinstance(raised.value, SerializationError)
    with pytest.raises(pickle.PickleError):
        cache.add("bad", Unpicklable())
    with pytest.raises(pickle.PickleError):
        cache.set_many({"good": 1, "bad": Unpicklable()})
    as_json = make_cache(OPTIONS={"SERIALIZER": "json"})
    with pytest.raises(SerializationError, match="JSON"):
        as_json.set("bad", object())
    as_json.set("good", {"a": [1, 2]})
    assert as_json.get("good") == {"a": [1, 2]}


def test_close_is_a_no_op(cache: ShardedSentinelCache) -> None:
    cache.set("k", 1)
    cache.close()
    assert not cache.core.closed
    assert cache.get("k") == 1
