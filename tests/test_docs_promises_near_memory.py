"""docs/near-cache.md, "Memory cost": what a near-cache copy costs beyond its stored bytes.

10,000 values of 117 stored bytes are read through a near cache on real servers, each kept as
a copy; the heap they add (``tracemalloc``, the keys made beforehand) is printed with ``-s``
(``python -m pytest -s tests/test_docs_promises_near_memory.py``), the figure the page quotes.
What is asserted is that every copy is kept and counted at its stored size: the page's bound
(``NEAR_CACHE_MAX_BYTES`` counts the stored, serialized bytes) depends on it.
"""

from __future__ import annotations

import gc
import tracemalloc

from waiting import wait_until

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

COPIES = 10_000
STORED = 117


def test_the_heap_a_copy_costs(cluster: LocalSentinelCluster) -> None:
    codec = Codec()
    empty = codec.dumps("")
    assert isinstance(empty, bytes)
    value = "v" * (STORED - len(empty))
    stored = codec.dumps(value)
    assert isinstance(stored, bytes) and len(stored) == STORED
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, near_cache=True, db=7
    )
    try:
        client = CacheClient(core, codec)
        keys = [f"near:memory:{n}" for n in range(COPIES)]
        assert client.set_many(dict.fromkeys(keys, value), 600) == []
        core.discover()
        near = core.near
        assert near is not None
        wait_until(lambda: all(near.status(i)["tracked"] for i in range(2)), 10, "tracking")
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for key in keys:
            assert client.get(key) == value
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        shards = [near.status(i) for i in range(2)]
        assert sum(s["entries"] for s in shards) == COPIES  # every copy kept
        assert sum(s["bytes"] for s in shards) == COPIES * STORED  # counted at its stored size
        client.delete_many(keys)
    finally:
        core.close()
    print(
        f"\nnear cache: {COPIES} copies of {STORED}-byte stored values: {grown / 1e6:.2f} MB "
        f"of heap, {grown / COPIES - STORED:.0f} bytes per copy beyond the stored bytes"
    )
