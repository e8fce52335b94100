"""The near cache through an outage: a read a replica answers while the master is unreachable
is served but never kept as a near copy. The master's tracking session knows nothing of such a
read, so no invalidation would ever come for it; and the replica may lag what the master
acknowledged before it hung, which a copy would then serve for up to ``NEAR_CACHE_TTL``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from waiting import key_on, wait_until

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

pytestmark = pytest.mark.failover

ClusterFactory = Callable[..., LocalSentinelCluster]


def tracked_pool(
    make_cluster: ClusterFactory, push: bool
) -> tuple[LocalSentinelCluster, ShardedSentinelPool]:
    """One shard with a replica, its near cache tracking and the replica in step; down-after
    60 s: the frozen master is neither replaced nor demoted during a test."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=1, down_after_ms=60000)
    pool = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        near_cache_push=push,
        socket_timeout=1.0,
    )
    try:
        pool.discover()
        shard = pool.shards[0]
        wait_until(lambda: pool.near.status(0)["tracked"], 10, "shard 0 to be tracked")
        wait_until(lambda: shard.outage_replicas(shard.generation), 5, "a replica in step")
    except BaseException:
        pool.close()
        raise
    return cluster, pool


def test_replica_answers_in_an_outage_are_served_not_kept_as_near_copies(
    make_cluster: ClusterFactory, near_push: bool
) -> None:
    cluster, pool = tracked_pool(make_cluster, near_push)
    shard = pool.shards[0]
    try:
        codec = Codec()
        client = CacheClient(pool, codec)
        keys = [key_on(pool, 0, f"near-outage{i}") for i in range(6)]
        with cluster.node_client(shard.address) as master:  # not through the cache: no copies
            master.mset({key: codec.dumps(f"value of {key}") for key in keys})
            assert master.execute_command("WAIT", 1, 5000) == 1
        assert [pool.near.get(k) for k in keys] == [None] * len(keys)
        cluster.freeze_node(shard.address)
        try:
            # Found unreachable by a multi-key read: the replica answers its batch.
            many = client.get_many(keys[:3])
            assert many == {k: f"value of {k}" for k in keys[:3]}
            assert shard.in_outage(shard.generation)
            # Single reads once the outage is known: the replica answers, without a ticket.
            for key in keys[3:]:
                assert client.get(key) == f"value of {key}"
            assert shard.outage_reads >= 4
            assert [pool.near.get(k) for k in keys] == [None] * len(keys)
            assert pool.near.status(0)["entries"] == 0
        finally:
            cluster.thaw_node(shard.address)
        wait_until(lambda: not shard.in_outage(shard.generation), 10, "the outage to end")
        # The master answers again: its reads are kept as before.
        wait_until(lambda: pool.near.status(0)["tracked"], 10, "shard 0 tracked again")
        assert client.get(keys[0]) == f"value of {keys[0]}"
        wait_until(lambda: pool.near.get(keys[0]) is not None, 5, "a near copy from the master")
    finally:
        pool.close()


def test_the_near_read_that_finds_the_master_unreachable_is_answered_by_the_replica(
    make_cluster: ClusterFactory, near_push: bool
) -> None:
    """The first read of an outage, a near-cache miss (a read the master alone may answer, for
    its copy is kept): it is sent again to the replica, as a read without a near cache is."""
    cluster, pool = tracked_pool(make_cluster, near_push)
    shard = pool.shards[0]
    try:
        codec = Codec()
        client = CacheClient(pool, codec)
        key = key_on(pool, 0, "near-first")
        with cluster.node_client(shard.address) as master:
            master.set(key, codec.dumps("stored"))
            assert master.execute_command("WAIT", 1, 5000) == 1
        served = shard.outage_reads
        cluster.freeze_node(shard.address)
        try:
            assert client.get(key) == "stored"
            assert shard.in_outage(shard.generation) and shard.outage_reads == served + 1
            assert pool.near.get(key) is None and pool.near.status(0)["in_flight"] == 0
        finally:
            cluster.thaw_node(shard.address)
    finally:
        pool.close()
