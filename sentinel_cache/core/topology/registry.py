"""Process-wide registry: equal configurations share one core; fork and shutdown hooks."""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sentinel_cache.core.config import PoolConfig
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

# -- process-wide registry: equal configurations share one core --------------------------------
_registry: dict[PoolConfig, ShardedSentinelPool] = {}
_registry_lock = threading.Lock()


def shared_pool(config: PoolConfig) -> ShardedSentinelPool:
    """The live core for ``config`` in this process, created on first request."""
    from sentinel_cache.core.topology.sharded_pool import (
        ShardedSentinelPool,  # it registers itself here
    )

    with _registry_lock:
        pool = _registry.get(config)
        if pool is None or pool.closed:
            pool = ShardedSentinelPool.from_config(config)
            _registry[config] = pool
        return pool


def _reinit_registry_lock() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()


# Every core of this process, for the fork hook (weak: a core nobody holds is not kept alive).
_live: weakref.WeakSet[ShardedSentinelPool] = weakref.WeakSet()


def track(pool: ShardedSentinelPool) -> None:
    """Let the fork hook reach ``pool`` (every core registers itself when built)."""
    _live.add(pool)


def _before_fork() -> None:
    for pool in list(_live):
        pool.before_fork()


def _after_fork_in_child() -> None:
    _reinit_registry_lock()
    for pool in list(_live):
        pool.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def forget(pool: ShardedSentinelPool) -> None:
    with _registry_lock:
        if _registry.get(pool.config) is pool:
            del _registry[pool.config]


def close_all() -> None:
    """Close every shared core (tests, and servers that shut down cleanly)."""
    with _registry_lock:
        pools = list(_registry.values())
    for pool in pools:
        pool.close()


def live_cores() -> list[ShardedSentinelPool]:
    """Every core of this process that is not closed (metrics read their gauges here)."""
    return [core for core in list(_live) if not core.closed]
