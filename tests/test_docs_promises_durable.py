"""``DURABLE_REPLICAS`` as docs/configuration.md describes it, on real servers: after each
``set``, ``add`` and ``set_many`` (and the value ``get_or_set`` stores) the write is followed by
``WAIT`` for that many replicas, so a write that returned is on a replica; deletes, ``incr`` and ``touch`` do not wait; a replica that
does not acknowledge within ``DURABLE_TIMEOUT_MS`` is logged and the write still succeeds."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis
from waiting import key_on

from sentinel_cache.core.ops.client import CacheClient, execute
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


def waits_sent(pool: ShardedSentinelPool) -> int:
    """``WAIT`` commands shard 0's master has run (its command statistics)."""
    stats = execute(pool, pool.shards[0], lambda client: client.info("commandstats"))
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def test_writes_wait_for_a_replica_and_deletes_do_not(cluster: LocalSentinelCluster) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        client = CacheClient(pool, Codec(), durable_replicas=1, durable_timeout_ms=5000)
        name = pool.shards[0].name
        cluster.wait_for_replication(name)
        (host, port) = cluster.replica_addresses(name)[0]
        replica = redis.Redis(host, port, socket_timeout=5)
        keys = [key_on(pool, 0, f"docs-durable-{i}") for i in range(5)]
        client.delete_many(keys)

        before = waits_sent(pool)
        assert client.set(keys[0], "one", 60)
        assert replica.get(keys[0]) is not None  # acknowledged by the replica: it is there
        assert client.add(keys[1], "two", 60)
        assert replica.get(keys[1]) is not None
        assert client.set_many({keys[2]: "three", keys[3]: "four"}, 60) == []
        assert None not in replica.mget(keys[2:4])
        assert client.get_or_set(keys[4], lambda: "five", 60) == "five"
        assert replica.get(keys[4]) is not None
        assert waits_sent(pool) == before + 4  # one WAIT per write, set_many's one batch too

        assert client.incr(keys[0] + ":n", create=True) == 1
        assert client.touch(keys[1], 120)
        assert client.delete(keys[0])
        assert client.delete_many(keys[1:] + [keys[0] + ":n"]) == 5
        assert waits_sent(pool) == before + 4  # none of these waited
        replica.close()
    finally:
        pool.close()


def test_a_replica_shortfall_is_logged_and_the_write_still_succeeds(
    make_cluster: Callable[..., LocalSentinelCluster], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=1)
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    replica = cluster.replica_addresses(cluster.master_names[0])[0]
    try:
        client = CacheClient(pool, Codec(), durable_replicas=1, durable_timeout_ms=100)
        assert client.set("docs-durable-warm", "w", 60)  # connected, the replica acknowledging
        caplog.set_level(logging.WARNING, logger="sentinel_cache")
        cluster.freeze_node(replica)  # its link stays open and silent: no acknowledgement
        try:
            assert client.set("docs-durable-held", "v", 60) is True
            assert client.get("docs-durable-held") == "v"
        finally:
            cluster.thaw_node(replica)
    finally:
        pool.close()
    shortfalls = [
        record.getMessage()
        for record in caplog.records
        if "acknowledged by 0 of 1 replicas within 100 ms" in record.getMessage()
    ]
    assert len(shortfalls) == 1, [record.getMessage() for record in caplog.records]
