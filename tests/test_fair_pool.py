"""The fair pools against a real server: FIFO hand-off, no exhaustion under contention, timeouts,
slots after connect failures, forks and cancelled tasks (issue 11, item 5)."""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry
from threads import Workers

from sentinel_cache.core.topology.fair_pool import (
    EXHAUSTED,
    AsyncFairBlockingConnectionPool,
    FairBlockingConnectionPool,
)
from sentinel_cache.testing import LocalSentinelCluster

KEY = "fair-pool:key"


@pytest.fixture
def node(cluster: LocalSentinelCluster) -> dict[str, Any]:
    """Connection kwargs for the first shard's master."""
    host, port = cluster.master_address(cluster.master_names[0])
    with cluster.node_client((host, port)) as client:
        client.set(KEY, b"v")
    return {"host": host, "port": port, "password": cluster.requirepass}


@pytest.fixture
def make_pool(node: dict[str, Any]) -> Iterator[Callable[..., FairBlockingConnectionPool]]:
    made: list[FairBlockingConnectionPool] = []

    def factory(**kwargs: Any) -> FairBlockingConnectionPool:
        pool = FairBlockingConnectionPool(**{**node, **kwargs})
        made.append(pool)
        return pool

    yield factory
    for pool in made:
        pool.disconnect()


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


NO_RETRY: dict[str, Any] = {"retry": Retry(NoBackoff(), 0), "socket_connect_timeout": 1}


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n[fair pool] {line}")


# -- threads ----------------------------------------------------------------------------------
def test_waiters_are_served_in_arrival_order(make_pool: Callable[..., Any]) -> None:
    pool = make_pool(max_connections=1, timeout=10)
    held = pool.get_connection()
    order: list[object] = []

    def borrower(index: int) -> None:
        connection = pool.get_connection()
        order.append(index)
        pool.release(connection)

    workers = Workers(timeout=20)
    for index in range(5):
        workers.spawn(borrower, index, name=f"borrower-{index}")
        wait_until(lambda n=index + 1: pool.waiting() == n)  # type: ignore[misc]
    pool.release(held)
    again = pool.get_connection()  # the releaser asks again at once: it queues behind all five
    order.append("releaser")
    workers.join()
    assert order == [0, 1, 2, 3, 4, "releaser"]
    assert again is held  # one connection, handed along the line
    pool.release(again)
    assert (pool.in_use(), pool.idle(), pool.waiting()) == (0, 1, 0)


def test_sixteen_threads_two_connections_no_exhaustion(
    make_pool: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    pool = make_pool(max_connections=2, timeout=2)
    client = redis.Redis(connection_pool=pool)
    calls = [0] * 16
    errors: list[BaseException] = []
    start = threading.Barrier(16)
    deadline = [0.0]

    def worker(index: int) -> None:
        start.wait()
        while time.monotonic() < deadline[0]:
            try:
                client.get(KEY)
            except Exception as exc:
                errors.append(exc)
                return
            calls[index] += 1

    deadline[0] = time.monotonic() + 2.0
    with Workers(timeout=30) as workers:
        for i in range(16):
            workers.spawn(worker, i, name=f"worker-{i}")
    mean = statistics.mean(calls)
    report(
        capsys,
        f"16 threads / 2 connections / 2 s: {sum(calls)} GETs, per thread min {min(calls)} "
        f"mean {mean:.0f} max {max(calls)}, errors {len(errors)}",
    )
    assert errors == []
    assert min(calls) >= 0.5 * mean
    assert pool.in_use() == 0 and pool.waiting() == 0 and pool.connection_count() <= 2


def test_exhaustion_only_after_a_full_timeout(make_pool: Callable[..., Any]) -> None:
    pool = make_pool(max_connections=1, timeout=0.3)
    held = pool.get_connection()
    started = time.monotonic()
    with pytest.raises(RedisConnectionError) as caught:
        pool.get_connection()
    assert str(caught.value) == EXHAUSTED  # unlabelled: redis-py's own error (a labelled pool names its shard)
    assert time.monotonic() - started >= 0.29
    assert pool.waiting() == 0

    # A connection released within the timeout is handed over, not an error.
    def give_back() -> None:
        time.sleep(0.1)
        pool.release(held)

    with Workers(timeout=10) as workers:
        workers.spawn(give_back, name="give-back")
        assert pool.get_connection() is held
    pool.release(held)
    assert (pool.in_use(), pool.idle()) == (0, 1)


def test_connect_failure_frees_its_slot() -> None:
    pool = FairBlockingConnectionPool(
        host="127.0.0.1", port=closed_port(), max_connections=2, timeout=5, **NO_RETRY
    )
    for _ in range(5):
        with pytest.raises(RedisConnectionError) as caught:
            pool.get_connection()
        assert str(caught.value) != EXHAUSTED
    assert (pool.in_use(), pool.idle(), pool.connection_count()) == (0, 0, 0)

    # Many at once: waiters get the failed connections' slots, nobody waits out the timeout.
    messages: list[str] = []

    def borrow() -> None:
        try:
            pool.get_connection()
        except RedisConnectionError as exc:
            messages.append(str(exc))

    started = time.monotonic()
    with Workers(timeout=30) as workers:
        for n in range(8):
            workers.spawn(borrow, name=f"borrow-{n}")
    assert len(messages) == 8 and EXHAUSTED not in messages
    assert time.monotonic() - started < 4
    assert (pool.in_use(), pool.idle(), pool.waiting()) == (0, 0, 0)


class TaggedConnection(redis.connection.Connection):
    """Like the core's shard connections: an extra constructor argument."""

    def __init__(self, *, tag: str, **kwargs: Any) -> None:
        self.tag = tag
        super().__init__(**kwargs)


def test_drop_in_for_clients_pipelines_and_extra_kwargs(make_pool: Callable[..., Any]) -> None:
    pool = make_pool(max_connections=2, timeout=1, connection_class=TaggedConnection, tag="s0")
    client = redis.Redis(connection_pool=pool)
    pipe = client.pipeline()
    pipe.set("fair-pool:p", 1)
    pipe.get("fair-pool:p")
    assert pipe.execute() == [True, b"1"]
    assert client.get(KEY) == b"v"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        connection = pool.get_connection("GET", KEY)  # redis-py < 5.3 passes the command
    assert isinstance(connection, TaggedConnection) and connection.tag == "s0"
    assert "in_use=1" in repr(pool) and "max=2" in repr(pool)
    pool.release(connection)
    pool.release(connection)  # twice: ignored
    assert (pool.in_use(), pool.idle()) == (0, 1)


def test_retire_idle_closes_now_and_reconnects_lazily(make_pool: Callable[..., Any]) -> None:
    pool = make_pool(max_connections=2, timeout=1)
    client = redis.Redis(connection_pool=pool)
    assert client.get(KEY) == b"v"
    connection = pool.get_connection()  # the idle one
    pool.release(connection)
    assert connected(connection) and pool.idle() == 1
    assert pool.retire_idle() == 1
    assert not connected(connection) and (pool.idle(), pool.in_use()) == (1, 0)
    assert client.get(KEY) == b"v"
    assert connected(connection)


def connected(connection: Any) -> bool:
    """redis-py's ``is_connected``; sync connections have it only from redis-py 5.1 on."""
    return getattr(connection, "is_connected", connection._sock is not None)


def test_forked_child_gets_a_fresh_pool(make_pool: Callable[..., Any]) -> None:
    pool = make_pool(max_connections=2, timeout=1)
    client = redis.Redis(connection_pool=pool)
    assert client.get(KEY) == b"v"
    parent_connection = pool._available_connections[0]
    # A parent thread holds the pool's lock across the fork: the child must not inherit it.
    locked, done = threading.Event(), threading.Event()

    def hold() -> None:
        with pool._lock:
            locked.set()
            done.wait()

    workers = Workers(timeout=10)
    workers.spawn(hold, name="holder")
    assert locked.wait(10), "the holder took the pool's lock"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            ok = (
                client.get(KEY) == b"v"
                and pool.pid == os.getpid()
                and parent_connection not in pool._connections
                and (pool.in_use(), pool.idle()) == (0, 1)
            )
            code = 0 if ok else 2
        finally:
            os._exit(code)
    done.set()
    workers.join()
    deadline = time.monotonic() + 15
    while True:
        done_pid, status = os.waitpid(pid, os.WNOHANG)
        if done_pid:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the child hung on the pool")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.get(KEY) == b"v"  # the parent's connection was left alone
    assert pool._available_connections == [parent_connection]


def test_a_single_thread_reuses_one_connection(make_pool: Callable[..., Any]) -> None:
    """Back-to-back calls from one thread go over the same connection (the reason it runs at
    redis-py's speed; the speed itself is measured by ``benchmarks/ratios.py``)."""
    pool = make_pool(max_connections=4, timeout=2)
    client = redis.Redis(connection_pool=pool)
    first = client.client_id()  # the server's id of the TCP connection that carried the call
    assert all(client.get(KEY) == b"v" for _ in range(2000))
    assert client.client_id() == first
    assert (pool.connection_count(), pool.idle(), pool.in_use()) == (1, 1, 0)


# -- asyncio ----------------------------------------------------------------------------------
def make_async(node: dict[str, Any], **kwargs: Any) -> AsyncFairBlockingConnectionPool:
    return AsyncFairBlockingConnectionPool(**{**node, **kwargs})


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0)


def test_async_waiters_are_served_in_arrival_order(node: dict[str, Any]) -> None:
    async def scenario() -> None:
        pool = make_async(node, max_connections=1, timeout=10)
        held = await pool.get_connection()
        order: list[object] = []

        async def borrower(index: int) -> None:
            connection = await pool.get_connection()
            order.append(index)
            await pool.release(connection)

        tasks = []
        for index in range(5):
            tasks.append(asyncio.create_task(borrower(index)))
            await until(lambda n=index + 1: pool.waiting() == n)  # type: ignore[misc]
        await pool.release(held)
        again = await pool.get_connection()
        order.append("releaser")
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3, 4, "releaser"]
        await pool.release(again)
        assert (pool.in_use(), pool.idle(), pool.waiting()) == (0, 1, 0)
        await pool.disconnect()

    asyncio.run(scenario())


def test_async_64_tasks_two_connections_no_exhaustion(
    node: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    async def scenario() -> tuple[list[int], list[BaseException]]:
        pool = make_async(node, max_connections=2, timeout=2)
        client = redis.asyncio.Redis(connection_pool=pool)
        calls = [0] * 64
        errors: list[BaseException] = []
        deadline = time.monotonic() + 1.5

        async def worker(index: int) -> None:
            while time.monotonic() < deadline:
                try:
                    await client.get(KEY)
                except Exception as exc:
                    errors.append(exc)
                    return
                calls[index] += 1

        await asyncio.gather(*(worker(i) for i in range(64)))
        assert pool.in_use() == 0 and pool.waiting() == 0 and pool.connection_count() <= 2
        await pool.disconnect()
        return calls, errors

    calls, errors = asyncio.run(scenario())
    mean = statistics.mean(calls)
    report(
        capsys,
        f"64 tasks / 2 connections / 1.5 s: {sum(calls)} GETs, per task min {min(calls)} "
        f"mean {mean:.0f} max {max(calls)}, errors {len(errors)}",
    )
    assert errors == []
    assert min(calls) >= 0.5 * mean


def test_async_exhaustion_after_timeout(node: dict[str, Any]) -> None:
    async def scenario() -> None:
        pool = make_async(node, max_connections=1, timeout=0.2)
        held = await pool.get_connection()
        started = time.monotonic()
        with pytest.raises(RedisConnectionError) as caught:
            await pool.get_connection()
        assert str(caught.value) == EXHAUSTED
        assert time.monotonic() - started >= 0.19
        assert pool.waiting() == 0
        await pool.release(held)
        assert (pool.in_use(), pool.idle()) == (0, 1)
        await pool.disconnect()

    asyncio.run(scenario())


def test_async_cancelled_waiters_lose_nothing(node: dict[str, Any]) -> None:
    async def scenario() -> None:
        pool = make_async(node, max_connections=1, timeout=10)
        held = await pool.get_connection()

        # Cancelled while queued: the next waiter is served.
        first = asyncio.create_task(pool.get_connection())
        second = asyncio.create_task(pool.get_connection())
        await until(lambda: pool.waiting() == 2)
        first.cancel()
        await pool.release(held)
        assert await second is held
        assert first.cancelled()
        await pool.release(held)
        assert (pool.in_use(), pool.idle(), pool.waiting()) == (0, 1, 0)

        # Cancelled after the connection was handed to it, before it ran: passed on.
        held = await pool.get_connection()
        first = asyncio.create_task(pool.get_connection())
        second = asyncio.create_task(pool.get_connection())
        await until(lambda: pool.waiting() == 2)
        await pool.release(held)  # handed to `first`, which has not run yet
        first.cancel()
        assert await second is held
        await pool.release(held)

        # The same with nobody behind: the connection goes back to idle.
        held = await pool.get_connection()
        first = asyncio.create_task(pool.get_connection())
        await until(lambda: pool.waiting() == 1)
        await pool.release(held)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert (pool.in_use(), pool.idle(), pool.waiting()) == (0, 1, 0)

        # Cut short by the caller's own timeout (asyncio.wait_for cancels it).
        held = await pool.get_connection()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pool.get_connection(), 0.05)
        await pool.release(held)
        assert (pool.in_use(), pool.idle(), pool.waiting()) == (0, 1, 0)
        await pool.disconnect()

    asyncio.run(scenario())


class HangingConnection(redis.asyncio.connection.Connection):
    """Connects forever, so a task can be cancelled in the middle of connecting."""

    async def connect(self) -> None:
        await asyncio.sleep(30)


def test_async_failed_or_cancelled_connects_free_their_slots(node: dict[str, Any]) -> None:
    async def scenario() -> None:
        pool = make_async(
            {"host": "127.0.0.1", "port": closed_port()},
            max_connections=2,
            timeout=5,
            **NO_RETRY,
        )
        results = await asyncio.gather(
            *(pool.get_connection() for _ in range(8)), return_exceptions=True
        )
        assert all(isinstance(r, RedisConnectionError) for r in results)
        assert all(str(r) != EXHAUSTED for r in results)
        assert (pool.in_use(), pool.idle(), pool.connection_count()) == (0, 0, 0)

        hanging = make_async(node, max_connections=1, timeout=5, connection_class=HangingConnection)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(hanging.get_connection(), 0.05)
        assert (hanging.in_use(), hanging.idle()) == (0, 0)

    asyncio.run(scenario())


def test_async_a_single_task_reuses_one_connection(node: dict[str, Any]) -> None:
    """The asyncio pool's counterpart (its speed: ``benchmarks/ratios.py``)."""

    async def scenario() -> None:
        pool = make_async(node, max_connections=4, timeout=2)
        client = redis.asyncio.Redis(connection_pool=pool)
        first = await client.client_id()
        assert [await client.get(KEY) for _ in range(2000)] == [b"v"] * 2000
        assert await client.client_id() == first
        assert (pool.connection_count(), pool.idle(), pool.in_use()) == (1, 1, 0)
        await pool.disconnect()

    asyncio.run(scenario())
