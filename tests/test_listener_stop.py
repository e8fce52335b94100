"""A stopped sentinel listener makes no new connection.

Why: :meth:`SentinelListener.stop` closes the subscription's socket to end its wait, and
redis-py's subscription then reconnects on its own (its retry's failure step reconnects even
with no retries left); that connect's handshake held the core's ``close()`` for its 2 s socket
timeout, 2 closes of 40 with the near cache on (tracked by sampling the threads of a slow
close). Real sentinels."""

from __future__ import annotations

import pytest
import redis
from waiting import wait_until

from sentinel_cache.core.config import Address
from sentinel_cache.core.topology.listener import SentinelListener
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


def test_a_stopped_listeners_connections_refuse_to_connect(cluster: LocalSentinelCluster) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        pool.discover()
        listener = SentinelListener(pool, Address(*cluster.sentinel_addresses[0]), {})
        listener.start()
        wait_until(lambda: listener.connected, 5, "the listener's subscription")
        client = listener._client  # the subscription's client, which stop() closes
        assert client is not None
        connections = client.connection_pool

        def connection() -> redis.Connection:  # one of the subscription's kind, outside its count
            made: redis.Connection = connections.connection_class(**connections.connection_kwargs)
            return made

        live = connection()
        live.connect()  # before stop(): its connections connect
        live.disconnect()
        listener.stop()
        assert not listener.alive and not listener.connected
        with pytest.raises(redis.ConnectionError, match="the listener is stopped"):
            connection().connect()
    finally:
        pool.close()
