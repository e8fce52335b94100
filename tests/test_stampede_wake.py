"""A computation's end wakes the waiters of other processes (issue 26's cold-key target): the
store (or release) of a ``get_or_set`` lock, and the end of a pages/decorators ticket, add an
entry to the lock's wake stream, and a waiter blocked on it (``XREAD BLOCK``) returns within a
round trip, not after its block. The stream is gone soon after the lock; a holder killed
mid-computation is still taken over as its lock expires, however long a block may be. Sync and
async flavours; waiters in real processes, on real servers."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from typing import Any

import pytest
from threads import Workers
from waiting import key_on, wait_until

from sentinel_cache.core.ops import _async, _sync
from sentinel_cache.core.ops._sync.stampede import WAKE_MS, lock_key, wake_key
from sentinel_cache.core.ops.aio import AsyncCacheClient, AsyncSingleFlight
from sentinel_cache.core.ops.client import CacheClient, SingleFlight
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

DB = 7
#: A waiter's block in these tests (s): far longer than a wake takes, so a waiter that returns
#: well within it was woken (the socket timeout's half, 2.5 s, is above it).
BLOCK_S = 2.0
FLAVOURS = ["sync", "async"]


def pool_of(cluster: LocalSentinelCluster) -> ShardedSentinelPool:
    return ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, db=DB)


def blocked_on_wake(pool: ShardedSentinelPool, key: str) -> bool:
    """A client of the key's master is blocked in an XREAD (the waiter, on the wake stream)."""
    return any(
        c.get("cmd") == "xread" and "b" in c.get("flags", "")
        for c in pool.client_for(key).client_list()
    )


def _waiter(
    master_names: list[str], sentinels: list[Any], key: str, flavour: str, kind: str, out: Any
) -> None:
    """Another process: wait on ``key`` (``kind``: get_or_set, or a single-flight ticket) with
    blocks of BLOCK_S; send (what it got, when it returned, when it computed if it did)."""
    _sync.stampede.LONGEST_BLOCK = _async.stampede.LONGEST_BLOCK = BLOCK_S
    pool = ShardedSentinelPool(master_names, sentinels, db=DB)
    computed: list[float] = []

    def compute() -> str:
        computed.append(time.monotonic())
        return "the waiter's"

    async def in_a_loop() -> Any:
        client = AsyncCacheClient(pool, Codec())
        try:
            if kind == "ticket":
                return await AsyncSingleFlight(client, 30).begin(key)
            return await client.get_or_set(key, compute, 60, lock_timeout=30)
        finally:
            await client.aclose()

    try:
        if flavour == "async":
            got = asyncio.run(in_a_loop())
        elif kind == "ticket":
            got = SingleFlight(CacheClient(pool, Codec()), 30).begin(key)
        else:
            got = CacheClient(pool, Codec()).get_or_set(key, compute, 60, lock_timeout=30)
        out.put((repr(got), time.monotonic(), computed[0] if computed else None))
    finally:
        pool.close()


def start_waiter(cluster: LocalSentinelCluster, key: str, flavour: str, kind: str) -> Any:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    args = (cluster.master_names, cluster.sentinel_addresses, key, flavour, kind, out)
    process = context.Process(target=_waiter, args=args)
    process.start()
    return process, out


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_waiter_in_another_process_is_woken_by_the_store(
    cluster: LocalSentinelCluster, flavour: str
) -> None:
    pool = pool_of(cluster)
    client = CacheClient(pool, Codec())
    key = f"wake-{flavour}-{time.time_ns()}"
    computing, release, stored_at = Workers(timeout=60), [False], []

    def compute() -> str:
        wait_until(lambda: release[0], 40, "the waiter's block")
        return "the holder's"

    def hold() -> None:
        assert client.get_or_set(key, compute, 60, lock_timeout=30) == "the holder's"
        stored_at.append(time.monotonic())  # after the store's round trip: the later bound

    process = None
    try:
        computing.spawn(hold)
        wait_until(lambda: pool.client_for(key).exists(lock_key(key)), 10, "the lock")
        process, out = start_waiter(cluster, key, flavour, "get_or_set")
        wait_until(lambda: blocked_on_wake(pool, key), 30, "the waiter blocked on the wake key")
        released = time.monotonic()
        release[0] = True
        computing.join()
        got, returned, computed = out.get(timeout=20)
        process.join(10)
        assert process.exitcode == 0
        assert got == repr("the holder's") and computed is None
        # Woken: back within a fraction of its 2 s block after the store (unwoken, ~1.9 s)
        assert returned - released < 1.0, f"returned {returned - released:.3f}s after the store"
        assert stored_at and returned - stored_at[0] < 1.0
    finally:
        if process is not None and process.is_alive():
            process.kill()
        pool.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_ticket_waiter_in_another_process_is_woken_by_the_ticket_end(
    cluster: LocalSentinelCluster, flavour: str
) -> None:
    """The pages' and decorators' single flight: a waiter on a ticket held here returns None
    (look in the cache again) within a round trip of the ticket's end."""
    pool = pool_of(cluster)
    key = f"ticket-{flavour}-{time.time_ns()}"
    process = None
    try:
        ticket = SingleFlight(CacheClient(pool, Codec()), 30).begin(key)
        assert ticket is not None and ticket.token is not None
        process, out = start_waiter(cluster, key, flavour, "ticket")
        wait_until(lambda: blocked_on_wake(pool, key), 30, "the waiter blocked on the wake key")
        ended = time.monotonic()
        ticket.end()
        got, returned, _ = out.get(timeout=20)
        process.join(10)
        assert process.exitcode == 0
        assert got == "None"  # another caller's computation ended: look again
        assert returned - ended < 1.0, f"returned {returned - ended:.3f}s after the end"
        assert not pool.client_for(key).exists(lock_key(key))
    finally:
        if process is not None and process.is_alive():
            process.kill()
        pool.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_wake_key_does_not_outlive_the_lock_by_more_than_its_second(
    cluster: LocalSentinelCluster, flavour: str
) -> None:
    """No wake key while the lock is held (nothing is announced yet), one right after the store
    or a failed computation's release (with at most WAKE_MS to live), none a moment later."""
    pool = pool_of(cluster)
    stored, failed = f"gone-{flavour}-{time.time_ns()}", f"gone-failed-{flavour}-{time.time_ns()}"
    seen: dict[str, Any] = {}

    def compute() -> str:
        seen["during"] = pool.client_for(stored).exists(wake_key(stored))
        return "value"

    def broken() -> str:
        raise RuntimeError("no value")

    async def in_a_loop() -> None:
        client = AsyncCacheClient(pool, Codec())
        try:
            await client.get_or_set(stored, compute, 60, lock_timeout=30)
            with pytest.raises(RuntimeError, match="no value"):
                await client.get_or_set(failed, broken, 60, lock_timeout=30)
        finally:
            await client.aclose()

    try:
        if flavour == "async":
            asyncio.run(in_a_loop())
        else:
            client = CacheClient(pool, Codec())
            client.get_or_set(stored, compute, 60, lock_timeout=30)
            with pytest.raises(RuntimeError, match="no value"):
                client.get_or_set(failed, broken, 60, lock_timeout=30)
        assert seen["during"] == 0
        for key in (stored, failed):
            shard = pool.client_for(key)
            assert not shard.exists(lock_key(key))
            assert 0 < shard.pttl(wake_key(key)) <= WAKE_MS
        wait_until(
            lambda: not any(pool.client_for(k).exists(wake_key(k)) for k in (stored, failed)),
            WAKE_MS / 1000 + 2,
            "the wake keys to expire",
        )
    finally:
        pool.close()


def _holder(master_names: list[str], sentinels: list[Any], key: str, locked: Any) -> None:
    pool = ShardedSentinelPool(master_names, sentinels, db=DB)

    def compute() -> str:
        locked.put(time.monotonic())
        time.sleep(60)  # killed long before
        return "never"

    CacheClient(pool, Codec()).get_or_set(key, compute, 60, lock_timeout=LOCK_S)


LOCK_S = 3.0


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_waiter_blocked_on_a_killed_holder_takes_over_as_its_lock_expires(
    cluster: LocalSentinelCluster, flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 2.5 s (5 s asked, the socket timeout's half given), a lock of 3 s: a waiter
    blocked when its holder is SIGKILLed computes within the lock's time + 1 s, its last block
    cut to the lock's time left (a whole one would end about 2 s past the lock)."""
    monkeypatch.setattr(_sync.stampede, "LONGEST_BLOCK", 5.0)
    monkeypatch.setattr(_async.stampede, "LONGEST_BLOCK", 5.0)
    pool = pool_of(cluster)
    key = f"killed-wake-{flavour}-{time.time_ns()}"
    context = multiprocessing.get_context("fork")
    locked = context.Queue()
    holder = context.Process(
        target=_holder, args=(cluster.master_names, cluster.sentinel_addresses, key, locked)
    )
    took_over: list[float] = []
    got: list[Any] = []

    def compute() -> str:
        took_over.append(time.monotonic())
        return "taken over"

    async def in_a_loop() -> Any:
        client = AsyncCacheClient(pool, Codec())
        try:
            return await client.get_or_set(key, compute, 60, lock_timeout=LOCK_S)
        finally:
            await client.aclose()

    def wait() -> None:
        if flavour == "async":
            got.append(asyncio.run(in_a_loop()))
        else:
            got.append(CacheClient(pool, Codec()).get_or_set(key, compute, 60, lock_timeout=LOCK_S))

    holder.start()
    try:
        locked_at = locked.get(timeout=20)
        with Workers(timeout=LOCK_S + 10) as workers:
            workers.spawn(wait)
            wait_until(lambda: blocked_on_wake(pool, key), LOCK_S, "the waiter blocked")
            os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
            holder.join(5)
        assert got == ["taken over"]
        assert took_over[0] - locked_at < LOCK_S + 1.0, f"{took_over[0] - locked_at:.3f}s"
    finally:
        if holder.is_alive():
            holder.kill()
        pool.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_planned_failover_under_a_blocked_waiter_still_serves_the_one_value(
    make_cluster: Any, flavour: str
) -> None:
    """A waiter (its own core, as another process) blocked on the wake key when the key's shard
    fails over: the old master unblocks it as it turns replica, and it blocks again on the new
    one, where the holder stores: it returns the holder's value, one computation in all, and
    well before the lock's 30 s."""
    topology = make_cluster(shards=2, replicas=1, sentinels=3)
    holder_pool = ShardedSentinelPool(topology.master_names, topology.sentinel_addresses, db=DB)
    waiter_pool = ShardedSentinelPool(topology.master_names, topology.sentinel_addresses, db=DB)
    key = f"failover-wake-{flavour}-{time.time_ns()}"
    shard = holder_pool.shard_for(key)
    release, runs, got = [False], [], []

    def compute() -> str:
        runs.append("holder")
        wait_until(lambda: release[0], 40, "the switch")
        return "the holder's"

    def waiter_computes() -> str:
        runs.append("waiter")
        return "the waiter's"

    async def in_a_loop() -> Any:
        client = AsyncCacheClient(waiter_pool, Codec())
        try:
            return await client.get_or_set(key, waiter_computes, 60, lock_timeout=30)
        finally:
            await client.aclose()

    def wait() -> None:
        if flavour == "async":
            got.append(asyncio.run(in_a_loop()))
        else:
            waiter = CacheClient(waiter_pool, Codec())
            got.append(waiter.get_or_set(key, waiter_computes, 60, lock_timeout=30))

    holder = CacheClient(holder_pool, Codec())
    try:
        with Workers(timeout=60) as workers:
            workers.spawn(lambda: got.append(holder.get_or_set(key, compute, 60, lock_timeout=30)))
            wait_until(lambda: runs == ["holder"], 10, "the holder computing")
            began = time.monotonic()
            workers.spawn(wait)
            wait_until(lambda: blocked_on_wake(holder_pool, key), 30, "the waiter blocked")
            generation = shard.generation
            topology.failover(shard.name)
            wait_until(lambda: shard.generation != generation, 20, "the switch")
            release[0] = True
        assert got == ["the holder's", "the holder's"]
        assert runs == ["holder"]
        assert time.monotonic() - began < 20  # not the lock's 30 s
    finally:
        holder_pool.close()
        waiter_pool.close()


def test_an_unreadable_value_under_a_held_lock_is_waited_past_not_polled(
    cluster: LocalSentinelCluster,
) -> None:
    """Bytes the cache cannot read appear under the key while another caller holds its lock,
    and an earlier round's wake entry is still there (it would wake every block at once): the
    waiter treats the bytes as absent and blocks on the wake key after that entry (a few PTTLs,
    not a loop of round trips), then returns the holder's value once it is stored."""
    holder_pool, waiter_pool = pool_of(cluster), pool_of(cluster)  # two cores: two processes
    key = f"unreadable-wake-{time.time_ns()}"
    node = holder_pool.client_for(key)
    release, got = [False], []

    def compute() -> str:
        wait_until(lambda: release[0], 40, "the count")
        return "the holder's"

    def pttl_calls() -> int:
        return int(node.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0))

    holder, waiter = CacheClient(holder_pool, Codec()), CacheClient(waiter_pool, Codec())
    try:
        assert holder.get_or_set(key, lambda: "earlier", 60) == "earlier"  # an earlier round
        node.delete(key)  # its wake entry stays for WAKE_MS
        with Workers(timeout=60) as workers:
            workers.spawn(lambda: got.append(holder.get_or_set(key, compute, 60, lock_timeout=30)))
            wait_until(lambda: node.exists(lock_key(key)), 10, "the lock")
            node.set(key, b"\x00not a value of ours", ex=60)
            assert waiter.get(key) is None  # unreadable: absent
            assert node.exists(wake_key(key))  # the earlier entry, still there
            before = pttl_calls()
            workers.spawn(
                lambda: got.append(waiter.get_or_set(key, lambda: "no", 60, lock_timeout=30))
            )
            wait_until(lambda: blocked_on_wake(holder_pool, key), 30, "the waiter blocked")
            during = pttl_calls() - before
            release[0] = True
        assert during <= 10, f"{during} PTTLs before the waiter blocked: polling, not blocking"
        assert got == ["the holder's", "the holder's"]
    finally:
        holder_pool.close()
        waiter_pool.close()


def test_a_process_holds_at_most_a_quarter_of_a_shards_pool_blocked(
    cluster: LocalSentinelCluster,
) -> None:
    """MAX_CONNECTIONS 4: one connection of the shard's pool may block at once. Two waiters of
    one process on two cold keys of one shard: one blocks on its wake key, the other polls
    (never a second blocked connection); both return the holders' values."""
    holder_pool = pool_of(cluster)
    waiter_pool = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, db=DB, max_connections=4
    )
    prefix = f"quarter-{time.time_ns()}"
    keys = [key_on(holder_pool, 0, f"{prefix}-a"), key_on(holder_pool, 0, f"{prefix}-b")]
    node = holder_pool.client_for(keys[0])
    release, got, most = [False], [], [0]

    def compute(key: str) -> Any:
        def run() -> str:
            wait_until(lambda: release[0], 40, "the samples")
            return f"value of {key}"

        return run

    def blocked() -> int:
        return sum(
            c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in node.client_list()
        )

    holder, waiter = CacheClient(holder_pool, Codec()), CacheClient(waiter_pool, Codec())
    try:
        with Workers(timeout=60) as workers:
            for key in keys:
                workers.spawn(
                    lambda k=key: got.append(holder.get_or_set(k, compute(k), 60, lock_timeout=30))
                )
            wait_until(lambda: all(node.exists(lock_key(k)) for k in keys), 10, "the locks")
            for key in keys:
                workers.spawn(
                    lambda k=key: got.append(
                        waiter.get_or_set(k, lambda: "no", 60, lock_timeout=30)
                    )
                )
            wait_until(lambda: blocked() == 1, 30, "a waiter blocked")
            for _ in range(50):  # samples over about half a second
                most[0] = max(most[0], blocked())
                time.sleep(0.01)
            release[0] = True
        assert most[0] == 1
        assert sorted(got) == sorted([f"value of {k}" for k in keys] * 2)
    finally:
        holder_pool.close()
        waiter_pool.close()


def test_a_ticket_is_not_given_for_a_key_stored_since_the_callers_miss(
    cluster: LocalSentinelCluster,
) -> None:
    """A decorator's caller missed, then another caller computed, stored and released before
    this one asked for the lock: the lock is free, but the key is there, so no ticket (look in
    the cache again) and the lock is given back. Before, the caller computed it a second time
    (a loaded CI run: a cold Flask view ran twice across two processes)."""
    pool = pool_of(cluster)
    key = f"ticket-stored-{time.time_ns()}"
    try:
        flight = SingleFlight(CacheClient(pool, Codec()), 30)
        pool.client_for(key).set(key, b"computed by another caller", px=60_000)
        assert flight.begin(key) is None
        assert not pool.client_for(key).exists(lock_key(key))
        pool.client_for(key).delete(key)
        ticket = flight.begin(key)  # missing: this caller computes
        assert ticket is not None and ticket.token is not None
        ticket.end()
    finally:
        pool.close()
