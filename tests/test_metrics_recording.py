"""How the metrics are recorded (issue 27): plain numbers on the hot path, made into samples when
scraped, exactly as prometheus_client's own counters and histograms would give them; exact
counts after N calls, from many threads, in a forked child (only its own), and in
prometheus_client's multiprocess mode (added up over the processes)."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from samples import sample
from threads import Workers
from waiting import key_on

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.prometheus import MultiprocessMetrics, PrometheusMetrics
from sentinel_cache.testing import LocalSentinelCluster

CALLS = "sentinel_cache_command_duration_seconds"
LOOKUPS = "sentinel_cache_multi_key_lookups_total"


@pytest.fixture
def core(make_core: Callable[..., ShardedSentinelPool]) -> ShardedSentinelPool:
    return make_core(metrics=True)


def every_event(metrics: Any) -> None:
    """Each event of the core, some twice, with latencies on, between and past the buckets."""
    for seconds in (0.00005, 0.0001, 0.0003, 0.003, 0.7, 7.0):
        metrics.call("shard0", "get", "hit", seconds)
    metrics.call("shard1", "mget", "ok", 0.002)
    metrics.call("shard1", "incrby", "error", 0.01)
    metrics.lookups([("shard0", 3, 0), ("shard1", 2, 5)])
    metrics.lookups([("shard1", 0, 1)])
    metrics.switch("shard0", "listener")
    metrics.fence("shard0", 0.3)
    metrics.fence("shard0", 11.0)
    metrics.reresolve("shard1")
    metrics.retry("shard1")
    metrics.outage_read("shard0")
    metrics.skipped("shard1", "get_many")
    metrics.restart("shard0")
    metrics.restart("shard0")


def exposition(metrics_class: type[Any]) -> str:
    """The text a scrape returns for :func:`every_event`, the creation times blanked."""
    registry = CollectorRegistry()
    every_event(metrics_class(registry))
    text = generate_latest(registry).decode()
    text = re.sub(r"(?m)^(\w+_created\{[^}]*\}) .*$", r"\1 <created>", text)
    # the gauges (live cores) are the same collector in both: only our two kinds differ
    return "\n".join(line for line in text.splitlines() if "connections" not in line)


def test_the_samples_are_those_of_prometheus_clients_own_metrics() -> None:
    """Same names, help, types, labels, buckets, counts, sums and ``_created`` series as
    prometheus_client's Counter and Histogram (what MultiprocessMetrics uses) for one history."""
    ours, theirs = exposition(PrometheusMetrics), exposition(MultiprocessMetrics)
    assert 'le="0.0001"' in ours and "sentinel_cache_master_restarts_total" in ours
    assert ours == theirs


def test_a_scrape_after_n_calls_shows_exactly_n(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    name = core.shards[0].name
    hit, missing = key_on(core, 0, "counted-hit"), key_on(core, 0, "counted-miss")
    batch = [key_on(core, i, f"counted-many{i}") for i in range(len(core.shards))]
    client.delete(missing)
    client.set_many(dict.fromkeys(batch[:-1], 1), 60)
    client.delete(batch[-1])
    client.set(hit, "v", 60)
    before = {
        "hit": sample(f"{CALLS}_count", shard=name, command="get", outcome="hit"),
        "miss": sample(f"{CALLS}_count", shard=name, command="get", outcome="miss"),
        "inf": sample(f"{CALLS}_bucket", shard=name, command="get", outcome="hit", le="+Inf"),
        "mget": [
            sample(f"{CALLS}_count", shard=s.name, command="mget", outcome="ok")
            for s in core.shards
        ],
        "keys": [
            sample(LOOKUPS, shard=s.name, result=r) for s in core.shards for r in ("hit", "miss")
        ],
    }
    for _ in range(37):
        assert client.get(hit) == "v"
    for _ in range(11):
        assert client.get(missing) is None
    for _ in range(13):
        assert client.get_many(batch) == dict.fromkeys(batch[:-1], 1)
    assert sample(f"{CALLS}_count", shard=name, command="get", outcome="hit") == before["hit"] + 37
    assert (
        sample(f"{CALLS}_count", shard=name, command="get", outcome="miss") == before["miss"] + 11
    )
    assert (
        sample(f"{CALLS}_bucket", shard=name, command="get", outcome="hit", le="+Inf")
        == before["inf"] + 37
    )
    assert [
        sample(f"{CALLS}_count", shard=s.name, command="mget", outcome="ok") for s in core.shards
    ] == [n + 13 for n in before["mget"]]  # one batch per shard and call
    last = len(core.shards) - 1
    expected = [(13, 0) if i < last else (0, 13) for i in range(len(core.shards))]
    assert [
        sample(LOOKUPS, shard=s.name, result=r) for s in core.shards for r in ("hit", "miss")
    ] == [
        b + e for b, e in zip(before["keys"], [n for pair in expected for n in pair], strict=True)
    ]


def test_counts_from_many_threads_add_up_exactly(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    name = core.shards[1].name
    key = key_on(core, 1, "threads-counted")
    client.set(key, 1, 60)
    before = sample(f"{CALLS}_count", shard=name, command="get", outcome="hit")
    failures: list[str] = []

    def reader() -> None:
        for _ in range(250):
            if client.get(key) != 1:
                failures.append("a read missed")

    with Workers(timeout=60) as workers:
        for n in range(8):
            workers.spawn(reader, name=f"reader-{n}")
    assert all(not thread.is_alive() for thread in workers.threads)
    assert failures == []
    assert sample(f"{CALLS}_count", shard=name, command="get", outcome="hit") == before + 2000


def _child(core: ShardedSentinelPool, key: str, name: str, out: Any) -> None:
    series = {"shard": name, "command": "get", "outcome": "hit"}
    inherited = REGISTRY.get_sample_value(f"{CALLS}_count", series)
    client = CacheClient(core, Codec())
    for _ in range(3):
        client.get(key)
    out.put((inherited, REGISTRY.get_sample_value(f"{CALLS}_count", series)))


def test_a_forked_child_reports_its_own_calls_only(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    name = core.shards[0].name
    key = key_on(core, 0, "forked-counted")
    client.set(key, 1, 60)
    for _ in range(5):
        client.get(key)
    parent = sample(f"{CALLS}_count", shard=name, command="get", outcome="hit")
    assert parent >= 5
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child, args=(core, key, name, out))
    child.start()
    inherited, own = out.get(timeout=60)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert (inherited, own) == (None, 3.0)  # the parent's counts stayed with the parent
    assert sample(f"{CALLS}_count", shard=name, command="get", outcome="hit") == parent


SCRIPT = """
import sys
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.prometheus import shared_metrics
masters, sentinels, key = {masters!r}, {sentinels!r}, {key!r}
core = ShardedSentinelPool(masters, sentinels, metrics=True)
print(type(shared_metrics()).__name__)
client = CacheClient(core, Codec())
client.set(key, 1, 60)
for _ in range(7):
    client.get(key)
core.close()
"""


def test_multiprocess_mode_adds_up_over_processes(
    cluster: LocalSentinelCluster, tmp_path: Path
) -> None:
    """With PROMETHEUS_MULTIPROC_DIR each process writes its own files, and a scrape through
    prometheus_client's MultiProcessCollector adds them up: two processes of 7 gets, 14."""
    from prometheus_client import multiprocess

    key = f"multiproc-{os.getpid()}"
    script = textwrap.dedent(SCRIPT).format(
        masters=list(cluster.master_names),
        sentinels=[f"{a[0]}:{a[1]}" for a in cluster.sentinel_addresses],
        key=key,
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["MultiprocessMetrics"]
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses)
    try:
        name = pool.shard_for(key).name
    finally:
        pool.close()
    labels = {"shard": name, "command": "get", "outcome": "hit"}
    assert registry.get_sample_value(f"{CALLS}_count", labels) == 14
