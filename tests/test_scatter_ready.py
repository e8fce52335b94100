"""A multi-key call's scatter (issue 27): every shard is made ready before any batch is sent,
each shard's master read once for the batch, the same whether a shard had to wait (a core's
first call, a raised write fence) or not (the usual call, which reads each shard's state in
the one look that finds it ready). And the keys a read counts as found in the metrics are
those it returns, with and without an unreadable value among them (the decode of the whole
batch, or of each value after one failed), with metrics on and off."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from samples import sample
from threads import Workers
from waiting import key_on

from sentinel_cache import FailoverInProgressError
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


def spread(core: ShardedSentinelPool, prefix: str) -> list[str]:
    """Two keys on each shard."""
    return [
        key_on(core, index, f"{prefix}-{n}") for index in range(len(core.shards)) for n in (0, 1)
    ]


def test_a_multi_key_call_is_a_fresh_cores_first_call(cluster: LocalSentinelCluster) -> None:
    for first in ("set_many", "get_many", "delete_many"):
        core = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses)
        try:
            assert not core.started
            client = CacheClient(core, Codec())
            keys = spread(core, f"fresh-{first}")
            if first == "set_many":
                assert client.set_many(dict.fromkeys(keys, "v"), 60) == []
            elif first == "get_many":
                assert client.get_many(keys) == {}
                assert client.set_many(dict.fromkeys(keys, "v"), 60) == []
            else:
                assert client.delete_many(keys) == 0
                assert client.set_many(dict.fromkeys(keys, "v"), 60) == []
            assert core.started
            assert client.get_many(keys) == dict.fromkeys(keys, "v")
            assert client.delete_many(keys) == len(keys)
        finally:
            core.close()


@pytest.fixture
def core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    pool = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, failover_hold=0.4, listeners=False
    )
    pool.discover()
    yield pool
    pool.close()


def test_a_write_waits_for_a_fenced_shard_then_every_batch_is_sent(
    core: ShardedSentinelPool,
) -> None:
    client = CacheClient(core, Codec())
    keys = spread(core, "fenced")
    client.delete_many(keys)
    fenced = core.shards[0]
    fenced.raise_fence("+selected-slave")
    try:
        assert client.get_many(keys) == {}  # reads pass a fence, without waiting on it
        with Workers(timeout=5) as workers:
            workers.after(0.15, fenced.lower_fence)
            began = time.monotonic()
            assert client.set_many(dict.fromkeys(keys, "v"), 60) == []
            assert time.monotonic() - began >= 0.1  # held until the fence was lowered
    finally:
        fenced.lower_fence()
    assert client.get_many(keys) == dict.fromkeys(keys, "v")


def test_a_fence_held_too_long_sends_no_batch_to_any_shard(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    keys = spread(core, "held")
    client.delete_many(keys)
    core.shards[0].raise_fence("+selected-slave")
    try:
        with pytest.raises(FailoverInProgressError):
            client.set_many(dict.fromkeys(keys, "v"), 60)
        with pytest.raises(FailoverInProgressError):
            client.delete_many(keys)
    finally:
        core.shards[0].lower_fence()
    # The shard that was not fenced got nothing either: every shard is ready before any send.
    assert client.get_many(keys) == {}


@pytest.mark.parametrize("metrics", [True, False], ids=["metrics", "no-metrics"])
@pytest.mark.parametrize("unreadable", [False, True], ids=["readable", "one-unreadable"])
def test_the_keys_counted_found_are_those_returned(
    cluster: LocalSentinelCluster, metrics: bool, unreadable: bool
) -> None:
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, metrics=metrics, listeners=False
    )
    try:
        codec = Codec()
        client = CacheClient(core, codec)
        stored = [key_on(core, 0, f"counted-{n}") for n in range(3)]
        absent = [key_on(core, 0, "counted-absent"), key_on(core, 1, "counted-absent")]
        client.delete_many(absent)
        assert client.set_many(dict.fromkeys(stored, "v"), 60) == []
        if unreadable:
            address = core.shards[0].address
            assert address is not None
            with redis.Redis(host=address.host, port=address.port) as raw:
                raw.set(stored[0], codec.dumps("v")[:-3])  # a framed pickle cut short
        name, other = core.shards[0].name, core.shards[1].name
        series = "sentinel_cache_multi_key_lookups_total"
        counts = [(name, "hit"), (name, "miss"), (other, "hit"), (other, "miss")]
        before = [sample(series, shard=s, result=r) for s, r in counts]
        found = client.get_many(stored + absent)
        after = [sample(series, shard=s, result=r) for s, r in counts]
        readable = stored[1:] if unreadable else stored
        assert found == dict.fromkeys(readable, "v")
        grew = [b - a for a, b in zip(before, after, strict=True)]
        if metrics:
            assert grew == [len(readable), 4 - len(readable), 0, 1]
        else:
            assert grew == [0, 0, 0, 0]
    finally:
        core.close()
