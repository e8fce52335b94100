"""The live status report (framework-free): against real topologies, healthy and broken."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import pytest

from sentinel_cache.core.admin import status
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import BlackHoleServer, LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]


def _hostport(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def _pool(
    cluster: LocalSentinelCluster, extra_sentinels: tuple[str, ...] = ()
) -> ShardedSentinelPool:
    sentinels = [_hostport(a) for a in cluster.sentinel_addresses] + list(extra_sentinels)
    return ShardedSentinelPool(cluster.master_names, sentinels)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- healthy -----------------------------------------------------------------------------------


def test_healthy_report(cluster: LocalSentinelCluster) -> None:
    with _pool(cluster) as pool:
        report = status.collect(pool)
    assert report["state"] == "healthy", report["problems"]
    assert status.exit_code(report) == 0 == report["exit_code"]
    assert report["problems"] == []
    assert [s["name"] for s in report["shards"]] == cluster.master_names
    for index, shard in enumerate(report["shards"]):
        assert shard["index"] == index
        assert shard["weight"] == 1
        assert shard["address"] == _hostport(cluster.master_address(shard["name"]))
        assert shard["address_source"] == "sentinels"
        assert shard["role"] == "master"
        assert shard["sentinels_agreeing"] == shard["sentinels_total"] == 3
        assert shard["replicas_online"] == 1
        assert [r["address"] for r in shard["replicas"]] == [
            _hostport(a) for a in cluster.replica_addresses(shard["name"])
        ]
        assert shard["ckquorum"]["ok"] is True
        assert "OK" in shard["ckquorum"]["message"]
        assert isinstance(shard["keys"], int)
        assert shard["memory"]
        assert shard["latency_ms"] is not None and shard["latency_ms"] > 0  # a real round trip
        assert shard["switch_count"] == 0 and shard["fenced"] is False
        assert shard["problem"] is None and shard["problem_codes"] == []
        assert shard["master_state"] == "ok"
        assert isinstance(shard["config_epoch"], int)
        assert shard["failover_in_progress"] is False
        assert shard["sentinels_not_monitoring"] == []
    assert report["issues"] == [] and report["fail_on"] == "degraded"
    assert [s["address"] for s in report["sentinels"]] == [
        _hostport(a) for a in cluster.sentinel_addresses
    ]
    assert all(s["reachable"] and s["latency_ms"] is not None for s in report["sentinels"])
    assert all(s["state"] == "ok" and s["refused"] is None for s in report["sentinels"])
    # An idle pool has no listeners yet: reported as unknown, not as a problem.
    assert all(s["listener_connected"] is None for s in report["sentinels"])
    assert report["pool"] == {"started": False, "closed": False}


def test_started_pool_reports_its_listeners(cluster: LocalSentinelCluster) -> None:
    with _pool(cluster) as pool:
        pool.discover()
        deadline = time.monotonic() + 5
        while not all(pool.listeners.status().values()) and time.monotonic() < deadline:
            time.sleep(0.02)
        report = status.collect(pool)
    assert report["state"] == "healthy", report["problems"]
    assert report["pool"]["started"] is True
    assert all(s["listener_connected"] is True for s in report["sentinels"])
    assert all(s["client_address"] == s["address"] for s in report["shards"])
    assert report["notes"] == []


def test_json_shape(cluster: LocalSentinelCluster) -> None:
    with _pool(cluster) as pool:
        report = status.collect(pool)
    decoded = json.loads(status.render_json(report))
    assert decoded["state"] == "healthy"
    assert decoded["exit_code"] == 0
    assert isinstance(decoded["problems"], list)
    for shard, name in zip(decoded["shards"], cluster.master_names, strict=True):
        assert shard["name"] == name
        assert shard["address"] == _hostport(cluster.master_address(name))
        for key in ("role", "replicas", "sentinels_agreeing", "sentinels_total", "ckquorum"):
            assert key in shard
    assert {s["address"] for s in decoded["sentinels"]} == {
        _hostport(a) for a in cluster.sentinel_addresses
    }
    assert json.loads(status.render_json(report, indent=None)) == decoded


def test_render_text_names_every_shard_and_sentinel(cluster: LocalSentinelCluster) -> None:
    with _pool(cluster) as pool:
        text = status.render_text(status.collect(pool), title="cache 'default'")
    assert text.startswith("cache 'default': HEALTHY (exit 0)")
    assert "last switch (this process)" in text and " epoch " in text
    for name in cluster.master_names:
        line = next(line for line in text.splitlines() if f" {name} " in line)
        assert _hostport(cluster.master_address(name)) in line
        assert "master" in line
    for address in cluster.sentinel_addresses:
        assert _hostport(address) in text
    assert "problems:" not in text


def test_exit_code_mapping() -> None:
    assert status.exit_code({"state": "healthy"}) == 0
    assert status.exit_code({"state": "degraded"}) == 1
    assert status.exit_code({"state": "down"}) == 2
    assert status.exit_code({}) == 2  # an unreadable report is no reason for confidence
    assert status.exit_code({"state": "degraded"}, fail_on="down") == 0
    assert status.exit_code({"state": "down"}, fail_on="down") == 2


# -- degraded ----------------------------------------------------------------------------------


@pytest.mark.failover
def test_stopped_sentinel_is_degraded(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    stopped = _hostport(cluster.sentinel_addresses[1])
    cluster.stop_sentinel(1)
    with _pool(cluster) as pool:
        report = status.collect(pool)
    assert report["state"] == "degraded"
    assert status.exit_code(report) == 1
    assert any(stopped in problem and "unreachable" in problem for problem in report["problems"])
    by_address = {s["address"]: s for s in report["sentinels"]}
    assert by_address[stopped]["reachable"] is False and by_address[stopped]["error"]
    assert by_address[stopped]["state"] == "unreachable"
    assert [i["code"] for i in report["issues"]] == ["unreachable"]
    assert report["issues"][0]["sentinel"] == stopped
    (shard,) = report["shards"]
    assert shard["role"] == "master"
    assert (shard["sentinels_agreeing"], shard["sentinels_total"]) == (2, 3)
    assert stopped in status.render_text(report)


@pytest.mark.failover
def test_shard_without_replica_is_degraded(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(shards=1, replicas=0, sentinels=1)
    with _pool(cluster) as pool:
        report = status.collect(pool)
    assert report["state"] == "degraded"
    assert report["shards"][0]["replicas_online"] == 0
    assert report["shards"][0]["problem"] == "no_replica"
    assert any("no replica online" in p for p in report["problems"])


def test_sentinels_that_disagree_are_degraded(
    cluster: LocalSentinelCluster, make_cluster: ClusterFactory
) -> None:
    # A foreign sentinel monitoring another "shard0" names a different master.
    other = make_cluster(shards=1, replicas=1, sentinels=1)
    stranger = _hostport(other.sentinel_addresses[0])
    with _pool(cluster, extra_sentinels=(stranger,)) as pool:
        report = status.collect(pool)
    assert report["state"] == "degraded"
    shard0 = report["shards"][0]
    assert shard0["address"] == _hostport(cluster.master_address("shard0"))
    assert (shard0["sentinels_agreeing"], shard0["sentinels_total"]) == (3, 4)
    assert any("shard0" in p and "disagree" in p and stranger in p for p in report["problems"]), (
        report["problems"]
    )
    assert shard0["problem"] == "sentinels_disagree"
    assert report["shards"][1]["sentinels_not_monitoring"] == [stranger]
    # shard1 is unknown to the stranger: that is a disagreement too.
    assert any(
        stranger in d and "does not monitor" in d
        for d in report["shards"][1]["sentinels_disagreeing"]
    )


# -- down --------------------------------------------------------------------------------------


@pytest.mark.failover
def test_killed_master_without_failover_is_down(make_cluster: ClusterFactory) -> None:
    # down-after of a minute: the sentinels keep naming the dead master for the whole test.
    cluster = make_cluster(shards=2, replicas=1, sentinels=3, down_after_ms=60_000)
    dead = _hostport(cluster.kill_master("shard1"))
    with _pool(cluster) as pool:
        report = status.collect(pool)
    assert report["state"] == "down"
    assert status.exit_code(report) == 2
    shard0, shard1 = report["shards"]
    assert shard0["role"] == "master"
    assert shard1["address"] == dead
    assert shard1["role"] is None and shard1["role_error"]
    assert shard1["master_state"] == "unreachable" and shard1["problem"] == "master_unreachable"
    assert any("shard1" in p and dead in p for p in report["problems"])
    assert report["problems"][0].startswith("shard 1 (shard1)")  # the worst problem comes first
    text = status.render_text(report)
    assert text.startswith("DOWN (exit 2)")
    assert dead in text


def test_everything_down_is_reported_quickly_not_raised() -> None:
    with BlackHoleServer() as hole:
        sentinels = [_hostport(hole.address), f"127.0.0.1:{_closed_port()}"]
        with ShardedSentinelPool(["alpha", "beta"], sentinels) as pool:
            started = time.monotonic()
            report = status.collect(pool, timeout=0.3)
            elapsed = time.monotonic() - started
    assert elapsed < 1.5, elapsed
    assert report["state"] == "down" and status.exit_code(report) == 2
    assert all(s["address"] is None and s["replicas"] is None for s in report["shards"])
    assert all(not s["reachable"] and s["error"] for s in report["sentinels"])
    assert all(s["state"] == "unreachable" for s in report["sentinels"])
    assert [s["problem"] for s in report["shards"]] == ["sentinels_unreachable"] * 2
    assert sum("no master known: no sentinel reachable" in p for p in report["problems"]) == 2
    text = status.render_text(report)
    assert "alpha" in text and "beta" in text and _hostport(hole.address) in text
    json.loads(status.render_json(report))


@pytest.mark.failover
def test_credentials_reach_both_sides(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(
        shards=1,
        replicas=1,
        sentinels=1,
        requirepass="node-secret",
        sentinel_requirepass="sentinel-secret",
    )
    sentinels = [_hostport(a) for a in cluster.sentinel_addresses]
    with ShardedSentinelPool(
        cluster.master_names,
        sentinels,
        password="node-secret",
        sentinel_kwargs={"password": "sentinel-secret"},
    ) as pool:
        report = status.collect(pool)
    assert report["state"] == "healthy", report["problems"]
    assert report["shards"][0]["role"] == "master"
    with ShardedSentinelPool(cluster.master_names, sentinels, password="node-secret") as pool:
        report = status.collect(pool)
    assert report["state"] == "down"
    (sentinel,) = report["sentinels"]
    assert not sentinel["reachable"] and "Authentication" in sentinel["error"]
    assert sentinel["state"] == "auth_refused"  # not "unreachable": it answered, with a refusal
    assert report["shards"][0]["problem"] == "sentinels_auth_refused"


@pytest.mark.failover
def test_sentinels_gone_falls_back_to_the_clients_master(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=1)
    master = _hostport(cluster.master_address("shard0"))
    with _pool(cluster) as pool:
        pool.discover()
        cluster.stop_sentinel(0)
        report = status.collect(pool, timeout=0.3)
    # The application keeps serving from the master it knows: degraded, not down.
    assert report["state"] == "degraded", report["problems"]
    (shard,) = report["shards"]
    assert shard["address_source"] == "client (last known)"
    assert shard["address"] == master
    assert shard["role"] == "master"
    assert shard["replicas"] is None and shard["ckquorum"]["ok"] is None
    # Named for what it is, and not down: this process still serves from that master.
    assert shard["problem"] == "sentinels_unreachable"
    assert status.exit_code(report, fail_on="down") == 0
