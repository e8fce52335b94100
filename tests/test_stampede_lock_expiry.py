"""``get_or_set`` whose computation outlasts its lock (``STAMPEDE_LOCK_TIMEOUT``, issue 36 item
6): the lock bounds how long the other callers wait for the holder, not whether the holder may
store. Its value is stored if nothing newer was written meanwhile, so a slow computation is
stored after the first run (it was never stored: each call computed again) and callers that
took over after the expiry converge on that one value; a value written by someone else during
the computation still wins and is never overwritten. Real servers; processes are real."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from threads import Workers
from waiting import wait_until

from sentinel_cache.core.ops._sync.stampede import lock_key
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

DB = 9
#: The lock of issue 36's report; each computation below lasts until that lock has expired.
LOCK = 0.5


@pytest.fixture(scope="module")
def single(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as topology:
        yield topology


@pytest.fixture
def pool(single: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    core = ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=DB)
    yield core
    core.close()


def outlasting(pool: ShardedSentinelPool, key: str, value: Any, runs: list[Any]) -> Any:
    """A computation that ends only once the lock it was begun under has expired (the server
    says the lock key is gone or another's): it outlasts ``STAMPEDE_LOCK_TIMEOUT`` however
    loaded the machine is, with no sleep standing for the expiry."""
    raw = pool.client_for(key)

    def compute() -> Any:
        runs.append(value)
        held = raw.get(lock_key(key))
        assert held is not None, "computing without the lock"
        wait_until(lambda: raw.get(lock_key(key)) != held, 10 + LOCK, "the lock's expiry")
        return value

    return compute


def test_sequential_calls_store_the_first_computation(
    pool: ShardedSentinelPool, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36's figures: 0.5 s lock, a longer computation, 5 calls one after the other. They
    computed 5 times and stored nothing; now the first stores and the other 4 hit."""
    client = CacheClient(pool, Codec())
    key = f"slow-{time.time_ns()}"
    runs: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
        got = [
            client.get_or_set(key, outlasting(pool, key, f"run {n}", runs), 60, lock_timeout=LOCK)
            for n in range(5)
        ]
    assert runs == ["run 0"]
    assert got == ["run 0"] * 5
    assert client.get(key) == "run 0"
    # the holder's own lock had expired: nothing to release, nothing left behind
    assert not pool.client_for(key).exists(lock_key(key))
    # and the log says why: the lock timeout is shorter than the computation
    assert any(
        "lock expired or was lost" in r.getMessage() and "stored" in r.getMessage()
        for r in caplog.records
    )


def test_asyncio_sequential_calls_store_the_first_computation(pool: ShardedSentinelPool) -> None:
    key = f"aslow-{time.time_ns()}"
    runs: list[Any] = []

    async def main() -> list[Any]:
        client = AsyncCacheClient(pool, Codec())
        try:
            return [
                await client.get_or_set(
                    key, outlasting(pool, key, f"run {n}", runs), 60, lock_timeout=LOCK
                )
                for n in range(5)
            ]
        finally:
            await client.aclose()

    assert asyncio.run(main()) == ["run 0"] * 5
    assert runs == ["run 0"]
    assert CacheClient(pool, Codec()).get(key) == "run 0"


def test_a_caller_that_took_over_returns_the_first_value_and_stores_nothing_over_it(
    single: LocalSentinelCluster, pool: ShardedSentinelPool
) -> None:
    """The first holder's lock expires; a second caller (another core: as another process)
    takes the lock and computes too. The first stores, having found nothing newer; the second,
    finding that value written meanwhile, returns it instead of its own: one stored value, every
    caller served it, and the second's lock released."""
    other = ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=DB)
    first, second = CacheClient(pool, Codec()), CacheClient(other, Codec())
    key = f"takeover-{time.time_ns()}"
    runs: list[Any] = []
    first_done = threading.Event()
    second_computing = threading.Event()
    got: dict[str, Any] = {}

    def slow_second() -> str:
        runs.append("second")
        second_computing.set()
        assert first_done.wait(15), "the first caller never returned"
        return "second"

    def slow_first() -> str:
        runs.append("first")
        # the second caller computes: the first's lock expired and the second took it
        assert second_computing.wait(15), "the second caller never took over"
        return "first"

    def call_first() -> None:
        got["first"] = first.get_or_set(key, slow_first, 60, lock_timeout=LOCK)
        first_done.set()

    try:
        with Workers(timeout=30) as workers:
            workers.spawn(call_first)
            wait_until(lambda: runs == ["first"], 10, "the first computation")
            # the second caller waits for the first's lock, then takes it as it expires
            workers.spawn(
                lambda: got.update(second=second.get_or_set(key, slow_second, 60, lock_timeout=30))
            )
        assert runs == ["first", "second"]
        assert got == {"first": "first", "second": "first"}
        assert first.get(key) == "first"
        assert not pool.client_for(key).exists(lock_key(key))  # the second released its own
    finally:
        other.close()


def test_a_write_made_after_the_lock_expired_wins(pool: ShardedSentinelPool) -> None:
    """A value another client writes during the computation, after the lock expired, is kept,
    and is what the computing caller returns."""
    client, writer = CacheClient(pool, Codec()), CacheClient(pool, Codec())
    key = f"written-{time.time_ns()}"
    runs: list[Any] = []
    late = outlasting(pool, key, "late", runs)

    def compute() -> str:
        value = late()  # the lock has expired by now
        assert writer.set(key, "written", 60)  # acknowledged before the computation ends
        return value

    assert client.get_or_set(key, compute, 60, lock_timeout=LOCK) == "written"
    assert client.get(key) == "written"
    assert runs == ["late"]


def test_a_refresh_that_outlasts_its_lock_still_replaces_the_value(
    pool: ShardedSentinelPool,
) -> None:
    """Early refresh (every hit due, ``early`` 1e9): the recomputation outlasts its lock; the
    key still holds the value it replaces, so the new value is stored."""
    client = CacheClient(pool, Codec())
    key = f"refresh-{time.time_ns()}"
    assert client.get_or_set(key, lambda: "first", 60, early=1e9) == "first"
    runs: list[Any] = []
    refreshed = client.get_or_set(
        key, outlasting(pool, key, "second", runs), 60, lock_timeout=LOCK, early=1e9
    )
    assert (refreshed, runs) == ("second", ["second"])
    assert client.get(key) == "second"


# -- processes: issue 36's 4 processes at once -------------------------------------------------
def _process(master_names: list[str], sentinels: list[Any], key: str, go: Any, out: Any) -> None:
    """One process: one get_or_set on the cold key, a computation that outlasts the lock."""
    pool = ShardedSentinelPool(master_names, sentinels, db=DB)
    runs: list[Any] = []
    try:
        client = CacheClient(pool, Codec())
        compute = outlasting(pool, key, f"computed by {os.getpid()}", runs)
        go.wait(30)
        out.put((runs, client.get_or_set(key, compute, 60, lock_timeout=LOCK)))
    except BaseException as exc:  # the parent fails the test with it
        out.put(([], f"raised {type(exc).__name__}: {exc}"))
    finally:
        pool.close()


def test_processes_at_once_converge_on_one_stored_value(single: LocalSentinelCluster) -> None:
    """4 processes call get_or_set on one cold key at once; each computation outlasts the lock,
    so several compute (one per lock expiry until the first stores). Before: 4 computations,
    4 different values returned, nothing stored. Now every caller gets the one stored value."""
    key = f"processes-{time.time_ns()}"
    context = multiprocessing.get_context("fork")
    go, out = context.Event(), context.Queue()
    processes = [
        context.Process(
            target=_process, args=(single.master_names, single.sentinel_addresses, key, go, out)
        )
        for _ in range(4)
    ]
    for process in processes:
        process.start()
    go.set()
    results = [out.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode == 0
    returned = [value for _, value in results]
    computed = [value for runs, _ in results for value in runs]
    pool = ShardedSentinelPool(single.master_names, single.sentinel_addresses, db=DB)
    try:
        stored = CacheClient(pool, Codec()).get(key)
    finally:
        pool.close()
    assert stored in computed, (stored, computed)
    assert returned == [stored] * 4, returned
    print(f"\n4 processes, lock {LOCK}s: {len(computed)} computations, 1 value stored and returned")
