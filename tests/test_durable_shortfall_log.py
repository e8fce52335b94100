"""A WAIT shortfall (``DURABLE_REPLICAS``) is logged once per 10 s per shard, then with how many
lines were held back: with a replica down every write falls short, and a line per write would
flood the log (docs/operations.md). On a real server without replicas, so every WAIT falls
short at once; the throttle's clock is the test's."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
import types
import warnings
from collections.abc import Callable

import pytest
from durable_support import shortfalls

from sentinel_cache.core import throttle
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

SHORT = "acknowledged by 0 of 1 replicas within 10 ms"


def test_shortfalls_are_logged_once_per_interval_per_shard(
    make_cluster: Callable[..., LocalSentinelCluster],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(throttle, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    cluster = make_cluster(shards=2, replicas=0, sentinels=1)
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        client = CacheClient(pool, Codec(), durable_replicas=1, durable_timeout_ms=10)
        keys = {shard.index: [] for shard in pool.shards}  # type: dict[int, list[str]]
        i = 0
        while min(len(group) for group in keys.values()) < 5:
            key = f"short:{i}"
            keys[pool.shard_for(key).index].append(key)
            i += 1
        caplog.set_level(logging.WARNING, logger="sentinel_cache")

        def lines() -> list[str]:
            found = shortfalls(caplog, 10)
            caplog.clear()
            return found

        for key in keys[0][:5]:
            assert client.set(key, "v", 60) is True  # every write still succeeds
        assert lines() == [f"write to {keys[0][0]!r} {SHORT}"]
        assert client.set(keys[1][0], "v", 60) is True  # the other shard has its own line
        assert lines() == [f"write to {keys[1][0]!r} {SHORT}"]
        now[0] += 10.5  # the interval is over: the next line says how many were held back
        assert client.delete_many(keys[0]) == 5
        assert lines() == [f"write to shard {pool.shards[0].name} {SHORT} "
                           "(4 similar messages suppressed in the last 10s)"]  # fmt: skip

        async def asyncio_writes() -> None:  # the asyncio flavour shares the same throttle
            aclient = AsyncCacheClient(pool, Codec(), durable_replicas=1, durable_timeout_ms=10)
            for key in keys[0]:
                assert await aclient.set(key, "v", 60) is True
            await aclient.aclose()

        asyncio.run(asyncio_writes())
        assert lines() == []  # within the new interval
    finally:
        pool.close()


def test_a_forked_child_logs_though_a_parent_thread_held_the_throttle(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    """A thread of the parent inside the shard's throttle at the fork (its lock held, and held
    forever in the child, where that thread does not exist): the child's shortfall still logs
    (its throttles got new locks) instead of hanging."""
    cluster = make_cluster(shards=1, replicas=0, sentinels=1)
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    client = CacheClient(pool, Codec(), durable_replicas=1, durable_timeout_ms=10)
    try:
        assert client.set("short:fork", "v", 60)  # the shard's throttle now exists
        held = threading.Event()
        release = threading.Event()
        throttles = [
            obj for obj in gc.get_objects() if type(obj) is throttle.Throttle
        ]  # every throttle of the process, the shard's among them (type(): isinstance would
        # set up a Django lazy object found on the way)

        def hold() -> None:
            with contextlib.ExitStack() as stack:
                for found in throttles:
                    stack.enter_context(found._lock)
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(5)
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            pid = os.fork()
        if pid == 0:  # the child: one write that falls short, then report and leave
            try:
                signal.alarm(5)  # a hang ends the child, reported as no answer
                done = client.set("short:fork:child", "v", 60)
                os.write(write, b"ok" if done else b"no")
            finally:
                os._exit(0)
        release.set()
        holder.join(5)
        os.close(write)
        try:
            answer = os.read(read, 10)
        finally:
            os.close(read)
            os.waitpid(pid, 0)
        assert answer == b"ok"
    finally:
        pool.close()
