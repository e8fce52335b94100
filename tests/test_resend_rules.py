"""What is sent again after a connection failure: a command that cannot have run, whatever it
does; one that may have run, only if it is idempotent (``lean_rules.may_resend``).

Real servers throughout. Before the fix an asyncio ``incr``/``add`` right after a
``CLIENT KILL TYPE normal`` (what the sentinels send on every reconfiguration) was written to
the closed connection, could not be told from one the master ran, and raised; and a command
whose connect was refused during an outage (never sent) raised instead of being held.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from test_closed_connections import kill_clients  # every master: this module has one
from waiting import key_on, wait_until

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.async_clients import AsyncLeanShardIO, shared_async_clients
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.lean import LeanShardIO
from sentinel_cache.core.topology.lean_rules import mark_unsent, may_resend, unsent
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

ROUNDS = 20
FLAVOURS = ("sync", "asyncio")


def test_the_rule_resends_what_was_never_sent_whatever_it_does() -> None:
    sent = ConnectionResetError(104, "Connection reset by peer")
    never = mark_unsent(ConnectionRefusedError(111, "Connection refused"))
    assert unsent(never) and not unsent(sent)
    assert [may_resend(never, False), may_resend(never, True)] == [True, True]
    assert [may_resend(sent, False), may_resend(sent, True)] == [False, True]


@pytest.fixture(scope="module")
def one(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """Its own topology: the tests kill every client of its master."""
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as private:
        yield private


@pytest.fixture
def core(one: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    # The asyncio flavour here is the pool's (the shared connection's: test_async_mux.py).
    pool = ShardedSentinelPool(
        one.master_names, one.sentinel_addresses, listeners=False, async_multiplex=False
    )
    pool.discover()
    yield pool
    pool.close()


def run_async(make: Callable[[AsyncCacheClient], Coroutine[Any, Any, Any]], core: Any) -> Any:
    async def scenario() -> Any:
        client = AsyncCacheClient(core, Codec())
        try:
            return await make(client)
        finally:
            await client.aclose()

    return asyncio.run(scenario())


def after_kills(
    flavour: str, cluster: LocalSentinelCluster, core: ShardedSentinelPool, call: str, key: str
) -> tuple[list[Any], list[BaseException]]:
    """``ROUNDS`` times: a call that leaves a pooled connection, a kill, then ``call`` (``incr``
    by 1, or ``add`` after the key was deleted). Its results and what it raised."""
    results: list[Any] = []
    errors: list[BaseException] = []
    assert CacheClient(core, Codec()).set(key, 0, None) is True

    def check(killed: int) -> None:
        assert killed >= 1

    if flavour == "sync":
        client = CacheClient(core, Codec())
        for _ in range(ROUNDS):
            assert client.get("resend-warm") is None  # a pooled connection, then closed
            if call == "add":
                client.delete(key)
            check(kill_clients(cluster))
            try:
                results.append(client.incr(key, 1) if call == "incr" else client.add(key, 1, None))
            except ShardUnavailableError as exc:
                errors.append(exc)
        return results, errors

    async def scenario(client: AsyncCacheClient) -> None:
        for _ in range(ROUNDS):
            assert await client.get("resend-warm") is None
            if call == "add":
                await client.delete(key)
            check(kill_clients(cluster))  # while the loop does not run: it cannot have seen it
            try:
                if call == "incr":
                    results.append(await client.incr(key, 1))
                else:
                    results.append(await client.add(key, 1, None))
            except ShardUnavailableError as exc:
                errors.append(exc)

    run_async(scenario, core)
    return results, errors


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("call", ["incr", "add"])
def test_non_idempotent_calls_right_after_client_kill_succeed_once_each(
    one: LocalSentinelCluster, core: ShardedSentinelPool, flavour: str, call: str
) -> None:
    key = key_on(core, 0, f"resend-{call}-{flavour}")
    results, errors = after_kills(flavour, one, core, call, key)
    assert errors == [], f"{len(errors)} of {ROUNDS} raised: {errors[:2]}"
    if call == "incr":  # each sent exactly once: 1, 2, ..., 20
        assert results == list(range(1, ROUNDS + 1))
        assert CacheClient(core, Codec()).get(key) == ROUNDS
    else:
        assert results == [True] * ROUNDS
    assert core.shards[0].unreachable_since is None


def cut_after_write(
    monkeypatch: pytest.MonkeyPatch,
    cluster: LocalSentinelCluster,
    key: str,
    flavour: str,
    ran: Callable[[redis.Redis], bool],
) -> tuple[list[int], redis.Redis]:
    """Patch the flavour's lean write: after the first write about ``key``, wait until the
    master ran it (``ran``, asked through the admin client), then shut the socket down, so the
    reply never arrives: a connection cut after the write, the command run. The list counts the
    cuts; the admin client is the caller's to close."""
    cuts: list[int] = []
    admin = redis.Redis(*cluster.master_address(cluster.master_names[0]))

    def shut(sock: Any) -> None:
        wait_until(lambda: ran(admin), 5, "the master to run the write")
        # The reply taken off the socket (a twin of its descriptor), then the socket shut down.
        with socket.socket(fileno=os.dup(sock.fileno())) as twin:
            twin.settimeout(5)
            assert twin.recv(64)  # the reply, never read by the client
            twin.shutdown(socket.SHUT_RDWR)
        cuts.append(1)

    def sends_incr(command: Any) -> bool:  # the write, or its script by name or body
        return not cuts and any(key.encode() in bytes(part) for part in command)

    if flavour == "sync":
        real = LeanShardIO.send_packed_command

        def send(self: Any, command: Any, check_health: bool = True) -> None:
            real(self, command, check_health)
            if sends_incr(command):
                shut(self._sock)

        monkeypatch.setattr(LeanShardIO, "send_packed_command", send)
    else:
        real_async = AsyncLeanShardIO.send_packed_command

        async def asend(self: Any, command: Any, check_health: bool = True) -> None:
            await real_async(self, command, check_health)
            if sends_incr(command):
                shut(self._writer.transport.get_extra_info("socket"))

        monkeypatch.setattr(AsyncLeanShardIO, "send_packed_command", asend)
    return cuts, admin


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_non_idempotent_call_cut_after_the_write_is_never_sent_twice(
    one: LocalSentinelCluster,
    core: ShardedSentinelPool,
    flavour: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = key_on(core, 0, f"resend-cut-{flavour}")
    client = CacheClient(core, Codec())
    assert client.set(key, 0, None) is True
    cuts, admin = cut_after_write(monkeypatch, one, key, flavour, lambda a: a.get(key) == b"1")
    try:
        with pytest.raises(ShardUnavailableError, match="shard 0"):
            if flavour == "sync":
                client.incr(key, 1)
            else:
                run_async(lambda aclient: aclient.incr(key, 1), core)
    finally:
        monkeypatch.undo()
        admin.close()
    assert cuts == [1]
    assert client.get(key) == 1  # run once, not resent


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_smove_on_one_shard_cut_after_the_write_is_never_sent_twice(
    one: LocalSentinelCluster,
    core: ShardedSentinelPool,
    flavour: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The native ``SMOVE`` (both sets on one shard) goes through the multi-key path; resent
    after it ran, it answered False for a member it had moved (found by the history checker:
    ``django API, CLIENT KILL``, seed 788102419, the member then a phantom in the
    destination)."""
    source = key_on(core, 0, f"resend-smove-{flavour}")
    destination = f"{source}-to"
    client = CacheClient(core, Codec())
    client.delete_many([source, destination])
    assert client.sadd(source, "m") == 1
    cuts, admin = cut_after_write(
        monkeypatch, one, source, flavour, lambda a: a.exists(destination) == 1
    )
    try:
        with pytest.raises(ShardUnavailableError, match="shard 0"):
            if flavour == "sync":
                client.smove(source, destination, "m")
            else:
                run_async(lambda aclient: aclient.smove(source, destination, "m"), core)
    finally:
        monkeypatch.undo()
        admin.close()
    assert cuts == [1]
    assert (client.smembers(source), client.smembers(destination)) == (set(), {"m"})


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_refused_connect_in_an_outage_is_held_like_any_unsent_command(
    make_cluster: Callable[..., LocalSentinelCluster], flavour: str
) -> None:
    """A SIGKILLed master: the pooled connection is closed, the new connect refused, so the
    ``incr`` was never sent and ``OUTAGE_HOLD`` holds it until the switch, as an idempotent
    call is; it lands on the new master once."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=3, down_after_ms=1000)
    pool = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, outage_hold=20.0, outage_reads=False
    )
    try:
        pool.discover()
        key = key_on(pool, 0, f"resend-refused-{flavour}")
        name = cluster.master_names[0]

        def kill() -> None:
            admin = cluster.node_client(pool.shards[0].address)
            try:
                assert admin.execute_command("WAIT", 1, 5000) == 1  # the replica has the 1
            finally:
                admin.close()
            cluster.kill_master(name)

        if flavour == "sync":
            client = CacheClient(pool, Codec())
            assert client.add(key, 0, None)
            assert client.incr(key, 1) == 1
            kill()
            result = client.incr(key, 1)
        else:

            async def scenario(aclient: AsyncCacheClient) -> int:
                assert await aclient.add(key, 0, None)
                assert await aclient.incr(key, 1) == 1
                kill()
                return int(await aclient.incr(key, 1))

            result = run_async(scenario, pool)
        assert result == 2
        assert CacheClient(pool, Codec()).get(key) == 2
    finally:
        pool.close()


def test_an_asyncio_write_to_a_closing_transport_is_refused_as_never_sent(
    core: ShardedSentinelPool,
) -> None:
    """The transport already closing when the command was to be written (a write to it would
    be dropped silently): nothing is written, and the error says so, so even an ``incr`` may be
    sent again on a new connection."""

    async def scenario() -> BaseException | None:
        master = await shared_async_clients(core).master_of(core.shards[0])
        connections = master.connection_pool
        connection = await connections.get_connection()
        try:
            connection._writer.transport.close()
            try:
                await connection.send_packed_command([b"*1\r\n$4\r\nPING\r\n"])
            except RedisConnectionError as exc:
                return exc
            return None
        finally:
            await connections.release(connection)
            await connections.disconnect()

    error = asyncio.run(scenario())
    assert isinstance(error, RedisConnectionError) and unsent(error), repr(error)
