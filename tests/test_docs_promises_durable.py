"""``DURABLE_REPLICAS`` as docs/configuration.md describes it, on real servers: every write
(``set``, ``add``, ``set_many``, the value ``get_or_set`` stores, ``incr``, ``touch``, ``delete``,
``delete_many``, ...) is followed by ``WAIT`` for that many replicas, so a write or a delete that
returned is on a replica (a crash of the master cannot bring a deleted key back); a replica that
does not acknowledge within ``DURABLE_TIMEOUT_MS`` is logged and the write still succeeds."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis
from durable_support import shortfalls
from waiting import key_on

from sentinel_cache.core.ops.client import CacheClient, execute
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


def waits_sent(pool: ShardedSentinelPool) -> int:
    """``WAIT`` commands shard 0's master has run (its command statistics)."""
    stats = execute(pool, pool.shards[0], lambda client: client.info("commandstats"))
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def test_writes_and_deletes_wait_for_a_replica(cluster: LocalSentinelCluster) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        client = CacheClient(pool, Codec(), durable_replicas=1, durable_timeout_ms=5000)
        name = pool.shards[0].name
        cluster.wait_for_replication(name)
        (host, port) = cluster.replica_addresses(name)[0]
        replica = redis.Redis(host, port, socket_timeout=5)
        keys = [key_on(pool, 0, f"docs-durable-{i}") for i in range(5)]
        client.delete_many([*keys, key_on(pool, 0, "docs-durable-counter")])

        before = waits_sent(pool)
        assert client.set(keys[0], "one", 60)
        assert replica.get(keys[0]) is not None  # acknowledged by the replica: it is there
        assert client.add(keys[1], "two", 60)
        assert replica.get(keys[1]) is not None
        assert client.set_many({keys[2]: "three", keys[3]: "four"}, 60) == []
        assert None not in replica.mget(keys[2:4])
        assert client.get_or_set(keys[4], lambda: "five", 60) == "five"
        assert replica.get(keys[4]) is not None
        # one WAIT per write: set_many's one batch, get_or_set's lock and its store
        assert waits_sent(pool) == before + 5

        counter = key_on(pool, 0, "docs-durable-counter")
        assert client.incr(counter, create=True) == 1
        assert replica.get(counter) == b"1"
        assert client.touch(keys[1], 120)
        assert replica.ttl(keys[1]) > 60
        assert client.delete(keys[0])
        assert replica.exists(keys[0]) == 0  # the delete is on the replica when it returns
        assert client.delete_many(keys[1:] + [counter]) == 5
        assert replica.exists(*keys[1:], counter) == 0
        assert waits_sent(pool) == before + 9  # deletes, incr and touch waited too
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
    assert len(shortfalls(caplog, 100)) == 1, caplog.messages


def test_every_operation_answers_the_same_with_durable_replicas(
    cluster: LocalSentinelCluster,
) -> None:
    """The WAIT the runner appends to a write is its own: every operation's answer is the same
    with DURABLE_REPLICAS as without (single- and multi-key, scripts, MULTI/EXEC, across shards)."""
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        answers = []
        for durable in (0, 1):
            client = CacheClient(pool, Codec(), durable_replicas=durable, durable_timeout_ms=5000)
            k = [f"docs-durable-ops-{i}" for i in range(6)]
            client.delete_many(k)
            answers.append(
                [
                    client.set(k[0], "v", 60),
                    client.set(k[0], "w", 60, xx=True),
                    client.add(k[0], "x", 60),
                    client.incr(k[1], 2**63 - 1, create=True),
                    client.incr(k[1], 5),  # past 64 bits: the read-modify-write script
                    client.touch(k[0], 120),
                    client.set_many({k[2]: 1, k[3]: 2}, 60),
                    client.get_or_set_many({k[2]: 9, k[4]: 4}, 60),
                    client.sadd(k[5], "a", "b"),
                    client.sinterstore(k[4] + "s", k[5], k[5]),
                    client.smove(k[5], k[4] + "t", "a"),
                    client.hset(k[3] + "h", "f", "v"),
                    client.zadd(k[3] + "z", {"m": 1.0}),
                    client.zincrby(k[3] + "z", 2, "m"),
                    client.delete(k[0]),
                    client.remove_many([k[1], k[2]]),
                    client.delete_many([*k, k[4] + "s", k[4] + "t", k[3] + "h", k[3] + "z"]),
                ]
            )
        assert answers[0] == answers[1]
    finally:
        pool.close()
