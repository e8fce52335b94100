"""Single-flight ``get_or_set`` (issue 26, ``STAMPEDE_PROTECTION``): on a cold key exactly one
caller across processes and threads computes; a holder killed mid-computation hands over once
its lock expires; a failover of the key's shard during a computation neither deadlocks nor lets
two computations overwrite each other unnoticed. Real servers; processes are real processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest
from threads import Workers
from waiting import wait_until

from sentinel_cache import ArgumentValueError, ConfigurationError
from sentinel_cache.core.config import parse_cache_config
from sentinel_cache.core.ops._sync.stampede import lock_key
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

DB = 6


def pool_of(cluster: LocalSentinelCluster) -> ShardedSentinelPool:
    return ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, db=DB)


def counter(pool: ShardedSentinelPool, name: str) -> int:
    """How many computations ran, counted on the server (every process sees the same)."""
    return int(pool.client_for(name).get(name) or 0)


def computation(pool: ShardedSentinelPool, name: str, seconds: float, value: Any) -> Any:
    def compute() -> Any:
        pool.client_for(name).incr(name)
        time.sleep(seconds)
        return value

    return compute


def _callers(
    master_names: list[str], sentinels: list[Any], key: str, threads: int, out: Any
) -> None:
    """One process: ``threads`` threads calling get_or_set on one cold key."""
    pool = ShardedSentinelPool(master_names, sentinels, db=DB)
    client = CacheClient(pool, Codec())
    compute = computation(pool, f"{key}:runs", 0.2, f"value-of-{key}")
    got: list[Any] = []
    workers = Workers(timeout=30)
    for _ in range(threads):
        workers.spawn(lambda: got.append(client.get_or_set(key, compute, 60, lock_timeout=5)))
    workers.join(timeout=20)
    out.put((os.getpid(), got))
    pool.close()


def test_many_processes_and_threads_compute_a_cold_key_once(
    cluster: LocalSentinelCluster,
) -> None:
    key = f"cold-{time.time_ns()}"
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    started = time.monotonic()
    processes = [
        context.Process(
            target=_callers, args=(cluster.master_names, cluster.sentinel_addresses, key, 16, out)
        )
        for _ in range(4)
    ]
    for process in processes:
        process.start()
    results = [out.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode == 0
    elapsed = time.monotonic() - started
    values = [value for _, got in results for value in got]
    pool = pool_of(cluster)
    try:
        assert counter(pool, f"{key}:runs") == 1
        assert values == [f"value-of-{key}"] * 64
        assert not pool.client_for(key).exists(lock_key(key))  # released with the store
        assert CacheClient(pool, Codec()).get(key) == f"value-of-{key}"
    finally:
        pool.close()
    assert elapsed < 30  # a correctness bound (no caller hangs); the speed is make bench's
    print(f"\n64 callers in 4 processes: 1 computation, all returned within {elapsed:.3f}s")


def _holder(master_names: list[str], sentinels: list[Any], key: str, ready: Any) -> None:
    pool = ShardedSentinelPool(master_names, sentinels, db=DB)
    client = CacheClient(pool, Codec())

    def compute() -> str:
        ready.set()
        time.sleep(60)  # killed long before
        return "never"

    client.get_or_set(key, compute, 60, lock_timeout=1.0)


def test_a_holder_killed_mid_computation_hands_over_when_its_lock_expires(
    cluster: LocalSentinelCluster,
) -> None:
    key = f"killed-{time.time_ns()}"
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(
        target=_holder, args=(cluster.master_names, cluster.sentinel_addresses, key, ready)
    )
    holder.start()
    pool = pool_of(cluster)
    try:
        assert ready.wait(10), "the holder never began computing"
        assert pool.client_for(key).exists(lock_key(key))
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join(5)
        began = time.monotonic()
        value = CacheClient(pool, Codec()).get_or_set(key, lambda: "taken over", 60, lock_timeout=1)
        waited = time.monotonic() - began
        assert value == "taken over"
        assert waited < 1.0 + 1.0  # the lock's 1 s, then one computation, with a margin
    finally:
        pool.close()


def test_a_lost_lock_lets_the_value_stored_meanwhile_win(cluster: LocalSentinelCluster) -> None:
    """The first holder's lock vanishes mid-computation (as after a failover that lost it): a
    second caller computes and stores; the first one's late value is not stored over it, and
    the first caller returns the stored value (tests/test_stampede_lock_expiry.py: a holder
    whose lock expired still stores when nothing was written meanwhile)."""
    pool, other = pool_of(cluster), pool_of(cluster)  # two cores: as two processes
    first, second = CacheClient(pool, Codec()), CacheClient(other, Codec())
    key = f"lost-{time.time_ns()}"
    computing = threading.Event()
    outcomes: dict[str, Any] = {}

    def slow() -> str:
        computing.set()
        wait_until(lambda: "second" in outcomes, 10, "the second computation")
        return "late"

    workers = Workers(timeout=30)
    workers.spawn(lambda: outcomes.update(first=first.get_or_set(key, slow, 60, lock_timeout=30)))
    try:
        assert computing.wait(10)
        pool.client_for(key).delete(lock_key(key))  # the lock is lost
        outcomes["second"] = second.get_or_set(key, lambda: "fresh", 60, lock_timeout=30)
        workers.join(timeout=15)
        assert outcomes == {"first": "fresh", "second": "fresh"}
        assert first.get(key) == "fresh"  # the late value did not overwrite it
    finally:
        pool.close()
        other.close()


def test_a_failing_computation_releases_the_lock_and_raises_in_every_coalesced_caller(
    cluster: LocalSentinelCluster,
) -> None:
    pool = pool_of(cluster)
    client = CacheClient(pool, Codec())
    key = f"fails-{time.time_ns()}"
    gate = threading.Event()
    errors: list[BaseException] = []

    def broken() -> Any:
        gate.wait(5)
        raise RuntimeError("the database is down")

    def call() -> None:
        try:
            client.get_or_set(key, broken, 60, lock_timeout=30)
        except RuntimeError as exc:
            errors.append(exc)

    workers = Workers(timeout=30)
    try:
        for _ in range(8):
            workers.spawn(call)
        time.sleep(0.1)  # let the threads gather on the one flight
        gate.set()
        workers.join(timeout=15)
        assert len(errors) == 8 and all("database is down" in str(e) for e in errors)
        assert not pool.client_for(key).exists(lock_key(key))  # released at once
        assert client.get_or_set(key, lambda: "recovered", 60) == "recovered"
    finally:
        pool.close()


def test_a_planned_failover_during_a_computation_loses_nothing(
    make_cluster: Any,
) -> None:
    topology = make_cluster(shards=2, replicas=1, sentinels=3)
    pool = ShardedSentinelPool(topology.master_names, topology.sentinel_addresses, db=DB)
    clients = [CacheClient(pool, Codec()) for _ in range(4)]
    key = f"failover-{time.time_ns()}"
    shard = pool.shard_for(key)
    computing = threading.Event()
    got: list[Any] = []

    def compute() -> str:
        pool.client_for("runs").incr("runs")
        computing.set()
        time.sleep(1.5)
        return "computed"

    workers = Workers(timeout=30)
    try:
        for client in clients:
            workers.spawn(
                lambda c=client: got.append(c.get_or_set(key, compute, 60, lock_timeout=10))
            )
        assert computing.wait(10)
        generation = shard.generation
        topology.failover(shard.name)  # planned: the lock reaches the replica first
        wait_until(lambda: shard.generation != generation, 15, "the switch")
        workers.join(timeout=30)
        assert got == ["computed"] * 4
        assert int(pool.client_for("runs").get("runs")) == 1
        assert clients[0].get(key) == "computed"
    finally:
        pool.close()


def test_async_tasks_coalesce_and_compute_once(cluster: LocalSentinelCluster) -> None:
    pool = pool_of(cluster)
    key = f"async-{time.time_ns()}"
    runs: list[int] = []

    def compute() -> str:
        runs.append(1)
        time.sleep(0.1)
        return "a-value"

    async def main() -> list[Any]:
        client = AsyncCacheClient(pool, Codec())
        try:
            return await asyncio.gather(
                *(client.get_or_set(key, compute, 60, lock_timeout=5) for _ in range(20))
            )
        finally:
            await client.aclose()

    try:
        assert asyncio.run(main()) == ["a-value"] * 20
        assert runs == [1]
    finally:
        pool.close()


def test_plain_values_and_zero_timeouts_store_nothing_to_coordinate(
    cluster: LocalSentinelCluster,
) -> None:
    pool = pool_of(cluster)
    client = CacheClient(pool, Codec())
    key = f"plain-{time.time_ns()}"
    try:
        assert client.get_or_set(key, "a constant", 60) == "a constant"  # no computation
        assert client.get(key) == "a constant"
        assert client.get_or_set(f"{key}:0", lambda: "now", 0) == "now"  # expires at once
        assert client.get(f"{key}:0") is None
        with pytest.raises(ArgumentValueError, match="lock_timeout"):
            client.get_or_set(key, lambda: 1, 60, lock_timeout=float("nan"))
    finally:
        pool.close()


def test_early_refresh_keeps_a_steadily_read_key_from_expiring(
    cluster: LocalSentinelCluster,
) -> None:
    """Readers call get_or_set on a key with a 1 s timeout for 3.5 s; a prober's plain GET every
    5 ms never finds it missing after the first store (without early refresh it expires every
    second until a reader recomputes it), and no two computations overlap."""
    pool = pool_of(cluster)
    key = f"early-{time.time_ns()}"
    runs: list[float] = []
    missing: list[float] = []
    done = threading.Event()

    def compute() -> float:
        runs.append(time.monotonic())
        time.sleep(0.05)
        return time.monotonic()

    def reader() -> None:
        client = CacheClient(pool, Codec())
        while not done.is_set():
            client.get_or_set(key, compute, 1, lock_timeout=5, early=1.0)
            time.sleep(0.002)

    def prober() -> None:
        raw = pool.client_for(key)
        while not done.is_set():
            if raw.get(key) is None:
                missing.append(time.monotonic())
            time.sleep(0.005)

    first = CacheClient(pool, Codec()).get_or_set(key, compute, 1, lock_timeout=5, early=1.0)
    assert first
    try:
        with Workers(timeout=30) as workers:
            for _ in range(3):
                workers.spawn(reader)
            workers.spawn(prober)
            time.sleep(3.5)
            done.set()
        assert missing == []
        assert 3 <= len(runs) <= 6  # about one per second, never a burst
        gaps = [b - a for a, b in zip(runs, runs[1:], strict=False)]
        assert min(gaps) > 0.05  # never two at once
    finally:
        done.set()
        pool.close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"STAMPEDE_PROTECTION": "yes"}, "STAMPEDE_PROTECTION"),
        ({"STAMPEDE_LOCK_TIMEOUT": 0}, "STAMPEDE_LOCK_TIMEOUT"),
        ({"STAMPEDE_LOCK_TIMEOUT": float("inf")}, "STAMPEDE_LOCK_TIMEOUT"),
    ],
)
def test_bad_options_are_refused_naming_them(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        parse_cache_config(["127.0.0.1:1"], {"MASTERS": ["a"], **options})
