"""The asyncio connections' lean I/O path (``AsyncLeanIO`` in core/ops/async_clients.py): the
same replies and the same failures as redis.asyncio's own path, on real servers. It writes
without waiting when the transport takes the batch, reads without a timer when the reply has
arrived, hands RESP3 pushes to redis-py, and a pool skips announcing a release with nothing to
re-authenticate. Every core here is pinned to the pool (``async_multiplex=False``): the shared
connection (``ASYNC_MULTIPLEX``, the default) has its own tests in tests/test_async_mux.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError
from waiting import key_on

from sentinel_cache import ShardUnavailableError
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.async_clients import AsyncLeanShardConnection
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

try:
    import hiredis  # noqa: F401

    HIREDIS = True
except ImportError:  # the CI cells without hiredis: redis-py's path serves every call
    HIREDIS = False

ClusterFactory = Callable[..., LocalSentinelCluster]


@pytest.fixture
def core(make_core: Callable[..., ShardedSentinelPool]) -> ShardedSentinelPool:
    """conftest's ``core``, on the pool."""
    return make_core(listeners=False, discover=True, async_multiplex=False)


def test_the_core_connections_take_the_lean_path_with_hiredis(core: ShardedSentinelPool) -> None:
    client = AsyncCacheClient(core, Codec())
    keys = [key_on(core, i, "lean") for i in range(len(core.shards))]

    async def main() -> list[Any]:
        await client.set_many(dict.fromkeys(keys, "v"), 60)
        assert await client.get_many(keys) == dict.fromkeys(keys, "v")
        found = []
        for shard in core.shards:
            connections = (await client.io.master(shard)).connection_pool
            connection = await connections.get_connection()
            try:
                found.append((type(connection), connection._lean() is not None))
            finally:
                await connections.release(connection)
        await client.aclose()
        return found

    assert asyncio.run(main()) == [(AsyncLeanShardConnection, HIREDIS)] * len(core.shards)


def test_replies_in_many_pieces_and_batches_larger_than_a_socket_buffer(
    core: ShardedSentinelPool,
) -> None:
    """1 MB values: each shard's batch is written in several sends (the write waits for the
    transport to drain) and its reply read in many pieces."""
    client = AsyncCacheClient(core, Codec())
    values = {f"lean:big:{i}": bytes([i]) * 1_000_000 for i in range(8)}
    assert {core.shard_for(key) for key in values} == set(core.shards)

    async def main() -> dict[Any, Any]:
        assert await client.set_many(values, 60) == []
        found = await client.get_many(list(values))
        assert await client.delete_many(list(values)) == len(values)
        await client.aclose()
        return found

    assert asyncio.run(main()) == values


def test_an_error_reply_is_raised_and_the_connection_kept(core: ShardedSentinelPool) -> None:
    """An error reply is the command's failure, not the connection's: raised after the replies
    that follow it were read, and the socket stays in step for the next call."""
    client = AsyncCacheClient(core, Codec())
    shard = core.shards[0]
    key = key_on(core, 0, "lean-error")

    async def main() -> tuple[Any, Any, Any]:
        await client.execute(shard, [("SET", key, "not a number")], write=True)
        connections = (await client.io.master(shard)).connection_pool
        with pytest.raises(ResponseError, match="not an integer"):
            await client.execute(shard, [("INCR", key), ("GET", key)], write=True)
        idle = [(c, c.is_connected) for c in connections._get_free_connections()]
        replies = await client.execute(shard, [("GET", key), ("PING",)], write=False)
        after = [(c, c.is_connected) for c in connections._get_free_connections()]
        await client.aclose()
        return idle, after, replies

    idle, after, replies = asyncio.run(main())
    assert replies == [b"not a number", b"PONG"]
    assert len(idle) == 1 and idle[0][1]  # not dropped by the error reply
    assert after == idle  # and the next call used it


def test_a_connection_with_an_unread_reply_is_not_handed_out_as_it_is(
    core: ShardedSentinelPool,
) -> None:
    """The checkout's stale-reply rule on the lean path: a connection given back with a reply
    still unread (in the socket's buffer) is reconnected before anyone reads it as theirs."""
    client = AsyncCacheClient(core, Codec())
    shard = core.shards[0]
    old, new = key_on(core, 0, "unread-old"), key_on(core, 0, "unread-new")

    async def main() -> list[Any]:
        await client.execute(shard, [("SET", old, "old"), ("SET", new, "new")], write=True)
        connections = (await client.io.master(shard)).connection_pool
        connection = await connections.get_connection()
        await connection.send_command("GET", old)  # its reply is never read
        deadline = time.monotonic() + 5
        while not connection._reader._buffer and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert connection._reader._buffer  # the reply has arrived
        await connections.release(connection)
        replies = await client.execute(shard, [("GET", new)], write=False)
        await client.aclose()
        return replies

    assert asyncio.run(main()) == [b"new"]


def test_a_write_to_a_lost_connection_raises(core: ShardedSentinelPool) -> None:
    """The transport drops a write to a connection it lost without a word: the send says so
    (redis-py's ConnectionError), or a write nobody reads the reply of (``post``) would be lost
    silently."""
    client = AsyncCacheClient(core, Codec())
    shard = core.shards[0]

    async def main() -> None:
        connections = (await client.io.master(shard)).connection_pool
        connection = await connections.get_connection()
        try:
            connection._writer.transport.abort()  # as after a socket error
            with pytest.raises(redis.ConnectionError):
                await connection.send_command("PING")
            assert not connection.is_connected
        finally:
            await connections.release(connection)
        assert await client.execute(shard, [("PING",)], write=False) == [b"PONG"]
        await client.aclose()

    asyncio.run(main())


def test_a_resp3_push_before_a_reply_goes_to_redis_py_and_the_reply_comes_back(
    cluster: LocalSentinelCluster,
) -> None:
    """With CLIENT TRACKING on a RESP3 connection, an invalidation push arrives ahead of the
    next reply; the read hands it to redis-py's push handler and returns the reply itself."""
    core = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        listeners=False,
        protocol=3,
        async_multiplex=False,
    )
    core.discover()
    client = AsyncCacheClient(core, Codec())
    shard = core.shards[0]
    key = key_on(core, 0, "lean-push")
    pushes: list[Any] = []

    async def main() -> list[Any]:
        connections = (await client.io.master(shard)).connection_pool
        connection = await connections.get_connection()
        try:
            handler = connection._parser.handle_push_response

            async def record(response: Any, **kwargs: Any) -> Any:
                pushes.append(response)
                return await handler(response, **kwargs)

            connection._parser.handle_push_response = record
            replies = []
            for command in (("CLIENT", "TRACKING", "ON"), ("SET", key, "1"), ("GET", key)):
                await connection.send_command(*command)
                replies.append(await connection.read_response())
            with redis.Redis(*shard.address) as other:  # type: ignore[misc]
                other.set(key, "2")  # the server pushes an invalidation of the key to us
            deadline = time.monotonic() + 5
            while not connection._reader._buffer and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            await connection.send_command("PING")
            replies.append(await connection.read_response())
            await connection.send_command("GET", key)
            replies.append(await connection.read_response())
        finally:
            await connection.disconnect()
            await connections.release(connection)
            await client.aclose()
        return replies

    replies = asyncio.run(main())
    core.close()
    assert replies[3:] == [b"PONG", b"2"]  # the push never taken for a reply, on either path
    if HIREDIS:  # the lean path hands it to redis-py's handler (without hiredis, redis-py's own
        # path reads it, and redis-py 5.0's python parser does not call that handler)
        assert len(pushes) == 1 and pushes[0][0] in (b"invalidate", "invalidate")


def test_a_release_with_a_token_to_re_authenticate_with_is_still_announced(
    core: ShardedSentinelPool,
) -> None:
    """redis-py's streaming credentials: a connection given a new token re-authenticates when
    it is released (the server counts the AUTH); one without sends nothing on release."""
    client = AsyncCacheClient(core, Codec())
    shard = core.shards[0]
    assert shard.address is not None
    admin = redis.Redis(*shard.address)

    def auths() -> int:
        stats = admin.info("commandstats").get("cmdstat_auth")
        return 0 if stats is None else int(stats["calls"])

    class Token:
        def try_get(self, name: str) -> str:
            return "default"

        def get_value(self) -> str:
            return "any"  # the default user has no password: AUTH default <anything> is OK

    async def main() -> tuple[int, int]:
        connections = (await client.io.master(shard)).connection_pool
        plain = await connections.get_connection()
        before = auths()
        await connections.release(plain)  # nothing to re-authenticate: released quietly
        quiet = auths() - before
        connection = await connections.get_connection()
        assert connection is plain
        if not hasattr(connection, "set_re_auth_token"):  # redis-py < 5.1: no such feature
            await connections.release(connection)
            await client.aclose()
            return quiet, 1
        connection.set_re_auth_token(Token())
        await connections.release(connection)
        announced = auths() - before
        assert await client.execute(shard, [("PING",)], write=False) == [b"PONG"]
        await client.aclose()
        return quiet, announced

    try:
        assert asyncio.run(main()) == (0, 1)
    finally:
        admin.close()


@pytest.mark.failover
def test_a_frozen_master_costs_an_async_get_many_one_socket_timeout(
    make_cluster: ClusterFactory,
) -> None:
    """The read's timer is armed when the reply has not arrived: a hung master fails the call
    after one socket timeout, the other shard's part is served meanwhile, and once the master
    answers again the next call gets its own replies (the timed-out socket was dropped)."""
    cluster = make_cluster(shards=2, replicas=0, sentinels=1, down_after_ms=5000)
    core = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        async_multiplex=False,
        socket_timeout=0.5,
        listeners=False,
        reresolve_interval=0.0,
        outage_hold=0,  # the call's error and its one timeout are under test, not the hold
    )
    client = AsyncCacheClient(core, Codec())
    frozen, alive = key_on(core, 0, "frozen"), key_on(core, 1, "alive")
    master = core.shards[0].address or core.discover() or core.shards[0].address
    timings: list[float] = []

    async def main() -> tuple[Any, Any]:
        await client.set_many({frozen: 1, alive: 2}, None)
        assert core.shards[0].address is not None
        cluster.freeze_node(core.shards[0].address)
        try:
            started = time.monotonic()
            with pytest.raises(ShardUnavailableError):
                await client.get_many([frozen, alive])
            timings.append(time.monotonic() - started)
            started = time.monotonic()
            other = await client.get(alive)
            timings.append(time.monotonic() - started)
        finally:
            cluster.thaw_node(core.shards[0].address)
        after = await client.get_many([alive, frozen])
        await client.aclose()
        return other, after

    other, after = asyncio.run(main())
    core.close()
    assert master is not None
    assert 0.45 <= timings[0] < 2 * 0.5, timings  # one socket timeout, never two
    assert timings[1] < 0.5 and other == 2
    assert after == {frozen: 1, alive: 2}


@pytest.mark.failover
def test_a_read_cancelled_half_way_drops_its_socket(make_cluster: ClusterFactory) -> None:
    """A task cancelled while its reply is on the way must not leave that reply for the next
    caller of the connection: it gets its own keys' values, never the cancelled call's. (The
    runner drops a batch's unread sockets; a connection's own read drops it as well.)"""
    cluster = make_cluster(shards=1, replicas=0, sentinels=1, down_after_ms=5000)
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, listeners=False, async_multiplex=False
    )
    client = AsyncCacheClient(core, Codec())
    first = {f"cancel:a{i}": f"a{i}" for i in range(5)}
    second = {f"cancel:b{i}": f"b{i}" for i in range(5)}

    async def main() -> dict[Any, Any]:
        await client.set_many({**first, **second}, None)
        address = core.shards[0].address
        assert address is not None
        cluster.freeze_node(address)
        connections = (await client.io.master(core.shards[0])).connection_pool
        connection = await connections.get_connection()
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.get_many(list(first)), 0.2)
            await connection.send_command("GET", "cancel:a0")  # the connection's own rule too
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(connection.read_response(), 0.2)
            dropped = not connection.is_connected
        finally:
            cluster.thaw_node(address)
            await connections.release(connection)
        assert dropped
        await asyncio.sleep(0.2)  # the frozen master's late reply reaches its socket, if open
        found = await client.get_many(list(second))
        await client.aclose()
        return found

    assert asyncio.run(main()) == second
    core.close()
