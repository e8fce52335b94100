"""A value the cache cannot read (another serializer's, another signing key's, corrupt) is absent
to every Django read, never "present but missing": ``get`` misses, ``has_key`` says False, ``add``
stores over it and Django's own ``get_or_set`` (get, compute, add, get) returns and keeps the
computed value, sync and async, with and without STAMPEDE_PROTECTION."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest
from django_support import DJANGO_DB, build_cache, cache_entry, unique_prefix

from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

# A pickle written by another app: this cache is configured for json.
FOREIGN = pickle.dumps({"written": "by django-redis"}, protocol=pickle.DEFAULT_PROTOCOL)


def plant(cluster: LocalSentinelCluster, cache: ShardedSentinelCache, key: str) -> str:
    """Write the foreign bytes straight to the node that owns ``key``; the key as stored."""
    made = cache.make_and_validate_key(key)
    name = cluster.master_names[cache.core.shard_index(made)]
    with cluster.node_client(cluster.master_address(name), db=DJANGO_DB) as node:
        node.set(made, FOREIGN, ex=60)
        assert node.get(made) == FOREIGN
    assert cache.ttl(key) > 0  # the cache sees the key there: not planted where it never looks
    return made


@pytest.mark.parametrize("stampede", [False, True])
def test_an_unreadable_value_is_absent_to_every_read(
    cluster: LocalSentinelCluster, stampede: bool
) -> None:
    options: dict[str, Any] = {"SERIALIZER": "json", "STAMPEDE_PROTECTION": stampede}
    entry = cache_entry(cluster, KEY_PREFIX=unique_prefix(), OPTIONS=options)
    assert entry["OPTIONS"].get("DB", 0) == DJANGO_DB  # where plant() writes
    cache = build_cache(entry)
    try:
        for key in ("get", "has", "add", "gos"):
            plant(cluster, cache, key)
        assert cache.get("get", "default") == "default"
        assert cache.has_key("has") is False
        assert "has" not in cache
        assert cache.add("add", {"new": 1}, 60) is True
        assert cache.get("add") == {"new": 1}
        assert cache.add("add", "loses", 60) is False  # a readable value is present
        calls: list[int] = []

        def compute() -> str:
            calls.append(1)
            return "computed"

        assert cache.get_or_set("gos", compute, 60) == "computed"
        assert cache.get_or_set("gos", compute, 60) == "computed"
        assert calls == [1]  # stored the first time: not recomputed on every call
    finally:
        cache.close()


def test_an_unreadable_value_is_absent_to_async_reads(cluster: LocalSentinelCluster) -> None:
    options = {"SERIALIZER": "json"}
    cache = build_cache(cache_entry(cluster, KEY_PREFIX=unique_prefix(), OPTIONS=options))

    async def scenario() -> tuple[Any, ...]:
        for key in ("has", "add", "gos"):
            plant(cluster, cache, key)
        has = await cache.ahas_key("has")
        added = await cache.aadd("add", "new", 60)
        got = await cache.aget("add")
        computed = await cache.aget_or_set("gos", lambda: "computed", 60)
        kept = await cache.aget("gos")
        return has, added, got, computed, kept

    try:
        assert asyncio.run(scenario()) == (False, True, "new", "computed", "computed")
    finally:
        cache.close()


def test_a_held_lock_is_present_to_every_read(cluster: LocalSentinelCluster) -> None:
    """redis-py's bare token would be unreadable, so absent; the lock writes its token in the
    cache's format instead (django-redis's test_lock asserts has_key while it is held)."""
    cache = build_cache(cache_entry(cluster, KEY_PREFIX=unique_prefix()))
    try:
        lock = cache.lock("held", timeout=10)
        assert lock.acquire(blocking=False)
        assert cache.has_key("held")
        token = cache.get("held")
        assert isinstance(token, str) and len(token) == 32
        other = cache.lock("held", timeout=10)
        assert not other.acquire(blocking=False)
        assert cache.add("held", "stolen", 10) is False
        lock.release()
        assert not cache.has_key("held")
    finally:
        cache.close()
