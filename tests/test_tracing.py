"""OpenTelemetry (``TRACING = True``, issue 15): our spans name the shard and the master that
answered, and say when a call waited on a write fence or was retried after a switch; redis-py's
own instrumentation keeps working on the core's clients. Real servers, in-memory exporter."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from spans import EXPORTER, install, ours
from threads import Workers
from waiting import key_on

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient, execute
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    install()


@pytest.fixture
def core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    made = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, tracing=True)
    EXPORTER.clear()
    yield made
    made.close()


def test_a_call_names_its_shard_and_master(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    key = key_on(core, 1, "trace")
    client.set(key, "v", 60)
    assert client.get(key) == "v"
    (span,) = ours("get")
    shard = core.shards[1]
    assert span.kind == trace.SpanKind.CLIENT
    assert span.attributes["sentinel_cache.shard"] == shard.name
    assert span.attributes["db.system.name"] == "redis"
    assert (span.attributes["server.address"], span.attributes["server.port"]) == (
        shard.address.host,
        shard.address.port,
    )
    assert "sentinel_cache.retried" not in span.attributes


def test_a_multi_key_call_is_one_span_over_its_shards(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    keys = [key_on(core, 0, "trace-many"), key_on(core, 1, "trace-many")]
    client.get_many(keys)
    (span,) = ours("get_many")
    assert sorted(span.attributes["sentinel_cache.shards"]) == sorted(s.name for s in core.shards)


def test_async_calls_are_traced_too(core: ShardedSentinelPool) -> None:
    import asyncio

    async def go() -> None:
        client = AsyncCacheClient(core, Codec())
        await client.set("trace-async", 1, 60)
        await client.aclose()

    asyncio.run(go())
    (span,) = ours("set")
    assert span.attributes["sentinel_cache.shard"] == core.shard_for("trace-async").name


def test_a_write_held_by_the_fence_says_how_long(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    key = key_on(core, 0, "trace-fence")
    client.set(key, 0, 60)  # started, master known
    shard = core.shards[0]
    shard.raise_fence("test: a failover announced")
    EXPORTER.clear()
    with Workers(timeout=5) as workers:
        workers.after(0.2, shard.lower_fence)
        client.set(key, 1, 60)
    (span,) = ours("set")
    assert span.attributes["sentinel_cache.fence_wait_ms"] >= 150


@pytest.mark.failover
def test_a_call_retried_after_a_switch_says_so(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    name = cluster.master_names[0]
    # No listeners: only the safety net can learn of the switch, on the next call.
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, tracing=True, listeners=False
    )
    try:
        client = CacheClient(core, Codec())
        client.set("before", 1, None)
        old = cluster.master_address(name)
        cluster.kill_master(name)
        # Every sentinel must name the new master: the safety net's one re-resolve asks them.
        cluster.wait_for_master_change(name, old)
        EXPORTER.clear()
        client.set("after", 2, None)
        (span,) = ours("set")
        assert span.attributes["sentinel_cache.retried"] is True
        host, port = cluster.master_address(name)
        assert (span.attributes["server.address"], span.attributes["server.port"]) == (host, port)
    finally:
        core.close()


def test_redis_py_instrumentation_works_on_the_core_clients(core: ShardedSentinelPool) -> None:
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    instrumentor = RedisInstrumentor()
    instrumentor.instrument()
    try:
        shard = core.shards[0]
        execute(core, shard, lambda client: client.set("trace-raw", "v"))
        assert execute(core, shard, lambda client: client.get("trace-raw"), write=False) == b"v"
        client = CacheClient(core, Codec())
        client.set("trace-cache", 1, 60)  # our own sends are unaffected by the patching
        assert client.get("trace-cache") == 1
    finally:
        instrumentor.uninstrument()
    names = [s.name for s in EXPORTER.get_finished_spans()]
    assert "SET" in names and "GET" in names  # redis-py's spans, from the instrumentation
    assert ours("set") and ours("get")
