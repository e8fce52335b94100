"""``ASYNC_MULTIPLEX``: every task of an event loop shares one auto-pipelined connection per
shard master (``core/ops/async_mux.py``), with the pooled path's failover rules. Real servers,
except the hostile replies, which need a fake master (as in ``test_hostile_replies``)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Coroutine, Iterator
from types import SimpleNamespace
from typing import Any

import hiredis
import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from test_closed_connections import kill_clients
from test_hostile_replies import BOUND, HOSTILE, hostile, names_the_shard  # noqa: F401
from waiting import key_on, wait_until

from sentinel_cache import ReplyProtocolError, ShardUnavailableError, StaleReplyError
from sentinel_cache.core.config import PoolConfig, parse_cache_config
from sentinel_cache.core.ops import async_mux
from sentinel_cache.core.ops._async import runner as runner_module
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.async_mux import AsyncMuxPool, MuxCall, MuxLink, replies_due
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.lean_rules import unsent
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ConfigurationError
from sentinel_cache.testing import LocalSentinelCluster

NAME = "mux-test"
TASKS = 64


@pytest.fixture(scope="module")
def two(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """Its own topology: the tests kill clients and turn a master into a replica."""
    with LocalSentinelCluster(shards=2, replicas=0, sentinels=1) as private:
        yield private


def make(cluster: LocalSentinelCluster, **options: Any) -> ShardedSentinelPool:
    options.setdefault("async_multiplex", True)
    pool = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        listeners=False,
        client_name=NAME,
        **options,
    )
    pool.discover()
    return pool


@pytest.fixture
def core(two: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    pool = make(two)
    yield pool
    pool.close()


def run(
    core: ShardedSentinelPool, scenario: Callable[[AsyncCacheClient], Coroutine[Any, Any, Any]]
) -> Any:
    async def main() -> Any:
        client = AsyncCacheClient(core, Codec())
        try:
            return await scenario(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


async def pool_of(client: AsyncCacheClient, index: int) -> AsyncMuxPool:
    pool = (await client.io.master(client.core.shards[index])).connection_pool
    assert isinstance(pool, AsyncMuxPool)
    return pool


def ours(cluster: LocalSentinelCluster) -> list[int]:
    """Per master, the server connections named ours (``CLIENT LIST``)."""
    counts = []
    for name in cluster.master_names:
        with redis.Redis(*cluster.master_address(name)) as admin:
            counts.append(sum(1 for c in admin.client_list() if c.get("name") == NAME))
    return counts


# -- the option ----------------------------------------------------------------------------------
def test_the_option_is_on_by_default_and_must_be_a_bool() -> None:
    """On unless turned off; the configuration tells an explicit ``True`` (which warns when the
    pool must serve instead) from the default (which falls back quietly)."""
    default = PoolConfig.create(["m"], [("127.0.0.1", 26379)])
    assert default.async_multiplex is True
    assert default.async_multiplex_explicit is False
    asked = PoolConfig.create(["m"], [("127.0.0.1", 26379)], async_multiplex=True)
    assert asked.async_multiplex is True and asked.async_multiplex_explicit is True
    off = PoolConfig.create(["m"], [("127.0.0.1", 26379)], async_multiplex=False)
    assert off.async_multiplex is False and off.async_multiplex_explicit is False
    for options, explicit in (
        ({"MASTERS": ["m"]}, False),
        ({"MASTERS": ["m"], "ASYNC_MULTIPLEX": True}, True),
    ):
        config, _ = parse_cache_config([("127.0.0.1", 26379)], options)  # Django's, Flask's
        assert config.async_multiplex is True and config.async_multiplex_explicit is explicit
    with pytest.raises(ConfigurationError, match="async_multiplex_explicit"):
        # not an option: what the user asked is read from async_multiplex alone
        PoolConfig.create(["m"], [("127.0.0.1", 26379)], async_multiplex_explicit=True)
    with pytest.raises(
        ConfigurationError, match="async_multiplex: must be True or False .got 'yes'"
    ):
        PoolConfig.create(["m"], [("127.0.0.1", 26379)], async_multiplex="yes")


def test_the_reply_count_is_read_from_the_packed_commands() -> None:
    get, skip = (
        hiredis.pack_command(("GET", "k")),
        hiredis.pack_command(("CLIENT", "REPLY", "SKIP")),
    )
    big = hiredis.pack_command(("SET", "k", b"\r\n*3\r\n" * 1000, "PX", 10))
    assert replies_due([get]) == 1
    assert replies_due([get + big + get]) == 3
    assert replies_due([skip + big + skip + big]) == 0  # CLIENT REPLY SKIP: none for either
    assert replies_due([skip + big + get, big]) == 2
    # the connection's count in C gives the same
    counting = SimpleNamespace(counter=hiredis.Reader())
    for data in ([get], [get + big + get], [skip + big + skip + big], [skip + big + get]):
        assert MuxLink.due(counting, data) == replies_due(data)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ends inside a command"):
        MuxLink.due(counting, [get[:-3]])  # type: ignore[arg-type]
    assert MuxLink.due(counting, [get]) == 1  # and counts right again after


# -- one connection, replies in order -------------------------------------------------------------
@pytest.mark.parametrize("multiplex", [True, False])
def test_many_tasks_share_one_connection_per_shard_and_get_their_own_replies(
    two: LocalSentinelCluster, multiplex: bool
) -> None:
    """64 tasks mixing single-key calls and batches of every size on 2 shards: each gets its
    own replies (FIFO routing by reply count) on one server connection per master (the pool,
    for comparison, holds one per task in flight)."""
    core = make(two, async_multiplex=multiplex)
    held: list[list[int]] = []

    async def scenario(client: AsyncCacheClient) -> None:
        async def task(n: int) -> None:
            keys = [f"mux:{n}:{i}" for i in range(n % 12 + 1)]
            for round_ in range(20):
                values = {key: f"{key}={round_}" for key in keys}
                assert await client.set_many(values, 60) == []
                assert await client.get_many(keys) == values
                assert await client.incr(keys[0] + ":n", 1) if round_ else True
                assert await client.get(keys[-1]) == values[keys[-1]]
                if round_ == 10:
                    held.append(ours(two))  # mid-run, while every task is in flight

        await client.set_many({f"mux:{n}:0:n": 0 for n in range(TASKS)}, 60)
        await asyncio.gather(*(task(n) for n in range(TASKS)))
        counts = [await client.get(f"mux:{n}:0:n") for n in range(TASKS)]
        assert counts == [19] * TASKS

    try:
        run(core, scenario)
    finally:
        core.close()
    most = [max(column) for column in zip(*held, strict=True)]
    if multiplex:
        assert most == [1, 1], most
    else:
        assert min(most) > 1, most


def test_a_cancelled_task_leaves_the_others_in_step(core: ShardedSentinelPool) -> None:
    """Tasks cancelled while their replies are in flight: their replies are read and dropped,
    the other tasks get theirs, and the connection stays open."""

    async def scenario(client: AsyncCacheClient) -> None:
        keys = [key_on(core, 0, f"mux-cancel-{i}") for i in range(8)]
        await client.set_many({key: key for key in keys}, 60)
        link = (await pool_of(client, 0)).link

        async def reader(key: str) -> None:
            for _ in range(200):
                assert await client.get(key) == key

        for _ in range(20):
            doomed = [asyncio.ensure_future(client.get_many(keys)) for _ in range(8)]
            kept = [asyncio.ensure_future(reader(key)) for key in keys]
            await asyncio.sleep(0)  # the doomed calls queued (some written)
            for task in doomed:
                task.cancel()
            await asyncio.gather(*kept)
            for task in doomed:
                with pytest.raises(asyncio.CancelledError):
                    await task
        pool = await pool_of(client, 0)
        assert pool.link is link and link is not None and link.closed is None
        assert not link.calls

    run(core, scenario)


# -- the resend rules -----------------------------------------------------------------------------
@pytest.mark.parametrize("call", ["incr", "add"])
def test_non_idempotent_calls_right_after_client_kill_succeed_once_each(
    two: LocalSentinelCluster, core: ShardedSentinelPool, call: str
) -> None:
    """test_resend_rules's shape on the shared connection: killed while idle, the loop not run
    since, the next call finds the socket readable before it writes (nothing sent)."""
    key = key_on(core, 0, f"mux-resend-{call}")
    assert CacheClient(core, Codec()).set(key, 0, None) is True
    results: list[Any] = []

    async def scenario(client: AsyncCacheClient) -> None:
        for _ in range(20):
            assert await client.get("mux-resend-warm") is None
            if call == "add":
                await client.delete(key)
            assert kill_clients(two) >= 1
            results.append(
                await client.incr(key, 1) if call == "incr" else await client.add(key, 1, None)
            )

    run(core, scenario)
    assert results == (list(range(1, 21)) if call == "incr" else [True] * 20)


def test_a_call_killed_in_the_write_buffer_is_resent_one_written_is_not(
    two: LocalSentinelCluster, core: ShardedSentinelPool
) -> None:
    """CLIENT KILL while calls are pending: the ``incr`` written before the kill (its reply
    lost) is a plain connection error and not sent again; those still in the write buffer are
    marked unsent and resent on a new connection, each run once."""
    written = key_on(core, 0, "mux-written")
    queued = [key_on(core, 0, f"mux-queued-{i}") for i in range(5)]
    CacheClient(core, Codec()).set_many(dict.fromkeys([written, *queued], 0), None)
    admin = redis.Redis(*two.master_address(two.master_names[0]))
    outcomes: list[Any] = []

    async def scenario(client: AsyncCacheClient) -> None:
        await client.get(written)  # connected
        warm = key_on(core, 0, "mux-written-warm")  # the script loaded on that master
        await client.set(warm, 0, None)
        assert await client.incr(warm, 1) == 1
        link = (await pool_of(client, 0)).link
        assert link is not None
        sock = link.transport.get_extra_info("socket")
        first = asyncio.ensure_future(client.incr(written, 1))
        await asyncio.sleep(0)  # written at once (the loop was idle)
        rest = [asyncio.ensure_future(client.incr(key, 1)) for key in queued]
        await asyncio.sleep(0)  # queued behind it, in the buffer until the turn ends
        assert link.unflushed == len(queued), link
        wait_until(lambda: admin.get(written) == b"1", 5, "the master to run the first incr")
        with socket.socket(fileno=os.dup(sock.fileno())) as twin:
            twin.settimeout(5)
            assert twin.recv(64)  # the first reply, never read by the client
            twin.shutdown(socket.SHUT_RDWR)
        outcomes.extend(await asyncio.gather(first, *rest, return_exceptions=True))

    try:
        run(core, scenario)
        values = [admin.get(key) for key in [written, *queued]]
    finally:
        admin.close()
    assert isinstance(outcomes[0], ShardUnavailableError), outcomes[0]
    for outcome in outcomes[1:]:
        if isinstance(outcome, BaseException):
            raise outcome
    assert outcomes[1:] == [1] * len(queued)
    assert values == [b"1"] * (len(queued) + 1)  # each run once


def test_a_call_begun_after_a_kills_reply_is_not_written_on_the_killed_connection(
    two: LocalSentinelCluster, core: ShardedSentinelPool
) -> None:
    """tests/test_kill_storm.py's promise (docs/failover.md) with a call in flight on the shared
    connection, so no checkout looks at its socket: the node closed it before answering the
    kill, the loop has not read that yet, and the write buffer is flushed before the loop's
    reader runs. The flush reads the socket first: the ``incr`` begun after the kill's reply
    is found unsent, runs once on a new connection and returns; the ``get`` in flight is
    resent (idempotent)."""
    busy = key_on(core, 0, "mux-busy")
    after = key_on(core, 0, "mux-after")
    CacheClient(core, Codec()).set_many({busy: 7, after: 0}, None)
    admin = redis.Redis(*two.master_address(two.master_names[0]))

    async def scenario(client: AsyncCacheClient) -> tuple[Any, Any]:
        warm = key_on(core, 0, "mux-after-warm")  # connected, the script loaded on that master
        await client.set(warm, 0, None)
        assert await client.incr(warm, 1) == 1
        link = (await pool_of(client, 0)).link
        assert link is not None
        first = asyncio.ensure_future(client.get(busy))
        await asyncio.sleep(0)  # written at once (the loop was idle); its reply not read
        assert link.calls and link.closed is None, link
        assert kill_clients(two) >= 1  # the loop does not run meanwhile
        later = await asyncio.gather(client.incr(after, 1), return_exceptions=True)
        return later[0], await first

    try:
        incremented, got = run(core, scenario)
        value = admin.get(after)
    finally:
        admin.close()
    if isinstance(incremented, BaseException):
        raise incremented
    assert (incremented, got, value) == (1, 7, b"1")


def test_a_kill_with_many_tasks_in_flight_loses_no_idempotent_call(
    two: LocalSentinelCluster, core: ShardedSentinelPool
) -> None:
    """Kills while 64 tasks read and write: idempotent calls are resent on a new shared
    connection and every one succeeds."""

    async def scenario(client: AsyncCacheClient) -> None:
        stop = asyncio.Event()

        async def task(n: int) -> int:
            key, done = f"mux-kill:{n}", 0
            while not stop.is_set():
                assert await client.set(key, done, 60) is True
                assert await client.get(key) == done
                done += 1
            return done

        tasks = [asyncio.ensure_future(task(n)) for n in range(TASKS)]
        for _ in range(10):
            await asyncio.sleep(0.02)
            await asyncio.to_thread(kill_clients, two)
        stop.set()
        assert all(done > 0 for done in await asyncio.gather(*tasks))

    run(core, scenario)


# -- SOCKET_TIMEOUT, per call ---------------------------------------------------------------------
def test_a_call_past_its_socket_timeout_fails_alone_and_the_calls_behind_it_are_dropped(
    two: LocalSentinelCluster,
) -> None:
    timeout = 0.3
    core = make(two, socket_timeout=timeout)
    key = key_on(core, 0, "mux-timeout")

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, "v", 60)
        pool = await pool_of(client, 0)
        blocked, behind = await pool.get_connection(), await pool.get_connection()
        started = time.monotonic()
        await blocked.send_packed_command([hiredis.pack_command(("BLPOP", "mux-nothing", 10))])
        await behind.send_packed_command([hiredis.pack_command(("GET", key))])
        with pytest.raises(RedisTimeoutError, match="Timeout reading from"):
            await blocked.read_response()
        elapsed = time.monotonic() - started
        with pytest.raises(RedisConnectionError) as dropped:
            await behind.read_response()
        assert not unsent(dropped.value) and not isinstance(dropped.value, RedisTimeoutError)
        assert timeout <= elapsed < 10, elapsed  # its own timeout, not the BLPOP's 10 s
        assert await client.get(key) == "v"  # a new connection
        assert pool.link is not None and pool.link.closed is None

    try:
        run(core, scenario)
    finally:
        core.close()


# -- the shard's rules: stale replies, READONLY, the guard ----------------------------------------
def test_a_reply_after_a_promotion_is_no_acknowledgement(core: ShardedSentinelPool) -> None:
    """A promotion announced while a call's reply is in flight: StaleReplyError, the connection
    closed; the next call opens a new one."""
    shard = core.shards[0]
    key = key_on(core, 0, "mux-stale")

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, 1, 60)
        pool = await pool_of(client, 0)
        call = await pool.get_connection()
        await call.send_packed_command([hiredis.pack_command(("INCR", key))])
        shard.note_promotion()  # what the listener does on +promoted-slave
        with pytest.raises(StaleReplyError, match="promoted a replica"):
            await call.read_response()
        old = pool.link
        assert old is not None and old.closed is not None
        assert await client.get(key) == 2
        assert pool.link is not old

    run(core, scenario)


def test_a_planted_fault_without_the_generation_check_acknowledges_a_stale_reply(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: with the link's view of the shard frozen (the generation check
    skipped), the reply after a promotion is taken as an acknowledgement."""
    shard = core.shards[0]
    key = key_on(core, 0, "mux-planted")

    class Frozen:
        def __init__(self, state: Any) -> None:
            self.state = state

    async def scenario(client: AsyncCacheClient) -> Any:
        await client.set(key, 1, 60)
        pool = await pool_of(client, 0)
        call = await pool.get_connection()
        assert pool.link is not None
        monkeypatch.setattr(pool.link, "shard", Frozen(shard.state))
        await call.send_packed_command([hiredis.pack_command(("INCR", key))])
        shard.note_promotion()
        return await call.read_response()

    assert run(core, scenario) == 2


def test_readonly_closes_the_shared_connection(two: LocalSentinelCluster) -> None:
    """A master turned replica answers writes with READONLY: the shared connection is closed
    (the next call connects anew, to wherever the shard points)."""
    core = make(two, outage_hold=0)
    address = two.master_address(two.master_names[0])
    other = two.master_address(two.master_names[1])
    key = key_on(core, 0, "mux-readonly")
    admin = redis.Redis(*address)

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, 1, 60)
        pool = await pool_of(client, 0)
        first = pool.link
        admin.replicaof(other[0], other[1])
        try:
            with pytest.raises(ShardUnavailableError):
                await client.set(key, 2, 60)
            assert first is not None and first.closed is not None
        finally:
            admin.replicaof("NO", "ONE")
        assert await client.set(key, 3, 60) is True
        assert pool.link is not first

    try:
        run(core, scenario)
    finally:
        admin.close()
        core.close()


@pytest.mark.parametrize(("reply", "protocol_error"), HOSTILE)
def test_a_hostile_reply_fails_the_call_within_a_timeout(
    hostile: Callable[..., ShardedSentinelPool],  # noqa: F811
    reply: bytes,
    protocol_error: bool,
) -> None:
    """test_hostile_replies's replies on the shared connection: a protocol error naming the
    shard (or one timeout), the connection closed, within the same bound."""
    from sentinel_cache.testing.fake_sentinel import Raw

    pool = hostile({("GET",): Raw(reply)}, async_multiplex=True)
    results: list[tuple[Any, float]] = []

    async def scenario(client: AsyncCacheClient) -> None:
        for _ in range(2):
            started = time.monotonic()
            try:
                outcome: Any = await client.get("k")
            except Exception as exc:
                outcome = exc
            results.append((outcome, time.monotonic() - started))
        assert (await pool_of(client, 0)).multiplexed

    run(pool, scenario)
    for error, elapsed in results:
        names_the_shard(error, pool)
        if protocol_error:
            assert isinstance(error.__cause__, ReplyProtocolError), repr(error.__cause__)
        assert elapsed < BOUND, f"{elapsed:.2f} s"


# -- what stays on a connection of its own, post, fork --------------------------------------------
def test_redis_py_methods_take_the_dedicated_pool(core: ShardedSentinelPool) -> None:
    """The cache's own calls open none of the pool's connections; a transaction opens one."""

    async def scenario(client: AsyncCacheClient) -> None:
        keys = [key_on(core, 0, f"mux-own-{i}") for i in range(10)]
        await asyncio.gather(*(client.set(key, 1, 60) for key in keys))
        assert await client.get_many(keys) == dict.fromkeys(keys, 1)
        master = await client.io.master(core.shards[0])
        assert master.connection_pool.dedicated._ledger.slots == 0  # none opened
        async with master.pipeline(transaction=True) as pipe:
            pipe.set("mux-dedicated", "1")
            pipe.incr("mux-dedicated")
            assert await pipe.execute() == [True, 2]
        assert await master.execute_command("GET", "mux-dedicated") == b"2"
        pool = master.connection_pool
        assert isinstance(pool, AsyncMuxPool) and pool.dedicated._ledger.slots == 1
        assert pool.dedicated.max_connections == core.config.max_connections  # the fallback's

    run(core, scenario)


def test_posted_writes_keep_the_connection_in_step(core: ShardedSentinelPool) -> None:
    """``post`` (each command after ``CLIENT REPLY SKIP``) on the shared connection among
    calls waiting for replies: nobody's replies shift."""
    shard = core.shards[0]
    keys = [key_on(core, 0, f"mux-post-{i}") for i in range(20)]

    async def scenario(client: AsyncCacheClient) -> None:
        await client.get(keys[0])
        if shard.allows("CLIENT REPLY") is None:
            await client.learn([shard], "CLIENT REPLY")
        assert shard.allows("CLIENT REPLY") is True

        async def poster(n: int) -> None:
            await client.post({shard: [("SET", keys[n], f"p{n}")]})

        async def reader(n: int) -> None:
            for _ in range(20):
                assert await client.get(keys[n]) in (None, f"v{n}")

        await client.set_many({key: f"v{n}" for n, key in enumerate(keys[10:], 10)}, 60)
        await asyncio.gather(*(poster(n) for n in range(10)), *(reader(n) for n in range(10, 20)))
        link = (await pool_of(client, 0)).link
        assert link is not None and link.closed is None
        master = await client.io.master(shard)
        assert await master.execute_command("GET", keys[3]) == b"p3"

    run(core, scenario)


def test_a_forked_process_opens_its_own_connection(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a fork (PROCESS.pid changed) the next call connects anew and leaves the parent's
    socket alone."""
    from sentinel_cache.core.process import PROCESS

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set("mux-fork", 1, 60)
        pool = await pool_of(client, core.shard_index("mux-fork"))
        parent = pool.link
        monkeypatch.setattr(PROCESS, "pid", PROCESS.pid + 1)
        assert await client.get("mux-fork") == 1
        assert pool.link is not parent and parent is not None and parent.closed is None
        parent.close()

    run(core, scenario)


def test_types_are_what_the_module_says() -> None:
    assert MuxLink.__mro__[1] is asyncio.Protocol
    assert MuxCall.__slots__
    assert async_mux.WRITE_AT_ONCE_WHEN_IDLE in (True, False)


@pytest.mark.parametrize("explicit", [True, False], ids=["asked", "default"])
def test_without_the_lean_path_the_pool_serves_and_says_so(
    two: LocalSentinelCluster, caplog: pytest.LogCaptureFixture, explicit: bool
) -> None:
    """docs/configuration.md: with ``HEALTH_CHECK_INTERVAL`` (or without hiredis) the pool
    serves the calls, with a warning once per shard and event loop if ``ASYNC_MULTIPLEX: True``
    was set; on by default only, the pool serves quietly (a debug line)."""
    from sentinel_cache.core.ops.async_clients import AsyncLeanShardConnection

    if explicit:
        core = make(two, health_check_interval=5)
    else:
        core = ShardedSentinelPool(
            two.master_names,
            two.sentinel_addresses,
            listeners=False,
            client_name=NAME,
            health_check_interval=5,
        )
        core.discover()

    async def scenario(client: AsyncCacheClient) -> None:
        for _ in range(3):
            await client.set("mux-health", 1, 60)
            assert await client.get("mux-health") == 1
        pool = await pool_of(client, core.shard_index("mux-health"))
        assert not pool.multiplexed and pool.link is None
        connection = await pool.get_connection()
        try:
            assert type(connection) is AsyncLeanShardConnection
        finally:
            await pool.release(connection)

    caplog.set_level("DEBUG", logger="sentinel_cache")
    try:
        run(core, scenario)
    finally:
        core.close()
    said = [r for r in caplog.records if "ASYNC_MULTIPLEX needs hiredis" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert said[0].levelname == ("WARNING" if explicit else "DEBUG")


def test_after_a_switch_a_checkout_closes_the_old_masters_connection(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    """A planned failover (the listeners see ``+switch-master``): the next call's checkout finds
    the shard's generation moved, closes the connection to the old master and writes to the new
    one."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=1)
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, async_multiplex=True
    )
    core.discover()
    shard = core.shards[0]

    async def scenario(client: AsyncCacheClient) -> None:
        assert await client.set("mux-switch", 1, 60) is True
        pool = await pool_of(client, 0)
        old = pool.link
        assert old is not None
        generation = shard.generation
        name = cluster.master_names[0]
        before = cluster.master_address(name)
        await asyncio.to_thread(cluster.failover, name)
        # the listener's news (a thread): polled, bounded
        deadline = time.monotonic() + 30
        while shard.generation == generation or shard.fenced:
            assert time.monotonic() < deadline, "the core never saw the switch"
            await asyncio.sleep(0.01)
        call = await pool.get_connection()  # the checkout alone, nothing sent
        assert old.closed is not None and call.link is not old
        await pool.release(call)
        assert await client.set("mux-switch", 2, 60) is True
        link = pool.link
        assert link is not None
        now = (link.connection.host, link.connection.port)
        assert now == tuple(shard.address) and now != tuple(before)
        assert await client.get("mux-switch") == 2

    try:
        run(core, scenario)
    finally:
        core.close()


# -- test_resend_rules's other shapes, on the shared connection -----------------------------------
def cut_after_write(
    monkeypatch: pytest.MonkeyPatch,
    cluster: LocalSentinelCluster,
    key: str,
    ran: Callable[[redis.Redis], bool],
) -> tuple[list[int], redis.Redis]:
    """After the first call about ``key`` is written (a lone call is written at once), wait
    until the master ran it, take its reply off the socket and shut the socket down: the
    connection cut after the write, the command run."""
    cuts: list[int] = []
    admin = redis.Redis(*cluster.master_address(cluster.master_names[0]))
    real = MuxLink.queue

    # Where every call's bytes go (the runner's round trip and a MuxCall's send alike).
    def queue(self: MuxLink, call: MuxCall, data: list[Any]) -> None:
        real(self, call, data)
        if not cuts and any(key.encode() in bytes(part) for part in data):
            assert self.unflushed == 0, "written at once (the loop was idle)"
            wait_until(lambda: ran(admin), 5, "the master to run the write")
            sock = self.transport.get_extra_info("socket")
            with socket.socket(fileno=os.dup(sock.fileno())) as twin:
                twin.settimeout(5)
                assert twin.recv(64)  # the reply, never read by the client
                twin.shutdown(socket.SHUT_RDWR)
            cuts.append(1)

    monkeypatch.setattr(MuxLink, "queue", queue)
    return cuts, admin


def test_a_non_idempotent_call_cut_after_the_write_is_never_sent_twice(
    two: LocalSentinelCluster, core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, warm = key_on(core, 0, "mux-cut"), key_on(core, 0, "mux-cut-warm")
    client = CacheClient(core, Codec())
    assert client.set_many({key: 0, warm: 0}, None) == []

    async def incr(aclient: AsyncCacheClient) -> Any:
        assert await aclient.incr(warm, 1) == 1  # the script loaded on that master
        cuts, admin = cut_after_write(monkeypatch, two, key, lambda a: a.get(key) == b"1")
        try:
            return await aclient.incr(key, 1)
        finally:
            admin.close()
            assert cuts == [1]

    try:
        with pytest.raises(ShardUnavailableError, match="shard 0"):
            run(core, incr)
    finally:
        monkeypatch.undo()
    assert client.get(key) == 1  # run once, not resent


def test_an_smove_on_one_shard_cut_after_the_write_is_never_sent_twice(
    two: LocalSentinelCluster, core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = key_on(core, 0, "mux-smove")
    destination = f"{source}-to"
    client = CacheClient(core, Codec())
    client.delete_many([source, destination])
    assert client.sadd(source, "m") == 1
    cuts, admin = cut_after_write(monkeypatch, two, source, lambda a: a.exists(destination) == 1)
    try:
        with pytest.raises(ShardUnavailableError, match="shard 0"):
            run(core, lambda aclient: aclient.smove(source, destination, "m"))
    finally:
        monkeypatch.undo()
        admin.close()
    assert cuts == [1]
    assert (client.smembers(source), client.smembers(destination)) == (set(), {"m"})


def test_a_refused_connect_in_an_outage_is_held_like_any_unsent_command(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    """A SIGKILLed master: the shared connection is closed, the new connect refused, so the
    ``incr`` was never sent and ``OUTAGE_HOLD`` holds it until the switch; it lands on the new
    master once."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=3, down_after_ms=1000)
    pool = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        outage_hold=20.0,
        outage_reads=False,
        async_multiplex=True,
    )
    try:
        pool.discover()
        key = key_on(pool, 0, "mux-refused")

        def kill() -> None:
            admin = cluster.node_client(pool.shards[0].address)
            try:
                assert admin.execute_command("WAIT", 1, 5000) == 1  # the replica has the 1
            finally:
                admin.close()
            cluster.kill_master(cluster.master_names[0])

        async def scenario(aclient: AsyncCacheClient) -> int:
            assert await aclient.add(key, 0, None)
            assert await aclient.incr(key, 1) == 1
            kill()
            return int(await aclient.incr(key, 1))

        assert run(pool, scenario) == 2
        assert CacheClient(pool, Codec()).get(key) == 2
    finally:
        pool.close()


def test_a_call_on_a_closing_transport_is_refused_as_never_sent(core: ShardedSentinelPool) -> None:
    async def scenario(client: AsyncCacheClient) -> None:
        pool = await pool_of(client, 0)
        call = await pool.get_connection()
        call.link.transport.close()
        with pytest.raises(RedisConnectionError) as refused:
            await call.send_packed_command([hiredis.pack_command(("INCR", "mux-closing"))])
        assert unsent(refused.value)
        assert await client.set("mux-closing-after", 1, 60) is True  # a new connection serves

    run(core, scenario)


def test_a_resp3_push_goes_to_redis_py_and_the_replies_stay_in_step(
    two: LocalSentinelCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CLIENT TRACKING on the shared RESP3 connection, an invalidation push arrives among
    the replies: it is handed to redis-py's push handler, and no call's replies shift."""
    core = make(two, protocol=3)
    shard = core.shards[0]
    key = key_on(core, 0, "mux-push")
    pushes: list[Any] = []

    async def scenario(client: AsyncCacheClient) -> list[Any]:
        await client.get(key)  # connected
        link = (await pool_of(client, 0)).link
        assert link is not None and link.push is not None
        handler = link.connection._parser.handle_push_response

        async def record(response: Any, **kwargs: Any) -> Any:
            pushes.append(response)
            return await handler(response, **kwargs)

        monkeypatch.setattr(link.connection._parser, "handle_push_response", record)
        pool = await pool_of(client, 0)

        async def call(*command: Any) -> Any:
            handle = await pool.get_connection()
            await handle.send_packed_command([hiredis.pack_command(command)])
            return await handle.read_response()

        replies = [await call("CLIENT", "TRACKING", "ON"), await call("SET", key, "1")]
        replies.append(await call("GET", key))
        with redis.Redis(*shard.address) as other:  # type: ignore[misc]
            other.set(key, "2")  # the server pushes an invalidation of the key to us
        deadline = time.monotonic() + 5
        while not pushes:  # bounded: the push arrives when the loop reads the socket
            assert time.monotonic() < deadline, "no push arrived"
            await asyncio.sleep(0.005)
        replies += [await call("PING"), await call("GET", key)]
        assert link.closed is None
        return replies

    try:
        replies = run(core, scenario)
    finally:
        core.close()
    assert replies == [b"OK", b"OK", b"1", b"PONG", b"2"], replies
    assert pushes and pushes[0][0] in (b"invalidate", "invalidate"), pushes


# -- the runner's round trip on the shared connection (MuxLink.start, then finish) -----------------
def test_the_cache_calls_take_the_round_trip_once_connected(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the shared connection is open, a call is one round trip on it (``start``, then
    ``finish``): no handle checked out (the figures in docs/benchmarks.md are this path's); the
    first call connects through the checkout, as before."""
    key = key_on(core, 0, "mux-fast")
    checkouts: list[int] = []
    trips: list[int] = []
    real_checkout, real_start = AsyncMuxPool.get_connection, MuxLink.start

    async def get_connection(self: AsyncMuxPool, *args: Any, **kwargs: Any) -> Any:
        checkouts.append(1)
        return await real_checkout(self, *args, **kwargs)

    def start(self: MuxLink, commands: Any, promotions: int | None = None) -> MuxCall:
        trips.append(len(commands))
        return real_start(self, commands, promotions)

    monkeypatch.setattr(AsyncMuxPool, "get_connection", get_connection)
    monkeypatch.setattr(MuxLink, "start", start)

    async def scenario(client: AsyncCacheClient) -> None:
        assert await client.set(key, 1, 60) is True
        assert checkouts == [1] and trips == []  # connected through the checkout
        for call, expected in (
            (client.get(key), 1),
            (client.incr(key, 1), 2),
            (client.delete(key), True),
        ):
            before = len(trips)
            assert await call == expected
            assert len(trips) > before
        assert checkouts == [1]

    run(core, scenario)


def promote_when_queued(
    monkeypatch: pytest.MonkeyPatch, core: ShardedSentinelPool, key: str
) -> list[int]:
    """A promotion announced right after the first call about ``key`` is queued (its reply not
    read yet); returns the reply counts of the calls about ``key`` queued."""
    queued: list[int] = []
    real = MuxLink.queue

    def queue(self: MuxLink, call: MuxCall, data: list[Any]) -> None:
        real(self, call, data)
        if any(key.encode() in bytes(part) for part in data):
            queued.append(call.due)
            if len(queued) == 1:
                core.shards[0].note_promotion()  # what the listener does on +promoted-slave

    monkeypatch.setattr(MuxLink, "queue", queue)
    return queued


def test_the_round_trip_takes_no_reply_after_a_promotion_as_an_acknowledgement(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A promotion between queueing a call and reading its reply: a non-idempotent ``incr``
    raises StaleReplyError (run once on the server, never resent), the connection closed."""
    key = key_on(core, 0, "mux-fast-stale")

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, 1, 60)
        old = (await pool_of(client, 0)).link
        queued = promote_when_queued(monkeypatch, core, key)
        with pytest.raises(StaleReplyError, match="promoted a replica"):
            await client.incr(key, 1)
        assert queued == [1]  # one reply due (the number of commands), sent once
        assert old is not None and old.closed is not None
        monkeypatch.undo()
        assert await client.get(key) == 2  # it ran once; a new connection serves

    run(core, scenario)


def test_the_round_trip_resends_an_idempotent_read_after_a_promotion(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same switch under a ``get``: its reply is refused and the read sent again, on a new
    connection, and answered."""
    key = key_on(core, 0, "mux-fast-reread")

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, "v", 60)
        old = (await pool_of(client, 0)).link
        queued = promote_when_queued(monkeypatch, core, key)
        assert await client.get(key) == "v"
        assert queued == [1, 1]  # refused, then sent again
        new = (await pool_of(client, 0)).link
        assert old is not None and old.closed is not None and new is not old

    run(core, scenario)


def test_a_planted_fault_in_the_round_trip_acknowledges_a_stale_reply(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: with the link's view of the shard frozen, the ``incr`` after a
    promotion is taken as acknowledged."""
    key = key_on(core, 0, "mux-fast-planted")

    async def scenario(client: AsyncCacheClient) -> Any:
        await client.set(key, 1, 60)
        link = (await pool_of(client, 0)).link
        assert link is not None
        monkeypatch.setattr(link, "shard", SimpleNamespace(state=core.shards[0].state))
        promote_when_queued(monkeypatch, core, key)
        return await client.incr(key, 1)

    assert run(core, scenario) == 2


def test_the_round_trip_raises_an_error_reply_after_the_rest_and_stays_in_step(
    core: ShardedSentinelPool,
) -> None:
    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key_on(core, 0, "mux-fast-warm"), 1, 60)
        link = (await pool_of(client, 0)).ready()
        assert link is not None
        key = key_on(core, 0, "mux-fast-error")
        with pytest.raises(redis.ResponseError, match="not an integer"):
            await link.roundtrip([("SET", key, "x"), ("INCR", key), ("GET", key)])
        assert link.closed is None and not link.calls
        assert await link.roundtrip([("GET", key)]) == [b"x"]  # its own reply, in step

    run(core, scenario)


def test_the_round_trip_on_a_closing_transport_is_refused_as_never_sent(
    core: ShardedSentinelPool,
) -> None:
    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key_on(core, 0, "mux-fast-warm"), 1, 60)
        link = (await pool_of(client, 0)).ready()
        assert link is not None
        link.transport.close()
        with pytest.raises(RedisConnectionError) as refused:
            await link.roundtrip([("INCR", "mux-fast-closing")])
        assert unsent(refused.value)
        assert await client.set("mux-fast-closing-after", 1, 60) is True  # a new connection

    run(core, scenario)


def test_a_round_trip_past_its_socket_timeout_fails_alone_and_the_ones_behind_are_dropped(
    two: LocalSentinelCluster,
) -> None:
    timeout = 0.3
    core = make(two, socket_timeout=timeout)
    key = key_on(core, 0, "mux-fast-timeout")

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, "v", 60)
        link = (await pool_of(client, 0)).ready()
        assert link is not None
        started = time.monotonic()
        blocked, behind = await asyncio.gather(
            link.roundtrip([("BLPOP", "mux-fast-nothing", 10)]),
            link.roundtrip([("GET", key)]),
            return_exceptions=True,
        )
        elapsed = time.monotonic() - started
        assert isinstance(blocked, RedisTimeoutError), blocked
        assert isinstance(behind, RedisConnectionError), behind
        assert not unsent(behind) and not isinstance(behind, RedisTimeoutError)
        assert timeout <= elapsed < 10, elapsed  # its own timeout, not the BLPOP's 10 s
        assert await client.get(key) == "v"  # a new connection
        # A call whose first reply came and whose second did not fails whole.
        link = (await pool_of(client, 0)).ready()
        assert link is not None
        with pytest.raises(RedisTimeoutError):
            await link.roundtrip([("GET", key), ("BLPOP", "mux-fast-nothing", 10)])

    try:
        run(core, scenario)
    finally:
        core.close()


def test_a_loading_reply_in_the_round_trip_closes_the_shared_connection(
    hostile: Callable[..., ShardedSentinelPool],  # noqa: F811
) -> None:
    """``-LOADING`` (redis-py's BusyLoadingError, a connection error handed as a reply) is no
    value: the call fails as a connection failure naming the shard, the connection closed."""
    from sentinel_cache.testing.fake_sentinel import Raw

    pool = hostile(
        {("GET",): Raw(b"-LOADING the dataset is being loaded\r\n")}, async_multiplex=True
    )

    async def scenario(client: AsyncCacheClient) -> None:
        mux = await pool_of(client, 0)
        await mux.get_connection()  # connected: the get below is a round trip
        link = mux.ready()
        assert link is not None
        with pytest.raises(ShardUnavailableError) as failed:
            await client.get("k")
        names_the_shard(failed.value, pool)
        assert isinstance(failed.value.__cause__, redis.exceptions.BusyLoadingError)
        assert link.closed is not None

    run(pool, scenario)


# -- the runner's direct round trip: execute sends on the open shared connection without run ---
def spy_run(monkeypatch: pytest.MonkeyPatch, client: AsyncCacheClient) -> list[bool]:
    """Record each call of the client's ``run`` (the safety net's entry): its ``failed``."""
    runs: list[bool] = []
    real = client.run

    async def run(*args: Any, **kwargs: Any) -> Any:
        runs.append(kwargs.get("failed") is not None)
        return await real(*args, **kwargs)

    monkeypatch.setattr(client, "run", run)
    return runs


def test_a_call_on_the_open_shared_connection_skips_the_safety_nets_coroutines(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once connected, a single-key call is ``execute`` and the link's ``roundtrip``: ``run``
    (and the loop's client lookup) only when that round trip fails, or where ``run`` would not
    send to the shared connection at once (the tests below)."""
    key = key_on(core, 0, "mux-direct")

    async def scenario(client: AsyncCacheClient) -> None:
        runs = spy_run(monkeypatch, client)
        assert await client.set(key, 1, 60) is True
        assert runs == [False]  # the first call connects, through run and the checkout
        assert await client.get(key) == 1
        assert await client.incr(key, 1) == 2
        assert await client.delete(key) is True
        assert runs == [False]

    run(core, scenario)


def test_a_failed_direct_round_trip_takes_the_safety_net_from_where_it_failed(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A promotion while a direct ``get`` is queued: its reply is refused and ``run`` is
    entered with that failure (not from the start: the read is not sent a third time), which
    sends the read again on a new connection."""
    key = key_on(core, 0, "mux-direct-failed")

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, "v", 60)
        runs = spy_run(monkeypatch, client)
        queued = promote_when_queued(monkeypatch, core, key)
        assert await client.get(key) == "v"
        assert runs == [True] and queued == [1, 1]

    run(core, scenario)


def test_a_write_behind_a_raised_fence_waits_for_it(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write fence holds a write even on an open shared connection (the direct round trip
    is not taken); a read is not fenced and takes it."""
    key = key_on(core, 0, "mux-direct-fence")
    shard = core.shards[0]
    waited: list[str] = []

    async def wait_fence(fenced: Any, hold: float) -> None:  # the fence lowered at once
        waited.append(fenced.label)
        fenced.lower_fence()

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, 1, 60)
        runs = spy_run(monkeypatch, client)
        monkeypatch.setattr(runner_module, "wait_fence", wait_fence)
        shard.raise_fence("a test")
        try:
            assert await client.get(key) == 1
            assert runs == [] and waited == []
            assert await client.set(key, 2, 60) is True
            assert runs == [False] and waited == [shard.label]
        finally:
            shard.lower_fence()

    run(core, scenario)


def test_a_read_with_replicas_in_rotation_is_not_taken_to_the_master_directly(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``READ_FROM_REPLICAS``: a read asks the rotation for a replica (here none serves, so the
    master answers), a write goes to the master directly."""
    key = key_on(core, 0, "mux-direct-replicas")
    asked: list[int] = []

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, 1, 60)
        real = client.io.reader

        async def reader(shard: Any) -> Any:
            asked.append(shard.index)
            return await real(shard)

        monkeypatch.setattr(client.io, "reader", reader)
        monkeypatch.setattr(client, "replica_reads", True)
        assert await client.get(key) == 1
        assert asked == [0]
        assert await client.set(key, 2, 60) is True
        assert asked == [0]

    run(core, scenario)


def test_a_call_in_a_known_outage_is_not_sent_to_the_master_directly(
    two: LocalSentinelCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard whose master is known unreachable (``OUTAGE_HOLD``): a write is held before it
    is sent, so the master's timeout is paid once, not per call; not sent directly."""
    core = make(two, outage_hold=5.0)
    key = key_on(core, 0, "mux-direct-outage")
    shard = core.shards[0]
    held: list[int] = []

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, 1, 60)

        async def hold(held_shard: Any, generation: int, error: Any) -> None:
            held.append(held_shard.index)
            held_shard.reachable_again()

        monkeypatch.setattr(client, "hold", hold)
        shard.note_unreachable(shard.generation)
        assert await client.set(key, 2, 60) is True
        assert held == [0]

    try:
        run(core, scenario)
    finally:
        core.close()
