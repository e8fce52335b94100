"""The asyncio multi-key path's shortcuts keep the rules of the long way round (issue 27): a
READONLY reply read on the lean path drops its socket, a connection marked for reconnection is
not handed out as it is by the quick release, and the running loop's clients, found without a
lookup per shard, are never a closed state nor another loop's."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio.connection
from redis.exceptions import ReadOnlyError
from threads import Workers
from waiting import key_on

from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture
def pooled(make_core: Callable[..., ShardedSentinelPool]) -> ShardedSentinelPool:
    """conftest's ``core`` on the pool (``ASYNC_MULTIPLEX: False``): the two tests taking it are
    about a pooled connection's checkout and release, which the shared connection has not (its
    READONLY rule: tests/test_async_mux.py::test_readonly_closes_the_shared_connection)."""
    return make_core(listeners=False, discover=True, async_multiplex=False)


def test_a_readonly_reply_drops_the_socket(
    pooled: ShardedSentinelPool, cluster: LocalSentinelCluster
) -> None:
    """A node that answers a write with READONLY is no master: the connection that read it is
    closed, so its next use connects to wherever the shard points by then."""
    core = pooled
    client = AsyncCacheClient(core, Codec())
    shard = core.shards[0]
    master = shard.address
    assert master is not None
    replica = Address(*cluster.replica_addresses(shard.name)[0])

    async def main() -> tuple[bool, bool, Any]:
        shard.switch(replica, source="test")  # the shard's connections follow it there
        connections = (await client.io.master(shard)).connection_pool
        connection = await connections.get_connection()
        try:
            lean = connection._lean() is not None
            await connection.send_packed_command([b"*3\r\n$3\r\nSET\r\n$2\r\nro\r\n$1\r\nv\r\n"])
            with pytest.raises(ReadOnlyError):
                await connection.read_response()
            dropped = not connection.is_connected
        finally:
            await connections.release(connection)
            shard.switch(master, source="test restore")
        replies = await client.execute(shard, [("PING",)], write=False)
        await client.aclose()
        return lean, dropped, replies

    lean, dropped, replies = asyncio.run(main())
    assert dropped
    assert replies == [b"PONG"]
    assert lean or not _hiredis()  # the lean path was the one under test (with hiredis)


def test_a_connection_marked_for_reconnection_is_closed_on_release(
    pooled: ShardedSentinelPool,
) -> None:
    """redis-py marks a connection for reconnection (maintenance notifications): its release
    closes it, the quick one included, and the next checkout connects it again."""
    core = pooled
    client = AsyncCacheClient(core, Codec())
    shard = core.shards[0]

    marks = hasattr(redis.asyncio.connection.AbstractConnection, "mark_for_reconnect")

    async def main() -> tuple[bool, bool, Any]:
        connections = (await client.io.master(shard)).connection_pool
        connection = await connections.get_connection()
        if marks:  # redis-py >= 6
            connection.mark_for_reconnect()
        await connections.release(connection)
        closed = not connection.is_connected
        again = await connections.get_connection()
        reconnected = again is connection and again.is_connected
        await connections.release(again)
        replies = await client.execute(shard, [("PING",)], write=False)
        await client.aclose()
        return closed, reconnected, replies

    # Without marks (older redis-py) the release keeps the connection as it is.
    assert asyncio.run(main()) == (marks, True, [b"PONG"])


def test_a_loop_closed_in_place_gets_new_clients(core: ShardedSentinelPool) -> None:
    """``aclose`` in a running loop closes its clients; the next call of that loop gets new,
    listed ones (a closed state handed out again would hold connections nobody closes)."""
    client = AsyncCacheClient(core, Codec())
    keys = [key_on(core, i, "reopen") for i in range(len(core.shards))]

    async def main() -> tuple[Any, Any, int]:
        await client.set_many(dict.fromkeys(keys, "v"), 60)
        before = await client.io.master(core.shards[0])
        await client.aclose()
        found = await client.get_many(keys)
        after = await client.io.master(core.shards[0])
        listed = client.clients.loop_count
        await client.aclose()
        return found, before is after, listed

    assert asyncio.run(main()) == (dict.fromkeys(keys, "v"), False, 1)


def test_loops_in_two_threads_each_get_their_own_clients(core: ShardedSentinelPool) -> None:
    """Two threads' event loops calling at once: each loop's calls use its own clients (an
    asyncio connection belongs to the loop that opened it), however they interleave."""
    client = AsyncCacheClient(core, Codec())
    keys = [key_on(core, i, "two-loops") for i in range(len(core.shards))]
    seen: dict[str, dict[int, Any]] = {}  # the clients themselves: no id reused meanwhile
    results: dict[str, Any] = {}
    both = threading.Barrier(2, timeout=10)

    def run(name: str) -> None:
        async def main() -> Any:
            both.wait()  # the two loops run side by side
            clients: dict[int, Any] = {}
            found = None
            for _ in range(50):
                found = await client.get_many(keys)
                for shard in core.shards:
                    master = await client.io.master(shard)
                    clients[id(master)] = master
                await asyncio.sleep(0)
            await client.aclose()
            return clients, found

        seen[name], results[name] = asyncio.run(main())

    async def fill() -> None:
        await client.set_many(dict.fromkeys(keys, "v"), 60)
        await client.aclose()

    asyncio.run(fill())
    with Workers(timeout=30) as workers:
        first = workers.spawn(run, "a", name="loop-a")
        second = workers.spawn(run, "b", name="loop-b")
    assert not first.is_alive() and not second.is_alive()
    assert results == {"a": dict.fromkeys(keys, "v"), "b": dict.fromkeys(keys, "v")}
    assert len(seen["a"]) == len(core.shards) == len(seen["b"])  # one client per shard per loop
    assert not seen["a"].keys() & seen["b"].keys()


def _hiredis() -> bool:
    try:
        import hiredis  # noqa: F401
    except ImportError:
        return False
    return True
