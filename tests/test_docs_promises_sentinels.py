"""docs/configuration.md: sentinels known to the listed ones are learned and used, "up to 16
sentinels in all (or as many as are listed, if more)". A sentinel listing 500 peers, beside a
real one, leaves the core with exactly that many; listed beyond the cap, all are kept and none
is learned on top."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sentinel_cache.core.topology.sentinels import MAX_SENTINELS
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.fake_sentinel import FakeSentinel

SHORT = {"socket_timeout": 0.3, "socket_connect_timeout": 0.3}


@pytest.fixture
def flooding(cluster: LocalSentinelCluster) -> Iterator[FakeSentinel]:
    """A sentinel naming shard 0's true master and listing 500 peers, on loopback ports 20 to
    519, where nothing listens (the servers of test runs take ports from 20000)."""
    master = cluster.master_address(cluster.master_names[0])
    peers = [
        ["name", f"p{i}", "ip", "127.0.0.1", "port", str(20 + i), "flags", "sentinel"]
        for i in range(500)
    ]
    fake = FakeSentinel(
        {
            ("SENTINEL", "GET-MASTER-ADDR-BY-NAME"): [str(part) for part in master],
            ("SENTINEL", "SENTINELS"): peers,
            ("SENTINEL", "REPLICAS"): [],
        }
    )
    yield fake
    fake.close()


def test_learned_sentinels_stop_at_the_documented_cap(
    cluster: LocalSentinelCluster, flooding: FakeSentinel
) -> None:
    assert MAX_SENTINELS == 16  # the page's figure
    pool = ShardedSentinelPool(
        cluster.master_names[:1],
        [flooding.address, cluster.sentinel_addresses[0]],  # a majority needs the fake's answer
        sentinel_kwargs=SHORT,
        listeners=False,
    )
    try:
        pool.discover()
        learned = list(pool.sentinels.addresses)
    finally:
        pool.close()
    assert len(learned) == MAX_SENTINELS, learned
    assert flooding.address in learned and cluster.sentinel_addresses[0] in learned


def test_more_listed_sentinels_than_the_cap_are_all_kept(
    cluster: LocalSentinelCluster, flooding: FakeSentinel
) -> None:
    listed = [flooding.address, *cluster.sentinel_addresses]
    # Ports below 20 on loopback: nothing listens there, so nothing answers (refused at once).
    listed += [("127.0.0.1", 1 + i) for i in range(MAX_SENTINELS + 2 - len(listed))]
    pool = ShardedSentinelPool(
        cluster.master_names[:1], listed, sentinel_kwargs=SHORT, listeners=False
    )
    try:
        pool.discover()
        kept = list(pool.sentinels.addresses)
    finally:
        pool.close()
    assert len(kept) == len(listed) == MAX_SENTINELS + 2, kept  # none learned beyond, none lost
