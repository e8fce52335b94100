"""``sentinel_cache.core.admin.health``: the probe every health endpoint serves, on real topologies."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
from health_support import HEALTH_DB

from sentinel_cache.core.admin import health
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]


def core_for(cluster: LocalSentinelCluster, **kwargs: object) -> ShardedSentinelPool:
    config = cluster.config()
    return ShardedSentinelPool(
        config["masters"],
        config["sentinels"],
        db=HEALTH_DB,
        password=config["password"],
        sentinel_kwargs={"password": config["sentinel_password"]},
        **kwargs,
    )


def started(core: ShardedSentinelPool) -> ShardedSentinelPool:
    """Discovery done and every failover listener subscribed (else the first report is
    rightly degraded: a failover would not be heard of yet)."""
    core.discover()
    deadline = time.monotonic() + 5
    while not ((states := core.listener_states()) and all(states.values())):
        assert time.monotonic() < deadline, states
        time.sleep(0.01)
    return core


@pytest.fixture
def shared_core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    core = started(core_for(cluster))
    yield core
    core.close()


def test_probe_keys_are_placed_on_their_shard() -> None:
    # Nothing connects: the ring alone decides, whatever the weights.
    core = ShardedSentinelPool(["a", "b", "c"], ["127.0.0.1:1"], weights=[1, 5, 1])
    try:
        keys = [health.probe_key(core, index) for index in range(3)]
        assert [core.shard_index(key) for key in keys] == [0, 1, 2]
        assert all(
            key.startswith(f"sentinel_cache:health:{n}:")
            for n, key in zip("abc", keys, strict=True)
        )
    finally:
        core.close()


def test_healthy_topology_every_shard_written_and_read_on_its_master(
    cluster: LocalSentinelCluster, shared_core: ShardedSentinelPool
) -> None:
    report = health.check(shared_core)
    assert (report.status, report.ready, report.degraded) == ("ok", True, False), report
    assert report.problems == () and report.warnings == ()
    assert [s.name for s in report.shards] == cluster.master_names
    for shard in report.shards:
        master = cluster.master_address(shard.name)
        assert shard.ok and shard.error is None
        assert shard.address == f"{master[0]}:{master[1]}"
        assert shard.replicas_online == 1
        assert shard.latency_ms is not None and shard.latency_ms < 500
        assert shared_core.shard_index(shard.key) == shard.index
        # The write landed on that shard's master, with the probe's short expiry.
        with cluster.node_client(master, db=HEALTH_DB) as node:
            assert node.get(shard.key).startswith(b"sentinel_cache-probe:")
            assert 0 < node.pttl(shard.key) <= health.PROBE_TTL_MS
    assert report.elapsed_ms < 500
    assert all(report.listeners.values()) and len(report.listeners) == 3
    data = json.loads(json.dumps(report.as_dict()))
    assert data["status"] == "ok" and data["shards"][1]["name"] == cluster.master_names[1]
    assert "deep" not in data


def test_deep_check_adds_the_sentinels_view(shared_core: ShardedSentinelPool) -> None:
    report = health.check(shared_core, deep=True)
    assert report.deep is not None and report.deep["state"] == "healthy", report.deep
    assert [s["role"] for s in report.deep["shards"]] == ["master", "master"]
    assert report.status == "ok"


def test_a_closed_core_is_down_without_hanging() -> None:
    core = ShardedSentinelPool(["a", "b"], ["127.0.0.1:1"])
    core.close()
    report = health.check(core, timeout=0.2)
    assert report.status == "down" and not report.ready
    assert [s.ok for s in report.shards] == [False, False]
    assert report.problems[0].startswith("shard 0 (a): ") and "closed" in report.problems[0]


@pytest.mark.failover
def test_a_hung_master_is_named_within_the_budget(make_cluster: ClusterFactory) -> None:
    # No replica: every shard serves without redundancy (degraded, still ready).
    cluster = make_cluster(shards=2, replicas=0, sentinels=1, down_after_ms=5000)
    core = core_for(cluster)
    try:
        report = health.check(core, timeout=0.3)
        assert (report.status, report.ready) == ("degraded", True), report
        assert [s.replicas_online for s in report.shards] == [0, 0]
        assert report.warnings[0].startswith("shard 0 (shard0): master ")
        assert "no replica online" in report.warnings[0]

        frozen = cluster.master_address("shard1")
        cluster.freeze_node(frozen)
        try:
            began = time.monotonic()
            report = health.check(core, timeout=0.3)
            elapsed = time.monotonic() - began
        finally:
            cluster.thaw_node(frozen)
        assert elapsed < 0.3 + 0.35, elapsed
        assert (report.status, report.ready) == ("down", False)
        assert [s.ok for s in report.shards] == [True, False]
        assert report.problems == (
            f"shard 1 (shard1): master {frozen[0]}:{frozen[1]}: no answer within 0.3s",
        )
        assert report.failing == ["1 (shard1)"]

        deadline = time.monotonic() + 5
        while not (report := health.check(core, timeout=0.3)).ready:
            assert time.monotonic() < deadline, report.problems
            time.sleep(0.05)
    finally:
        core.close()


def test_http_status_and_summary() -> None:
    assert health.http_status("ok") == 200
    assert health.http_status("degraded") == 200  # a readiness probe stays up
    assert health.http_status("degraded", "degraded") == 503
    assert health.http_status("down") == 503
    with pytest.raises(ValueError, match="fail_on"):
        health.http_status("ok", "sometimes")
    assert health.parse_fail_on(None) == "down"
    assert health.parse_fail_on("Degraded") == "degraded"
    with pytest.raises(ValueError):
        health.parse_fail_on("never")

    code, body = health.summary({"default": "the cache could not be built: bad OPTIONS"})
    assert code == 503 and body["status"] == "down"
    assert body["problems"] == ["default: the cache could not be built: bad OPTIONS"]
    code, body = health.summary({})
    assert code == 503 and body["problems"] == ["no sentinel_cache cache is configured"]
