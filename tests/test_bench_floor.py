"""benchmarks/floor.py, the floor contender of make bench, against real servers: it does what
the other contenders do (same values, timeouts, results, placement as ours), so its figures
are a fair floor, and a failed call never leaves a reply for the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import hiredis
import pytest
import redis

from benchmarks.contenders import TIMEOUT, Contender, Topology, _raw_sharded
from benchmarks.floor import floor_one, floor_sharded
from sentinel_cache.core.ring import HashRing
from sentinel_cache.testing import LocalSentinelCluster

VALUE = {"id": 1, "name": "floor", "tags": ["a", "b"], "score": 1.5}


@pytest.fixture
def floors(cluster: LocalSentinelCluster) -> Iterator[tuple[Topology, Contender, Contender]]:
    topo = Topology.of(cluster)
    one, sharded = floor_one(topo), floor_sharded(topo)
    yield topo, one, sharded
    one.close()
    sharded.close()


@pytest.fixture
def servers(cluster: LocalSentinelCluster) -> Iterator[list[redis.Redis]]:
    """A client straight to each master, in the masters' order."""
    made = [redis.Redis(host=h, port=p) for h, p in Topology.of(cluster).master_addresses]
    yield made
    for client in made:
        client.close()


def test_each_key_lands_on_the_master_our_ring_picks_with_the_bench_timeout(
    floors: tuple[Topology, Contender, Contender], servers: list[redis.Redis]
) -> None:
    topo, _, floor = floors
    ring = HashRing([1] * len(topo.masters))
    keys = [f"floor-test:place:{i}" for i in range(40)]
    assert floor.set(keys[0], VALUE) is True
    assert floor.set_many(dict.fromkeys(keys[1:], VALUE)) is True
    used = set()
    for key in keys:
        home = ring.shard_index(key)
        used.add(home)
        for index, node in enumerate(servers):
            assert node.exists(key) == (1 if index == home else 0), (key, index)
        assert TIMEOUT - 5 < servers[home].ttl(key) <= TIMEOUT
    assert used == set(range(len(servers)))  # 40 keys reach every shard


def test_results_are_the_same_as_redis_py_on_the_same_masters(
    floors: tuple[Topology, Contender, Contender],
) -> None:
    topo, _, floor = floors
    plain = _raw_sharded(topo)
    try:
        keys = [f"floor-test:same:{i}" for i in range(30)]
        plain.delete_many(keys)
        floor.set_many(dict.fromkeys(keys[:20], VALUE))
        assert floor.get_many(keys) == plain.get_many(keys) == dict.fromkeys(keys[:20], VALUE)
        assert floor.get(keys[0]) == plain.get(keys[0]) == VALUE
        assert floor.get(keys[25]) is None
        assert floor.delete_many(keys) == 20
        assert plain.get_many(keys) == {} and floor.get_many(keys) == {}
        floor.set("floor-test:n", 0)
        assert floor.incr("floor-test:n") == 1
        assert plain.incr("floor-test:n") == 2
        assert floor.get("floor-test:n") == 2
    finally:
        plain.close()


def test_one_master_keeps_every_key_on_the_first(
    floors: tuple[Topology, Contender, Contender], servers: list[redis.Redis]
) -> None:
    _, one, _ = floors
    keys = [f"floor-test:one:{i}" for i in range(20)]
    one.set_many(dict.fromkeys(keys, VALUE))
    first, *others = servers
    assert first.exists(*keys) == 20
    assert all(node.exists(*keys) == 0 for node in others)
    assert one.get_many(keys) == dict.fromkeys(keys, VALUE)
    assert one.delete_many(keys) == 20


def test_an_error_reply_is_raised_and_the_next_call_reads_its_own_reply(
    floors: tuple[Topology, Contender, Contender],
) -> None:
    _, _, floor = floors
    floor.set("floor-test:text", VALUE)
    with pytest.raises(hiredis.ReplyError, match="not an integer"):
        floor.incr("floor-test:text")
    assert floor.get("floor-test:text") == VALUE  # not the error, nor a reply left unread


def test_the_async_calls_use_their_own_connections_and_close_them(
    floors: tuple[Topology, Contender, Contender],
) -> None:
    _, _, floor = floors

    async def calls() -> None:
        assert await floor.aset("floor-test:async", VALUE) is True
        assert await floor.aget("floor-test:async") == VALUE
        assert await floor.aget("floor-test:async-missing") is None
        await floor.aclose()

    asyncio.run(calls())
    assert floor.get("floor-test:async") == VALUE
