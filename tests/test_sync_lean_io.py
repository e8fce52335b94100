"""The sync masters' lean I/O path (``LeanIO`` in core/topology/lean.py): the same replies and
the same failures as redis-py's own path, on real servers. It sends with one ``sendall``, reads
into the parser's own hiredis reader, maps error replies to redis-py's classes, hands RESP3
pushes to redis-py, checks a checkout with the kernel's byte count or one poll (an unread reply
or a closed socket is reconnected first), leaves the socket's timeout to the kernel on Linux,
and a pool skips announcing a release with nothing to re-authenticate."""

from __future__ import annotations

import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.exceptions import BusyLoadingError, NoScriptError, ReadOnlyError, ResponseError
from waiting import key_on, wait_until

from sentinel_cache import ShardUnavailableError
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.lean import LeanShardConnection
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

try:
    import hiredis  # noqa: F401

    HIREDIS = True
except ImportError:  # the CI cells without hiredis: redis-py's path serves every call
    HIREDIS = False

ClusterFactory = Callable[..., LocalSentinelCluster]


def test_the_core_connections_take_the_lean_path_with_hiredis(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    keys = [key_on(core, i, "lean") for i in range(len(core.shards))]
    client.set_many(dict.fromkeys(keys, "v"), 60)
    assert client.get_many(keys) == dict.fromkeys(keys, "v")
    found = []
    for shard in core.shards:
        connection = shard.pool.get_connection()
        try:
            found.append((type(connection), connection._lean() is not None))
        finally:
            shard.pool.release(connection)
    assert found == [(LeanShardConnection, HIREDIS)] * len(core.shards)


def test_replies_in_many_pieces_and_batches_larger_than_a_socket_buffer(
    core: ShardedSentinelPool,
) -> None:
    """1 MB values: each shard's batch is sent whole and its reply read in many pieces."""
    client = CacheClient(core, Codec())
    values = {f"lean:big:{i}": bytes([i]) * 1_000_000 for i in range(8)}
    assert {core.shard_for(key) for key in values} == set(core.shards)
    assert client.set_many(values, 60) == []
    assert client.get_many(list(values)) == values
    assert client.delete_many(list(values)) == len(values)
    assert client.get_many(list(values)) == {}


def test_replies_of_every_type_are_redis_py_s(core: ShardedSentinelPool) -> None:
    """The lean read returns what redis-py's own read of the same connection returns (no
    response callbacks: the runner reads raw replies), for each reply type our commands get."""
    client = CacheClient(core, Codec())
    shard = core.shards[0]
    key, hkey = key_on(core, 0, "lean-types"), key_on(core, 0, "lean-hash")
    commands = [
        ("SET", key, "5"),
        ("INCRBY", key, 2),
        ("GET", key),
        ("GET", key + ":absent"),
        ("HSET", hkey, "f", "v"),
        ("HGETALL", hkey),
        ("PEXPIRE", key, 60000),
        ("MGET", key, key + ":absent"),
        ("DEL", key, hkey),
    ]
    lean = client.execute(shard, commands, write=True)
    connection = redis.Connection(*shard.address)  # type: ignore[misc]  # redis-py's own path
    try:
        plain = []
        for command in commands:
            connection.send_command(*command)
            plain.append(connection.read_response())
    finally:
        connection.disconnect()
    assert lean == plain
    assert lean[1:4] == [7, b"7", None] and lean[5] in ({b"f": b"v"}, [b"f", b"v"])


@pytest.mark.parametrize(
    ("reply", "kind", "drops"),
    [
        ("READONLY You cannot write against a read only replica.", ReadOnlyError, True),
        ("NOSCRIPT No matching script.", NoScriptError, False),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", ResponseError, False),
        ("LOADING Redis is loading the dataset in memory", BusyLoadingError, True),
    ],
)
def test_an_error_reply_is_redis_py_s_class(
    core: ShardedSentinelPool, reply: str, kind: type[Exception], drops: bool
) -> None:
    """Each error reply becomes the exception class redis-py's parser maps it to, with its
    message. One that means the connection is unusable (``LOADING`` is a ConnectionError)
    drops the socket, and so does ``READONLY`` (the node is no master: the shard connection's
    rule); any other leaves it in step for the next command."""
    shard = core.shards[0]
    script = f"return redis.error_reply('{reply}')"
    connection = shard.pool.get_connection()
    try:
        assert connection._lean() is not None or not HIREDIS
        connection.send_command("EVAL", script, 0)
        with pytest.raises(kind) as lean:
            connection.read_response()
        dropped = not connection._sock
        if not dropped:
            connection.send_command("PING")
            assert connection.read_response() in (b"PONG", "PONG", True)
    finally:
        shard.pool.release(connection)
    plain = redis.Connection(*shard.address)  # type: ignore[misc]
    try:
        plain.send_command("EVAL", script, 0)
        with pytest.raises(kind) as own:
            plain.read_response()
    finally:
        plain.disconnect()
    assert type(lean.value) is type(own.value)
    assert str(lean.value) == str(own.value)
    assert dropped == drops


def test_an_error_reply_is_raised_and_the_connection_kept(core: ShardedSentinelPool) -> None:
    """An error reply is the command's failure, not the connection's: raised after the replies
    that follow it were read, and the socket stays in step for the next call."""
    client = CacheClient(core, Codec())
    shard = core.shards[0]
    key = key_on(core, 0, "lean-error")
    client.execute(shard, [("SET", key, "not a number")], write=True)
    with pytest.raises(ResponseError, match="not an integer"):
        client.execute(shard, [("INCR", key), ("GET", key)], write=True)
    idle = [(c, c.is_connected) for c in shard.pool._get_free_connections()]
    replies = client.execute(shard, [("GET", key), ("PING",)], write=False)
    after = [(c, c.is_connected) for c in shard.pool._get_free_connections()]
    assert replies[0] == b"not a number" and replies[1] in (b"PONG", True)
    assert len(idle) == 1 and idle[0][1]  # not dropped by the error reply
    assert after == idle  # and the next call used it


def test_a_connection_with_an_unread_reply_is_not_handed_out_as_it_is(
    core: ShardedSentinelPool,
) -> None:
    """The checkout's stale-reply rule on the lean path: a connection given back with a reply
    still unread (in the socket's buffer) is reconnected before anyone reads it as theirs."""
    client = CacheClient(core, Codec())
    shard = core.shards[0]
    old, new = key_on(core, 0, "unread-old"), key_on(core, 0, "unread-new")
    client.execute(shard, [("SET", old, "old"), ("SET", new, "new")], write=True)
    connection = shard.pool.get_connection()
    connection.send_command("GET", old)  # its reply is never read
    wait_until(lambda: connection.can_read(), 5, "the unread reply to arrive")
    shard.pool.release(connection)
    assert client.execute(shard, [("GET", new)], write=False) == [b"new"]


def test_a_connection_the_server_closed_is_reconnected_before_a_write_is_sent(
    core: ShardedSentinelPool,
) -> None:
    """An idle connection the server closed (CLIENT KILL, a timeout, a restart) is found at
    checkout and made again: a write that may not be sent twice (INCR) is sent once, on a
    live socket, not failed on the dead one."""
    client = CacheClient(core, Codec())
    shard = core.shards[0]
    key = key_on(core, 0, "lean-killed")
    client.execute(shard, [("SET", key, 1)], write=True)
    (idle,) = shard.pool._get_free_connections()
    assert shard.address is not None
    with redis.Redis(*shard.address) as admin:  # type: ignore[misc]
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    poller = select.poll()
    poller.register(idle._sock, select.POLLIN)
    wait_until(lambda: bool(poller.poll(0)), 5, "the server's close to reach the idle socket")
    assert client.execute(shard, [("INCR", key)], write=True, idempotent=False) == [2]
    assert client.execute(shard, [("GET", key)], write=False) == [b"2"]


def test_a_send_to_a_closed_socket_raises_redis_py_s_error(core: ShardedSentinelPool) -> None:
    """A send that fails is redis-py's ConnectionError, and the socket is dropped."""
    shard = core.shards[0]
    connection = shard.pool.get_connection()
    try:
        connection._sock.close()  # as after a socket error
        with pytest.raises(redis.ConnectionError, match="while writing to socket"):
            connection.send_command("PING")
        assert not connection.is_connected
    finally:
        shard.pool.release(connection)
    client = CacheClient(core, Codec())
    assert client.execute(shard, [("PING",)], write=False)[0] in (b"PONG", True)


def test_a_resp3_push_before_a_reply_goes_to_redis_py_and_the_reply_comes_back(
    cluster: LocalSentinelCluster,
) -> None:
    """With CLIENT TRACKING on a RESP3 connection, an invalidation push arrives ahead of the
    next reply; the read hands it to redis-py's push handler and returns the reply itself."""
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, listeners=False, protocol=3
    )
    core.discover()
    shard = core.shards[0]
    key = key_on(core, 0, "lean-push")
    pushes: list[Any] = []
    connection = shard.pool.get_connection()
    try:
        handler = connection._parser.handle_push_response

        def record(response: Any, **kwargs: Any) -> Any:
            pushes.append(response)
            return handler(response, **kwargs)

        connection._parser.handle_push_response = record
        replies = []
        for command in (("CLIENT", "TRACKING", "ON"), ("SET", key, "1"), ("GET", key)):
            connection.send_command(*command)
            replies.append(connection.read_response())
        assert shard.address is not None
        with redis.Redis(*shard.address) as other:  # type: ignore[misc]
            other.set(key, "2")  # the server pushes an invalidation of the key to us
        wait_until(lambda: connection.can_read(), 5, "the invalidation push")
        connection.send_command("PING")
        replies.append(connection.read_response())
        connection.send_command("GET", key)
        replies.append(connection.read_response())
    finally:
        connection.disconnect()
        shard.pool.release(connection)
        core.close()
    assert replies[3] in (b"PONG", True) and replies[4] == b"2"  # the push never a reply
    if HIREDIS:  # the lean path hands it to redis-py's handler
        assert len(pushes) == 1 and pushes[0][0] in (b"invalidate", "invalidate")


def test_a_release_with_a_token_to_re_authenticate_with_is_still_announced(
    core: ShardedSentinelPool,
) -> None:
    """redis-py's streaming credentials: a connection given a new token re-authenticates when
    it is released (the server counts the AUTH); one without sends nothing on release."""
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

    try:
        plain = shard.pool.get_connection()
        before = auths()
        shard.pool.release(plain)  # nothing to re-authenticate: released quietly
        assert auths() == before
        connection = shard.pool.get_connection()
        assert connection is plain
        if not hasattr(connection, "set_re_auth_token"):  # redis-py < 5.1: no such feature
            shard.pool.release(connection)
            return
        connection.set_re_auth_token(Token())
        shard.pool.release(connection)
        assert auths() == before + 1
        assert CacheClient(core, Codec()).execute(shard, [("PING",)], write=False)[0] in (
            b"PONG",
            True,
        )
    finally:
        admin.close()


@pytest.mark.failover
def test_a_frozen_master_costs_a_get_many_one_socket_timeout(
    make_cluster: ClusterFactory,
) -> None:
    """A hung master fails the call after one socket timeout, the other shard's part is
    served meanwhile, and once the master answers again the next call gets its own replies
    (the timed-out socket was dropped, its late reply never read as another call's)."""
    cluster = make_cluster(shards=2, replicas=0, sentinels=1, down_after_ms=5000)
    core = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        socket_timeout=0.5,
        listeners=False,
        reresolve_interval=0.0,
        outage_hold=0,  # the call's error and its one timeout are under test, not the hold
    )
    try:
        client = CacheClient(core, Codec())
        frozen, alive = key_on(core, 0, "frozen"), key_on(core, 1, "alive")
        client.set_many({frozen: 1, alive: 2}, None)
        address = core.shards[0].address
        assert address is not None
        cluster.freeze_node(address)
        try:
            started = time.monotonic()
            with pytest.raises(ShardUnavailableError):
                client.get_many([frozen, alive])
            took = time.monotonic() - started
            assert client.get(alive) == 2
        finally:
            cluster.thaw_node(address)
        assert 0.45 <= took < 2 * 0.5, took  # one socket timeout, never two
        assert client.get_many([alive, frozen]) == {frozen: 1, alive: 2}
    finally:
        core.close()


def test_threads_sharing_a_shard_get_their_own_replies(core: ShardedSentinelPool) -> None:
    """Eight threads sharing a shard's pool: each call reads its own replies."""
    shard = core.shards[0]
    shard.pool.disconnect()
    client = CacheClient(core, Codec())
    keys = [key_on(core, 0, f"lean-thread{i}") for i in range(8)]
    client.set_many({key: key for key in keys}, 60)
    wrong: list[Any] = []
    errors: list[BaseException] = []

    def work(key: str) -> None:
        try:
            for _ in range(300):
                found = client.get(key)
                if found != key:
                    wrong.append((key, found))
        except BaseException as exc:  # collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == [] and wrong == []


# -- the kernel's timeouts and the checkout without poll ------------------------------------------
# (core/topology/lean.py: kernel_timeouts, _Lean.unread). On Linux, with hiredis, a call lets go
# of the GIL twice (its send, and its wait for the reply) instead of five times.

KERNEL = HIREDIS and sys.platform.startswith("linux")


class CountingPoller:
    """A poller that counts its ``poll`` calls (in place of a ``_Lean``'s)."""

    def __init__(self, poller: Any) -> None:
        self.poller, self.calls = poller, 0

    def poll(self, *args: Any) -> Any:
        self.calls += 1
        return self.poller.poll(*args)


def idle_lean(shard: Any) -> Any:
    (idle,) = shard.pool._get_free_connections()
    lean = idle._lean()
    assert lean is not None
    return idle, lean


def test_the_socket_timeout_is_the_kernel_s_and_a_late_reply_is_a_timeout_error(
    make_core: Callable[..., ShardedSentinelPool],
) -> None:
    """The socket is blocking in Python's eyes with ``SO_RCVTIMEO``/``SO_SNDTIMEO`` at
    SOCKET_TIMEOUT; a reply later than that is redis-py's TimeoutError (not the EAGAIN the
    kernel gives), the socket is dropped, and the next call is served."""
    core = make_core(listeners=False, discover=True, socket_timeout=0.3)
    shard = core.shards[0]
    client = CacheClient(core, Codec())
    client.execute(shard, [("PING",)], write=False)
    (idle,) = shard.pool._get_free_connections()
    if KERNEL:
        assert idle._sock.gettimeout() is None
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            timeval = idle._sock.getsockopt(socket.SOL_SOCKET, option, 16)
            assert struct.unpack("ll", timeval) == (0, 300_000)
    else:  # redis-py's path: Python's timeout
        assert idle._sock.gettimeout() == 0.3
    connection = shard.pool.get_connection()
    try:
        connection.send_command("BLPOP", key_on(core, 0, "kernel-absent"), 5)
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError, match="Timeout reading from socket"):
            connection.read_response()
        assert 0.25 <= time.monotonic() - started < 2
        assert not connection.is_connected
    finally:
        shard.pool.release(connection)
    assert client.execute(shard, [("PING",)], write=False)[0] in (b"PONG", True)


def test_redis_py_s_own_read_gets_the_python_timeout_back(
    make_core: Callable[..., ShardedSentinelPool],
) -> None:
    """A read that takes redis-py's path (undecoded) on a socket whose timeout is the
    kernel's: its timeout is still redis-py's TimeoutError, and the next checkout hands the
    timeout to the kernel again."""
    core = make_core(listeners=False, discover=True, socket_timeout=0.3)
    shard = core.shards[0]
    connection = shard.pool.get_connection()
    try:
        connection.send_command("BLPOP", key_on(core, 0, "kernel-absent"), 5)
        with pytest.raises(redis.TimeoutError):
            connection.read_response(disable_decoding=True)
    finally:
        shard.pool.release(connection)
    connection = shard.pool.get_connection()
    try:
        connection.send_command("PING")
        assert connection.read_response(disable_decoding=True) in (b"PONG", "PONG")
        assert connection._sock.gettimeout() == 0.3  # redis-py's path took it
    finally:
        shard.pool.release(connection)
    connection = shard.pool.get_connection()
    try:
        # The checkout gave it back to the kernel (redis-py's path keeps Python's).
        assert connection._sock.gettimeout() == (None if KERNEL else 0.3)
    finally:
        shard.pool.release(connection)


def test_a_checkout_asks_the_kernel_s_byte_count_and_polls_only_when_it_moved(
    core: ShardedSentinelPool,
) -> None:
    """A drained connection is checked out without ``poll`` (which lets go of the GIL): the
    kernel's count of received bytes matches what the lean reads took. Bytes nobody read
    (a reply left unread) move the count: that checkout polls, finds them and reconnects;
    once the count is taken again, checkouts stop polling."""
    client = CacheClient(core, Codec())
    shard = core.shards[0]
    key = key_on(core, 0, "kernel-count")
    client.execute(shard, [("SET", key, "v")], write=True)
    shard.pool.disconnect()
    client.execute(shard, [("GET", key)], write=False)
    if not KERNEL:  # redis-py's path: its own check at every checkout
        assert shard.pool._get_free_connections()[0]._lean() is None
        return
    connection, lean = idle_lean(shard)
    counting = lean.poller = CountingPoller(lean.poller)
    for _ in range(20):
        assert client.execute(shard, [("GET", key)], write=False) == [b"v"]
    assert counting.calls == 0
    assert lean.counted and lean.received > 0

    # redis-py's own read (undecoded) is not counted: the next checkout polls, once.
    taken = shard.pool.get_connection()
    assert taken is connection
    taken.send_command("GET", key)
    assert taken.read_response(disable_decoding=True) == b"v"
    shard.pool.release(taken)
    for _ in range(5):
        assert client.execute(shard, [("GET", key)], write=False) == [b"v"]
    assert counting.calls == 1

    # A reply left unread: the count moved, the poll finds it, the connection is made again.
    taken = shard.pool.get_connection()
    taken.send_command("GET", key)
    wait_until(lambda: taken.can_read(), 5, "the unread reply to arrive")
    shard.pool.release(taken)
    assert client.execute(shard, [("SET", key, "w"), ("GET", key)], write=True) == [b"OK", b"w"]
    assert counting.calls == 2
    assert connection._lean() is not lean  # a new socket
