"""Helpers the tests share: wait for a condition with a bound, find a key on a given shard."""

from __future__ import annotations

import time
from collections.abc import Callable

from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def key_on(core: ShardedSentinelPool, index: int, prefix: str = "k") -> str:
    """The first ``prefix:N`` key the ring places on shard ``index``."""
    n = 0
    while core.shard_index(f"{prefix}:{n}") != index:
        n += 1
    return f"{prefix}:{n}"
