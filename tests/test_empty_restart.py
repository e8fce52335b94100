"""A master restarted empty is reported (issue 22, finding 4).

The master of shard 0 is SIGKILLed and started again at once, before the sentinels mark it
down: the topology's nodes persist nothing, so it comes back empty and its replica resyncs from
it. Nothing fails over; the sentinels only send ``+reboot``, about ten seconds later. The cache
must say so: an ERROR naming the shard and both run ids, the shard's status, the metric, and
no near-cache copy of the lost data left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY
from waiting import key_on, wait_until

from sentinel_cache.core.admin import health, status
from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.client import CacheClient, execute
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]
METRIC = "sentinel_cache_master_restarts_total"


def run_id(cluster: LocalSentinelCluster, address: Address) -> str:
    with cluster.node_client(address) as client:
        return str(client.info("server")["run_id"])


def restarts_counted(name: str) -> float:
    return REGISTRY.get_sample_value(METRIC, {"shard": name}) or 0.0


def restart_empty(cluster: LocalSentinelCluster, name: str) -> tuple[str, str]:
    """SIGKILL the master of ``name`` and start it again at once; its run ids before and after."""
    address = Address(*cluster.master_address(name))
    before = run_id(cluster, address)
    cluster.kill_node(address)
    cluster.restart_node(address)
    after = run_id(cluster, address)
    assert after != before
    return before, after


def restart_errors(caplog: pytest.LogCaptureFixture, label: str, *run_ids: str) -> list[str]:
    return [
        message
        for record in caplog.records
        if record.levelno == logging.ERROR
        and f"shard {label}" in (message := record.getMessage())
        and all(r in message for r in run_ids)
    ]


def test_a_master_restarted_empty_is_reported_and_its_near_copies_dropped(
    make_cluster: ClusterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=3)
    names = cluster.master_names
    pool = ShardedSentinelPool(
        names, cluster.sentinel_addresses, listeners=False, near_cache=True, metrics=True
    )
    caplog.set_level(logging.ERROR, logger="sentinel_cache")
    try:
        pool.discover()
        shard, other = pool.shards
        keys = [key_on(pool, 0, f"lost{i}") for i in range(20)]
        wait_until(lambda: pool.near.status(0)["tracked"], 10, "shard 0 to be tracked")
        client = CacheClient(pool, Codec())
        for key in keys:
            client.set(key, "v", None)
        cached = []
        for key in keys:  # the read's reply is kept as a near copy
            assert client.get(key) == "v"
            cached.append(pool.near.get(key))
        counted = restarts_counted(names[0])
        before, after = restart_empty(cluster, names[0])
        with cluster.node_client(Address(*cluster.master_address(names[0]))) as master:
            assert master.dbsize() == 0  # it did come back empty
        # A restart forces every connection to reconnect: the near cache's tracker does at once,
        # a pool connection on its next use.
        wait_until(lambda: shard.restarts == 1, 10, "the restart to be noticed")
        assert [client.get(key) for key in keys] == [None] * 20  # the data is gone
        state = pool.status()["shards"]
        assert [s["restarts"] for s in state] == [1, 0]
        last = state[0]["last_restart"]
        assert (last["previous_run_id"], last["run_id"]) == (before, after)
        assert restarts_counted(names[0]) == counted + 1
        report = status.collect(pool)  # what sentinel_status shows, run in this process
        assert report["shards"][0]["restarts"] == 1
        assert report["shards"][0]["run_id"] == after
        assert [n for n in report["notes"] if "restarted" in n and before in n and after in n]
        probe = health.check(pool)
        assert probe.status == health.DEGRADED
        assert [w for w in probe.warnings if "restarted" in w and after in w], probe.warnings
        assert [pool.near.get(key) for key in keys] == [None] * 20
        # Another connection to the same restarted process reports nothing new.
        shard.pool.disconnect()
        execute(pool, shard, lambda c: c.ping())
        assert shard.restarts == 1 and other.restarts == 0
    finally:
        pool.close()
    assert any(cached), "the test needs near-cache copies before the restart"
    assert len(restart_errors(caplog, shard.label, before, after)) == 1, caplog.text


def test_a_failover_is_no_restart(make_cluster: ClusterFactory) -> None:
    """A new run_id after a switch is the new master's, not a restart."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    name = cluster.master_names[0]
    pool = ShardedSentinelPool([name], cluster.sentinel_addresses)
    try:
        pool.discover()
        shard = pool.shards[0]
        execute(pool, shard, lambda c: c.set("k", "v"))
        old = Address(*cluster.master_address(name))
        cluster.failover(name)
        new = cluster.wait_for_master_change(name, old, timeout=30)
        wait_until(lambda: shard.address == new, 10, "the switch")
        wait_until(lambda: ping(pool) is True, 10, "the new master to answer")
        assert shard.run_id == run_id(cluster, Address(*new))
        assert (shard.switch_count, shard.restarts) == (1, 0)
    finally:
        pool.close()


def ping(pool: ShardedSentinelPool) -> Any:
    try:
        return execute(pool, pool.shards[0], lambda c: c.ping())
    except Exception:
        return None


def test_the_sentinels_reboot_event_reports_a_restart_nothing_reconnected_through(
    make_cluster: ClusterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """No traffic after the restart, no near cache: only the sentinels' ``+reboot`` (about
    ten seconds later) tells the listener, which asks the master's run_id itself."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    name = cluster.master_names[0]
    pool = ShardedSentinelPool([name], cluster.sentinel_addresses)
    caplog.set_level(logging.ERROR, logger="sentinel_cache")
    try:
        pool.discover()
        shard = pool.shards[0]
        execute(pool, shard, lambda c: c.set("k", "v"))
        wait_until(
            lambda: all(pool.listener_states().values()) and bool(pool.listener_states()),
            10,
            "the listeners",
        )
        before, after = restart_empty(cluster, name)
        wait_until(lambda: shard.restarts == 1, 30, "+reboot to be reported")
        assert shard.last_restart is not None
        assert shard.last_restart["source"].startswith("+reboot from ")
        assert (shard.last_restart["previous_run_id"], shard.last_restart["run_id"]) == (
            before,
            after,
        )
    finally:
        pool.close()
    assert len(restart_errors(caplog, shard.label, before, after)) == 1, caplog.text
