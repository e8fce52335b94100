"""``ASYNC_MULTIPLEX``'s direct round trip from the operation's own coroutine (issue 37): once
the shared connection is open, ``get`` and ``set`` (and ``keyed`` for the other single-key
operations) queue their command on it and await its reply themselves, without ``keyed``,
``execute``, ``run`` or ``MuxLink.roundtrip`` (``AsyncRunner.started``). Each rule that path
must not skip has a test here that fails when the path skips it: metrics, ``DURABLE_REPLICAS``'
``WAIT``, ``IGNORE_EXCEPTIONS`` after a failed round trip, the write fence, and the batching
of the calls woken together. Real servers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from durable_support import shortfalls
from redis.exceptions import ConnectionError as RedisConnectionError
from samples import sample
from waiting import key_on

from sentinel_cache.core.ops._async import runner as runner_module
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.async_mux import AsyncMuxPool, MuxCall, MuxLink
from sentinel_cache.core.ops.plans import FailOpen
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.lean_rules import CLOSED
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture
def core(make_core: Callable[..., ShardedSentinelPool]) -> ShardedSentinelPool:
    return make_core(async_multiplex=True, discover=True)


def run(
    client: AsyncCacheClient, scenario: Callable[[AsyncCacheClient], Coroutine[Any, Any, Any]]
) -> Any:
    async def main() -> Any:
        try:
            return await scenario(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


async def link_of(client: AsyncCacheClient, index: int) -> MuxLink:
    pool = (await client.io.master(client.core.shards[index])).connection_pool
    assert isinstance(pool, AsyncMuxPool) and pool.link is not None
    return pool.link


def spy(monkeypatch: pytest.MonkeyPatch, client: AsyncCacheClient, *names: str) -> list[str]:
    """The runner's coroutines ``names`` entered from now on, in order."""
    entered: list[str] = []
    for name in names:
        real = getattr(client, name)

        def wrapped(*args: Any, real: Any = real, name: str = name, **kwargs: Any) -> Any:
            entered.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(client, name, wrapped)
    return entered


def test_get_and_set_go_straight_to_the_shared_connection_once_connected(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = key_on(core, 0, "direct-op")

    async def scenario(client: AsyncCacheClient) -> None:
        assert await client.set(key, 1, 60) is True  # connects (keyed, run, the checkout)
        entered = spy(monkeypatch, client, "keyed", "execute", "run")
        starts: list[int] = []
        real_start = MuxLink.start

        def start(self: MuxLink, commands: Any, promotions: int | None = None) -> MuxCall:
            starts.append(len(commands))
            return real_start(self, commands, promotions)

        monkeypatch.setattr(MuxLink, "start", start)
        assert await client.get(key) == 1
        assert await client.set(key, 2, 60) is True
        assert await client.get(key) == 2
        assert entered == [] and starts == [1, 1, 1]
        assert await client.incr(key, 1) == 3  # keyed's own direct round trip
        assert set(entered) == {"keyed"} and len(starts) == 3 + len(entered)

    run(AsyncCacheClient(core, Codec()), scenario)


@pytest.mark.parametrize("option", ["near_cache", "tracing", "previous_masters"])
def test_a_core_option_with_work_around_every_call_keeps_get_off_the_direct_path(
    make_core: Callable[..., ShardedSentinelPool],
    cluster: LocalSentinelCluster,
    monkeypatch: pytest.MonkeyPatch,
    option: str,
) -> None:
    """The near cache (its copy and ticket), tracing (a span per call) and a resharding (the
    previous owner asked too) each do work around every call: a ``get`` goes through ``keyed``
    with each of them on (the runner reads them once, when it is built)."""
    value: Any = [cluster.master_names[0]] if option == "previous_masters" else True
    core = make_core(async_multiplex=True, discover=True, listeners=False, **{option: value})
    key = key_on(core, 0, f"direct-{option}")

    async def scenario(client: AsyncCacheClient) -> None:
        assert await client.set(key, 1, 60) is True  # connected
        assert (await link_of(client, 0)).closed is None
        assert client.started(key, [("GET", key)], False) is None
        assert client.started(key, [("SET", key, b"x")], True) is None
        entered = spy(monkeypatch, client, "keyed")
        assert await client.get(key) == 1
        assert entered == ["keyed"]

    run(AsyncCacheClient(core, Codec()), scenario)


def test_metrics_count_every_get_and_set(
    make_core: Callable[..., ShardedSentinelPool],
) -> None:
    """With ``METRICS`` the calls go through ``execute``'s timing: counted, hit and miss."""
    core = make_core(async_multiplex=True, metrics=True, discover=True)
    name = core.shards[0].name
    hit, missing = key_on(core, 0, "direct-metrics-hit"), key_on(core, 0, "direct-metrics-miss")
    series = "sentinel_cache_command_duration_seconds_count"

    def counts() -> list[float]:
        return [
            sample(series, shard=name, command="set", outcome="ok"),
            sample(series, shard=name, command="get", outcome="hit"),
            sample(series, shard=name, command="get", outcome="miss"),
        ]

    async def scenario(client: AsyncCacheClient) -> list[float]:
        await client.delete(missing)
        await client.set(hit, 0, 60)  # connected
        before = counts()
        for _ in range(3):
            assert await client.set(hit, "v", 60) is True
            assert await client.get(hit) == "v"
            assert await client.get(missing) is None
        return [b - a for a, b in zip(before, counts(), strict=True)]

    assert run(AsyncCacheClient(core, Codec()), scenario) == [3, 3, 3]


def test_durable_replicas_wait_after_every_set(
    make_cluster: Callable[..., LocalSentinelCluster], caplog: pytest.LogCaptureFixture
) -> None:
    """``DURABLE_REPLICAS``: a set is followed by its ``WAIT`` on the shared connection too
    (no replica here, so it falls short, and says so)."""
    cluster = make_cluster(shards=1, replicas=0, sentinels=1)
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, listeners=False, async_multiplex=True
    )
    core.discover()
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    client = AsyncCacheClient(core, Codec(), durable_replicas=1, durable_timeout_ms=10)

    async def scenario(client: AsyncCacheClient) -> None:
        await client.get("direct-durable-warm")  # connected (a read waits for nothing)
        assert shortfalls(caplog, 10) == []
        assert await client.set("direct-durable", "v", 60) is True
        assert shortfalls(caplog, 10) == [
            "write to 'direct-durable' acknowledged by 0 of 1 replicas within 10 ms"
        ]

    try:
        run(client, scenario)
    finally:
        core.close()


def test_a_failed_direct_call_is_failed_open_with_ignore_exceptions(
    make_cluster: Callable[..., LocalSentinelCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``IGNORE_EXCEPTIONS``: a direct round trip that fails, and whose safety net fails too
    (every reply refused here, as on a connection closed by the node; no replica to answer the
    read), answers as if absent."""
    cluster = make_cluster(shards=1, replicas=0, sentinels=1)
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, listeners=False, async_multiplex=True
    )
    core.discover()
    key = "direct-fail-open"
    client = AsyncCacheClient(core, Codec(), fail_open=FailOpen(ignore=True))

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError(CLOSED)

    async def refused_later(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError(CLOSED)

    async def silent(*args: Any, **kwargs: Any) -> bool:
        return False

    async def scenario(client: AsyncCacheClient) -> tuple[Any, Any]:
        await client.set(key, "v", 60)
        entered = spy(monkeypatch, client, "resumed")
        monkeypatch.setattr(MuxLink, "finish", refused)  # the direct round trip
        monkeypatch.setattr(MuxCall, "read_response", refused_later)  # the safety net's
        # Nor does the node answer the safety net's PING on a new connection (else a closed
        # connection is no outage, and the set below finds the link closed by that check).
        monkeypatch.setattr(client, "answers", silent)
        got = await client.get(key, "default")
        stored = await client.set(key, "w", 60)
        return got, (stored, entered)

    try:
        got, (stored, entered) = run(client, scenario)
    finally:
        core.close()
    assert got == "default" and stored is False
    assert entered == ["resumed", "resumed"]


def test_a_set_behind_a_raised_fence_waits_for_it_a_get_does_not(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = key_on(core, 0, "direct-fence")
    shard = core.shards[0]
    waited: list[str] = []

    async def wait_fence(fenced: Any, hold: float) -> None:  # the fence lowered at once
        waited.append(fenced.label)
        fenced.lower_fence()

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, 1, 60)
        monkeypatch.setattr(runner_module, "wait_fence", wait_fence)
        shard.raise_fence("a test")
        try:
            assert await client.get(key) == 1
            assert waited == []
            assert await client.set(key, 2, 60) is True
            assert waited == [shard.label]
        finally:
            shard.lower_fence()

    run(AsyncCacheClient(core, Codec()), scenario)


def test_calls_woken_together_are_written_together(core: ShardedSentinelPool) -> None:
    """A call queued on an idle connection is written at once, except while several calls
    whose replies came since the last write may still queue theirs: written alone, the first
    of them would split every batch in two (issue 37's figures)."""
    key = key_on(core, 0, "direct-woken")

    async def scenario(client: AsyncCacheClient) -> None:
        await client.set(key, "v", 60)
        link = await link_of(client, 0)
        assert link.woken == 1 and not link.calls and not link.out  # the set's own reply
        loop = asyncio.get_running_loop()
        # Two calls whose replies come in one chunk (fed here, as the socket would):
        calls = [MuxCall(link, 1, loop.create_future()) for _ in range(2)]
        link.calls.extend(calls)
        link.data_received(b"$1\r\na\r\n$1\r\nb\r\n")
        assert [call.replies for call in calls] == [[b"a"], [b"b"]]
        assert link.woken == 3 and not link.calls and not link.out
        call = link.start([("GET", key)])
        assert link.out, "queued for the end of the loop turn, not written alone"
        assert link.finish(await call.waiter) == [client.codec.dumps("v")]
        assert link.woken == 1  # the batch written; this one alone woken since
        call = link.start([("GET", key)])
        assert not link.out, "a lone task's next call on an idle connection: written at once"
        await call.waiter

    run(AsyncCacheClient(core, Codec()), scenario)
