"""The single-key calls' metrics event (``Metrics.sent``, issue 27): the backend derives the
labels itself, its own way, and a scrape must show exactly what :meth:`Metrics.call` with the
labels of ``command_name`` and ``outcome`` would have recorded (names, labels, buckets, counts
and sums), on its own and beside prometheus_client's own histograms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from samples import CALLS, LATENCIES, sample, scrape
from waiting import key_on

from sentinel_cache.core.metrics import command_name, outcome
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.prometheus import MultiprocessMetrics, PrometheusMetrics

# Batches as the runner sends them, with their replies: a get's hit and miss, a get with the
# near cache's PTTL (more hits than misses), writes and a counter, and a write whose first reply is None (SET NX that
# found the key): None is a miss only for a GET.
HISTORY: list[tuple[str, list[tuple[Any, ...]], list[Any]]] = [
    ("shard0", [("GET", b"k")], [b"v"]),
    ("shard0", [("GET", b"j")], [b""]),
    ("shard0", [("GET", b"k")], [None]),
    ("shard0", [("GET", b"k"), ("PTTL", b"k")], [b"v", 1000]),
    ("shard0", [("GET", b"k"), ("PTTL", b"k")], [None, -2]),
    ("shard1", [("SET", b"k", b"v", "EX", 60)], [True]),
    ("shard1", [("SET", b"k", b"v", "EX", 60, "NX")], [None]),
    ("shard1", [("INCRBY", b"n", 1)], [3]),
    ("shard0", [("DEL", b"k")], [1]),
]


def through_sent(metrics_class: type[Any]) -> str:
    registry = CollectorRegistry()
    metrics = metrics_class(registry)
    for seconds in LATENCIES:
        for shard, commands, replies in HISTORY:
            metrics.sent(shard, commands, replies, seconds)
    return scrape(registry)


def through_call() -> str:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    for seconds in LATENCIES:
        for shard, commands, replies in HISTORY:
            metrics.call(shard, command_name(commands), outcome(commands, replies), seconds)
    return scrape(registry)


def test_sent_records_what_call_with_the_derived_labels_records() -> None:
    expected = through_call()
    for series in (
        'command="get",outcome="hit"',
        'command="get",outcome="miss"',
        'command="set",outcome="ok"',
        'command="incrby",outcome="ok"',
        'command="del",outcome="ok"',
    ):
        assert series in expected
    assert 'outcome="miss",shard="shard1"' not in expected  # SET NX's None is no miss
    assert through_sent(PrometheusMetrics) == expected
    assert through_sent(MultiprocessMetrics) == expected  # prometheus_client's own histograms


@pytest.fixture
def core(make_core: Callable[..., ShardedSentinelPool]) -> ShardedSentinelPool:
    return make_core(metrics=True)


def test_single_key_calls_on_a_real_shard_count_by_label(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    name = core.shards[0].name
    key, counter = key_on(core, 0, "sent-key"), key_on(core, 0, "sent-counter")
    client.delete(key)
    client.delete(counter)
    series = [("get", "hit"), ("get", "miss"), ("set", "ok"), ("incrby", "ok")]

    def counts() -> list[float]:
        return [sample(f"{CALLS}_count", shard=name, command=c, outcome=o) for c, o in series] + [
            sample(f"{CALLS}_count", shard=name, command="set", outcome="miss")
        ]

    before = counts()
    for _ in range(5):
        assert client.get(key) is None
    assert client.set(key, "v", 60)
    for _ in range(3):
        assert client.get(key) == "v"
    assert client.set(key, "w", 60, nx=True) is False  # SET NX answered None, then a GET hit
    assert client.incr(counter, create=True) == 1  # INCRBY
    assert client.incr(counter, create=True) == 2
    assert [b - a for a, b in zip(before, counts(), strict=True)] == [4, 5, 2, 2, 0]
