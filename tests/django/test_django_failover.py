"""A real failover while Django views (sync and async) are served through the test client."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client, override_settings
from django_support import cache_entry, configure_django
from threads import Workers

from sentinel_cache.core.config import Address
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]
URLCONF = configure_django()
LOCMEM = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}


@pytest.mark.failover
def test_views_serve_through_a_failover_with_no_errors(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=3)
    # Writes are held while the sentinels promote the replica; allow the whole failover.
    entry = cache_entry(cluster, KEY_PREFIX="views", OPTIONS={"FAILOVER_HOLD": 15})
    with override_settings(CACHES={"default": LOCMEM, "sharded": entry}, ROOT_URLCONF=URLCONF):
        cache = caches["sharded"]
        assert isinstance(cache, ShardedSentinelCache)
        try:
            run_traffic_through_failover(cluster, cache)
        finally:
            cache.core.close()


def on_shard(cache: ShardedSentinelCache, key: str, name: str) -> bool:
    return cache.core.shard_for(cache.make_key(key)).name == name


def run_traffic_through_failover(
    cluster: LocalSentinelCluster, cache: ShardedSentinelCache
) -> None:
    client = Client()
    keys = [f"page{i}" for i in range(8)]
    assert {cache.core.shard_for(cache.make_key(k)).index for k in keys} == {0, 1}
    name = cluster.master_names[0]
    shard = cache.core.shard(name)
    old = Address(*cluster.master_address(name))
    assert client.get("/write/warm?value=1").status_code == 200
    assert shard.address == old

    switched = threading.Event()

    def fail_over() -> None:
        try:
            cluster.failover(name)
            new = Address(*cluster.wait_for_master_change(name, old, timeout=30))
            deadline = time.monotonic() + 30
            while shard.address != new and time.monotonic() < deadline:
                time.sleep(0.01)
            assert shard.address == new, f"the core did not follow {old} -> {new}"
        finally:
            switched.set()  # the traffic below ends either way; the join reports a failure

    errors: list[str] = []
    requests = 0
    expected: dict[str, str] = {}

    def request(path: str) -> dict[str, Any] | None:
        nonlocal requests
        requests += 1
        try:
            response = client.get(path)
        except Exception as exc:  # the test client re-raises a view's exception
            errors.append(f"{path}: {type(exc).__name__}: {exc}")
            return None
        if response.status_code != 200:
            errors.append(f"{path}: HTTP {response.status_code}")
            return None
        result: dict[str, Any] = response.json()
        return result

    # Meanwhile one long-lived event loop keeps pooled asyncio connections to the shard that
    # fails over: they must re-point to the new master.
    async_errors: list[str] = []
    async_ops = 0
    async_key = next(k for k in (f"async{i}" for i in range(100)) if on_shard(cache, k, name))

    async def async_traffic() -> None:
        nonlocal async_ops
        await cache.aset(async_key, 0, 600)
        settled = 0
        while settled < 40:
            if switched.is_set():
                settled += 1
            try:
                await cache.aset(f"{async_key}:v", settled, 600)
                await cache.aget(f"{async_key}:v")
                await cache.aincr(async_key)
                await cache.aget_many([async_key, f"{async_key}:v", "page0", "page1"])
                async_ops += 4
            except Exception as exc:
                async_errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.005)
        await cache.aclose()

    workers = Workers(timeout=60)
    workers.spawn(asyncio.run, async_traffic(), name="async")
    workers.spawn(fail_over, name="failover")
    after_switch = 0
    round_number = 0
    while after_switch < 20:
        round_number += 1
        if switched.is_set():
            after_switch += 1
        for key in keys:
            value = f"{round_number}"
            written = request(f"/write/{key}?value={value}")
            if written is not None and written["stored"]:
                expected[key] = value
            request(f"/read/{key}")
            request(f"/count/counter-{key}")
        request(f"/async-write/async-{round_number % 4}?value={round_number}")
    workers.join()
    assert async_errors == [], f"{len(async_errors)} of {async_ops} async calls failed"
    assert async_ops > 100
    assert errors == [], f"{len(errors)} of {requests} requests failed: {errors[:5]}"
    assert shard.switch_count == 1
    # After the switch every write is read back from the new master.
    for key in keys:
        assert request(f"/read/{key}") == {"value": expected[key]}
    assert errors == []
