"""A pooled connection the master closed is no outage (``run``'s one resend on a new connection).

A master closes its clients' connections when they idle past its ``timeout``, when the
sentinels reconfigure it (``CLIENT KILL TYPE normal``) and when it restarts. The sync pool's
checkout finds that out with a ``poll``; asyncio's only once the event loop has run, so the
next call on such a connection met the end of file, re-resolved the shard, noted an outage and
raised ``ShardUnavailableError``: every call after a kill, 20 of 20 here, before the fix. Real
servers; the kill is a real ``CLIENT KILL``, sent while the loop does not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from waiting import key_on

from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.lean import LeanShardIO
from sentinel_cache.core.topology.lean_rules import CLOSED, closed_by_node, socket_failure
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster


def refused_connect() -> RedisConnectionError:
    """redis-py's error for a refused connect, raised as it raises it (the context implicit)."""
    message = "Error 111 connecting to 127.0.0.1:1. Connection refused."
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError:
            raise RedisConnectionError(message)  # noqa: B904 - as redis-py raises it
    except RedisConnectionError as exc:
        return exc


def test_closed_by_node_tells_a_closed_connection_from_the_other_failures() -> None:
    reset = ConnectionResetError(104, "Connection reset by peer")
    pipe = BrokenPipeError(32, "Broken pipe")
    closed = [
        RedisConnectionError(CLOSED),
        socket_failure(reset, writing=False, timed_out=False, host="h", timeout_from="h"),
        socket_failure(pipe, writing=True, timed_out=False, host="", timeout_from="socket"),
        reset,
    ]
    assert [closed_by_node(exc) for exc in closed] == [True] * len(closed)
    others = [
        refused_connect(),
        RedisTimeoutError("Timeout reading from socket"),
        socket_failure(TimeoutError(), writing=False, timed_out=True, host="", timeout_from="h"),
        AuthenticationError("invalid username-password pair"),
        ShardUnavailableError(CLOSED),  # ours, raised after the safety net: never resent
        RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
    ]
    assert [closed_by_node(exc) for exc in others] == [False] * len(others)


@pytest.fixture(scope="module")
def two(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """Its own topology: the tests kill every client of its masters (the sentinels' too) and
    restart one."""
    with LocalSentinelCluster(shards=2, replicas=0, sentinels=1) as private:
        yield private


@pytest.fixture
def core(two: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    pool = ShardedSentinelPool(two.master_names, two.sentinel_addresses, listeners=False)
    pool.discover()
    yield pool
    pool.close()


def kill_clients(cluster: LocalSentinelCluster) -> int:
    """``CLIENT KILL TYPE normal`` on every master, as the sentinels send it; how many went."""
    killed = 0
    for name in cluster.master_names:
        with redis.Redis(*cluster.master_address(name)) as admin:
            killed += int(admin.client_kill_filter(_type="normal", skipme=True))
    return killed


def keys_on_both(core: ShardedSentinelPool, name: str) -> list[str]:
    return [key_on(core, 0, f"{name}-a"), key_on(core, 1, f"{name}-b")]


def no_outage(core: ShardedSentinelPool) -> list[Any]:
    return [shard.unreachable_since for shard in core.shards]


CALLS = ("get", "set", "get_many", "set_many", "delete_many")


def call_on(client: CacheClient | AsyncCacheClient, call: str, keys: list[str]) -> Any:
    """``call`` on ``keys`` (both set to 1 before): its result, or the coroutine giving it."""
    if call == "get":
        return client.get(keys[0])
    if call == "set":
        return client.set(keys[0], 1, 300)
    if call == "get_many":
        return client.get_many(keys)
    if call == "set_many":
        return client.set_many(dict.fromkeys(keys, 1), 300)
    return client.delete_many(keys)


def check_call(call: str, result: Any, keys: list[str]) -> None:
    expected = {
        "get": 1,
        "set": True,
        "get_many": dict.fromkeys(keys, 1),
        "set_many": [],  # no key failed
        "delete_many": len(keys),  # both deleted
    }
    assert result == expected[call]


def run_async(make: Callable[[AsyncCacheClient], Coroutine[Any, Any, Any]], core: Any) -> Any:
    async def scenario() -> Any:
        client = AsyncCacheClient(core, Codec())
        try:
            return await make(client)
        finally:
            await client.aclose()

    return asyncio.run(scenario())


@pytest.mark.parametrize("call", CALLS)
def test_asyncio_calls_after_the_master_closed_every_connection(
    two: LocalSentinelCluster, core: ShardedSentinelPool, call: str
) -> None:
    keys = keys_on_both(core, f"closed-async-{call}")

    async def scenario(client: AsyncCacheClient) -> list[Any]:
        results = []
        for _ in range(5):
            assert await client.set_many(dict.fromkeys(keys, 1), 300) == []
            # Connections open on both masters, then closed by them while the loop does not
            # run: the pool cannot have seen it.
            assert kill_clients(two) >= 2
            results.append(await call_on(client, call, keys))
        return results

    for result in run_async(scenario, core):
        check_call(call, result, keys)
    assert no_outage(core) == [None, None]
    if call == "delete_many":
        assert CacheClient(core, Codec()).get_many(keys) == {}


@pytest.mark.parametrize("call", CALLS)
def test_sync_calls_on_a_connection_closed_after_the_checkout_look(
    two: LocalSentinelCluster,
    core: ShardedSentinelPool,
    call: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sync checkout's ``poll`` sees a closed connection; one closed right after it (the
    same window as asyncio's) is what this reproduces, the look answering "ready" regardless."""
    client = CacheClient(core, Codec())
    keys = keys_on_both(core, f"closed-sync-{call}")
    for _ in range(5):
        assert client.set_many(dict.fromkeys(keys, 1), 300) == []
        with monkeypatch.context() as patched:
            patched.setattr(LeanShardIO, "ready_to_send", lambda self: self._sock is not None)
            assert kill_clients(two) >= 2
            check_call(call, call_on(client, call, keys), keys)
    assert no_outage(core) == [None, None]


def test_asyncio_calls_after_a_master_restarted_at_its_address(
    two: LocalSentinelCluster, core: ShardedSentinelPool
) -> None:
    """A master SIGKILLed and started again at once (no failover: the sentinels never mark it
    down): the next calls succeed on new connections. It comes back empty (nothing persists)."""
    key = key_on(core, 0, "closed-restart")
    address = Address(*two.master_address(two.master_names[0]))

    async def scenario(client: AsyncCacheClient) -> list[Any]:
        assert await client.set(key, "before", 300) is True
        two.kill_node(address)
        two.restart_node(address)
        return [await client.get(key), await client.set(key, "after", 300), await client.get(key)]

    assert run_async(scenario, core) == [None, True, "after"]
    assert no_outage(core) == [None, None]


def test_a_master_gone_after_closing_the_connection_is_still_the_shards_error(
    two: LocalSentinelCluster, core: ShardedSentinelPool
) -> None:
    """The end of file of a killed master, then a refused connect: the resend on a new
    connection fails at once and the safety net's rules follow (an outage noted, the shard's
    error), as before."""
    key = key_on(core, 1, "closed-gone")
    address = Address(*two.master_address(two.master_names[1]))

    async def scenario(client: AsyncCacheClient) -> tuple[BaseException | None, float | None]:
        assert await client.set(key, "v", 300) is True
        two.kill_node(address)
        try:
            await client.get(key)
        except ShardUnavailableError as exc:
            # Looked at when the error is raised: once the node is back, a re-resolve that
            # finds it a master again ends the outage (a loaded CI run saw None after it).
            return exc, core.shards[1].unreachable_since
        return None, None

    try:
        error, unreachable_since = run_async(scenario, core)
    finally:
        two.restart_node(address)
    assert isinstance(error, ShardUnavailableError)
    assert f"shard {core.shards[1].label}" in str(error)
    assert unreachable_since is not None
