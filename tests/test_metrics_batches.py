"""A multi-key call's metrics event (``Metrics.batches``, issue 27): one call of the backend
for all the shards a scatter touched. The metric is labelled by shard, so every shard's batch
must still be counted: a scrape shows exactly what one :meth:`Metrics.call` per batch, with
``command_name`` and ``ok``/``error``, would have recorded (names, labels, buckets, counts and
sums), on its own and through prometheus_client's own histograms; on real shards each shard a
call touched counts once per call, and a core without metrics records nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from samples import CALLS, LATENCIES, sample, scrape
from waiting import key_on

from sentinel_cache.core.metrics import Metrics, command_name
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.prometheus import MultiprocessMetrics, PrometheusMetrics
from sentinel_cache.testing import LocalSentinelCluster

# Scatters as the runner records them: per shard its name, its commands, read or not. A batch
# whose first command is GET (a previous owner's copy plan) is "ok", never a hit or a miss.
SCATTERS: list[list[tuple[str, list[tuple[Any, ...]], bool]]] = [
    [("shard0", [("MGET", b"a", b"b")], True), ("shard1", [("MGET", b"c")], True)],
    [("shard0", [("MGET", b"a"), ("PTTL", b"a")], True), ("shard1", [("MGET", b"c")], False)],
    [("shard1", [("EVAL", "script", 1, b"c", 60, b"v")], True)],
    [("shard0", [("MSET", b"a", b"v")], False), ("shard2", [("DEL", b"d")], True)],
    [("shard2", [("GET", b"d"), ("PTTL", b"d")], True)],
]


def through_batches(metrics_class: type[Any]) -> str:
    registry = CollectorRegistry()
    metrics = metrics_class(registry)
    for seconds in LATENCIES:
        for scatter in SCATTERS:
            metrics.batches([(shard, commands, ok, seconds) for shard, commands, ok in scatter])
    return scrape(registry)


def through_call() -> str:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    for seconds in LATENCIES:
        for scatter in SCATTERS:
            for shard, commands, ok in scatter:
                metrics.call(shard, command_name(commands), "ok" if ok else "error", seconds)
    return scrape(registry)


def test_batches_records_what_one_call_per_batch_records() -> None:
    expected = through_call()
    for series in (
        'command="mget",outcome="ok",shard="shard0"',
        'command="mget",outcome="error",shard="shard1"',
        'command="eval",outcome="ok",shard="shard1"',
        'command="mset",outcome="error",shard="shard0"',
        'command="del",outcome="ok",shard="shard2"',
        'command="get",outcome="ok",shard="shard2"',
    ):
        assert series in expected
    assert 'outcome="hit"' not in expected  # a scatter's GET batch is no single-key read
    assert through_batches(PrometheusMetrics) == expected
    assert through_batches(MultiprocessMetrics) == expected  # Metrics.batches, the default


def test_the_default_batches_calls_call_once_per_batch() -> None:
    seen: list[tuple[str, str, str, float]] = []

    class Recorder(Metrics):
        def call(self, shard: str, command: str, outcome: str, seconds: float) -> None:
            seen.append((shard, command, outcome, seconds))

    Recorder().batches([("s0", [("MGET", b"a")], True, 0.5), ("s1", [("DEL", b"b")], False, 1.5)])
    assert seen == [("s0", "mget", "ok", 0.5), ("s1", "del", "error", 1.5)]


@pytest.fixture(params=[True, False], ids=["metrics", "no-metrics"])
def core(request: pytest.FixtureRequest, cluster: LocalSentinelCluster) -> Iterator[Any]:
    made = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, metrics=request.param
    )
    yield made, request.param
    made.close()


def test_each_shard_a_multi_key_call_touched_counts_once(core: Any) -> None:
    pool, recording = core
    client = CacheClient(pool, Codec())
    keys = [key_on(pool, index, f"batches-{n}") for index in (0, 1) for n in range(2)]
    names = [shard.name for shard in pool.shards]
    series = [("mget", "ok"), ("eval", "ok"), ("msetex", "ok"), ("mset", "ok"), ("del", "ok")]

    def counts() -> list[float]:
        return [
            sample(f"{CALLS}_count", shard=name, command=command, outcome=outcome)
            for name in names
            for command, outcome in series
        ]

    def seconds() -> float:
        return sum(
            sample(f"{CALLS}_sum", shard=name, command="mget", outcome="ok") for name in names
        )

    client.delete_many(keys)
    before, spent = counts(), seconds()
    for _ in range(3):
        assert client.set_many(dict.fromkeys(keys, "v"), 60) == []  # SET_EACH (Redis 7.0), or
        assert client.set_many(dict.fromkeys(keys, "w"), None) == []  # MSET
        assert client.get_many(keys) == dict.fromkeys(keys, "w")
        assert client.delete_many(keys) == len(keys)
    assert client.get_many(keys) == {}
    grew = [after - was for was, after in zip(before, counts(), strict=True)]
    if not recording:
        assert grew == [0] * len(grew)
        assert seconds() == spent
        return
    per_shard = [grew[i : i + len(series)] for i in range(0, len(grew), len(series))]
    for mget, eval_, msetex, mset, deleted in per_shard:
        assert mget == 4  # three reads that found the keys, one that found none
        assert mset == 3
        assert deleted == 3
        # With a timeout: MSETEX where the master has it (Valkey 9): the 3 calls and the probe
        # that asked this new pool's master (once, see FEATURES); else SET_EACH.
        assert (eval_, msetex) in ((3, 0), (0, 4))
    assert seconds() > spent
