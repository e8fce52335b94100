"""A master that hangs (SIGSTOP) under a multi-key call: as for single keys
(tests/test_outage_hung.py), only the call that finds it unreachable pays its
``SOCKET_TIMEOUT``. Once the outage is known, a ``get_many`` over keys on the hung shard and
another is answered without asking the hung master (its keys by the replica in step, the other
shard's by its master), and a ``set_many`` (or ``delete_many``) with ``OUTAGE_HOLD`` waits
before its batch is sent: it raises when the hold runs out (fail-open: the held shard's keys
are the ones not set), and lands on the new master after a switch. With
``OUTAGE_READS`` off a ``get_many`` still asks the master (its timeout, then the error). ``-s``
prints the figures."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from waiting import key_on, wait_until

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ops.plans import FailOpen
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

pytestmark = pytest.mark.failover

ClusterFactory = Callable[..., LocalSentinelCluster]
TIMEOUT = 2.0  # the data nodes' SOCKET_TIMEOUT: what a call pays on the hung master
HOLD = 0.5
CALLS = 10
#: A bound far below TIMEOUT: a call that asked the hung master waits TIMEOUT at least.
BOUND = TIMEOUT / 2


def two_shards(make_cluster: ClusterFactory) -> LocalSentinelCluster:
    """Two shards with a replica each; the sentinels' down-after (60 s) outlasts the test, so
    the frozen master is neither replaced nor demoted unless the test asks for a failover."""
    return make_cluster(shards=2, replicas=1, sentinels=1, down_after_ms=60000)


def started(cluster: LocalSentinelCluster, **options: object) -> ShardedSentinelPool:
    pool = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, socket_timeout=TIMEOUT, **options
    )
    pool.discover()
    for shard in pool.shards if pool.config.outage_reads else ():
        wait_until(lambda s=shard: s.outage_replicas(s.generation), 10, "a replica in step")
    return pool


def seed(cluster: LocalSentinelCluster, pool: ShardedSentinelPool, prefix: str) -> dict[str, str]:
    """Three keys on each shard, written and replicated (WAIT) before the freeze."""
    values = {
        key_on(pool, index, f"{prefix}{index}-{n}"): f"value {index} {n}"
        for index in (0, 1)
        for n in range(3)
    }
    assert CacheClient(pool, Codec()).set_many(values, None) == []
    for shard in pool.shards:
        with cluster.node_client(shard.address) as master:
            assert master.execute_command("WAIT", 1, 5000) == 1
    return values


def timed(call: Callable[[], object]) -> tuple[object, float]:
    began = time.monotonic()
    value = call()
    return value, time.monotonic() - began


def test_get_many_in_a_known_outage_skips_the_hung_master_sync_and_asyncio(
    make_cluster: ClusterFactory,
) -> None:
    cluster = two_shards(make_cluster)
    pool = started(cluster, outage_hold=HOLD)
    hung, other = pool.shards
    try:
        values = seed(cluster, pool, "many")
        client = CacheClient(pool, Codec())
        master = hung.address
        assert master is not None
        cluster.freeze_node(master)
        try:
            served = hung.outage_reads
            found, first = timed(lambda: client.get_many(values))
            assert found == values
            assert first >= TIMEOUT  # it met the silent master: its timeout, then the replica
            assert hung.in_outage(hung.generation) and not other.in_outage(other.generation)
            assert hung.outage_reads == served + 1

            answers = [timed(lambda: client.get_many(values)) for _ in range(CALLS)]
            assert [a for a, _ in answers] == [values] * CALLS
            assert hung.outage_reads == served + 1 + CALLS  # the replica answered each
            assert other.outage_reads == 0  # the other shard's master answered
            slowest = max(t for _, t in answers)

            async def amain() -> list[float]:
                aclient = AsyncCacheClient(pool, Codec())
                times = []
                try:
                    for _ in range(CALLS):
                        began = time.monotonic()
                        assert await aclient.get_many(values) == values
                        times.append(time.monotonic() - began)
                finally:
                    await aclient.aclose()
                return times

            atimes = asyncio.run(amain())
            assert hung.outage_reads == served + 1 + 2 * CALLS
            print(
                f"\nhung master, get_many over 2 shards: first {first:.2f} s, the next {CALLS} "
                f"at most {slowest * 1e3:.1f} ms (sync), {max(atimes) * 1e3:.1f} ms (asyncio)"
            )
            # Asked of the master first, each would wait TIMEOUT again before the replica.
            assert slowest < BOUND, answers
            assert max(atimes) < BOUND, atimes
        finally:
            cluster.thaw_node(master)
        # The outage ends when the master answers again: get_many reads it, no replica asked.
        wait_until(lambda: not hung.in_outage(hung.generation), 15, "the outage to end")
        served = hung.outage_reads
        assert client.get_many(values) == values
        assert hung.outage_reads == served
    finally:
        pool.close()


def test_set_many_in_a_known_outage_is_held_before_it_is_sent(
    make_cluster: ClusterFactory,
) -> None:
    cluster = two_shards(make_cluster)
    pool = started(cluster, outage_hold=HOLD)
    hung, other = pool.shards
    try:
        values = seed(cluster, pool, "held")
        client = CacheClient(pool, Codec())
        open_client = CacheClient(pool, Codec(), fail_open=FailOpen(ignore=True))
        master = hung.address
        assert master is not None
        cluster.freeze_node(master)
        try:
            assert client.get_many(values) == values  # finds the outage: its timeout, once
            assert hung.in_outage(hung.generation)
            new = {key: f"new {value}" for key, value in values.items()}
            on_hung = [k for k in new if pool.shard_for(k) is hung]
            on_other = [k for k in new if pool.shard_for(k) is other]

            # Held, never sent to the hung master: the hold, not the master's timeout first.
            began = time.monotonic()
            with pytest.raises(ShardUnavailableError, match=r"OUTAGE_HOLD \(0\.5s\)") as raised:
                client.set_many(new, None)
            held = time.monotonic() - began
            assert "shard 0" in str(raised.value)

            async def aset() -> float:
                aclient = AsyncCacheClient(pool, Codec())
                try:
                    began = time.monotonic()
                    with pytest.raises(ShardUnavailableError, match=r"OUTAGE_HOLD \(0\.5s\)"):
                        await aclient.set_many(new, None)
                    return time.monotonic() - began
                finally:
                    await aclient.aclose()

            aheld = asyncio.run(aset())
            began = time.monotonic()
            with pytest.raises(ShardUnavailableError, match=r"OUTAGE_HOLD \(0\.5s\)"):
                client.delete_many(list(values))  # both shards: a scatter
            deleted = time.monotonic() - began
            # IGNORE_EXCEPTIONS: the held shard's keys are the ones not set, the other's land.
            newer = {key: f"newer {value}" for key, value in values.items()}
            failed, open_held = timed(lambda: open_client.set_many(newer, None))
            assert isinstance(failed, list) and sorted(failed) == sorted(on_hung)
            assert client.get_many(on_other) == {k: newer[k] for k in on_other}
            print(
                f"\nhung master, set_many over 2 shards held (OUTAGE_HOLD {HOLD:g}): raised after "
                f"{held:.2f} s (sync), {aheld:.2f} s (asyncio); fail-open {open_held:.2f} s; "
                f"delete_many {deleted:.2f} s"
            )
            # Sent to the hung master first, each would wait TIMEOUT before the hold.
            assert HOLD <= held < TIMEOUT and HOLD <= aheld < TIMEOUT
            assert HOLD <= open_held < TIMEOUT and HOLD <= deleted < TIMEOUT
        finally:
            cluster.thaw_node(master)
    finally:
        pool.close()


def test_set_many_held_in_a_known_outage_lands_on_the_new_master_after_the_switch(
    make_cluster: ClusterFactory,
) -> None:
    cluster = two_shards(make_cluster)
    hold = 30.0  # far longer than the switch: the call ends with it, not with the hold
    pool = started(cluster, outage_hold=hold)
    hung, other = pool.shards
    try:
        values = seed(cluster, pool, "switch")
        client = CacheClient(pool, Codec())
        master = hung.address
        assert master is not None
        cluster.freeze_node(master)
        try:
            assert client.get_many(values) == values  # finds the outage
            generation = hung.generation
            assert hung.in_outage(generation)
            new = {key: f"new {value}" for key, value in values.items()}
            outcome: list[object] = []

            def write() -> None:
                try:
                    outcome.append(timed(lambda: client.set_many(new, None)))
                except BaseException as exc:  # reported below, never lost
                    outcome.append(exc)

            writer = threading.Thread(target=write)
            writer.start()
            cluster.failover(hung.name)
            writer.join(hold + 10)
            assert not writer.is_alive()
            assert len(outcome) == 1 and isinstance(outcome[0], tuple), outcome
            failed, elapsed = outcome[0]
            assert failed == []
            assert hung.generation > generation and hung.address != master
            print(f"\nset_many held for the switch: {elapsed:.2f} s")
            assert elapsed < hold
            assert not hung.in_outage(hung.generation)
            assert client.get_many(new) == new  # read from the masters: the new one has them
        finally:
            cluster.thaw_node(master)
    finally:
        pool.close()


def test_without_outage_reads_get_many_still_asks_the_hung_master(
    make_cluster: ClusterFactory,
) -> None:
    cluster = two_shards(make_cluster)
    # OUTAGE_HOLD 0: what is under test is that each call asks the hung master (its timeout),
    # not the hold that follows (the default's 10 s a call were 30 s of this test's 37).
    pool = started(cluster, outage_reads=False, outage_hold=0)
    hung, other = pool.shards
    try:
        values = seed(cluster, pool, "noreads")
        client = CacheClient(pool, Codec())
        open_client = CacheClient(pool, Codec(), fail_open=FailOpen(ignore=True))
        master = hung.address
        assert master is not None
        cluster.freeze_node(master)
        try:
            with pytest.raises(ShardUnavailableError):
                client.get_many(values)
            assert hung.in_outage(hung.generation)
            # Known, and still each call waits for the master's timeout: the old behaviour.
            began = time.monotonic()
            with pytest.raises(ShardUnavailableError):
                client.get_many(values)
            assert time.monotonic() - began >= TIMEOUT
            found, elapsed = timed(lambda: open_client.get_many(values))
            assert found == {k: v for k, v in values.items() if pool.shard_for(k) is other}
            assert elapsed >= TIMEOUT
            assert hung.outage_reads == 0
        finally:
            cluster.thaw_node(master)
    finally:
        pool.close()
