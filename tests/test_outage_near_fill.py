"""A near-cache fill whose ticket saw a replica answer a read of its shard is refused, even when
the outage ended before the reply reached the near cache (the housekeeper found the master
answering again in between). That reply may be the replica's (``OUTAGE_READS``): the master's
tracking session heard nothing of it, so no invalidation would ever tear the copy. The
interleaving is forced here, one step at a time, on a real tracked pool: in a live call it
falls between the replica's reply and the fill, a few microseconds apart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from waiting import key_on, wait_until

from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture
def near_pool(cluster: LocalSentinelCluster, near_push: bool) -> Iterator[ShardedSentinelPool]:
    pool = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        near_cache_push=near_push,
        db=11,
    )
    try:
        pool.discover()
        wait_until(lambda: pool.near.status(0)["tracked"], 10, "shard 0 to be tracked")
        yield pool
    finally:
        pool.close()


def test_a_fill_after_a_replica_answered_its_shard_is_not_kept(
    near_pool: ShardedSentinelPool,
) -> None:
    near, shard = near_pool.near, near_pool.shards[0]
    data = Codec().dumps("a reply")
    kept, refused = key_on(near_pool, 0, "fill-kept"), key_on(near_pool, 0, "fill-refused")
    # An intact ticket's reply is kept: the check below is about the replica's answer alone.
    ticket = near.ticket(shard, kept)
    assert ticket is not None
    near.fill(shard, kept, ticket, data, -1)
    # In push mode a hit is refused while anything waits on the tracked socket (a PONG:
    # near_tracking.Arrivals), so the kept reply is looked for until it is served.
    wait_until(lambda: near.get(kept) == data, 5, "the kept reply to be served")
    ticket = near.ticket(shard, refused)
    assert ticket is not None
    shard.note_outage_read()  # what the runner records when a replica answered (outage_read)
    assert not shard.in_outage(shard.generation)  # and the outage is over (or never seen)
    near.fill(shard, refused, ticket, data, -1)
    assert near.get(refused) is None
    assert near.status(0)["in_flight"] == 0
