"""How the sync operations reach a shard and wait: the only sync-specific part.

Each shard owns its fair connection pool (and one per replica); blocking work of the core
runs inline; a write fence is waited for on its ``threading.Event``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sentinel_cache.core.config import Address
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

T = TypeVar("T")


class ShardIO:
    """One core's shard pools, as the generated sync operations reach them."""

    def __init__(self, core: ShardedSentinelPool) -> None:
        self.core = core

    def __repr__(self) -> str:
        return f"<ShardIO {self.core!r}>"

    def master(self, shard: Shard) -> Any:
        return shard.client

    def reader(self, shard: Shard) -> tuple[Address | None, Any]:
        """A replica in the read rotation (its address and client), or (None, None)."""
        return shard.read_replica() or (None, None)

    def replica(self, shard: Shard, address: Address) -> Any:
        """The client of one of the shard's replicas (for a read during an outage)."""
        return shard.replica_client(address)

    def writer(self, shard: Shard, key: Any) -> Any:
        """The near cache's writer connection, leased for a write of ``key`` whose value may
        be kept (the server does not echo writes made on it), or None: see
        :meth:`~sentinel_cache.core.topology.near.NearCache.lease`."""
        near = self.core.near
        return None if near is None else near.lease(shard, key)

    def close(self) -> None:
        """Nothing to do: the shards' pools belong to the core (closed with it)."""


def run_blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return function(*args, **kwargs)


def wait_switch(shard: Shard, generation: int, hold: float) -> bool:
    return shard.wait_change(generation, hold)


def wait_fence(shard: Shard, hold: float) -> None:
    shard.wait_fence(hold)
