"""Native asyncio cache operations over the same sharded core, on ``redis.asyncio``: the
operations of :mod:`sentinel_cache.core.ops._async.client` over the core's per-event-loop clients
(:mod:`sentinel_cache.core.ops.async_clients`)."""

from __future__ import annotations

from sentinel_cache.core.ops._async.hashes import AsyncHashOperations
from sentinel_cache.core.ops._async.sets import AsyncSetOperations
from sentinel_cache.core.ops._async.sorted_sets import AsyncSortedSetOperations
from sentinel_cache.core.ops._async.stampede import AsyncStampedeOperations
from sentinel_cache.core.ops.async_clients import AsyncShardClients, shared_async_clients
from sentinel_cache.core.topology._async.connection import (
    AsyncShardConnection,
    AsyncShardSSLConnection,
)


class AsyncCacheClient(
    AsyncStampedeOperations, AsyncSortedSetOperations, AsyncSetOperations, AsyncHashOperations
):
    """The asyncio client: the same operations, arguments and semantics as
    :class:`~sentinel_cache.core.ops.client.CacheClient` (one source, see
    :mod:`sentinel_cache.core.ops._async.client`). Cheap to create: connections belong to the core's
    :class:`AsyncShardClients`."""

    @property
    def clients(self) -> AsyncShardClients:
        """The core's per-event-loop clients, shared by every cache object of the core."""
        return self.io.clients


__all__ = [
    "AsyncCacheClient",
    "AsyncShardClients",
    "AsyncShardConnection",
    "AsyncShardSSLConnection",
    "shared_async_clients",
]
