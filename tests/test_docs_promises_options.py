"""Two rows of docs/configuration.md's option tables, on real servers:

* ``HEALTH_CHECK_INTERVAL``: "seconds of idleness after which a connection is ``PING``ed before
  use (0: never)": the master's own command count of ``PING`` says when one was sent;
* ``IGNORE_EXCEPTIONS``: "Serialization errors are never ignored": a value that cannot be
  serialized raises even when failing open, and nothing of the call is stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from waiting import key_on

from sentinel_cache.core.ops.client import CacheClient, execute
from sentinel_cache.core.ops.plans import FailOpen
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import SerializationError
from sentinel_cache.testing import LocalSentinelCluster

INTERVAL = 0.3


def pings(cluster: LocalSentinelCluster) -> int:
    """``PING`` commands the shard's master has run (asked on a connection of its own)."""
    with cluster.node_client(cluster.master_address(cluster.master_names[0])) as node:
        stats = node.info("commandstats")
    return int(stats.get("cmdstat_ping", {}).get("calls", 0))


def exists(pool: ShardedSentinelPool, key: str) -> int:
    """Whether the key is on its shard's master at all, whatever its bytes."""
    shard = pool.shards[pool.shard_index(key)]
    return int(execute(pool, shard, lambda client: client.exists(key)))


@pytest.mark.parametrize("interval", [INTERVAL, 0.0])
def test_an_idle_connection_is_pinged_before_use(
    make_cluster: Callable[..., LocalSentinelCluster], interval: float
) -> None:
    cluster = make_cluster(shards=1, replicas=0, sentinels=1)
    pool = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        listeners=False,
        max_connections=1,  # every call on the one connection
        health_check_interval=interval,
    )
    try:
        client = CacheClient(pool, Codec())
        assert client.set("docs:idle", "v", 60)
        before = pings(cluster)
        assert client.get("docs:idle") == "v"  # just used: no ping
        busy = pings(cluster)
        time.sleep(INTERVAL * 2)  # the idleness the option is about
        assert client.get("docs:idle") == "v"
        after = pings(cluster)
    finally:
        pool.close()
    assert busy == before
    assert after == busy + (1 if interval else 0)


def test_a_serialization_error_is_never_ignored(cluster: LocalSentinelCluster) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        client = CacheClient(pool, Codec(), fail_open=FailOpen(ignore=True))
        good, bad = key_on(pool, 0, "docs:failopen:good"), key_on(pool, 1, "docs:failopen:bad")
        client.delete_many([good, bad])

        def unpicklable() -> None:  # a local function: pickle cannot name it
            return None

        with pytest.raises(SerializationError):
            client.set(bad, unpicklable, 60)
        with pytest.raises(SerializationError):
            client.set_many({good: "fine", bad: unpicklable}, 60)
        stored = [exists(pool, good), exists(pool, bad)]
    finally:
        pool.close()
    assert stored == [0, 0]  # the good key of the refused batch was not written either
