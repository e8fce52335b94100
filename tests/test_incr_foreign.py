"""``incr`` on values another client wrote (issue 36 item 13): the server's ``INCR`` rule, a
canonical signed decimal, in every value format. Before, a value ``INCRBY`` refused went to the
past-64-bits fallback, which added to whatever the codec read as an integer: ``"-0"`` became 1
and ``"007"`` 8 in the default format, ``" 12"``, ``"12 "`` and ``"\\t7\\n"`` were incremented
with plain json. Now they raise the ``IncrementError`` a text value raises, naming the key, and
the value is left as it was; integers past 64 bits (a canonical decimal, or one this cache
encoded) are still added to. Each refused value is checked against the server's own INCRBY."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis

from sentinel_cache import IncrementError
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

DB = 10

FORMATS = [
    ("framed", "pickle"),  # the default
    ("framed", "json"),
    ("framed", "msgpack"),
    ("plain", "pickle"),
    ("plain", "json"),
    ("plain", "msgpack"),
    ("plain", "text"),
]

#: What another client may write that Redis's INCR refuses; several of them a codec reads as an
#: integer (the framed format's decimal rule, json, msgpack).
FOREIGN = [
    b"-0",
    b"007",
    b"-007",
    b"00",
    b"+5",
    b" 12",
    b"12 ",
    b"\t7\n",
    b"12.0",
    b"1e3",
    b"0x1f",
    b"",
    msgpack.packb(12),
    b"99999999999999999999 ",
]


@pytest.fixture(scope="module")
def pool(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    core = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, db=DB)
    yield core
    core.close()


def fresh(name: str) -> str:
    return f"{name}-{time.time_ns()}"


@pytest.mark.parametrize("data", FOREIGN, ids=repr)
def test_redis_itself_refuses_each_foreign_value(pool: ShardedSentinelPool, data: bytes) -> None:
    """The rule the cache follows is the server's: its INCRBY refuses every one of them."""
    key = fresh("server")
    raw = pool.client_for(key)
    raw.set(key, data)
    with pytest.raises(redis.ResponseError, match="not an integer"):
        raw.incrby(key, 1)
    assert raw.get(key) == data


@pytest.mark.parametrize(("value_format", "serializer"), FORMATS)
def test_foreign_values_are_refused_in_every_format(
    pool: ShardedSentinelPool, value_format: str, serializer: str
) -> None:
    client = CacheClient(pool, Codec(serializer, value_format=value_format))
    wrongly: dict[bytes, Any] = {}
    for data in FOREIGN:
        key = fresh("foreign")
        raw = pool.client_for(key)
        raw.set(key, data)
        for delta, create in ((1, False), (-3, False), (1, True)):
            try:
                wrongly[data] = client.incr(key, delta, create=create)
            except IncrementError as exc:
                assert key in str(exc) and "not an integer" in str(exc), str(exc)
        assert raw.get(key) == data  # left as it was
    assert wrongly == {}, f"incremented what INCR refuses: {wrongly}"


@pytest.mark.parametrize(("value_format", "serializer"), FORMATS)
def test_asyncio_refuses_them_too(
    pool: ShardedSentinelPool, value_format: str, serializer: str
) -> None:
    async def main() -> dict[bytes, Any]:
        client = AsyncCacheClient(pool, Codec(serializer, value_format=value_format))
        wrongly: dict[bytes, Any] = {}
        try:
            for data in FOREIGN:
                key = fresh("aforeign")
                pool.client_for(key).set(key, data)
                try:
                    wrongly[data] = await client.incr(key)
                except IncrementError as exc:
                    assert key in str(exc), str(exc)
        finally:
            await client.aclose()
        return wrongly

    assert asyncio.run(main()) == {}


@pytest.mark.parametrize(("value_format", "serializer"), FORMATS)
def test_canonical_decimals_and_our_own_big_integers_are_still_added_to(
    pool: ShardedSentinelPool, value_format: str, serializer: str
) -> None:
    codec = Codec(serializer, value_format=value_format)
    client = CacheClient(pool, codec)
    cases = [(b"12", 1, 13), (b"-5", 1, -4), (b"0", -1, -1), (b"9223372036854775806", 1, 2**63 - 1)]
    try:
        codec.dumps(2**64)
    except Exception:  # msgpack, text: no encoding for an integer past 64 bits
        big = False
    else:
        big = True
        cases += [
            (b"9223372036854775807", 1, 2**63),  # past 64 bits: the fallback, Python's sum
            (b"-9223372036854775808", -1, -(2**63) - 1),
            (b"18446744073709551616", 1, 2**64 + 1),  # a canonical decimal past 64 bits
        ]
    for data, delta, expected in cases:
        key = fresh("canonical")
        pool.client_for(key).set(key, data)
        assert client.incr(key, delta) == expected, data
        assert client.get(key) == expected
    if big:  # one this cache encoded itself (framed, or the serializer's bytes in plain)
        key = fresh("ours")
        assert client.set(key, 2**64, 60)
        assert client.incr(key, 2) == 2**64 + 2
        assert client.incr(key, -(2**63)) == 2**63 + 2
