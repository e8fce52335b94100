"""The safety net's one retry that fails too goes through the same rules as the first failure
(``run`` applies them in one loop): the shard is asked about again, so the last try goes to the
master the sentinels name, never to the node that just failed, and the error, if any, is the
shard's. Real servers; the node that is down is a loopback port nobody listens on."""

from __future__ import annotations

from typing import Any

import redis
from waiting import key_on

from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.client import execute
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.processes import free_ports


def test_a_retry_that_fails_too_asks_the_sentinels_before_the_last_try(
    cluster: LocalSentinelCluster,
) -> None:
    core = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    core.discover()
    try:
        shard = core.shards[0]
        master = shard.address
        assert master is not None
        dead = Address("127.0.0.1", free_ports(1)[0])
        key = key_on(core, 0, "retry-fails-too")
        tried: list[Address | None] = []

        def write(client: redis.Redis) -> Any:
            tried.append(shard.address)
            if len(tried) == 1:  # while this call fails, the shard moves to a node down as well
                shard.switch(dead, source="test: moved to a node that is down")
            return client.set(key, "v")

        assert execute(core, shard, write) is True
        # The first try failed on the moved connection, the retry on the dead node; its failure
        # made the shard ask the sentinels, who name the master: the last try went there.
        assert tried == [master, dead, master]
        assert shard.address == master
        assert shard.client.get(key) == b"v"
    finally:
        core.close()
