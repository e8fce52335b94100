"""The asyncio lean reads' socket timeout (``ReadDeadlines`` in core/ops/deadlines.py): one
timer per event loop for every read waiting for its reply, on real (frozen) servers. Each read
still times out after its own connection's socket timeout, whatever the other reads' deadlines
(the timer is moved earlier and re-armed), drops its socket, and a cancellation by the caller
that meets the deadline stays a cancellation."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.deadlines import read_deadlines
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]

pytestmark = pytest.mark.failover


def _core(cluster: LocalSentinelCluster, socket_timeout: float) -> ShardedSentinelPool:
    return ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        async_multiplex=False,  # the pool's reads (the shared connection's: test_async_mux.py)
        socket_timeout=socket_timeout,
        listeners=False,
        reresolve_interval=0.0,
    )


async def _connections(client: AsyncCacheClient, count: int) -> tuple[Any, list[Any]]:
    """``count`` connections of the first shard's pool, connected and checked out."""
    pool = (await client.io.master(client.core.shards[0])).connection_pool
    taken = [await pool.get_connection() for _ in range(count)]
    for connection in taken:
        await connection.send_command("PING")
        assert await connection.read_response() == b"PONG"
    return pool, taken


async def _timed_read(connection: Any, delay: float) -> tuple[str, float]:
    await asyncio.sleep(delay)
    await connection.send_command("GET", "deadline:key")
    started = time.monotonic()
    try:
        await connection.read_response()
    except redis.TimeoutError:
        return "timeout", time.monotonic() - started
    return "answered", time.monotonic() - started


def test_each_read_times_out_after_its_own_socket_timeout(make_cluster: ClusterFactory) -> None:
    """Reads waiting on a frozen master in one loop: a long-timeout read armed the timer first,
    short-timeout reads start later, one after another; each fails after its own timeout (not
    the first read's, and none waits forever), with its socket dropped."""
    cluster = make_cluster(shards=1, replicas=0, sentinels=1, down_after_ms=5000)
    slow_core, fast_core = _core(cluster, 1.5), _core(cluster, 0.3)
    slow, fast = AsyncCacheClient(slow_core, Codec()), AsyncCacheClient(fast_core, Codec())
    slow_core.discover()
    fast_core.discover()
    address = slow_core.shards[0].address

    async def main() -> tuple[list[tuple[str, float]], list[bool], int]:
        slow_pool, slow_taken = await _connections(slow, 1)
        fast_pool, fast_taken = await _connections(fast, 8)
        assert address is not None
        cluster.freeze_node(address)
        try:
            reads = [_timed_read(slow_taken[0], 0.0)]
            reads += [_timed_read(c, 0.05 * (i + 1)) for i, c in enumerate(fast_taken)]
            outcomes = await asyncio.wait_for(asyncio.gather(*reads), 10)
        finally:
            cluster.thaw_node(address)
        dropped = [not c.is_connected for c in [*slow_taken, *fast_taken]]
        left = len(read_deadlines(asyncio.get_running_loop()).waiting)
        for connection in slow_taken:
            await slow_pool.release(connection)
        for connection in fast_taken:
            await fast_pool.release(connection)
        await slow.aclose()
        await fast.aclose()
        return outcomes, dropped, left

    outcomes, dropped, left = asyncio.run(main())
    slow_core.close()
    fast_core.close()
    assert outcomes[0][0] == "timeout" and 1.45 <= outcomes[0][1] < 1.5 + 1, outcomes
    for outcome, elapsed in outcomes[1:]:
        assert outcome == "timeout" and 0.28 <= elapsed < 0.3 + 1, outcomes
    assert all(dropped)
    assert left == 0  # nothing left waiting once every read ended


def test_a_cancellation_meeting_the_deadline_stays_a_cancellation(
    make_cluster: ClusterFactory,
) -> None:
    """The caller cancels a read just as its deadline fires: the read ends cancelled (the
    caller's wish is not turned into a timeout, as with ``asyncio.timeout``), the socket is
    dropped, and the next read on a new socket gets its own reply. (Before Python 3.11 a task
    cannot tell whose cancellation it got: the read times out, as redis-py's ``async_timeout``
    does there.)"""
    cluster = make_cluster(shards=1, replicas=0, sentinels=1, down_after_ms=5000)
    core = _core(cluster, 30.0)
    client = AsyncCacheClient(core, Codec())
    core.discover()
    address = core.shards[0].address

    async def main() -> tuple[str, bool, Any]:
        pool, (connection,) = await _connections(client, 1)
        deadlines = read_deadlines(asyncio.get_running_loop())
        assert address is not None
        cluster.freeze_node(address)
        try:
            await connection.send_command("PING")
            task = asyncio.create_task(connection.read_response())
            until = time.monotonic() + 10
            while task not in deadlines.waiting and time.monotonic() < until:
                await asyncio.sleep(0.01)
            assert task in deadlines.waiting, "the read never waited for its reply"
            deadlines.waiting[task][0] = 0.0  # its deadline has passed ...
            task.cancel()  # ... as the caller cancels it
            deadlines._check()  # and the timer fires before the task runs again
            try:
                await task
                outcome = "answered"
            except asyncio.CancelledError:
                outcome = "cancelled"
            except redis.TimeoutError:
                outcome = "timeout"
        finally:
            cluster.thaw_node(address)
        dropped = not connection.is_connected
        await connection.send_command("ECHO", "mine")
        reply = await connection.read_response()
        await pool.release(connection)
        await client.aclose()
        return outcome, dropped, reply

    outcome, dropped, reply = asyncio.run(main())
    core.close()
    assert outcome == ("cancelled" if sys.version_info >= (3, 11) else "timeout")
    assert dropped
    assert reply == b"mine"
