"""The sync shard pool's quick release (``ShardPool.release``, issue 27): a connection with
nothing to re-authenticate or reconnect for goes straight back to the ledger; one marked for
reconnection (redis-py's maintenance notifications) takes the fair pool's full release, which
closes it, and the next checkout connects it again; a release of a connection the pool no
longer holds (released twice) changes nothing, and one made before a fork is dropped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from sentinel_cache.core.topology.lean import ShardPool
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture
def core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    pool.discover()
    yield pool
    pool.close()


def test_an_unmarked_connection_is_handed_back_connected(core: ShardedSentinelPool) -> None:
    pool = core.shards[0].pool
    assert isinstance(pool, ShardPool)
    connection = pool.get_connection()
    before = pool.idle()
    pool.release(connection)
    assert connection.is_connected
    assert pool.idle() == before + 1
    pool.release(connection)  # released twice: nothing changes
    assert pool.idle() == before + 1
    assert pool.get_connection() is connection  # the idle one, as it was
    connection.send_command("PING")
    assert connection.read_response() in (b"PONG", "PONG", True)
    pool.release(connection)


def test_a_connection_marked_for_reconnection_is_closed_on_release(
    core: ShardedSentinelPool,
) -> None:
    pool = core.shards[0].pool
    marks = hasattr(redis.connection.AbstractConnection, "mark_for_reconnect")
    connection = pool.get_connection()
    if marks:  # redis-py >= 6
        connection.mark_for_reconnect()
    pool.release(connection)
    # Without marks (older redis-py) the release keeps the connection as it is.
    assert (not connection.is_connected) == marks
    again = pool.get_connection()
    assert again is connection and again.is_connected
    again.send_command("PING")
    assert again.read_response() in (b"PONG", "PONG", True)
    pool.release(again)


def test_a_connection_made_before_a_fork_is_dropped(core: ShardedSentinelPool) -> None:
    pool = core.shards[0].pool
    connection = pool.get_connection()
    made, idle = pool.connection_count(), pool.idle()
    connection.pid = -1  # as if made by another process: not this pool's to hand on
    pool.release(connection)
    assert not connection.is_connected
    assert pool.connection_count() == made - 1
    assert pool.idle() == idle  # not kept for the next checkout
