"""The native async API: redis.asyncio clients per event loop, sharing the sync core's state."""

from __future__ import annotations

import asyncio
import gc
import time
import warnings
from typing import Any

import pytest
import redis
from django_support import MakeCache, build_cache, cache_entry
from redis.utils import HIREDIS_AVAILABLE

from sentinel_cache import FailoverInProgressError
from sentinel_cache.core.config import Address
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster


def keys_on_both_shards(cache: ShardedSentinelCache, count: int = 30) -> list[str]:
    keys = [f"ak{i}" for i in range(count)]
    assert {cache.core.shard_for(cache.make_key(k)).index for k in keys} == {0, 1}
    return keys


def key_on(cache: ShardedSentinelCache, index: int, stem: str = "on") -> str:
    for i in range(1000):
        key = f"{stem}{i}"
        if cache.core.shard_for(cache.make_key(key)).index == index:
            return key
    raise AssertionError("no key found for that shard")


def test_async_api(cache: ShardedSentinelCache) -> None:
    async def main() -> None:
        assert await cache.aget("missing") is None
        assert await cache.aget("missing", "dflt") == "dflt"
        assert await cache.aset("a", {"x": 1}) is True
        assert await cache.aget("a") == {"x": 1}
        assert await cache.aadd("a", 2) is False
        assert await cache.aadd("b", 2) is True
        assert await cache.aadd("zero", 2, 0) is True
        assert await cache.aget("zero") is None
        assert await cache.ahas_key("a") and not await cache.ahas_key("zero")
        assert await cache.adelete("a") is True
        assert await cache.adelete("a") is False
        assert await cache.atouch("b", 50) is True
        assert 49 < await cache.attl("b") <= 50  # type: ignore[operator]
        assert await cache.atouch("b", None) is True
        assert await cache.atouch("b", None) is True
        assert await cache.attl("b") is None
        assert await cache.aexpire("b", 20) is True
        assert await cache.apersist("b") is True
        assert await cache.atouch("missing") is False
        assert await cache.aget_or_set("gos", lambda: 3) == 3
        assert await cache.aget_or_set("gos", 4) == 3
        await cache.aset("n", 10, 100)
        assert await cache.aincr("n", 5) == 15
        assert await cache.adecr("n", 3) == 12
        assert 99 < await cache.attl("n") <= 100  # type: ignore[operator]
        with pytest.raises(ValueError):
            await cache.aincr("missing")
        await cache.aset("text", "abc")
        with pytest.raises(redis.ResponseError):
            await cache.aincr("text")
        await cache.aset("v", "value", version=2)
        assert await cache.aincr_version("v", version=2) == 3
        assert await cache.aget("v", version=3) == "value"
        assert await cache.adecr_version("v", version=3) == 2

        keys = keys_on_both_shards(cache)
        data = {k: i for i, k in enumerate(keys)}
        assert await cache.aset_many(data) == []
        assert await cache.aset_many({}) == []
        assert await cache.aget_many([*keys, "absent"]) == data
        assert await cache.aget_many([]) == {}
        assert sorted([k async for k in cache.aiter_keys("ak*")]) == sorted(keys)
        assert await cache.adelete_many(keys[:10]) == 10
        assert await cache.aget_many(keys) == {k: data[k] for k in keys[10:]}
        assert await cache.adelete_pattern("ak*") == 20
        assert await cache.aset_many(data, 0) == []
        assert await cache.aget_many(keys) == {}
        await cache.aset("left", 1)
        assert await cache.aclear() is True
        assert await cache.aget("left") is None
        await cache.aclose()

    asyncio.run(main())
    # sync and async see the same data through the same core
    asyncio.run(cache.aset("shared", 5))
    assert cache.get("shared") == 5


def test_50_concurrent_aincr_are_atomic_and_keep_the_ttl(cache: ShardedSentinelCache) -> None:
    async def main() -> list[int]:
        started = time.monotonic()
        await cache.aset("counter", 0, 100)
        results = await asyncio.gather(*(cache.aincr("counter") for _ in range(50)))
        assert await cache.aget("counter") == 50
        # Whole seconds left, as Redis's TTL rounds: 100 until half a second has gone, then less
        # by the time the calls took (over a second on a loaded machine), never none at all.
        left = await cache.attl("counter")
        elapsed = time.monotonic() - started
        assert left is not None and 100 - elapsed - 1 < left <= 100, (left, elapsed)
        return results

    results = asyncio.run(main())
    assert sorted(results) == list(range(1, 51))  # each increment saw a distinct value


def test_no_thread_hop_per_call_once_started(
    cache: ShardedSentinelCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.set("warm", 1)  # the sync side started the shared core
    hops: list[Any] = []
    original = asyncio.to_thread

    async def spy(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(func)
        return await original(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", spy)

    async def main() -> None:
        keys = keys_on_both_shards(cache)
        for _ in range(5):
            await cache.aset_many({k: 1 for k in keys})
            await cache.aget_many(keys)
            await cache.aset("one", 1)
            await cache.aget("one")
            await cache.aincr("one")

    asyncio.run(main())
    assert hops == []
    assert cache.aclient.core is cache.core  # one core: discovery and switch state shared


def test_first_use_from_async_discovers_once_in_a_thread(make_cache: MakeCache) -> None:
    fresh = make_cache(OPTIONS={"FAILOVER_HOLD": 1.25})  # a configuration nobody started yet
    assert fresh.core.status()["started"] is False

    async def main() -> None:
        await asyncio.gather(*(fresh.aset(f"k{i}", i) for i in range(20)))
        assert await fresh.aget_many([f"k{i}" for i in range(20)]) == {
            f"k{i}": i for i in range(20)
        }

    asyncio.run(main())
    assert fresh.core.status()["started"] is True


def test_loops_are_cleaned_up_when_they_end(cache: ShardedSentinelCache) -> None:
    async def use() -> int:
        await cache.aset("loop", 1)
        assert await cache.aget("loop") == 1
        return cache.aclient.clients.loop_count

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert asyncio.run(use()) == 1
            assert cache.aclient.clients.loop_count == 0  # shutdown_asyncgens closed them
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


@pytest.mark.parametrize("multiplex", [True, False], ids=["ASYNC_MULTIPLEX", "pool"])
def test_cache_objects_of_one_core_share_connections(
    make_cache: MakeCache, cluster: LocalSentinelCluster, multiplex: bool
) -> None:
    # Under ASGI Django builds a cache object per request: they must not each open sockets.
    # Counted on the server (CLIENT LIST, by a client name of this test's own core), so the
    # same promise is checked for the shared connection (the default) and for the pool.
    name = f"share-{'mux' if multiplex else 'pool'}"
    options: dict[str, Any] = {"CONNECTION_KWARGS": {"client_name": name}}
    if not multiplex:
        options["ASYNC_MULTIPLEX"] = False
    cache = make_cache(OPTIONS=options)
    twins = [
        build_cache(cache_entry(cluster, KEY_PREFIX=cache.key_prefix, OPTIONS=options))
        for _ in range(20)
    ]
    assert all(twin.core is cache.core for twin in twins)
    assert all(twin.aclient.clients is cache.aclient.clients for twin in twins)
    key = key_on(cache, 0)

    seen: list[str] = []  # every connection named by this test, for the failure message

    def held() -> int:
        """The cache objects' connections: named by this test, not the core's own sync
        checks (housekeeping's ``ROLE`` with replicas, a master's ``INFO``; one may be open at
        the moment counted, or caught in its handshake, before its first command)."""
        own = {"role", "info", "ping", "hello", "client|setname", "client|setinfo", "select"}
        total = 0
        for master in cluster.master_names:
            with redis.Redis(*cluster.master_address(master)) as admin:
                clients = [c for c in admin.client_list() if c.get("name") == name]
            seen.extend(f"{master}: cmd={c.get('cmd')} age={c.get('age')}" for c in clients)
            total += sum(1 for c in clients if c.get("cmd") not in own)
        return total

    async def main() -> tuple[int, int]:
        await cache.aset(key, 0)
        for twin in twins:
            await twin.aincr(key)
        in_turn = held()  # one connection, used by every cache object in turn
        if multiplex:  # and at once: still that one (the pool would open one per await)
            await asyncio.gather(*(twin.aincr(key) for twin in twins))
        return in_turn, held()

    in_turn, at_once = asyncio.run(main())
    assert in_turn == 1, seen
    if multiplex and not HIREDIS_AVAILABLE:  # the pool serves (docs/configuration.md)
        assert at_once > 1, seen
    else:
        assert at_once == 1, seen
    assert cache.get(key) == (40 if multiplex else 20)


def test_aclose_closes_only_this_loops_connections(cache: ShardedSentinelCache) -> None:
    async def main() -> None:
        await cache.aset("k", 1)
        assert cache.aclient.clients.loop_count == 1
        await cache.aclose()
        assert cache.aclient.clients.loop_count == 0
        assert await cache.aget("k") == 1  # reconnects lazily
        await cache.aclose()

    asyncio.run(main())
    assert not cache.core.closed
    assert cache.get("k") == 1


def test_async_follows_a_switch_and_the_readonly_safety_net(
    make_cache: MakeCache, cluster: LocalSentinelCluster
) -> None:
    # A private core (distinct options), pointed by hand at a replica: the async connections
    # must re-point on the generation change, get READONLY for a write, re-resolve through
    # the sentinels and retry on the real master.
    # No listeners: their resync could point the shard back before the safety net is tested.
    private = make_cache(OPTIONS={"FAILOVER_HOLD": 1.5, "LISTENERS": False})
    key = key_on(private, 0)
    shard = private.core.shard_for(private.make_key(key))
    master = Address(*cluster.master_address(shard.name))

    async def main() -> None:
        await private.aset(key, "before")
        replica = Address(*cluster.replica_addresses(shard.name)[0])
        generation = shard.generation
        shard.switch(replica, source="test")
        assert shard.generation == generation + 1
        assert await private.aset(key, "after") is True  # READONLY -> re-resolve -> retry
        assert shard.address == master
        assert await private.aget(key) == "after"

    asyncio.run(main())
    assert private.get(key) == "after"


def test_async_writes_wait_for_the_fence_then_fail_clearly(make_cache: MakeCache) -> None:
    private = make_cache(OPTIONS={"FAILOVER_HOLD": 0.3})
    private.set("warm", 1)
    key = key_on(private, 1)
    shard = private.core.shard_for(private.make_key(key))

    async def main() -> None:
        await private.aset(key, "v")
        shard.raise_fence("test failover")
        try:
            assert await private.aget(key) == "v"  # reads are not held
            started = time.monotonic()
            with pytest.raises(FailoverInProgressError, match="test failover"):
                await private.aset(key, "held")
            assert 0.25 < time.monotonic() - started < 0.3 + 1.0  # the hold, not a hang

            async def release() -> None:
                await asyncio.sleep(0.1)
                shard.lower_fence()

            releaser = asyncio.ensure_future(release())
            started = time.monotonic()
            # Succeeding at all proves the release: a write still held at the end of the 0.3 s
            # hold raises FailoverInProgressError (a speed figure is not a correctness bound).
            assert await private.aset(key, "released") is True
            assert time.monotonic() - started > 0.05
            await releaser
        finally:
            shard.lower_fence()
        assert await private.aget(key) == "released"

    asyncio.run(main())
