"""Which reads a replica answers in an outage (``OUTAGE_READS``), tried while the shard's master
hangs (SIGSTOP) and a replica in step would answer if asked: the outage known before the call,
or found by the read itself when the master hangs between two round trips of one operation.

What only the master can answer is never sent to it: a ``SCAN``/``SSCAN`` cursor is one node's,
a waiter's read of a computation lock must see its holder's lock and not a lagging copy, and the
read of a read-modify-write (incr past 64 bits, add over unreadable bytes) must come from the
node its write goes to. Each fails with the shard's error instead, and the replica's own command
counts show it was never asked (the runner's ``outage=False``). Reads kept off the read rotation
for another reason are answered: the early refresh's timed read of a hit, here, and the near
cache's tracked read (``tests/test_outage_near.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.exceptions import ResponseError
from waiting import key_on, wait_until

from sentinel_cache.core.ops._sync.stampede import lock_key, wait_released
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient, SingleFlight
from sentinel_cache.core.ops.plans import past_64_bits
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

pytestmark = pytest.mark.failover

ClusterFactory = Callable[..., LocalSentinelCluster]
TIMEOUT = 1.0  # the data nodes' SOCKET_TIMEOUT: what each call pays on the hung master
COUNTED = ("scan", "sscan", "xread", "pttl", "get")


class Outage:
    """One shard with a replica in step, its master frozen and the outage known (a read the
    replica answered); the sentinels' down-after (60 s) outlasts the test, so nothing fails
    over meanwhile."""

    def __init__(self, make_cluster: ClusterFactory) -> None:
        self.cluster = make_cluster(shards=1, replicas=1, sentinels=1, down_after_ms=60000)
        self.pool = ShardedSentinelPool(  # a read no replica may answer fails at once: what
            self.cluster.master_names,  # never_asked checks (the default hold would wait)
            self.cluster.sentinel_addresses,
            socket_timeout=TIMEOUT,
            outage_hold=0,
        )
        self.pool.discover()
        self.shard: Shard = self.pool.shards[0]
        self.client = CacheClient(self.pool, Codec())
        wait_until(lambda: self.shard.outage_replicas(self.shard.generation), 5, "a replica")
        (self.replica,) = self.shard.outage_replicas(self.shard.generation)
        self.master = self.shard.address
        assert self.master is not None

    def replicate(self) -> None:
        with self.cluster.node_client(self.master) as master:
            assert master.execute_command("WAIT", 1, 5000) == 1

    def begin(self) -> None:
        """Freeze the master; the first read finds it unreachable and the replica answers."""
        probe = key_on(self.pool, 0, "probe")
        self.client.set(probe, "probe", None)
        self.replicate()
        self.cluster.freeze_node(self.master)
        assert self.client.get(probe) == "probe"
        assert self.shard.in_outage(self.shard.generation)

    def replica_calls(self) -> dict[str, int]:
        """How many of each command the replica ran, by its own count."""
        with self.cluster.node_client(self.replica) as replica:
            stats = replica.info("commandstats")
        return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in COUNTED}

    def close(self) -> None:
        self.cluster.thaw_node(self.master)
        self.pool.close()


@pytest.fixture
def outage(make_cluster: ClusterFactory) -> Iterator[Outage]:
    made = Outage(make_cluster)
    try:
        yield made
    finally:
        made.close()


def never_asked(outage: Outage, call: Callable[[], Any]) -> None:
    """``call`` fails with the shard's error in the known outage, no replica answering it."""
    before, served = outage.replica_calls(), outage.shard.outage_reads
    with pytest.raises(ShardUnavailableError, match="shard 0"):
        call()
    assert outage.shard.outage_reads == served
    assert outage.replica_calls() == before


def test_a_scan_cursor_is_never_asked_of_a_replica(outage: Outage) -> None:
    keys = [key_on(outage.pool, 0, f"scanned{i}") for i in range(3)]
    for key in keys:
        outage.client.set(key, "v", None)
    members = key_on(outage.pool, 0, "members")
    outage.client.sadd(members, "a", "b", "c")
    outage.replicate()
    outage.begin()
    never_asked(outage, lambda: list(outage.client.iter_keys("*")))
    never_asked(outage, lambda: list(outage.client.sscan_iter(members)))


def test_an_asyncio_scan_cursor_is_never_asked_of_a_replica(outage: Outage) -> None:
    outage.client.set(key_on(outage.pool, 0, "ascanned"), "v", None)
    outage.begin()

    async def scan() -> list[bytes]:
        client = AsyncCacheClient(outage.pool, Codec())
        try:
            return [key async for key in client.iter_keys("*")]
        finally:
            await client.aclose()

    never_asked(outage, lambda: asyncio.run(scan()))


def test_a_waiter_reads_a_computation_lock_only_on_the_master(outage: Outage) -> None:
    """A waiter for another caller's computation (``get_or_set``, the pages' single flight)
    reads the lock's time left, blocked on its wake stream or polling: neither on a replica."""
    key = key_on(outage.pool, 0, "computing")
    with outage.cluster.node_client(outage.master) as master:
        master.set(lock_key(key), "another caller's token", px=60000)
    outage.replicate()
    outage.begin()
    client = outage.client
    deadline = time.monotonic() + 10  # a replica asked instead would wait this long: MISS
    # 60 s left: a block on the wake stream; 50 ms left: a poll (within the timer's slack)
    never_asked(outage, lambda: wait_released(client, key, 60000, client.decode, deadline))
    never_asked(outage, lambda: wait_released(client, key, 50, client.decode, deadline))


def test_incr_past_64_bits_reads_the_value_it_swaps_on_the_master(outage: Outage) -> None:
    """The master hangs between the ``INCRBY`` it refused (the result needs more than 64
    bits) and incr's own read of the value: that read is the master's or nothing, for the
    write that follows is conditional on what it read, on the node it goes to."""
    key = key_on(outage.pool, 0, "big counter")
    outage.client.set(key, 2**63 - 1, None)
    outage.replicate()
    client = outage.client
    keyed = client.keyed

    def hang_after_the_refusal(key: Any, commands: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return keyed(key, commands, *args, **kwargs)
        except ResponseError as exc:
            if past_64_bits(exc):  # the refusal arrived: the master hangs before the read
                outage.cluster.freeze_node(outage.master)
            raise

    client.keyed = hang_after_the_refusal  # type: ignore[method-assign]
    never_asked(outage, lambda: client.incr(key, 1))
    assert outage.shard.in_outage(outage.shard.generation)  # the read found the master hung
    outage.cluster.thaw_node(outage.master)
    client.keyed = keyed  # type: ignore[method-assign]
    wait_until(lambda: not outage.shard.in_outage(outage.shard.generation), 10, "outage end")
    assert client.incr(key, 1) == 2**63  # nothing was written meanwhile


def test_the_early_refresh_read_of_a_hit_is_answered_by_the_replica(outage: Outage) -> None:
    """``get_or_set`` with early refresh, and the pages' single flight, read a hit with its
    time left and its computation's duration (off the read rotation): in an outage the
    replica answers it, and a refresh not due yet returns the value."""
    key = key_on(outage.pool, 0, "refreshed")
    client = outage.client
    assert client.get_or_set(key, lambda: "computed", 600, early=1.0) == "computed"
    outage.replicate()
    outage.begin()
    served = outage.shard.outage_reads

    def not_again() -> str:
        raise AssertionError("computed again: the hit was not read")

    # XFetch with a 600 s timeout and a computation of a few ms: no refresh is due
    assert client.get_or_set(key, not_again, 600, early=1.0) == "computed"
    assert SingleFlight(client, 10.0).read(key, 1.0) == ("computed", None)
    assert outage.shard.outage_reads == served + 2


def test_add_over_an_unreadable_value_reads_it_on_the_master(outage: Outage) -> None:
    """``add`` found the key taken (``SET NX``) by bytes this cache cannot read, which count as
    absent, and reads them to replace them only if they are still the same. The master hangs
    between the two: that read is the master's or nothing, as incr's."""
    key = key_on(outage.pool, 0, "unreadable")
    unreadable = b"\xffnot this cache's format"
    with outage.cluster.node_client(outage.master) as master:
        master.set(key, unreadable)
    outage.replicate()
    client = outage.client
    keyed = client.keyed

    def hang_once_taken(key: Any, commands: Any, *args: Any, **kwargs: Any) -> Any:
        replies, dropped = keyed(key, commands, *args, **kwargs)
        if commands[0][0] == "SET" and "NX" in commands[0] and replies[0] is None:
            outage.cluster.freeze_node(outage.master)  # taken: the master hangs before the read
        return replies, dropped

    client.keyed = hang_once_taken  # type: ignore[method-assign]
    never_asked(outage, lambda: client.add(key, "added", None))
    assert outage.shard.in_outage(outage.shard.generation)
    outage.cluster.thaw_node(outage.master)
    client.keyed = keyed  # type: ignore[method-assign]
    wait_until(lambda: not outage.shard.in_outage(outage.shard.generation), 10, "outage end")
    with outage.cluster.node_client(outage.master) as master:
        assert master.get(key) == unreadable  # nothing was written meanwhile
    assert client.add(key, "added", None) and client.get(key) == "added"
