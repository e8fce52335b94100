"""A master that hangs (SIGSTOP: its sockets open and silent) before the sentinels fail it
over: only the call that finds it unreachable pays its ``SOCKET_TIMEOUT``. Once the outage is
known, reads are answered by the replica in step without asking the master first, writes with
``OUTAGE_HOLD`` wait before they are sent, and the outage ends when the master answers again.
``-s`` prints the figures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from waiting import key_on, wait_until

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

pytestmark = pytest.mark.failover

ClusterFactory = Callable[..., LocalSentinelCluster]
TIMEOUT = 2.0  # the data nodes' SOCKET_TIMEOUT
HOLD = 0.5
READS = 10


def hung_pool(make_cluster: ClusterFactory) -> tuple[LocalSentinelCluster, ShardedSentinelPool]:
    """One shard with a replica; the sentinels' down-after (60 s) outlasts the test, so the
    frozen master is neither replaced nor demoted meanwhile."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=1, down_after_ms=60000)
    pool = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, socket_timeout=TIMEOUT, outage_hold=HOLD
    )
    pool.discover()
    shard = pool.shards[0]
    wait_until(lambda: shard.outage_replicas(shard.generation), 5, "a replica in step")
    return cluster, pool


def timed(call: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    value = call()
    return value, time.monotonic() - started


def test_only_the_first_read_of_a_hung_master_waits_for_its_timeout(
    make_cluster: ClusterFactory,
) -> None:
    cluster, pool = hung_pool(make_cluster)
    shard = pool.shards[0]
    client = CacheClient(pool, Codec())
    keys = [key_on(pool, 0, f"hung{i}") for i in range(READS)]
    try:
        for key in keys:
            client.set(key, f"value of {key}", None)
        with cluster.node_client(shard.address) as master:
            assert master.execute_command("WAIT", 1, 5000) == 1
        served = shard.outage_reads
        cluster.freeze_node(shard.address)
        try:
            value, first = timed(lambda: client.get(keys[0]))
            assert value == f"value of {keys[0]}"
            assert first >= TIMEOUT  # it met the silent master: its timeout, then the replica
            assert shard.in_outage(shard.generation)
            answers = [timed(lambda k=key: client.get(k)) for key in keys]
            assert [a for a, _ in answers] == [f"value of {k}" for k in keys]
            # Asked of the master first, each would wait TIMEOUT again before the replica.
            slowest = max(t for _, t in answers)
            print(f"\nhung master: first read {first:.2f} s, the next {READS} at most {slowest * 1e3:.1f} ms")
            assert slowest < TIMEOUT / 2, answers
            assert shard.outage_reads == served + 1 + READS
            # A write is held before it is sent: the hold, never the master's timeout first.
            with pytest.raises(Exception, match=r"OUTAGE_HOLD \(0\.5s\)") as raised:
                timed(lambda: client.set(keys[0], "during", None))
            assert "shard 0" in str(raised.value)
        finally:
            cluster.thaw_node(shard.address)
        # The housekeeper finds the master answering again: the outage ends, the master serves.
        wait_until(lambda: not shard.in_outage(shard.generation), 10, "the outage to end")
        assert client.set(keys[0], "after", None)
        assert client.get(keys[0]) == "after"
        served = shard.outage_reads
        assert [client.get(k) for k in keys[1:]] == [f"value of {k}" for k in keys[1:]]
        assert shard.outage_reads == served  # no replica asked once the master answers
    finally:
        pool.close()


def test_asyncio_reads_of_a_known_outage_skip_the_hung_master(
    make_cluster: ClusterFactory,
) -> None:
    cluster, pool = hung_pool(make_cluster)
    shard = pool.shards[0]
    key = key_on(pool, 0, "ahung")

    async def main() -> list[float]:
        client = AsyncCacheClient(pool, Codec())
        await client.set(key, "v", None)
        with cluster.node_client(shard.address) as master:
            assert master.execute_command("WAIT", 1, 5000) == 1
        cluster.freeze_node(shard.address)
        try:
            assert await client.get(key) == "v"  # pays the timeout once
            times = []
            for _ in range(READS):
                started = time.monotonic()
                assert await client.get(key) == "v"
                times.append(time.monotonic() - started)
            return times
        finally:
            cluster.thaw_node(shard.address)
            await client.aclose()

    try:
        served = shard.outage_reads
        times = asyncio.run(main())
        assert max(times) < TIMEOUT / 2, times
        assert shard.outage_reads == served + 1 + READS
    finally:
        pool.close()
