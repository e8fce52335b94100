"""A value over its master's ``proto-max-bulk-len`` is refused before anything is sent.

The master would read it whole (the process holding several copies), then refuse it and drop
the connection: a 512 MiB ``set`` raised ``ShardUnavailableError ... Connection reset by peer``
after 5-11 s with the process at 4x the value's size. Now each new connection learns its
master's limit (``CONFIG GET proto-max-bulk-len``) and every write's batch is checked where it
is packed (``plans.pack``): ``ValueTooLargeError`` names the key, the size and the limit.
Real servers started with ``--proto-max-bulk-len 1mb`` (the smallest allowed), so the values
stay small; shard 1's master is raised to 2 MiB, so the limit is shown to be per master.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from waiting import key_on

from sentinel_cache import ValueTooLargeError
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.lean_rules import (
    DEFAULT_BULK_LIMIT,
    MIN_BULK_LIMIT,
    bulk_limit_of,
    too_large,
)
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

SMALL = MIN_BULK_LIMIT  # shard 0's master: --proto-max-bulk-len 1mb
LARGER = 2 * MIN_BULK_LIMIT  # shard 1's, raised with CONFIG SET before anything connects
BIG = b"v" * (MIN_BULK_LIMIT + MIN_BULK_LIMIT // 2)  # over shard 0's limit, under shard 1's


def test_the_limit_is_read_from_config_get_or_is_the_default() -> None:
    assert bulk_limit_of([b"proto-max-bulk-len", b"2097152"]) == LARGER
    assert bulk_limit_of({"proto-max-bulk-len": "1048576"}) == SMALL
    for refused in (None, b"OK", [], [b"proto-max-bulk-len"], [b"x", b"many"], [b"x", b"5"]):
        assert bulk_limit_of(refused) == DEFAULT_BULK_LIMIT
    assert too_large([("SET", "k", b"x" * 10)], 9) == ("k", 10)
    assert too_large([("MSET", "a", b"1", "b", b"x" * 10)], 9) == ("b", 10)
    assert too_large([("HSET", "h", "f", b"x" * 10)], 9) == ("h", 10)
    script = ("EVAL", "body", 2, "a", "b", 300, b"1", b"x" * 10)
    assert too_large([script], 9) == ("b", 10)
    assert too_large([("SET", "k", b"x" * 9)], 9) is None


@pytest.fixture(scope="module")
def limited(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(
        shards=2, replicas=0, sentinels=1, extra_server_args=["--proto-max-bulk-len", "1mb"]
    ) as private:
        with redis.Redis(*private.master_address(private.master_names[1])) as admin:
            admin.config_set("proto-max-bulk-len", str(LARGER))
        yield private


@pytest.fixture
def core(limited: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    pool = ShardedSentinelPool(limited.master_names, limited.sentinel_addresses, listeners=False)
    pool.discover()
    yield pool
    pool.close()


WRITES = ("set", "add", "set_many", "hset")


def write(client: Any, call: str, key: str, other: str) -> Any:
    """``call`` writing ``BIG`` at ``key`` (with ``set_many``, a small value at ``other`` too);
    the result, or the coroutine giving it."""
    if call == "set":
        return client.set(key, BIG, 300)
    if call == "add":
        return client.add(key, BIG, 300)
    if call == "set_many":
        return client.set_many({key: BIG, other: b"small"}, 300)
    return client.hset(key, "field", BIG)


def outcome(flavour: str, core: ShardedSentinelPool, call: str, key: str, other: str) -> Any:
    """What the write returned, or the exception it raised; then whether a small write on the
    same shard still succeeds (the connection was never broken)."""
    if flavour == "sync":
        client = CacheClient(core, Codec())
        try:
            result: Any = write(client, call, key, other)
        except ValueTooLargeError as exc:
            result = exc
        return result, client.set(f"{key}-after", 1, 300)

    async def scenario() -> Any:
        client = AsyncCacheClient(core, Codec())
        try:
            try:
                result: Any = await write(client, call, key, other)
            except ValueTooLargeError as exc:
                result = exc
            return result, await client.set(f"{key}-after", 1, 300)
        finally:
            await client.aclose()

    return asyncio.run(scenario())


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("call", WRITES)
def test_a_value_over_the_masters_limit_is_refused_before_sending(
    limited: LocalSentinelCluster, core: ShardedSentinelPool, call: str, flavour: str
) -> None:
    key = key_on(core, 0, f"limit-{call}-{flavour}")
    other = key_on(core, 1, f"limit-other-{call}-{flavour}")
    result, after = outcome(flavour, core, call, key, other)
    assert isinstance(result, ValueTooLargeError), result
    assert isinstance(result, ValueError)
    assert (result.key, result.limit) == (key, SMALL) and result.size > SMALL
    assert key in str(result) and str(SMALL) in str(result) and str(result.size) in str(result)
    assert after is True
    check = CacheClient(core, Codec())
    assert check.get(key) is None and check.get(other) is None  # nothing sent, to either shard
    assert [shard.unreachable_since for shard in core.shards] == [None, None]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_the_same_value_is_stored_on_a_master_that_allows_it(
    core: ShardedSentinelPool, flavour: str
) -> None:
    key = key_on(core, 1, f"limit-fits-{flavour}")
    result, after = outcome(flavour, core, "set", key, key_on(core, 0, "limit-fits-other"))
    assert (result, after) == (True, True)
    assert CacheClient(core, Codec()).get(key) == BIG
