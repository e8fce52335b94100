"""Non-idempotent calls under a storm of ``CLIENT KILL TYPE normal`` (what the sentinels send on
every reconfiguration) with many clients: a call begun after a kill's reply never raises.

Why: the history checker's long CLIENT KILL scenarios (16 clients per process) saw ops begun
2.7-11 ms after a kill's reply raise "Connection closed by server" (issue 36's item 7). Every
checkout of a master's connection looks at its idle socket (``poll``: sync
``LeanShardIO.ready_to_send``, asyncio ``AsyncLeanShardIO.idle_readable``), and the node closes
the killed connections before it replies, so a call begun after the reply finds its connection
closed and replaces it, sending nothing on it. What the scenarios saw was the harness's fault
proxy: the kill goes past it (as the sentinels reach the node), while each client's end of file
is relayed by it, later (:func:`history.nemeses.relayed`, tested here). Real servers throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from history.nemeses import relayed
from threads import Workers
from waiting import key_on

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

#: Clients at once (threads, or tasks of one loop), as the history scenarios' long versions.
CLIENTS = 16
#: Kills in one storm, one every KILL_EVERY seconds.
KILLS = 10
KILL_EVERY = 0.2
#: A client's pause between two calls (a request's other work): connections then idle in the
#: pool when a kill comes, and a later call checks one out.
PAUSE = 0.005
#: Idle connections through the proxy, and kills, in the relay test.
PROXIED = 16
RELAY_ROUNDS = 10


@pytest.fixture(scope="module")
def direct(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """Its own topology, no proxy: the tests kill every client of its master."""
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as private:
        yield private


@pytest.fixture(scope="module")
def proxied(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """A topology whose clients reach the master through the fault proxy, as the history
    scenarios' do."""
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1, faults=True) as private:
        yield private


@contextlib.contextmanager
def core_of(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        pool.discover()
        yield pool
    finally:
        pool.close()


class Storm:
    """The kills (each from its sending to its reply) and the calls that raised (invoked,
    completed, error), recorded from every client."""

    def __init__(self, proxied: bool) -> None:
        self.proxied = proxied
        # (sent, its reply, relayed(): when the proxy had closed the clients' side, if any)
        self.kills: list[tuple[float, float, float]] = []
        self.raised: list[tuple[float, float, BaseException]] = []
        self.calls = 0
        self.killed = 0
        #: The kills that closed at least one connection.
        self.hits = 0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"<Storm kills={len(self.kills)} hits={self.hits} calls={self.calls} "
            f"raised={len(self.raised)}>"
        )

    def kill(self, cluster: LocalSentinelCluster) -> None:
        """KILLS kills, KILL_EVERY apart, sent as the sentinels send them (past the proxy, as
        the history scenarios' are); then the end."""
        address = cluster.master_address(cluster.master_names[0])
        try:
            with cluster.node_client(address, direct=True, socket_timeout=5) as admin:
                admin.ping()
                for _ in range(KILLS):
                    self.done.wait(KILL_EVERY)
                    sent = time.monotonic()
                    closed = int(admin.client_kill_filter(_type="normal", skipme=True))
                    self.killed += closed
                    self.hits += closed > 0
                    answered = time.monotonic()
                    ended = relayed(cluster, address) if self.proxied else answered
                    self.kills.append((sent, answered, ended))
        finally:
            self.done.set()

    def struck(self) -> bool:
        """Whether the storm hit the clients: every kill was sent and most closed a connection.
        Not every one need: asyncio clients share one multiplexed connection per shard, which
        a kill may find being replaced on a loaded machine. (CI once saw 9 of 10, and 7 of 10
        was seen here for sync threads, while a kill that cut a write in flight put the shard
        in an outage, in which no call connected: fixed, see the test below.)"""
        return len(self.kills) == KILLS and self.hits >= KILLS - 3

    def call(self, invoked: float, error: BaseException | None) -> None:
        with self._lock:
            self.calls += 1
            if error is not None:
                self.raised.append((invoked, time.monotonic(), error))

    def after(self, end: int) -> list[tuple[float, float, BaseException]]:
        """The calls that raised though invoked after every kill they overlap had ended: at
        its reply (``end`` 1) or once relayed (``end`` 2). None may raise after a kill's
        reply without the proxy (the node closes the killed connections before it replies),
        nor after it was relayed through the proxy."""
        return [
            (invoked, completed, error)
            for invoked, completed, error in self.raised
            if not any(kill[0] <= completed and invoked <= kill[end] for kill in self.kills)
        ]


def storm(
    flavour: str, cluster: LocalSentinelCluster, core: ShardedSentinelPool, proxied: bool
) -> Storm:
    """CLIENTS clients calling ``incr`` (a shared counter) and ``add`` (a new key) in turn, PAUSE
    apart, on the one shard until KILLS kills were answered."""
    record = Storm(proxied)
    counter = key_on(core, 0, f"storm-{flavour}-counter")
    assert CacheClient(core, Codec()).set(counter, 0, None) is True
    with Workers(timeout=60) as workers:
        workers.spawn(record.kill, cluster, name="killer")
        if flavour == "sync":
            client = CacheClient(core, Codec())

            def calls(n: int) -> None:
                turn = 0
                while not record.done.is_set():
                    turn += 1
                    invoked = time.monotonic()
                    try:
                        if turn % 2:
                            client.incr(counter, 1)
                        else:
                            client.add(f"storm-sync-{n}-{turn}", 1, None)
                    except ShardUnavailableError as exc:
                        record.call(invoked, exc)
                    else:
                        record.call(invoked, None)
                    record.done.wait(PAUSE)

            for n in range(CLIENTS):
                workers.spawn(calls, n, name=f"client-{n}")
        else:

            async def scenario() -> None:
                client = AsyncCacheClient(core, Codec())

                async def calls(n: int) -> None:
                    turn = 0
                    while not record.done.is_set():
                        turn += 1
                        invoked = time.monotonic()
                        try:
                            if turn % 2:
                                await client.incr(counter, 1)
                            else:
                                await client.add(f"storm-async-{n}-{turn}", 1, None)
                        except ShardUnavailableError as exc:
                            record.call(invoked, exc)
                        else:
                            record.call(invoked, None)
                        await asyncio.sleep(PAUSE)

                try:
                    await asyncio.gather(*(calls(n) for n in range(CLIENTS)))
                finally:
                    await client.aclose()

            asyncio.run(scenario())
        record.done.wait(60)
    return record


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_no_call_begun_after_a_kills_reply_raises(
    direct: LocalSentinelCluster, flavour: str
) -> None:
    with core_of(direct) as core:
        record = storm(flavour, direct, core, proxied=False)
    late = record.after(1)
    print(
        f"{flavour}, no proxy: {record.calls} calls, {len(record.kills)} kills ({record.hits} hit, "
        f"{record.killed} connections), {len(record.raised)} raised in flight across a kill, "
        f"{len(late)} after"
    )
    assert record.struck(), f"{record.hits} of {len(record.kills)} kills closed a connection"
    assert late == [], (
        f"{len(late)} of {record.calls} calls raised after a kill's reply: {late[:3]}"
    )


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_through_the_proxy_no_call_begun_after_a_kill_was_relayed_raises(
    proxied: LocalSentinelCluster, flavour: str
) -> None:
    """The history scenarios' setting: calls begun after a kill's reply may raise (their end
    of file was still in the proxy: counted and printed), none begun after ``relayed``."""
    with core_of(proxied) as core:
        record = storm(flavour, proxied, core, proxied=True)
    after_reply, after_relay = record.after(1), record.after(2)
    print(
        f"{flavour}, through the proxy: {record.calls} calls, {len(record.kills)} kills "
        f"({record.hits} hit, {record.killed} connections), {len(record.raised)} raised, {len(after_reply)} begun "
        f"after a kill's reply, {len(after_relay)} after it was relayed"
    )
    assert record.struck(), f"{record.hits} of {len(record.kills)} kills closed a connection"
    assert after_relay == [], f"{len(after_relay)} raised after relayed(): {after_relay[:3]}"


def idle_connections(cluster: LocalSentinelCluster, count: int) -> list[socket.socket]:
    """``count`` connections to the master through its proxy, each with a PING answered."""
    host, port = cluster.master_address(cluster.master_names[0])
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=5)
        sockets.append(sock)
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
    return sockets


def unclosed(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` have nothing to read yet (no end of file, no reset)."""
    poller: Any = select.poll()
    for sock in sockets:
        poller.register(sock, select.POLLIN)
    return len(sockets) - len(poller.poll(0))


def test_the_history_kills_end_once_the_proxy_relayed_them(proxied: LocalSentinelCluster) -> None:
    """``relayed`` (the end of a history scenario's kill) comes after every proxied client's
    end of file: the kill's own reply, sent past the proxy, does not (the figures printed)."""
    address = proxied.master_address(proxied.master_names[0])
    at_reply = after_relay = 0
    with proxied.node_client(address, direct=True, socket_timeout=5) as admin:
        for _ in range(RELAY_ROUNDS):
            sockets = idle_connections(proxied, PROXIED)
            try:
                assert admin.client_kill_filter(_type="normal") >= PROXIED
                at_reply += unclosed(sockets)
                relayed(proxied, address)
                after_relay += unclosed(sockets)
            finally:
                for sock in sockets:
                    sock.close()
    print(
        f"of {RELAY_ROUNDS * PROXIED} proxied connections killed: {at_reply} not yet closed "
        f"on the client's side at the kill's reply, {after_relay} after relayed()"
    )
    assert after_relay == 0


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_write_cut_by_a_kill_leaves_no_outage(direct: LocalSentinelCluster, flavour: str) -> None:
    """An ``incr`` in flight (held by ``CLIENT PAUSE WRITE``) whose connection a ``CLIENT KILL``
    closes raises, since it may have run; but the node answers on a new connection, so the
    shard is not taken for unreachable. It was: every write on the shard was then held (for
    ``OUTAGE_HOLD``) until the housekeeper saw the master answer, 0.4-0.7 s per kill in the
    storm above."""
    address = direct.master_address(direct.master_names[0])
    with core_of(direct) as core, direct.node_client(address, direct=True) as admin:
        shard = core.shards[0]
        counter = key_on(core, 0, f"cut-{flavour}")
        client = CacheClient(core, Codec())
        assert client.set(counter, 0, None) is True

        def cut() -> None:
            """Once the call waits in the pause (the node counts it blocked): kill every client
            but us, then unpause."""
            deadline = time.monotonic() + 10
            while admin.info("clients")["blocked_clients"] < 1:
                assert time.monotonic() < deadline, "the incr never reached the paused node"
                time.sleep(0.01)
            assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
            admin.execute_command("CLIENT", "UNPAUSE")

        admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        with Workers(timeout=30) as workers:
            workers.spawn(cut, name="cut")
            if flavour == "sync":
                with pytest.raises(ShardUnavailableError, match="Connection closed"):
                    client.incr(counter, 1)
            else:

                async def incr() -> None:
                    aclient = AsyncCacheClient(core, Codec())
                    try:
                        assert await aclient.get(counter) == 0  # connected before the pause
                        with pytest.raises(ShardUnavailableError, match="Connection closed"):
                            await aclient.incr(counter, 1)
                    finally:
                        await aclient.aclose()

                asyncio.run(incr())
        assert shard.unreachable_since is None, shard.snapshot()
        assert client.incr(counter, 1) in (1, 2)  # the cut one may have run
