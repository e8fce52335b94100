"""Closing the core releases everything it holds, asyncio connections included."""

from __future__ import annotations

import asyncio
import time

from threads import Workers

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


def test_closing_the_core_closes_its_asyncio_connections(cluster: LocalSentinelCluster) -> None:
    core = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    client = AsyncCacheClient(core, Codec())
    loop = asyncio.new_event_loop()
    workers = Workers(timeout=5)
    workers.spawn(loop.run_forever, name="loop")
    try:

        async def use() -> list[object]:
            await client.set("lifecycle", 1, None)
            assert await client.get("lifecycle") == 1
            return [await client.io.master(shard) for shard in core.shards]

        pools = asyncio.run_coroutine_threadsafe(use(), loop).result(10)
        connections = [c for p in pools for c in p.connection_pool._connections]  # type: ignore[attr-defined]
        assert connections and any(c.is_connected for c in connections)
        assert client.clients.loop_count == 1
        core.close()  # from another thread than the loop's
        deadline = time.monotonic() + 5
        while any(c.is_connected for c in connections) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(c.is_connected for c in connections)
        assert client.clients.loop_count == 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        workers.join()
        loop.close()
