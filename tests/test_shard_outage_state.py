"""A shard's outage (its master found unreachable, nothing replacing it) is part of the state
every call reads in one look (``Shard.state``): it begins once per master, ends when that master
answers again, and a switch starts without it, so a call on the new master never takes the
outage's path. Then the runner's use of it, both ways: a read on a shard in a known outage goes
to a replica in step first, and one on a shard out of it goes to the master."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from waiting import key_on, wait_until

from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]
TIMEOUT = 2.0  # the data nodes' SOCKET_TIMEOUT: what a call pays on the hung master


def test_the_outage_is_in_the_state_and_a_switch_starts_without_it(
    make_core: Callable[..., ShardedSentinelPool],
) -> None:
    core = make_core(listeners=False, outage_reads=False, discover=True)
    shard = core.shards[0]
    generation = shard.generation
    assert shard.state.unreachable_since is None and not shard.in_outage(generation)

    shard.note_unreachable(generation - 1)  # an older master's: moot
    assert shard.state.unreachable_since is None
    shard.note_unreachable(generation)
    since = shard.state.unreachable_since
    assert since is not None and shard.unreachable_since == since
    assert shard.in_outage(generation) and not shard.in_outage(generation - 1)
    shard.note_unreachable(generation)  # found again: the outage began at the first
    assert shard.state.unreachable_since == since

    shard.reachable_again()
    assert shard.state.unreachable_since is None and not shard.in_outage(generation)

    shard.note_unreachable(generation)
    state = shard.state
    moved, _ = shard.switch(Address("127.0.0.1", 1), source="test")
    assert moved == "moved"
    assert shard.state.generation == generation + 1
    assert shard.state.unreachable_since is None  # the new master's state: no outage
    assert not shard.in_outage(generation) and not shard.in_outage(generation + 1)
    assert state.unreachable_since is not None  # the old look is a value, never changed


@pytest.mark.failover
def test_a_read_in_a_known_outage_asks_a_replica_first_and_after_it_the_master(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=1, down_after_ms=60000)
    pools = [
        ShardedSentinelPool(
            cluster.master_names,
            cluster.sentinel_addresses,
            socket_timeout=TIMEOUT,
            outage_reads=reads,
            # Without OUTAGE_READS the reads must raise at once, not be held for a switch that
            # never comes (the default hold took 10 s a call, 20 s of this test's 28).
            **({} if reads else {"outage_hold": 0}),
        )
        for reads in (True, False)
    ]
    pool, without = pools
    try:
        for each in pools:
            each.discover()
        shard, shard_without = pool.shards[0], without.shards[0]
        client, client_without = CacheClient(pool, Codec()), CacheClient(without, Codec())
        wait_until(lambda: shard.outage_replicas(shard.generation), 10, "a replica in step")
        key = key_on(pool, 0, "outage-state")

        async def aget() -> object:
            aclient = AsyncCacheClient(pool, Codec())
            try:
                return await aclient.get(key)
            finally:
                await aclient.aclose()

        client.set(key, "value", None)
        master = shard.address
        assert master is not None
        with cluster.node_client(master) as node:
            assert node.execute_command("WAIT", 1, 5000) == 1
        cluster.freeze_node(master)
        try:
            assert client.get(key) == "value"  # found unreachable; the replica answered
            assert shard.state.unreachable_since is not None
            with pytest.raises(ShardUnavailableError):  # OUTAGE_READS off: no replica asked
                client_without.get(key)
            assert shard_without.state.unreachable_since is not None
            with pytest.raises(ShardUnavailableError):  # ... in the known outage either
                client_without.get(key)

            # Known: the replica first, the hung master not waited on again.
            for get in (lambda: client.get(key), lambda: asyncio.run(aget())):
                served, began = shard.outage_reads, time.monotonic()
                assert get() == "value"
                assert time.monotonic() - began < TIMEOUT
                assert shard.outage_reads == served + 1
        finally:
            cluster.thaw_node(master)
        wait_until(lambda: not shard.in_outage(shard.generation), 15, "the outage's end")
        assert shard.state.unreachable_since is None
        served = shard.outage_reads
        assert client.get(key) == "value"
        assert asyncio.run(aget()) == "value"
        assert shard.outage_reads == served  # the master answered
    finally:
        for each in pools:
            each.close()
