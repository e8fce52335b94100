"""A near-cache copy is not served while a failover is announced, nor after a replica was
promoted since its read: a process whose listener noticed the switch first (scheduled sooner)
may already write on the new master, which this process's tracking hears nothing of. Found by
the history checker's near-cache failover scenarios: a few reads in a hundred thousand, 2 to
25 ms after another process's acknowledged overwrite, returned the old copy (the lag between
two processes' listeners on a loaded machine). The fence goes up at the failover leader's first
announcement, about a second before any process can write on the new master.

Real servers and the real listener: the sentinels' messages are fed to it as they are sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_near_cache_truth import near_status, tracked
from waiting import wait_until

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture
def core(cluster: LocalSentinelCluster, near_push: bool) -> Iterator[ShardedSentinelPool]:
    made = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        near_cache_push=near_push,
        db=10,
    )
    CacheClient(made, Codec()).clear(None)
    wait_until(lambda: tracked(made), 5, "tracking")
    wait_until(lambda: made.listeners is not None and made.listeners.listeners(), 5, "listeners")
    yield made
    made.close()


def _announce(core: ShardedSentinelPool, key: str, channel: str) -> None:
    """The failover leader's message about the key's shard, as a sentinel publishes it."""
    shard = core.shard_for(key)
    master = shard.address
    assert master is not None and core.listeners is not None
    replica = f"slave 127.0.0.1 1 @ {shard.name} {master.host} {master.port}"
    message = f"master {shard.name} {master.host} {master.port}"
    data = message if channel.startswith("-") else replica
    core.listeners.listeners()[0].handle(channel, data)


def _served(client: CacheClient, core: ShardedSentinelPool, key: str) -> bool:
    """Read ``key`` once (its value never changes here): was it a near-cache hit?"""
    before = near_status(core, key)["hits"]
    assert client.get(key) == "old"
    return near_status(core, key)["hits"] > before


def test_a_copy_is_not_served_while_a_failover_is_announced(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    key = "fence:announced"
    assert client.set(key, "old", 600) is True
    wait_until(lambda: _served(client, core, key), 5, "a near-cache hit")
    _announce(core, key, "+selected-slave")
    try:
        assert core.shard_for(key).fenced
        assert [_served(client, core, key) for _ in range(3)] == [False] * 3
    finally:
        _announce(core, key, "-failover-abort-not-elected")
    assert not core.shard_for(key).fenced
    # The failover gave up before any promotion: the old master stayed; copies serve again.
    wait_until(lambda: _served(client, core, key), 5, "a near-cache hit after the abort")


def test_a_copy_read_before_a_promotion_is_not_served_after_it(
    core: ShardedSentinelPool,
) -> None:
    client = CacheClient(core, Codec())
    key = "fence:promoted"
    assert client.set(key, "old", 600) is True
    wait_until(lambda: _served(client, core, key), 5, "a near-cache hit")
    promotions = core.shard_for(key).promotions
    _announce(core, key, "+failover-state-wait-promotion")
    _announce(core, key, "-failover-abort-slave-timeout")  # the fence is lowered, no switch
    assert core.shard_for(key).promotions == promotions + 1
    assert not core.shard_for(key).fenced
    assert _served(client, core, key) is False  # the copy predates the promotion
    # A read after the promotion keeps a copy of its own, served as usual.
    wait_until(lambda: _served(client, core, key), 5, "a near-cache hit of a new copy")
