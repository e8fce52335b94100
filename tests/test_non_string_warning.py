"""A key holding a list, hash, ... that this cache did not write is a miss to every read, and
each read that meets it says so in the log once, in the same words on the same logger, whether
it is a ``get`` (sync or asyncio, with or without the near cache) or the read of a
``get_or_set`` (``core.ops.client.non_string_miss``, the one place it is written)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from waiting import key_on

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

WORDS = "holds a non-string value: treated as a miss"


def warnings_about(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sentinel_cache" and r.levelno == logging.WARNING and repr(key) in r.getMessage()
    ]


@pytest.mark.parametrize("near_cache", [False, True])
def test_every_read_of_a_list_is_a_miss_logged_once(
    make_core: Callable[..., ShardedSentinelPool],
    caplog: pytest.LogCaptureFixture,
    near_cache: bool,
) -> None:
    core = make_core(near_cache=near_cache, db=14, discover=True)
    client = CacheClient(core, Codec())
    key = key_on(core, 0, f"listed-{near_cache}")
    raw = core.client_for(key)
    raw.delete(key)
    raw.rpush(key, "not a cache value")

    async def aget() -> object:
        aclient = AsyncCacheClient(core, Codec())
        try:
            return await aclient.get(key, "default")
        finally:
            await aclient.aclose()

    with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
        assert client.get(key, "default") == "default"
        assert warnings_about(caplog, key) == [f"key {key!r} {WORDS}"]
        caplog.clear()
        assert asyncio.run(aget()) == "default"
        assert warnings_about(caplog, key) == [f"key {key!r} {WORDS}"]
        caplog.clear()
        # without the near cache, the read its callers coalesce on; with it, get's
        assert client.get_or_set(key, lambda: "computed", 60) == "computed"
        assert warnings_about(caplog, key) == [f"key {key!r} {WORDS}"]
    raw.delete(key)
