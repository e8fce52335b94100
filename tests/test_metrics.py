"""Prometheus metrics (``METRICS = True``, issue 15): every series moves when its event happens,
on real servers; registered once per process however many cores there are."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from samples import sample
from waiting import key_on, wait_until

from sentinel_cache import ConfigurationError
from sentinel_cache.core.config import PoolConfig
from sentinel_cache.core.metrics import source_kind
from sentinel_cache.core.ops.client import CacheClient, execute
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture
def core(make_core: Callable[..., ShardedSentinelPool]) -> ShardedSentinelPool:
    return make_core(metrics=True)


def test_calls_lookups_and_gauges(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    name = core.shards[0].name
    hit, missing = key_on(core, 0, "metrics-hit"), key_on(core, 0, "metrics-miss")
    client.delete(missing)
    calls = "sentinel_cache_command_duration_seconds_count"
    keys = "sentinel_cache_multi_key_lookups_total"

    def counts() -> list[float]:
        return [
            sample(calls, shard=name, command="get", outcome="hit"),
            sample(calls, shard=name, command="get", outcome="miss"),
            sample(calls, shard=name, command="mget", outcome="ok"),
            sample(keys, shard=name, result="hit"),
            sample(keys, shard=name, result="miss"),
        ]

    before = counts()
    assert client.set(hit, "v", 60)
    assert client.get(hit) == "v"
    assert client.get(missing) is None
    assert client.get_many([hit, missing]) == {hit: "v"}  # one batch: a hit and a miss
    assert [b - a for a, b in zip(before, counts(), strict=True)] == [1, 1, 1, 1, 1]
    # Gauges are read from the live cores when scraped: this core's idle connections show.
    assert sample("sentinel_cache_connections_idle", shard=name) >= 1
    wait_until(lambda: core.listener_states() and all(core.listener_states().values()), 5, "subs")
    address = next(iter(core.listener_states()))
    assert sample("sentinel_cache_listener_connected", sentinel=address) == 1


def test_an_error_is_counted_as_one(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    key = key_on(core, 1, "metrics-wrongtype")
    name = core.shards[1].name
    execute(core, core.shards[1], lambda c: c.delete(key) and None)
    execute(core, core.shards[1], lambda c: c.rpush(key, "x"))
    series = "sentinel_cache_command_duration_seconds_count"
    before = sample(series, shard=name, command="incrby", outcome="error")
    with pytest.raises(Exception, match="WRONGTYPE"):
        client.incr(key, create=True)
    after = sample(series, shard=name, command="incrby", outcome="error")
    assert after == before + 1


@pytest.mark.failover
def test_a_planned_failover_counts_a_switch_and_a_fence_hold(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    core = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, metrics=True)
    try:
        client = CacheClient(core, Codec())
        client.set("before", 1, None)
        name = core.shards[0].name
        wait_until(lambda: core.listener_states() and all(core.listener_states().values()), 5, "")
        switches = sample("sentinel_cache_master_switches_total", shard=name, source="listener")
        fences = sample("sentinel_cache_write_fence_hold_seconds_count", shard=name)
        old = core.shards[0].address
        cluster.failover(name)
        wait_until(lambda: core.shards[0].address != old, 15, "the switch")
        wait_until(
            lambda: sample("sentinel_cache_write_fence_hold_seconds_count", shard=name) > fences,
            5,
            "the fence to be lowered",
        )
        assert (
            sample("sentinel_cache_master_switches_total", shard=name, source="listener")
            == switches + 1
        )
        assert client.get("before") == 1
    finally:
        core.close()


def test_metrics_is_a_boolean_option() -> None:
    with pytest.raises(ConfigurationError, match="metrics") as caught:
        PoolConfig.create(["a"], ["127.0.0.1:26379"], metrics="yes")
    assert caught.value.option == "metrics" and caught.value.value == "yes"


def test_switch_sources_are_bounded_labels() -> None:
    assert source_kind("+switch-master from 10.0.0.1:26379") == "listener"
    assert source_kind("safety net (ConnectionError: Error 111)") == "safety_net"
    assert source_kind("resync after subscribing to 10.0.0.1:26379") == "listener_resync"
    assert source_kind("discovery") == "discovery"
    assert source_kind("something new") == "other"


def test_without_prometheus_client_the_error_names_the_extra() -> None:
    script = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from sentinel_cache import ConfigurationError, ShardedSentinelPool\n"
        "try:\n"
        "    ShardedSentinelPool(['a'], ['127.0.0.1:1'], metrics=True)\n"
        "except ConfigurationError as exc:\n"
        "    print(exc.option, '|', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.startswith("METRICS |") and 'pip install "sentinel-cache[prometheus]"' in out


def test_many_cores_share_one_registration(cluster: LocalSentinelCluster) -> None:
    cores = [
        ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, metrics=True, db=n)
        for n in (3, 4)
    ]
    try:
        assert cores[0].metrics is cores[1].metrics  # a second registration would have raised
        for n, core in enumerate(cores):
            CacheClient(core, Codec()).set(key_on(core, 0, f"metrics-db{n}"), n, 60)
    finally:
        for core in cores:
            core.close()
