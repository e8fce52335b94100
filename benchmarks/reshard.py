"""Resharding's figures (issue 14), on one local topology of three masters (no replicas):

* the migration rate (``sentinel_cache.core.admin.reshard.migrate``) after appending a master to two,
  with values of 100 B, 1 KB and 10 KB (random bytes: nothing for ``DUMP`` to compress); keys
  moved per second over the wall time of the whole call (the final delete delay included), the
  median of three runs, and the scan rate (about two thirds of the keys scanned stay where they
  are). Target: at least 25,000 keys/s with 1 KB values;
* the cost of the transitional ring's fallback read, side by side (medians, interleaved): a get
  of a key still on its previous owner (read there and moved: the first read of each moved key)
  against a plain get without ``PREVIOUS_MASTERS``; and, for scale, a hit and a miss on the
  owner with ``PREVIOUS_MASTERS`` set. Target: at most 2.5x;
* a reader reading every key that existed before the migration, during it (``get_many`` of 100
  keys at a time): its misses (target 0); then every key on its ring owner, no copy left
  anywhere else, none lost.

``python -m benchmarks.reshard`` runs it alone.
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks.ratios import VALUE, compare
from sentinel_cache.core.admin import reshard
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ring import HashRing
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster
from tests.threads import Workers

BEFORE = ["shard0", "shard1"]
AFTER = ["shard0", "shard1", "shard2"]
TTL_MS = 3_600_000
# Keys written before the append: about a third of them move. Fewer for bigger values.
SIZES = {100: 150_000, 1000: 150_000, 10_000: 30_000}


def _flush(cluster: LocalSentinelCluster) -> None:
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            node.flushall()


def _place(cluster: LocalSentinelCluster, keys: list[str], data: bytes) -> None:
    """``keys`` written where the two-master ring puts them, pipelined, with a TTL."""
    ring = HashRing([1, 1])
    nodes = {name: cluster.node_client(cluster.master_address(name)) for name in BEFORE}
    try:
        for start in range(0, len(keys), 2000):
            pipes = {name: node.pipeline(transaction=False) for name, node in nodes.items()}
            for key in keys[start : start + 2000]:
                pipes[BEFORE[ring.shard_index(key)]].set(key, data, px=TTL_MS)
            for pipe in pipes.values():
                pipe.execute()
    finally:
        for node in nodes.values():
            node.close()


def _settled(cluster: LocalSentinelCluster, keys: list[str]) -> dict[str, int]:
    """After the migration: keys lost, and keys found anywhere but on their owner."""
    ring = HashRing([1, 1, 1])
    wanted = set(keys)
    found: dict[str, list[str]] = {}
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            for key in node.scan_iter(count=2000):
                found.setdefault(key.decode(), []).append(name)
    misplaced = sum(1 for key, names in found.items() if names != [AFTER[ring.shard_index(key)]])
    return {"lost": len(wanted - set(found)), "misplaced": misplaced, "keys": len(keys)}


def _core(cluster: LocalSentinelCluster) -> ShardedSentinelPool:
    return ShardedSentinelPool(
        AFTER, cluster.sentinel_addresses, previous_masters=BEFORE, listeners=False
    )


def _migration_rates(cluster: LocalSentinelCluster, repeats: int) -> list[dict[str, Any]]:
    """Per value size, the median of ``repeats`` migrations (each on freshly written keys)."""
    rows = []
    for size, count in SIZES.items():
        runs = []
        for _ in range(repeats):
            _flush(cluster)
            keys = [f"bench:{size}:{n}" for n in range(count)]
            _place(cluster, keys, Codec().dumps(os.urandom(size)))
            core = _core(cluster)
            try:
                core.discover()
                began = time.perf_counter()
                report = reshard.migrate(core)
                seconds = time.perf_counter() - began
            finally:
                core.close()
            runs.append(
                {
                    "value_bytes": size,
                    "keys": count,
                    "moved": report.moved,
                    "seconds": seconds,
                    "keys_per_s": report.moved / seconds,
                    "mb_per_s": report.moved * size / seconds / 1e6,
                    "scanned_per_s": report.scanned / seconds,
                    "complete": report.complete,
                    **_settled(cluster, keys),
                }
            )
        runs.sort(key=lambda r: r["keys_per_s"])
        median = dict(runs[len(runs) // 2])
        median["runs_keys_per_s"] = [r["keys_per_s"] for r in runs]
        median["lost"] = sum(r["lost"] for r in runs)
        median["misplaced"] = sum(r["misplaced"] for r in runs)
        rows.append(median)
    return rows


def _fallback_cost(cluster: LocalSentinelCluster, *, rounds: int, calls: int) -> dict[str, Any]:
    from sentinel_cache.django import ShardedSentinelCache

    _flush(cluster)
    sentinels = cluster.config()["sentinels"]

    def backend(masters: list[str], **options: Any) -> Any:
        return ShardedSentinelCache(
            sentinels, {"OPTIONS": {"MASTERS": masters, "LISTENERS": False, **options}}
        )

    old = backend(BEFORE)
    plain = backend(AFTER)
    transitional = backend(AFTER, PREVIOUS_MASTERS=BEFORE)
    needed = 20 + rounds * calls + 50
    moving: list[str] = []
    n = 0
    while len(moving) < needed:
        key = f"fb:{n}"
        n += 1
        if transitional.core.previous_shard_for(transitional.make_key(key)) is not None:
            moving.append(key)
    old.set_many(dict.fromkeys(moving, VALUE), 3600)
    plain.set("fb:hot", VALUE, 3600)
    absent = [
        key
        for key in (f"absent:{n}" for n in range(5000))
        if transitional.core.previous_shard_for(transitional.make_key(key)) is not None
    ]
    queue = iter(moving)
    misses = iter(absent * (needed // max(1, len(absent)) + 1))
    plain_get = "get without PREVIOUS_MASTERS (hit)"
    medians = compare(
        {
            plain_get: lambda: plain.get("fb:hot"),
            "get with PREVIOUS_MASTERS, key on its owner (hit)": lambda: transitional.get("fb:hot"),
            "get of a key still on its previous owner (fallback + move)": lambda: transitional.get(
                next(queue)
            ),
            "get with PREVIOUS_MASTERS, key absent (miss, both owners asked)": lambda: (
                transitional.get(next(misses))
            ),
        },
        rounds=rounds,
        calls=calls,
    )
    for cache in (old, plain, transitional):
        cache.core.close()
    floor = medians[plain_get]
    return {name: {"median_us": us, "ratio": us / floor} for name, us in medians.items()}


def _reader_during_migration(cluster: LocalSentinelCluster, count: int) -> dict[str, Any]:
    _flush(cluster)
    keys = [f"rd:{n}" for n in range(count)]
    _place(cluster, keys, Codec().dumps(os.urandom(1000)))
    migrating, reading = _core(cluster), _core(cluster)
    workers = Workers(timeout=30)
    stop = workers.stop
    seen = {"reads": 0, "misses": 0, "passes": 0}

    def read() -> None:
        client = CacheClient(reading, Codec())
        while not stop.is_set():
            for start in range(0, len(keys), 100):
                batch = keys[start : start + 100]
                found = client.get_many(batch)
                seen["reads"] += len(batch)
                seen["misses"] += len(batch) - len(found)
                if stop.is_set():
                    break
            else:
                seen["passes"] += 1

    try:
        with workers:  # a reader that raised fails the run: its misses would be undercounted
            workers.spawn(read, name="bench-reader")
            time.sleep(0.05)
            began = time.perf_counter()
            report = reshard.migrate(migrating)
            seconds = time.perf_counter() - began
    finally:
        migrating.close()
        reading.close()
    return {
        **seen,
        "migration_seconds": seconds,
        "moved_by_migration": report.moved,
        "moved_by_readers_first": report.already_present,
        **_settled(cluster, keys),
    }


def run(
    *, rounds: int = 5, calls: int = 200, repeats: int = 3, reader_keys: int = 60_000
) -> dict[str, Any]:
    with LocalSentinelCluster(shards=3, replicas=0, sentinels=1) as cluster:
        return {
            "migration": _migration_rates(cluster, repeats),
            "fallback": _fallback_cost(cluster, rounds=rounds, calls=calls),
            "reader": _reader_during_migration(cluster, reader_keys),
        }


def table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for r in results["migration"]:
        rows.append(
            [
                f"migration, {r['value_bytes']:,} B values ({r['moved']:,} of {r['keys']:,} "
                "keys move)",
                f"{r['keys_per_s']:,.0f} keys/s ({r['mb_per_s']:.0f} MB/s)",
                f"median of {len(r['runs_keys_per_s'])} runs ("
                + ", ".join(f"{x:,.0f}" for x in r["runs_keys_per_s"])
                + f"); {r['scanned_per_s']:,.0f} scanned/s; lost {r['lost']}, misplaced "
                f"{r['misplaced']}",
            ]
        )
    for name, figures in results["fallback"].items():
        rows.append([name, f"{figures['median_us']:.1f} µs", f"{figures['ratio']:.2f}x"])
    reader = results["reader"]
    rows.append(
        [
            f"reader during a migration of {reader['keys']:,} keys (get_many of 100)",
            f"{reader['misses']} misses in {reader['reads']:,} reads",
            f"lost {reader['lost']}, misplaced {reader['misplaced']}",
        ]
    )
    return ["measure", "value", "notes"], rows


def main() -> None:
    header, body = table(run())
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(3)]
    for row in [header, *body]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
