"""Memory and scale of the core on a 16-shard topology (16 masters, no replicas, 5 sentinels).

* Memory: a fresh child process imports everything, then builds a ``ShardedSentinelPool`` +
  ``CacheClient`` over N shards, discovers, writes one key per shard (one connection each) and
  lets the listeners subscribe. Reported: the RSS delta (``/proc/self/status`` VmRSS, in a run
  without tracemalloc) and tracemalloc's current/peak (in a separate run), and the thread count.
* Scale: single-key get/set through ``CacheClient`` over the first 2, 4, 8 and 16 masters of the
  same topology, interleaved; plus the ring lookup alone, warm (LRU hit) and cold (new keys).

``python -m benchmarks.scale`` runs it alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from benchmarks.contenders import ShardedRedisPy

SHARD_COUNTS = (2, 4, 8, 16)
OPS = ("get", "set")


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _short(path: str) -> str:
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _child(sentinels: list[str], masters: list[str], trace: bool) -> dict[str, Any]:
    """Runs in a fresh interpreter: the cost of one core over ``masters``."""
    import tracemalloc

    import redis  # noqa: F401  (imported before the baseline, like any app would have)

    from sentinel_cache.core.ops.client import CacheClient
    from sentinel_cache.core.serializers import Codec
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

    gc.collect()
    threads_before = threading.active_count()
    rss_before = _rss_kib()
    if trace:
        tracemalloc.start()
    pool = ShardedSentinelPool(masters, sentinels)
    client = CacheClient(pool, Codec())
    written = set()
    i = 0
    while len(written) < len(masters):  # one key on every shard: one connection each
        key = f"mem:{i}"
        i += 1
        shard = pool.shard_index(key)
        if shard not in written:
            client.set(key, {"v": i}, 60)
            written.add(shard)
    for i in range(2000):  # warm the ring's lookup cache a little, as traffic would
        client.get(f"mem:{i}")
    time.sleep(0.5)  # listeners subscribed
    gc.collect()
    out: dict[str, Any] = {
        "shards": len(masters),
        "sentinels": len(sentinels),
        "threads_added": threading.active_count() - threads_before,
        "ring_nodes": pool.ring.node_count,
    }
    if trace:
        current, peak = tracemalloc.get_traced_memory()
        out["tracemalloc_current_kib"] = current / 1024
        out["tracemalloc_peak_kib"] = peak / 1024
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        out["tracemalloc_top"] = [
            {
                "where": f"{_short(stat.traceback[0].filename)}:{stat.traceback[0].lineno}",
                "kib": stat.size / 1024,
                "blocks": stat.count,
            }
            for stat in snapshot.statistics("lineno")[:8]
        ]
        tracemalloc.stop()
    else:
        out["rss_delta_kib"] = _rss_kib() - rss_before
    pool.close()
    return out


def memory(sentinels: list[str], masters: list[str]) -> dict[str, Any]:
    """RSS and tracemalloc figures for a core over ``masters``, each from its own child."""
    result: dict[str, Any] = {}
    for trace in (False, True):
        argv = [sys.executable, "-m", "benchmarks.scale", "--child", "--json-args"]
        payload = json.dumps({"sentinels": sentinels, "masters": masters, "trace": trace})
        proc = subprocess.run(
            [*argv, payload], capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"memory child failed: {proc.stderr[-2000:]}")
        result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return result


def per_op(
    sentinels: list[str],
    masters: list[str],
    *,
    rounds: int,
    n: int,
    seed: int,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """get/set medians (µs) through CacheClient over 2..16 shards, interleaved."""
    from sentinel_cache.core.ops.client import CacheClient
    from sentinel_cache.core.serializers import Codec
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

    value = {"id": 1, "name": "scale", "tags": ["a", "b"]}
    counts = [c for c in SHARD_COUNTS if c <= len(masters)]
    pools = {c: ShardedSentinelPool(masters[:c], sentinels) for c in counts}
    clients: dict[Any, Any] = {c: CacheClient(pools[c], Codec()) for c in counts}
    # Control: plain redis-py over the same masters (routed by the same ring), so the cost of
    # reaching more server processes is told apart from the library's own per-shard cost.
    for pool in pools.values():
        pool.discover()
    addresses = [shard.address for shard in pools[counts[-1]].shards]
    raw = {
        c: ShardedRedisPy([redis.Redis(host=a.host, port=a.port) for a in addresses[:c]])
        for c in counts
    }
    for c in counts:
        clients[("raw", c)] = _RawAsClient(raw[c])
    keys = [f"scale:{i}" for i in range(1000)]
    variants: list[Any] = [*counts, *[("raw", c) for c in counts]]
    samples: dict[str, dict[Any, list[int]]] = {op: {v: [] for v in variants} for op in OPS}
    cpu: dict[str, dict[Any, list[float]]] = {op: {v: [] for v in variants} for op in OPS}
    rng = random.Random(seed)
    clock = time.perf_counter_ns
    try:
        for c in variants:
            for key in keys:
                clients[c].set(key, value, 300)
        for r in range(rounds):
            for op in rng.sample(OPS, 2):
                for _ in range(4):
                    order = list(variants)
                    rng.shuffle(order)
                    for c in order:
                        client, out = clients[c], samples[op][c]
                        gc.disable()
                        cpu0 = time.thread_time_ns()
                        try:
                            for i in range(n // 4):
                                key = keys[(r * n + i) % len(keys)]
                                t0 = clock()
                                if op == "get":
                                    client.get(key)
                                else:
                                    client.set(key, value, 300)
                                out.append(clock() - t0)
                        finally:
                            gc.enable()
                        cpu[op][c].append((time.thread_time_ns() - cpu0) / (n // 4))
            progress(f"scale round {r + 1}/{rounds} done")
    finally:
        for pool in pools.values():
            pool.close()
        for client in raw.values():
            client.close()
    result: dict[str, Any] = {}
    for op, per in samples.items():
        for prefix, chosen in (("", counts), ("raw_", [("raw", c) for c in counts])):
            result[f"{prefix}{op}"] = {
                str(c[1] if isinstance(c, tuple) else c): statistics.median(per[c]) / 1000
                for c in chosen
            }
            result[f"{prefix}{op}_client_cpu"] = {
                str(c[1] if isinstance(c, tuple) else c): statistics.median(cpu[op][c]) / 1000
                for c in chosen
            }
    result["ring_lookup"] = ring_lookup(counts)
    return result


class _RawAsClient:
    """The control, with CacheClient's get/set signature."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def get(self, key: str) -> Any:
        return self.raw.get("raw:" + key)  # its own keys: ours are framed, not bare pickles

    def set(self, key: str, value: Any, timeout: float) -> Any:
        return self.raw.set("raw:" + key, value)


def ring_lookup(counts: Sequence[int]) -> dict[str, dict[str, float]]:
    """ns per ``HashRing.shard_index``: warm (cached key) and cold (a new key every call)."""
    from sentinel_cache.core.ring import HashRing

    out: dict[str, dict[str, float]] = {"warm_ns": {}, "cold_ns": {}}
    for c in counts:
        ring = HashRing([1] * c)
        warm = [f"warm:{i}" for i in range(100)]
        for key in warm:
            ring.shard_index(key)
        cold = [f"cold:{c}:{i}:{'x' * 20}" for i in range(20000)]
        t0 = time.perf_counter_ns()
        for _ in range(200):
            for key in warm:
                ring.shard_index(key)
        out["warm_ns"][str(c)] = (time.perf_counter_ns() - t0) / 20000
        t0 = time.perf_counter_ns()
        for key in cold:
            ring.shard_index(key)
        out["cold_ns"][str(c)] = (time.perf_counter_ns() - t0) / len(cold)
    return out


def run(
    *, rounds: int = 5, n: int = 400, seed: int = 7, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    from sentinel_cache.testing import LocalSentinelCluster

    with LocalSentinelCluster(shards=16, replicas=0, sentinels=5) as cluster:
        sentinels = [f"{h}:{p}" for h, p in cluster.sentinel_addresses]
        masters = list(cluster.master_names)
        progress(f"scale: 16-shard topology up in {cluster.startup_seconds:.1f}s")
        mem = {str(c): memory(sentinels, masters[:c]) for c in (4, 16)}
        progress("scale: memory done")
        ops = per_op(sentinels, masters, rounds=rounds, n=n, seed=seed, progress=progress)
    return {"memory": mem, "per_op_us": ops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json-args", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.json_args)
        print(json.dumps(_child(spec["sentinels"], spec["masters"], spec["trace"])), flush=True)
        os._exit(0)  # no interpreter teardown noise in the child's stdout
    print(json.dumps(run(rounds=args.rounds), indent=2))


if __name__ == "__main__":
    main()
