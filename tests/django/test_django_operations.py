"""An operation added the documented way (docs/contributing.md): ``get_or_set_many``, written
once in the core and declared once in the Django adapter, sync and async."""

from __future__ import annotations

import asyncio

from sentinel_cache.django import ShardedSentinelCache


def test_get_or_set_many_adds_only_the_missing_keys(cache: ShardedSentinelCache) -> None:
    keys = [f"gosm{i}" for i in range(20)]
    assert {cache.core.shard_for(cache.make_key(k)).index for k in keys} == {0, 1}
    cache.set_many({k: "old" for k in keys[:10]})
    got = cache.get_or_set_many({k: "new" for k in keys}, 60)
    assert got == {**{k: "old" for k in keys[:10]}, **{k: "new" for k in keys[10:]}}
    assert cache.get_many(keys) == got  # the defaults were stored
    assert 0 < cache.ttl(keys[-1]) <= 60
    assert cache.get_or_set_many({}) == {}
    # Expiring at once: the defaults come back, nothing is stored.
    assert cache.get_or_set_many({"gosm-x": 1}, 0) == {"gosm-x": 1}
    assert cache.get("gosm-x") is None


def test_aget_or_set_many_is_the_same_operation(cache: ShardedSentinelCache) -> None:
    async def run() -> dict[str, object]:
        await cache.aset("agosm0", "old")
        got = await cache.aget_or_set_many({"agosm0": "new", "agosm1": "new"})
        await cache.aclose()
        return got

    assert asyncio.run(run()) == {"agosm0": "old", "agosm1": "new"}
    assert cache.get("agosm1") == "new"
