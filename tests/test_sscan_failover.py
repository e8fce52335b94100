"""``sscan_iter`` across a master change: an ``SSCAN`` cursor is one server's (its hash table is
seeded at random per process), so the scan of a set begins again on the new master
(:class:`~sentinel_cache.core.ops.scan.ShardScan`) and misses no member present throughout.

The failover lands mid-scan deterministically, as in ``test_scan_failover.py``: the client's
``execute`` is wrapped so that right after the first ``SSCAN`` reply with a cursor to continue
from, the shard fails over and the test waits until the core follows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from waiting import wait_until

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ops.plans import Command
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

pytestmark = pytest.mark.failover

ClusterFactory = Callable[..., LocalSentinelCluster]

MEMBERS = {f"m{i}" for i in range(20_000)}  # str members: a hash table, not an intset
BATCH = 500  # SSCAN COUNT: about 40 batches, the failover after the first


@pytest.fixture
def topology(make_cluster: ClusterFactory) -> Iterator[tuple[LocalSentinelCluster, CacheClient]]:
    """1 shard x 1 replica, a core with listeners, and the set ``big``, replicated."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=1, down_after_ms=600)
    core = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses)
    client = CacheClient(core, Codec())
    try:
        members = sorted(MEMBERS)
        for start in range(0, len(members), 5000):
            client.sadd("big", *members[start : start + 5000])
        assert client.scard("big") == len(MEMBERS)
        cluster.wait_for_replication()
        yield cluster, client
    finally:
        core.close()


def fail_over_mid_scan(
    monkeypatch: pytest.MonkeyPatch, cluster: LocalSentinelCluster, client: Any
) -> list[Any]:
    """Wrap ``client.execute`` (sync or async): after the first ``SSCAN`` reply with a cursor
    to continue from, fail the shard over and wait until the core follows. Returns a list that
    holds the new master once that happened."""
    real = client.execute
    switched: list[Any] = []

    def switch(shard: Shard, commands: Sequence[Command], replies: list[Any]) -> None:
        if not switched and commands[0][0] == "SSCAN" and int(replies[0][0]) != 0:
            old = cluster.master_address(shard.name)
            cluster.failover(shard.name)
            new = cluster.wait_for_master_change(shard.name, old, timeout=30)
            wait_until(lambda: shard.address == new, 30, "the core to follow the switch")
            switched.append(new)

    if isinstance(client, AsyncCacheClient):

        async def aexecute(shard: Shard, commands: Sequence[Command], **kwargs: Any) -> Any:
            replies = await real(shard, commands, **kwargs)
            await asyncio.to_thread(switch, shard, commands, replies)
            return replies

        monkeypatch.setattr(client, "execute", aexecute)
    else:

        def execute(shard: Shard, commands: Sequence[Command], **kwargs: Any) -> Any:
            replies = real(shard, commands, **kwargs)
            switch(shard, commands, replies)
            return replies

        monkeypatch.setattr(client, "execute", execute)
    return switched


def test_sscan_iter_misses_no_member_across_a_failover(
    topology: tuple[LocalSentinelCluster, CacheClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, client = topology
    switched = fail_over_mid_scan(monkeypatch, cluster, client)
    found = list(client.sscan_iter("big", count=BATCH))
    assert switched, "the shard switched during the scan"
    assert client.core.shards[0].address == switched[0]
    assert set(found) == MEMBERS


def test_async_sscan_iter_misses_no_member_across_a_failover(
    topology: tuple[LocalSentinelCluster, CacheClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, sync_client = topology

    async def scan() -> tuple[list[Any], list[Any]]:
        client = AsyncCacheClient(sync_client.core, Codec())
        try:
            switched = fail_over_mid_scan(monkeypatch, cluster, client)
            return [m async for m in client.sscan_iter("big", count=BATCH)], switched
        finally:
            await client.aclose()

    found, switched = asyncio.run(scan())
    assert switched, "the shard switched during the scan"
    assert set(found) == MEMBERS
