"""Helpers shared by the resharding command tests and their conftest (a uniquely named module:
``conftest`` is ambiguous as a module name when several test directories have one).

This directory is not a package, like ``tests/django``. Django can be configured once per
process: whichever test directory's conftest runs first configures the same minimal baseline,
and every test here sets its ``CACHES`` with ``override_settings``.
"""

from __future__ import annotations

import functools
from typing import Any

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ring import HashRing
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

BACKEND = "sentinel_cache.django.ShardedSentinelCache"
BEFORE = ["shard0", "shard1"]
AFTER = ["shard0", "shard1", "shard2"]
KEYS = [f"cmd:{n}" for n in range(2000)]


def flush(cluster: LocalSentinelCluster) -> None:
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            node.flushall()


def place(cluster: LocalSentinelCluster, masters: list[str] = BEFORE) -> None:
    """Every node emptied, then ``KEYS`` written under ``masters`` (raw keys, no prefix)."""
    flush(cluster)
    core = ShardedSentinelPool(masters, cluster.sentinel_addresses, listeners=False)
    try:
        CacheClient(core, Codec()).set_many({key: key for key in KEYS}, 600)
    finally:
        core.close()


def moving(keys: list[str] = KEYS) -> dict[tuple[str, str], int]:
    """(from, to) -> how many of ``keys`` an append of shard2 moves."""
    old, new = HashRing([1, 1]), HashRing([1, 1, 1])
    pairs: dict[tuple[str, str], int] = {}
    for key in keys:
        a, b = BEFORE[old.shard_index(key)], AFTER[new.shard_index(key)]
        if a != b:
            pairs[(a, b)] = pairs.get((a, b), 0) + 1
    return pairs


@functools.cache
def _ring(count: int) -> HashRing:
    return HashRing([1] * count)


def owner(key: str, masters: list[str]) -> str:
    """The master that owns ``key`` under ``masters`` (weights 1)."""
    return masters[_ring(len(masters)).shard_index(key)]


def locations(cluster: LocalSentinelCluster) -> dict[str, list[str]]:
    """Key -> the master names holding it (one SCAN of every master)."""
    found: dict[str, list[str]] = {}
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            for key in node.scan_iter(count=1000):
                found.setdefault(key.decode(), []).append(name)
    return found


def holders(cluster: LocalSentinelCluster, key: str) -> list[str]:
    """The master names holding ``key``."""
    names = []
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            if node.exists(key):
                names.append(name)
    return names


def django_entry(
    cluster: LocalSentinelCluster, masters: list[str], **options: Any
) -> dict[str, Any]:
    """A ``CACHES`` entry of our backend on ``cluster`` (no key prefix unless given)."""
    prefix = options.pop("KEY_PREFIX", "")
    return {
        "BACKEND": BACKEND,
        "LOCATION": cluster.config()["sentinels"],
        "KEY_PREFIX": prefix,
        "OPTIONS": {"MASTERS": masters, "LISTENERS": False, **options},
    }
