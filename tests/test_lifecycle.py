"""Closing the core releases everything it holds, asyncio connections included."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from threads import Workers

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


def _connections(pool: Any) -> list[Any]:
    """A master pool's asyncio connections: the pooled ones, or the shared one
    (``ASYNC_MULTIPLEX``)."""
    if hasattr(pool, "link"):  # a shard this test did not use has none
        return [] if pool.link is None else [pool.link]
    return list(pool._connections)


def _is_open(connection: Any) -> bool:
    closed = getattr(connection, "closed", False)  # a shared connection's: None while open
    return closed is None if closed is not False else bool(connection.is_connected)


@pytest.mark.parametrize("multiplex", [False, True], ids=["pool", "ASYNC_MULTIPLEX"])
def test_closing_the_core_closes_its_asyncio_connections(
    cluster: LocalSentinelCluster, multiplex: bool
) -> None:
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, listeners=False, async_multiplex=multiplex
    )
    client = AsyncCacheClient(core, Codec())
    loop = asyncio.new_event_loop()
    workers = Workers(timeout=5)
    workers.spawn(loop.run_forever, name="loop")
    try:

        async def use() -> list[object]:
            await client.set("lifecycle", 1, None)
            assert await client.get("lifecycle") == 1
            return [await client.io.master(shard) for shard in core.shards]

        masters = asyncio.run_coroutine_threadsafe(use(), loop).result(10)
        connections = [c for m in masters for c in _connections(m.connection_pool)]  # type: ignore[attr-defined]
        assert connections and any(_is_open(c) for c in connections)
        assert client.clients.loop_count == 1
        core.close()  # from another thread than the loop's
        deadline = time.monotonic() + 5
        while any(_is_open(c) for c in connections) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(_is_open(c) for c in connections)
        assert client.clients.loop_count == 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        workers.join()
        loop.close()
