"""``DURABLE_REPLICAS`` covers resharding's own writes, on real servers with replicas: the
migration's restores on a key's new owner, and an operation's move of a key from its previous
owner (``DUMP``/``RESTORE``, then the previous owner's copy deleted), are followed by ``WAIT``,
so the previous owner's copy is deleted only once the owner's replica has the key; the previous
owner's deletes wait for its replica too; a shortfall is logged and the move goes on.

Each test freezes one replica (``SIGSTOP``: its link stays open and silent) and thaws it a
moment later: what waited for it is still waiting at the thaw."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from durable_support import shortfalls, while_frozen

from sentinel_cache.core.admin import reshard
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]

KEYS = [f"durable-move-{n}" for n in range(60)]
THAW_AFTER = 0.5  # seconds: well inside the WAIT timeout below, well after a write without it
TIMEOUT_MS = 4000  # under the pools' 5 s socket timeout


def core_for(
    cluster: LocalSentinelCluster, masters: list[str], **options: Any
) -> ShardedSentinelPool:
    return ShardedSentinelPool(masters, cluster.sentinel_addresses, listeners=False, **options)


def resharding(cluster: LocalSentinelCluster) -> tuple[ShardedSentinelPool, list[str]]:
    """KEYS written on the first shard alone, and a core with the second appended (the first as
    ``PREVIOUS_MASTERS``); the keys whose owner is now the second shard."""
    a, b = cluster.master_names
    old = core_for(cluster, [a])
    try:
        CacheClient(old, Codec()).set_many({key: key for key in KEYS}, 600)
    finally:
        old.close()
    core = core_for(cluster, [a, b], previous_masters=[a])
    moving = [key for key in KEYS if core.shard_for(key).name == b]
    assert len(moving) > 5
    for name in (a, b):
        cluster.wait_for_replication(name)
    return core, moving


def test_the_migration_deletes_the_source_copies_once_the_owner_replica_has_them(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=1)
    a, b = cluster.master_names
    core, moving = resharding(cluster)
    replica = cluster.replica_addresses(b)[0]

    def on_source() -> int:
        with cluster.node_client(cluster.master_address(a)) as source:
            return int(source.exists(*moving))

    try:
        report, at_thaw, _ = while_frozen(
            cluster,
            replica,
            lambda: reshard.migrate(
                core, delete_delay=0.0, durable_replicas=1, durable_timeout_ms=TIMEOUT_MS
            ),
            on_source,
            thaw_after=THAW_AFTER,
        )
    finally:
        core.close()
    assert report.complete, report
    # The restores' WAIT held the source's deletes until the owner's replica acknowledged them.
    assert at_thaw == [len(moving)]
    with cluster.node_client(replica) as node:
        assert node.exists(*moving) == len(moving)
    with cluster.node_client(cluster.master_address(a)) as source:
        assert source.exists(*moving) == 0


def test_the_migrations_deletes_on_the_source_wait_for_its_replica(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=1)
    a, _ = cluster.master_names
    core, moving = resharding(cluster)
    replica = cluster.replica_addresses(a)[0]
    try:
        report, _, returned_after_thaw = while_frozen(
            cluster,
            replica,
            lambda: reshard.migrate(
                core, delete_delay=0.0, durable_replicas=1, durable_timeout_ms=TIMEOUT_MS
            ),
            thaw_after=THAW_AFTER,
        )
    finally:
        core.close()
    assert report.complete, report
    assert returned_after_thaw  # the source's DEL waited for the source's frozen replica
    with cluster.node_client(replica) as node:
        assert node.exists(*moving) == 0


def test_a_migration_shortfall_is_logged_and_the_keys_still_move(
    make_cluster: ClusterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=1)
    a, b = cluster.master_names
    core, moving = resharding(cluster)
    replica = cluster.replica_addresses(b)[0]
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    try:
        cluster.freeze_node(replica)
        report = reshard.migrate(core, delete_delay=0.0, durable_replicas=1, durable_timeout_ms=100)
    finally:
        cluster.thaw_node(replica)
        core.close()
    assert report.complete, report
    assert report.shards[0].moved == len(moving)
    line = f"write to shard {b} acknowledged by 0 of 1 replicas within 100 ms"
    assert shortfalls(caplog, 100).count(line) == 1, caplog.messages


def test_a_write_moving_a_key_deletes_the_old_copy_once_the_owner_replica_has_it(
    make_cluster: ClusterFactory,
) -> None:
    """``touch`` acts on the key where it lives now: moved first (``_move``), its restore on the
    owner waited for, and only then the previous owner's copy deleted."""
    cluster = make_cluster(shards=2, replicas=1, sentinels=1)
    a, b = cluster.master_names
    core, moving = resharding(cluster)
    key = moving[0]
    replica = cluster.replica_addresses(b)[0]

    def on_previous() -> int:
        with cluster.node_client(cluster.master_address(a)) as previous:
            return int(previous.exists(key))

    try:
        client = CacheClient(core, Codec(), durable_replicas=1, durable_timeout_ms=TIMEOUT_MS)
        touched, at_thaw, _ = while_frozen(
            cluster, replica, lambda: client.touch(key, 1200), on_previous, thaw_after=THAW_AFTER
        )
    finally:
        core.close()
    assert touched is True
    assert at_thaw == [1]  # the old copy outlived the owner's unacknowledged restore
    with cluster.node_client(replica) as node:
        assert node.get(key) is not None
        assert node.ttl(key) > 600
    with cluster.node_client(cluster.master_address(a)) as previous:
        assert previous.exists(key) == 0


def test_the_previous_owners_delete_waits_for_its_replica(make_cluster: ClusterFactory) -> None:
    """``set`` (its value wins) deletes the previous owner's copy after it: with
    DURABLE_REPLICAS the call returns once the previous owner's replica has that delete too."""
    cluster = make_cluster(shards=2, replicas=1, sentinels=1)
    a, _ = cluster.master_names
    core, moving = resharding(cluster)
    key = moving[0]
    replica = cluster.replica_addresses(a)[0]
    try:
        client = CacheClient(core, Codec(), durable_replicas=1, durable_timeout_ms=TIMEOUT_MS)
        stored, _, returned_after_thaw = while_frozen(
            cluster, replica, lambda: client.set(key, "new", 600), thaw_after=THAW_AFTER
        )
    finally:
        core.close()
    assert stored is True
    assert returned_after_thaw  # it waited for the frozen replica of the previous owner
    with cluster.node_client(replica) as node:
        assert node.exists(key) == 0
