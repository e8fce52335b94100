"""A sentinel user without ``SENTINEL MASTER`` (an ACL without ``+sentinel|master``): discovery
and the cache still work, but the answers carry no config epoch, so a switch is ordered by when it
was heard; that is said once per sentinel in the log, not left silent (it was)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.listener import CHANNELS
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

SECRET = "epoch-refused-S3cret-7a2c"
ALLOWED = [
    "+sentinel|get-master-addr-by-name",
    "+sentinel|sentinels",
    "+sentinel|replicas",
    "+sentinel|masters",
    "+subscribe",
    "+ping",
    *(f"&{channel}" for channel in CHANNELS),
]


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(shards=1, replicas=1, sentinels=1) as cluster:
        with cluster.sentinel_client(0) as sentinel:
            sentinel.execute_command(
                "ACL", "SETUSER", "no-epoch", "on", f">{SECRET}", "resetchannels", "-@all",
                *ALLOWED,
            )  # fmt: skip
        yield cluster


def test_a_refused_sentinel_master_is_logged_once_and_the_cache_works(
    topology: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    pool = ShardedSentinelPool(
        topology.master_names,
        topology.sentinel_addresses,
        sentinel_kwargs={"username": "no-epoch", "password": SECRET},
        listeners=False,
    )
    try:
        pool.discover()
        pool.discover()  # asked again: still one warning
        address = pool.sentinels.addresses[0]
        assert pool.sentinels.config_epoch(address, topology.master_names[0]) == 0
        cache = CacheClient(pool, Codec())
        assert cache.set("epoch-refused", "v", 60) and cache.get("epoch-refused") == "v"
    finally:
        pool.close()
    warnings = [
        r.getMessage() for r in caplog.records if "refuses SENTINEL MASTER" in r.getMessage()
    ]
    assert len(warnings) == 1, warnings
    assert str(address) in warnings[0] and "+sentinel|master" in warnings[0]
    assert SECRET not in warnings[0]
