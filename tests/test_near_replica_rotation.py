"""With ``READ_FROM_REPLICAS`` and the near cache, a read whose replies may be kept goes to the
master, the node whose tracking session keeps the copies current: a replica in the read
rotation may not have applied a write the master announced yet, and its stale reply would then
be served until ``NEAR_CACHE_TTL``. Checked by the nodes' own command counts, for a ``get`` and
for a ``get_many`` whose keys all live on one shard (the scatter's one-shard path)."""

from __future__ import annotations

from collections.abc import Callable

from waiting import key_on, wait_until

from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


def calls(cluster: LocalSentinelCluster, address: Address, command: str) -> int:
    with cluster.node_client(address) as node:
        stats = node.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_near_reads_go_to_the_master_not_the_read_rotation(
    make_core: Callable[..., ShardedSentinelPool], cluster: LocalSentinelCluster
) -> None:
    core = make_core(near_cache=True, read_from_replicas=True, db=12, discover=True)
    client = CacheClient(core, Codec())
    shard = core.shards[0]
    wait_until(lambda: core.near.status(0)["tracked"], 10, "shard 0 to be tracked")
    wait_until(lambda: shard.serving_replicas, 10, "a replica in the read rotation")
    (replica,) = shard.serving_replicas
    master = shard.address
    assert master is not None
    keys = [key_on(core, 0, f"rotation{i}") for i in range(4)]
    client.set_many(dict.fromkeys(keys, "v"), None)
    client.forget(keys)  # no copy kept by the writes: the reads below make them
    with cluster.node_client(master) as node:
        assert node.execute_command("WAIT", 1, 5000) == 1
    before = [calls(cluster, a, c) for a in (master, replica) for c in ("get", "mget")]
    assert client.get_many(keys[:3]) == dict.fromkeys(keys[:3], "v")
    assert client.get(keys[3]) == "v"
    after = [calls(cluster, a, c) for a in (master, replica) for c in ("get", "mget")]
    # master: one GET, one MGET; the replica: none
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 0, 0]
    assert all(core.near.get(key) is not None for key in keys)  # kept: the master's replies


def test_without_a_near_cache_a_one_shard_get_many_reads_the_rotation(
    make_core: Callable[..., ShardedSentinelPool], cluster: LocalSentinelCluster
) -> None:
    """The master-only rule is the near cache's: without one, READ_FROM_REPLICAS still sends a
    get_many whose keys all live on one shard to the read rotation."""
    core = make_core(read_from_replicas=True, db=12, discover=True)
    client = CacheClient(core, Codec())
    shard = core.shards[0]
    wait_until(lambda: shard.serving_replicas, 10, "a replica in the read rotation")
    (replica,) = shard.serving_replicas
    master = shard.address
    assert master is not None
    keys = [key_on(core, 0, f"rotation-off{i}") for i in range(3)]
    client.set_many(dict.fromkeys(keys, "v"), None)
    with cluster.node_client(master) as node:
        assert node.execute_command("WAIT", 1, 5000) == 1
    before = [calls(cluster, a, "mget") for a in (master, replica)]
    assert client.get_many(keys) == dict.fromkeys(keys, "v")
    after = [calls(cluster, a, "mget") for a in (master, replica)]
    assert [b - a for a, b in zip(before, after, strict=True)] == [0, 1]
