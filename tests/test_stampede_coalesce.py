"""``get_or_set`` with ``STAMPEDE_PROTECTION``: the threads (or tasks) of one process that call it
on one key at once coalesce before the read, not after it. One of them reads the key (and on a
miss takes the lock and computes); the others make no round trip and take no connection of their
own. On a hit each still gets its own copy of the value. Real servers (one master, no replica:
freezing it cannot fail it over)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from threads import Workers
from waiting import wait_until

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ops.sync_io import shared_flights
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

DB = 7
#: The commands the script that stores a computed value runs: it checks the lock is still the
#: holder's and the key was not written meanwhile (GET, GET), then sets the value and its
#: duration (SET, SET).
STORE_GETS, STORE_SETS = 2, 2
#: The look at the key under the freshly taken lock (a value stored since the read is returned,
#: not computed again): one GET, in the lock's round trip.
LOOK_GETS = 1


@pytest.fixture(scope="module")
def single(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as topology:
        yield topology


def calls(topology: LocalSentinelCluster, pool: ShardedSentinelPool, command: str) -> int:
    """How many times the master has run ``command`` (``INFO commandstats``)."""
    with topology.node_client(pool.shards[0].address) as node:
        stats = node.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_threads_on_a_cold_key_read_it_once_and_take_the_lock_once(
    single: LocalSentinelCluster,
) -> None:
    pool = ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=DB)
    client = CacheClient(pool, Codec())
    key = f"cold-{time.time_ns()}"
    flights = shared_flights(pool)
    runs: list[int] = []

    def compute() -> str:
        # every other caller is in the flight before it ends (none comes late to a hit)
        wait_until(lambda: flights.waiting(key) == 15, 10, "15 callers waiting on the flight")
        runs.append(1)
        return "computed"

    got: list[Any] = []
    try:
        client.get("warm-up")  # connected, the master known
        gets, sets = calls(single, pool, "get"), calls(single, pool, "set")
        with Workers(timeout=30) as workers:
            for _ in range(16):
                workers.spawn(lambda: got.append(client.get_or_set(key, compute, 60)))
        assert got == ["computed"] * 16
        assert runs == [1]
        # one read, not one per thread, the look under the lock and the store's check of its
        # lock (commandstats counts the commands a script runs too); the lock taken once, the
        # script's two SETs
        assert calls(single, pool, "get") - gets == 1 + LOOK_GETS + STORE_GETS
        assert calls(single, pool, "set") - sets == 1 + STORE_SETS
        assert client.get(key) == "computed"
    finally:
        pool.close()


def test_threads_coalesced_on_a_hit_each_get_their_own_copy(
    single: LocalSentinelCluster,
) -> None:
    pool = ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=DB)
    client = CacheClient(pool, Codec())
    key = f"hit-{time.time_ns()}"
    flights = shared_flights(pool)
    stored = {"rows": [1, 2, 3]}
    got: list[Any] = []

    def never() -> Any:
        raise AssertionError("computed on a hit")

    try:
        client.set(key, stored, 60)
        gets = calls(single, pool, "get")
        address = pool.shards[0].address
        with Workers(timeout=30) as workers:
            single.freeze_node(address)  # the first caller's read waits: the others join it
            try:
                for _ in range(8):
                    workers.spawn(lambda: got.append(client.get_or_set(key, never, 60)))
                wait_until(lambda: flights.waiting(key) == 7, 10, "7 callers on the read")
            finally:
                single.thaw_node(address)
        assert got == [stored] * 8
        assert len({id(value) for value in got}) == 8  # decoded once per caller
        assert calls(single, pool, "get") - gets == 1
    finally:
        pool.close()


def test_async_tasks_on_a_cold_key_read_it_once(single: LocalSentinelCluster) -> None:
    pool = ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=DB)
    key = f"async-cold-{time.time_ns()}"
    runs: list[int] = []

    def compute() -> str:
        runs.append(1)
        return "computed"

    async def main() -> tuple[list[Any], int]:
        client = AsyncCacheClient(pool, Codec())
        try:
            await client.get("warm-up")
            gets = calls(single, pool, "get")
            got = await asyncio.gather(*(client.get_or_set(key, compute, 60) for _ in range(20)))
            return list(got), calls(single, pool, "get") - gets
        finally:
            await client.aclose()

    try:
        got, gets = asyncio.run(main())
        assert got == ["computed"] * 20
        assert runs == [1]
        assert gets == 1 + LOOK_GETS + STORE_GETS
    finally:
        pool.close()


def test_a_non_string_or_unreadable_value_is_a_miss_computed_over(
    single: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    pool = ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=DB)
    client = CacheClient(pool, Codec())
    listed, garbled = f"listed-{time.time_ns()}", f"garbled-{time.time_ns()}"
    try:
        raw = pool.client_for(listed)
        raw.rpush(listed, "not a cache value")
        pool.client_for(garbled).set(garbled, b"\x00 not what the codec wrote")
        with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
            assert client.get_or_set(listed, lambda: "computed", 60) == "computed"
            assert client.get_or_set(garbled, lambda: "computed", 60) == "computed"
        assert client.get(listed) == "computed" and client.get(garbled) == "computed"
        messages = [r.getMessage() for r in caplog.records]
        assert any("non-string value" in m and listed in m for m in messages)
        assert any("unreadable value" in m and garbled in m for m in messages)
    finally:
        pool.close()


def test_async_tasks_of_two_caches_on_one_key_never_share_an_outcome(
    single: LocalSentinelCluster,
) -> None:
    """Two cores (here two databases of one master) in one event loop: the same key is two
    keys, each read and computed by its own callers."""
    pools = [
        ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=db)
        for db in (DB, DB + 1)
    ]
    key = f"two-caches-{time.time_ns()}"

    async def main() -> list[Any]:
        clients = [AsyncCacheClient(pool, Codec()) for pool in pools]
        try:
            await clients[0].set(key, "stored in the first", 60)
            return list(
                await asyncio.gather(
                    *(
                        client.get_or_set(key, lambda n=n: f"computed by cache {n}", 60)
                        for _ in range(3)
                        for n, client in enumerate(clients)
                    )
                )
            )
        finally:
            for client in clients:
                await client.aclose()

    try:
        assert asyncio.run(main()) == ["stored in the first", "computed by cache 1"] * 3
    finally:
        for pool in pools:
            pool.close()
