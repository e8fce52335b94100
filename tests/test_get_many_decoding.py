"""A multi-key read decodes each shard's replies at once (``Codec.loads_each``): the same values
as one ``loads`` per key, for every codec configuration, on real servers, sync and asyncio. A
stored None is found, an absent key is not, and one unreadable value among readable ones is a
miss on its own (logged) while the others are returned."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

CODECS = {
    "default": lambda: Codec(),
    "compressed": lambda: Codec(compressor="zlib", compress_min_length=10),
    "signed": lambda: Codec(signing_key=b"k" * 32),
    "json": lambda: Codec("json"),
    "plain pickle": lambda: Codec("pickle", value_format="plain"),
}
VALUES: dict[str, Any] = {
    "none": None,
    "int": 7,
    "big int": 2**70,
    "text": "x" * 40,
    "list": [1, "two", 3.5],
    "empty": "",
}


def _keys(core: ShardedSentinelPool, name: str) -> dict[str, Any]:
    keys = {f"decode:{name}:{label}": value for label, value in VALUES.items()}
    shards = {core.shard_index(key) for key in keys}
    assert len(shards) > 1, "the keys must spread over several shards"
    return keys


@pytest.mark.parametrize("name", sorted(CODECS))
def test_values_read_back_as_stored_sync_and_async(core: ShardedSentinelPool, name: str) -> None:
    codec = CODECS[name]()
    stored = _keys(core, name.replace(" ", "-"))
    absent = [f"decode:{name}:absent:{i}" for i in range(3)]
    sync = CacheClient(core, codec)
    assert sync.set_many(stored, 60) == []
    expected = dict(stored)
    keys = [*stored, *absent]
    assert sync.get_many(keys) == expected
    assert {key: codec.loads(data) for key, data in _raw(core, stored).items()} == expected

    async def main() -> dict[Any, Any]:
        client = AsyncCacheClient(core, codec)
        try:
            return await client.get_many(keys)
        finally:
            await client.aclose()

    assert asyncio.run(main()) == expected


def _raw(core: ShardedSentinelPool, keys: dict[str, Any]) -> dict[str, bytes]:
    found = {}
    for key in keys:
        address = core.shard_for(key).address
        assert address is not None
        with redis.Redis(host=address.host, port=address.port) as raw:
            data = raw.get(key)
        if data is not None:
            found[key] = data
    return found


def test_one_unreadable_value_is_a_miss_and_the_others_are_found(
    core: ShardedSentinelPool, caplog: pytest.LogCaptureFixture
) -> None:
    codec = Codec()
    stored = _keys(core, "unreadable")
    sync = CacheClient(core, codec)
    assert sync.set_many(stored, 60) == []
    broken = "decode:unreadable:text"
    address = core.shard_for(broken).address
    assert address is not None
    with redis.Redis(host=address.host, port=address.port) as raw:
        raw.set(broken, codec.dumps("x")[:-3])  # a framed pickle cut short
    expected = {key: value for key, value in stored.items() if key != broken}
    with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
        assert sync.get_many(list(stored)) == expected

    async def main() -> dict[Any, Any]:
        client = AsyncCacheClient(core, codec)
        try:
            return await client.get_many(list(stored))
        finally:
            await client.aclose()

    with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
        assert asyncio.run(main()) == expected
    warned = [r for r in caplog.records if "unreadable value" in r.getMessage()]
    assert len(warned) == 2  # once per call, for that key alone
