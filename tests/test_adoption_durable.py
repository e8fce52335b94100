"""``DURABLE_REPLICAS`` covers warm adoption's copies (``PREVIOUS_CACHE``), on real servers with
a replica: the copies of a batch on our shard are followed by ``WAIT``, and the previous cache's
copies are removed only after it, so a key copied onto our master and removed from the previous
cache is on our replica too; a shortfall is logged and the adoption goes on. The read path
(:meth:`Adopter.adopt`) and the migration (:func:`migrate_previous`) are both checked, through
the framework-free core; the adapters' read path in tests/django/test_django_previous_cache.py.

Each test freezes our replica (``SIGSTOP``: its link stays open and silent) and thaws it a
moment later: the removal from the previous cache is still waiting at the thaw."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
from durable_support import shortfalls, while_frozen

from sentinel_cache.core.admin.reshard.previous import (
    COPIED,
    Adopter,
    migrate_previous,
    pttls_on,
)
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]

PREFIX = "old:"
KEYS = [f"adopted-{n}" for n in range(40)]
THAW_AFTER = 0.5  # seconds: well inside the WAIT timeout below, well after a copy without it
TIMEOUT_MS = 4000  # under the pools' 5 s socket timeout


class Previous:
    """A previous cache on a plain redis server: values stored as text under ``old:<key>``."""

    label = "the old server"

    def __init__(self, server: redis.Redis) -> None:
        self.server = server

    def read(self, keys: Sequence[Any]) -> dict[Any, Any]:
        values = self.server.mget([PREFIX + key for key in keys])
        return {
            key: value.decode()
            for key, value in zip(keys, values, strict=True)
            if value is not None
        }

    def pttls(self, keys: Sequence[Any]) -> dict[Any, int | None]:
        return pttls_on([(self.server, [(key, PREFIX + key) for key in keys])])

    def remove(self, keys: Sequence[Any]) -> None:
        self.server.delete(*[PREFIX + key for key in keys])

    def clear(self, pattern: str | None) -> None:
        self.server.flushdb()

    def servers(self) -> Sequence[tuple[str, Any]]:
        return [(self.label, self.server)]

    def pattern(self) -> str:
        return f"{PREFIX}*"

    def key_of(self, stored: bytes) -> Any:
        return stored.decode()[len(PREFIX) :]

    def left(self) -> int:
        return int(self.server.exists(*[PREFIX + key for key in KEYS]))


@pytest.fixture
def topology(make_cluster: ClusterFactory) -> Iterator[tuple[LocalSentinelCluster, Previous]]:
    """Ours (one shard, one replica) and the previous cache holding KEYS on a server of its own."""
    ours = make_cluster(shards=1, replicas=1, sentinels=1)
    old = make_cluster(shards=1, replicas=0, sentinels=1)
    server = old.node_client(old.master_address(old.master_names[0]))
    server.mset({PREFIX + key: f"value of {key}" for key in KEYS})
    for key in KEYS[::2]:
        server.pexpire(PREFIX + key, 600_000)
    try:
        yield ours, Previous(server)
    finally:
        server.close()


def adopter_on(
    cluster: LocalSentinelCluster, timeout_ms: int
) -> tuple[Adopter, ShardedSentinelPool]:
    core = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    client = CacheClient(core, Codec(), durable_replicas=1, durable_timeout_ms=timeout_ms)
    return Adopter(client, lambda key: key), core


def frozen_adoption(
    cluster: LocalSentinelCluster, previous: Previous, adopt: Callable[[Adopter], Any]
) -> tuple[Any, list[int]]:
    """``adopt(adopter)`` while our replica is frozen, thawed THAW_AFTER later; its result and
    how many of KEYS the previous cache still had at the thaw."""
    adopter, core = adopter_on(cluster, TIMEOUT_MS)
    replica = cluster.replica_addresses(cluster.master_names[0])[0]
    try:
        result, at_thaw, _ = while_frozen(
            cluster, replica, lambda: adopt(adopter), previous.left, thaw_after=THAW_AFTER
        )
    finally:
        core.close()
    with cluster.node_client(replica) as node:
        assert node.exists(*KEYS) == len(KEYS)
        assert 0 < node.pttl(KEYS[0]) <= 600_000 and node.pttl(KEYS[1]) == -1
    assert previous.left() == 0
    return result, at_thaw


def test_a_read_through_removes_the_previous_copies_once_our_replica_has_them(
    topology: tuple[LocalSentinelCluster, Previous],
) -> None:
    cluster, previous = topology
    (found, outcomes), at_thaw = frozen_adoption(
        cluster, previous, lambda adopter: adopter.adopt(previous, KEYS, strict=False)
    )
    assert found == {key: f"value of {key}" for key in KEYS}
    assert {outcome for _, outcome in outcomes.values()} == {COPIED}
    # The copies' WAIT held the removal until our replica acknowledged them.
    assert at_thaw == [len(KEYS)]


def test_the_migration_removes_the_previous_copies_once_our_replica_has_them(
    topology: tuple[LocalSentinelCluster, Previous],
) -> None:
    cluster, previous = topology
    report, at_thaw = frozen_adoption(
        cluster, previous, lambda adopter: migrate_previous(adopter, previous, batch=100)
    )
    assert report.complete, report
    assert report.shards[0].moved == len(KEYS)
    assert at_thaw == [len(KEYS)]


def test_a_shortfall_is_logged_and_the_adoption_goes_on(
    topology: tuple[LocalSentinelCluster, Previous], caplog: pytest.LogCaptureFixture
) -> None:
    cluster, previous = topology
    (name,) = cluster.master_names
    adopter, core = adopter_on(cluster, 100)
    replica = cluster.replica_addresses(name)[0]
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    try:
        cluster.freeze_node(replica)
        found, outcomes = adopter.adopt(previous, KEYS)
    finally:
        cluster.thaw_node(replica)
        core.close()
    assert len(found) == len(KEYS)
    assert {outcome for _, outcome in outcomes.values()} == {COPIED}
    assert previous.left() == 0  # removed after the shortfall: the adoption went on
    line = f"write to shard {name} acknowledged by 0 of 1 replicas within 100 ms"
    assert shortfalls(caplog, 100).count(line) == 1, caplog.messages
