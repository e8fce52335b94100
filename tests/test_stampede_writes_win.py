"""``get_or_set`` with ``STAMPEDE_PROTECTION`` never overwrites a value written while it computed:
the computation stores over what the key held when it was read (nothing, or for an early refresh
the value it replaces), as Django's own ``get_or_set`` adds rather than sets. The write made
meanwhile is acknowledged, so it must survive, and it is what the computing caller returns."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from threads import Workers

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

DB = 8


@pytest.fixture(scope="module")
def single(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as topology:
        yield topology


@pytest.fixture
def pool(single: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    core = ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=DB)
    yield core
    core.close()


def blocked(started: threading.Event, go: threading.Event, value: Any) -> Any:
    def compute() -> Any:
        started.set()
        assert go.wait(10), "the test never let the computation end"
        return value

    return compute


def test_a_set_during_the_computation_of_a_cold_key_wins(pool: ShardedSentinelPool) -> None:
    client = CacheClient(pool, Codec())
    key = f"cold-{time.time_ns()}"
    started, go = threading.Event(), threading.Event()
    got: list[Any] = []
    with Workers(timeout=30) as workers:
        workers.spawn(lambda: got.append(client.get_or_set(key, blocked(started, go, "old"), 60)))
        assert started.wait(10)
        assert client.set(key, "written", 60)  # acknowledged while the computation runs
        go.set()
    assert got == ["written"]
    assert client.get(key) == "written"
    # the lock was released: the next miss computes at once
    client.delete(key)
    assert client.get_or_set(key, lambda: "again", 60) == "again"


def test_a_set_during_an_early_refresh_wins(pool: ShardedSentinelPool) -> None:
    client = CacheClient(pool, Codec())
    key = f"refresh-{time.time_ns()}"
    assert client.get_or_set(key, lambda: "first", 60, early=1e9) == "first"
    started, go = threading.Event(), threading.Event()
    got: list[Any] = []
    with Workers(timeout=30) as workers:
        # early 1e9: every hit is due for a refresh (XFetch), this one recomputes under the lock
        workers.spawn(
            lambda: got.append(client.get_or_set(key, blocked(started, go, "stale"), 60, early=1e9))
        )
        assert started.wait(10)
        assert client.set(key, "written", 60)
        go.set()
    assert got == ["written"]
    assert client.get(key) == "written"


def test_a_refresh_nobody_wrote_over_replaces_the_value(pool: ShardedSentinelPool) -> None:
    client = CacheClient(pool, Codec())
    key = f"refresh-plain-{time.time_ns()}"
    assert client.get_or_set(key, lambda: "first", 60, early=1e9) == "first"
    assert client.get_or_set(key, lambda: "second", 60, early=1e9) == "second"
    assert client.get(key) == "second"


def test_asyncio_a_set_during_the_computation_wins(pool: ShardedSentinelPool) -> None:
    key = f"acold-{time.time_ns()}"
    other = CacheClient(pool, Codec())  # another writer (another process, as far as it goes)

    def compute() -> str:
        assert other.set(key, "written", 60)  # acknowledged before the computation ends
        return "old"

    async def main() -> tuple[Any, Any]:
        client = AsyncCacheClient(pool, Codec())
        try:
            return await client.get_or_set(key, compute, 60), await client.get(key)
        finally:
            await client.aclose()

    assert asyncio.run(main()) == ("written", "written")
