"""``get`` decodes what it read, and an unreadable value is logged once and answers the default: each kind of reply (a value, a stored None, a raw
integer, an unreadable value, a miss), sync and asyncio, with and without the near cache (whose
own hit decodes the same way)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from waiting import key_on

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

WORDS = "treated as a miss"
#: The default codec's frame (a pickle) around bytes no unpickler reads.
UNREADABLE = Codec().dumps("x")[:2] + b"\xffnot a pickle"  # type: ignore[index]


def warnings_about(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sentinel_cache"
        and r.levelno == logging.WARNING
        and repr(key) in r.getMessage()
    ]


@pytest.mark.parametrize("near_cache", [False, True])
def test_every_kind_of_reply_decodes_as_before(
    make_core: Callable[..., ShardedSentinelPool],
    caplog: pytest.LogCaptureFixture,
    near_cache: bool,
) -> None:
    core = make_core(near_cache=near_cache, db=13, discover=True)
    client = CacheClient(core, Codec())
    keys = {
        name: key_on(core, 0, f"decode-{near_cache}-{name}")
        for name in ("value", "none", "int", "unreadable", "miss")
    }
    raw = core.client_for(keys["value"])
    raw.delete(*keys.values())
    client.set(keys["value"], {"a": [1, 2]}, 60)
    client.set(keys["none"], None, 60)
    raw.set(keys["int"], 41)
    raw.incr(keys["int"])
    raw.set(keys["unreadable"], UNREADABLE)

    async def aget(key: str) -> Any:
        aclient = AsyncCacheClient(core, Codec())
        try:
            return await aclient.get(key, "default")
        finally:
            await aclient.aclose()

    for get in (lambda key: client.get(key, "default"), lambda key: asyncio.run(aget(key))):
        for _ in range(2):  # with the near cache, the second is the near copy's hit
            assert get(keys["value"]) == {"a": [1, 2]}
            assert get(keys["none"]) is None  # a stored None is no miss
            assert get(keys["int"]) == 42
            assert get(keys["miss"]) == "default"
            with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
                caplog.clear()
                assert get(keys["unreadable"]) == "default"
                (warning,) = warnings_about(caplog, keys["unreadable"])
                assert WORDS in warning
    raw.delete(*keys.values())
