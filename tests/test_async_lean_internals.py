"""The asyncio lean read uses ``asyncio.StreamReader`` internals (``_buffer``, ``_paused``, ...).
A Python whose streams lack one of them must not break the calls: such a connection is left to
redis-py's own path, with the same replies. With ``ASYNC_MULTIPLEX`` (the default), which reads
with those internals too, the shard's calls go to the pool instead, quietly (the user did not
ask for the shared connection), with the same replies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from waiting import key_on

from sentinel_cache.core.ops import async_clients
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.async_mux import AsyncMuxPool
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

try:
    import hiredis  # noqa: F401

    HIREDIS = True
except ImportError:  # the CI cells without hiredis
    HIREDIS = False


@pytest.fixture
def core(make_core: Callable[..., ShardedSentinelPool]) -> ShardedSentinelPool:
    """conftest's ``core`` on the pool (``ASYNC_MULTIPLEX: False``): ``lean_paths`` checks out
    the pool's own connections."""
    return make_core(listeners=False, discover=True, async_multiplex=False)


def lean_paths(core: ShardedSentinelPool) -> tuple[dict[str, Any], list[bool]]:
    client = AsyncCacheClient(core, Codec())
    keys = [key_on(core, i, "internals") for i in range(len(core.shards))]

    async def main() -> tuple[dict[str, Any], list[bool]]:
        try:
            await client.set_many(dict.fromkeys(keys, "v"), 60)
            found = await client.get_many(keys)
            lean = []
            for shard in core.shards:
                connections = (await client.io.master(shard)).connection_pool
                connection = await connections.get_connection()
                try:
                    lean.append(connection._lean() is not None)
                finally:
                    await connections.release(connection)
            return found, lean
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_stream_without_the_internals_takes_redis_py_s_path(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    found, lean = lean_paths(core)
    # this Python has them: the lean path reads (with hiredis; without it redis-py's path)
    assert lean == [HIREDIS] * len(core.shards)
    assert set(found.values()) == {"v"}
    monkeypatch.setattr(
        async_clients, "STREAM_INTERNALS", (*async_clients.STREAM_INTERNALS, "_gone")
    )
    found, lean = lean_paths(core)
    assert lean == [False] * len(core.shards)
    assert set(found.values()) == {"v"} and len(found) == len(core.shards)


def multiplexed(core: ShardedSentinelPool) -> tuple[dict[str, Any], list[bool]]:
    """The replies of a set_many/get_many over every shard, and per shard whether the shared
    connection served them."""
    client = AsyncCacheClient(core, Codec())
    keys = [key_on(core, i, "internals-mux") for i in range(len(core.shards))]

    async def main() -> tuple[dict[str, Any], list[bool]]:
        try:
            await client.set_many(dict.fromkeys(keys, "m"), 60)
            found = await client.get_many(keys)
            shared = []
            for shard in core.shards:
                pool = (await client.io.master(shard)).connection_pool
                assert isinstance(pool, AsyncMuxPool)
                shared.append(pool.multiplexed and pool.link is not None)
            return found, shared
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_without_the_internals_the_default_multiplex_falls_back_to_the_pool_quietly(
    make_core: Callable[..., ShardedSentinelPool],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = make_core(listeners=False, discover=True)  # ASYNC_MULTIPLEX by default
    caplog.set_level("WARNING", logger="sentinel_cache")
    found, shared = multiplexed(core)
    assert shared == [HIREDIS] * len(core.shards)  # the shared connection (with hiredis)
    assert set(found.values()) == {"m"} and len(found) == len(core.shards)
    monkeypatch.setattr(
        async_clients, "STREAM_INTERNALS", (*async_clients.STREAM_INTERNALS, "_gone")
    )
    found, shared = multiplexed(core)
    assert shared == [False] * len(core.shards)
    assert set(found.values()) == {"m"} and len(found) == len(core.shards)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
