"""Load: 64 threads on 4 shards through CacheClient, with a planned failover in the middle.

Checks that every thread finishes (no deadlock) without an exception (a stale read fails it), that no shard ever has more connections than
``max_connections`` (counted in the pool and, by client name, on the servers), that none is
left checked out or open afterwards, and that no acknowledged write is lost: after the old
master has been demoted (and so has thrown away anything it took late), every acked key is read
back from the shard's new master. Figures are printed.

The run lasts ``SENTINEL_CACHE_LOAD_SECONDS`` (default 30; 10 when ``CI`` is set, to keep the
suite's budget); the failover starts halfway. Marked ``load``: ``-m "not load"`` skips it.

The second test measures what ``durable_replicas=1`` (``WAIT 1 <timeout>`` after each write, on
the same connection) costs a single ``set`` through CacheClient, and prints the figures.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from threads import Workers
from waiting import wait_until

from sentinel_cache.core.ops.client import CacheClient, escape_pattern
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

THREADS = 64
SHARDS = 4
MAX_CONNECTIONS = 24  # fewer than the threads: the blocking pool is exercised too
CLIENT_NAME = "sentinel-cache-load"


def load_seconds() -> float:
    default = "10" if os.environ.get("CI") else "30"
    return float(os.environ.get("SENTINEL_CACHE_LOAD_SECONDS", default))


class Worker(threading.Thread):
    """Mixed cache traffic; remembers every write the cache acknowledged."""

    def __init__(self, cache: CacheClient, index: int, halt: threading.Event) -> None:
        super().__init__(name=f"load-{index}", daemon=True)
        self.cache, self.index, self.halt = cache, index, halt
        self.rng = random.Random(index)
        self.acked: dict[str, int] = {}
        self.ops = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.slowest = 0.0
        self._n = 0

    def _key(self) -> tuple[str, int]:
        self._n += 1
        return f"load:{self.index}:{self._n}", self._n

    def run(self) -> None:
        cache, rng = self.cache, self.rng
        written: list[str] = []
        while not self.halt.is_set():
            roll = rng.random()
            started = time.monotonic()
            try:
                if roll < 0.5:
                    key, value = self._key()
                    if cache.set(key, value, 600):
                        self.acked[key] = value
                        written.append(key)
                elif roll < 0.55:
                    batch = dict(self._key() for _ in range(3))
                    failed = cache.set_many(batch, 600)
                    for key, value in batch.items():
                        if key not in failed:
                            self.acked[key] = value
                            written.append(key)
                elif roll < 0.85:
                    key = rng.choice(written) if written else "load:none"
                    value = cache.get(key)
                    assert value is None or value == self.acked.get(key), (key, value)
                else:
                    keys = rng.sample(written, min(5, len(written)))
                    found = cache.get_many(keys)
                    assert all(found[k] == self.acked[k] for k in found), found
                self.ops += 1
            except AssertionError:
                raise
            except Exception as exc:
                self.errors[type(exc).__name__] += 1
            self.slowest = max(self.slowest, time.monotonic() - started)


def named_connections(cluster: LocalSentinelCluster, address: Any) -> int:
    with cluster.node_client(address) as node:
        return sum(1 for c in node.client_list() if c.get("name") == CLIENT_NAME)


@pytest.mark.load
@pytest.mark.failover
def test_64_threads_4_shards_planned_failover(make_cluster: Callable[..., Any]) -> None:
    seconds = load_seconds()
    cluster: LocalSentinelCluster = make_cluster(shards=SHARDS, replicas=1, sentinels=3)
    pool = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        max_connections=MAX_CONNECTIONS,
        pool_timeout=10.0,
        client_name=CLIENT_NAME,
    )
    cache = CacheClient(pool, Codec())
    for index in range(3):
        # Demoting the old master waits for the sentinels to see it still claim "master" for
        # 4 publish periods (8 s) on INFO polled every 10 s; SENTINEL DEBUG (Redis 7+, Valkey)
        # shortens both for this private topology.
        with cluster.sentinel_client(index) as sentinel, contextlib.suppress(redis.ResponseError):
            sentinel.execute_command("SENTINEL", "DEBUG", "info-period", 200, "publish-period", 200)
    pool.discover()
    wait_until(
        lambda: all(s["listener_connected"] for s in pool.status()["sentinels"]), 5, "listeners"
    )
    halt = threading.Event()
    workers = [Worker(cache, i, halt) for i in range(THREADS)]
    peak = [0] * SHARDS
    server_peak = [0] * SHARDS
    watching = threading.Event()

    def watch() -> None:  # the pools' own count, sampled all along
        while not watching.is_set():
            for i, shard in enumerate(pool.status()["shards"]):
                peak[i] = max(peak[i], shard["connections"])
            watching.wait(0.01)

    watcher, load = Workers(timeout=5), Workers(timeout=30)
    watcher.spawn(watch, name="load-watch")
    began = time.monotonic()
    for worker in workers:
        load.start(worker)

    name = cluster.master_names[0]
    time.sleep(seconds / 2)
    for i, shard_name in enumerate(cluster.master_names):  # mid-run, on the servers
        server_peak[i] = named_connections(cluster, cluster.master_address(shard_name))
    old = cluster.master_address(name)
    cluster.wait_for_replication(name)
    failover_at = time.monotonic()
    cluster.failover(name)
    new = cluster.wait_for_master_change(name, old, timeout=30)
    # Writes taken by the old master after the promotion would be thrown away when it is
    # demoted: keep the load on until that has happened.
    wait_until(lambda: _role(cluster, old) == "slave", 30, "the old master to be demoted")
    failover_seconds = time.monotonic() - failover_at
    time.sleep(max(0.0, began + seconds - time.monotonic()))
    halt.set()
    try:
        load.join()  # a stale read asserted in a worker, or a worker stuck (deadlock?), fails here
        elapsed = time.monotonic() - began
        watching.set()
        watcher.join()
        in_use = [shard.pool.in_use() for shard in pool.shards]
        assert pool.shards[0].address == new
        # No acknowledged write lost, on the failed-over shard or anywhere else.
        acked: dict[str, int] = {}
        for worker in workers:
            acked.update(worker.acked)
        lost: dict[str, int] = {}
        by_shard: dict[int, list[str]] = collections.defaultdict(list)
        for key in acked:
            by_shard[pool.shard_index(key)].append(key)
        for index, keys in by_shard.items():
            address = cluster.master_address(cluster.master_names[index])
            with cluster.node_client(address) as node:
                for start in range(0, len(keys), 5000):
                    chunk = keys[start : start + 5000]
                    for key, raw in zip(chunk, node.mget(chunk), strict=True):
                        if raw is None or cache.decode(raw) != acked[key]:
                            lost[key] = index
    finally:
        watching.set()
        pool.close()

    def leftover_connections() -> list[int]:
        return [named_connections(cluster, cluster.master_address(n)) for n in cluster.master_names]

    leftover = leftover_connections()
    deadline = time.monotonic() + 2  # the servers notice closed sockets asynchronously
    while any(leftover) and time.monotonic() < deadline:
        time.sleep(0.05)
        leftover = leftover_connections()
    ops = sum(w.ops for w in workers)
    errors = sum((w.errors for w in workers), collections.Counter())
    print(
        f"\nload: {THREADS} threads x {SHARDS} shards for {elapsed:.1f}s "
        f"(failover of {name} took {failover_seconds:.2f}s to the old master's demotion): "
        f"{ops} ops ({ops / elapsed:.0f}/s), acked writes {len(acked)} "
        f"(shard 0: {len(by_shard[0])}), lost {len(lost)}, errors {sum(errors.values())} "
        f"{dict(errors)}, slowest op {max(w.slowest for w in workers) * 1000:.0f} ms; "
        f"connections per shard: pool peak {peak}, server mid-run {server_peak}, "
        f"max_connections {MAX_CONNECTIONS}, after close {leftover}"
    )
    assert lost == {}, f"{len(lost)} acknowledged writes lost, e.g. {list(lost.items())[:5]}"
    # the server also sees the housekeeping thread's ROLE connection (OUTAGE_READS, on by
    # default: docs/operations.md's connection sizing)
    assert max(peak) <= MAX_CONNECTIONS and max(server_peak) <= MAX_CONNECTIONS + 1
    assert in_use == [0] * SHARDS, f"connections still checked out: {in_use}"
    assert leftover == [0] * SHARDS, f"connections left open on the servers: {leftover}"
    assert ops > THREADS * 10
    # A planned failover is hidden by the write fence; nothing else may fail at all.
    assert not errors, dict(errors)


def _role(cluster: LocalSentinelCluster, address: Any) -> str:
    with cluster.node_client(address) as node:
        value = node.execute_command("ROLE")[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def _latencies(run: Callable[[int], Any], count: int) -> list[float]:
    samples = []
    for i in range(count):
        started = time.perf_counter()
        run(i)
        samples.append(time.perf_counter() - started)
    return sorted(samples)


def _summary(samples: list[float]) -> str:
    def at(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] * 1e6

    return f"median {at(0.5):.0f} us, p90 {at(0.9):.0f} us, p99 {at(0.99):.0f} us"


def test_durable_write_cost(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    count = int(os.environ.get("SENTINEL_CACHE_DURABLE_SAMPLES", "2000"))
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    plain = CacheClient(pool, Codec())
    durable = CacheClient(pool, Codec(), durable_replicas=1, durable_timeout_ms=100)
    value = {"user": 42, "name": "x" * 100}
    figures: dict[str, list[float]] = {}
    try:
        for client in (plain, durable):  # warm the connections of both shards
            for i in range(200):
                client.set(f"durable:warm:{i}", value, 60)
        with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
            # Interleaved rounds, so drift in the machine's load hits both alike.
            for round_ in range(4):
                for label, client in (("none", plain), ("WAIT 1", durable)):
                    samples = _latencies(
                        lambda i, c=client, r=round_, k=label: c.set(f"d:{k}:{r}:{i}", value, 60),
                        count // 4,
                    )
                    figures.setdefault(label, []).extend(samples)
                many = {f"dm:{round_}:{i}": value for i in range(20)}
                for label, client in (("none many", plain), ("WAIT 1 many", durable)):
                    samples = _latencies(lambda i, c=client, m=many: c.set_many(m, 60), 50)
                    figures.setdefault(label, []).extend(samples)
        unacked = [r.getMessage() for r in caplog.records if "acknowledged by" in r.getMessage()]
        for prefix in ("d:", "dm:", "durable:"):
            plain.clear(escape_pattern(prefix) + "*")
    finally:
        pool.close()
    for samples in figures.values():
        samples.sort()
    base, waited = (
        figures["none"][len(figures["none"]) // 2],
        figures["WAIT 1"][len(figures["WAIT 1"]) // 2],
    )
    print(
        f"\ndurable writes, single set of a ~130-byte value ({count} each, 1 replica, loopback): "
        f"none: {_summary(figures['none'])}; durable_replicas=1: {_summary(figures['WAIT 1'])}; "
        f"median cost +{(waited - base) * 1e6:.0f} us (x{waited / base:.2f}); "
        f"set_many of 20 keys on 2 shards: none {_summary(figures['none many'])}, "
        f"WAIT 1 {_summary(figures['WAIT 1 many'])}; writes not acked in time: {len(unacked)}"
    )
    assert not unacked, unacked[:3]  # a healthy local replica acks within 100 ms
    assert waited < base + 0.05  # WAIT on loopback costs a round trip, not the timeout
