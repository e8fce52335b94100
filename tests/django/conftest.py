"""Fixtures for the Django adapter's tests (``sentinel_cache.django``).

Django is configured at import from ``settings.py`` (guarded: another Django test directory
may have configured the same baseline first); non-Django tests elsewhere are unaffected.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django_support import (
    DJANGO_DB,
    MakeCache,
    build_cache,
    cache_entry,
    configure_django,
    opened,
    remember,
    unique_prefix,
)

from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

configure_django()


@pytest.fixture(autouse=True)
def _close_django_pools() -> Iterator[None]:
    """Close the cores this test's caches opened: nothing of ours (listener threads, sockets)
    outlives the test, whichever topology it used."""
    yield
    for pool in list(opened.values()):
        pool.close()
    opened.clear()


@pytest.fixture
def make_cache(cluster: LocalSentinelCluster) -> Iterator[MakeCache]:
    """``make_cache(**params)``: a backend on the session topology (DB ``DJANGO_DB``) with a
    fresh KEY_PREFIX unless one is given; prefixed keys are cleared afterwards."""
    made: list[ShardedSentinelCache] = []

    def factory(**params: Any) -> ShardedSentinelCache:
        params.setdefault("KEY_PREFIX", unique_prefix())
        made.append(remember(build_cache(cache_entry(cluster, **params))))
        return made[-1]

    yield factory
    for cache in made:
        if cache.key_prefix:
            cache.clear()


@pytest.fixture
def cache(make_cache: MakeCache) -> ShardedSentinelCache:
    """A backend with a unique prefix on the session topology."""
    return make_cache()


@pytest.fixture
def masters(cluster: LocalSentinelCluster) -> Iterator[dict[str, redis.Redis]]:
    """Plain redis-py clients on each shard's current master (``DJANGO_DB``), by master name."""
    clients = {
        name: cluster.node_client(cluster.master_address(name), db=DJANGO_DB)
        for name in cluster.master_names
    }
    yield clients
    for client in clients.values():
        client.close()
