"""The near cache's figures (issue 13), side by side in one run on one local topology:

* a near-cache hit through the Django backend against raw redis-py ``GET`` + unpickle on one
  server (target: at most 0.05x);
* the staleness window after another writer's acknowledged write: from its acknowledgement to
  the first read through the backend that returns the new value (median, p99, max; targets p99
  at most 5 ms, max at most 50 ms on loopback);
* a 90/10 read/write mix on 1,000 hot keys from 8 threads, with and without the near cache
  (target: at least 5x the throughput).

redis-py's own client-side cache needs a server that reports 7.4 or later: Debian's Redis 7.0
and Valkey 9.1 (which reports 7.2.4) both refuse it, so it is not measured here.

``python -m benchmarks.near`` runs it alone; ``make bench`` includes it.
"""

from __future__ import annotations

import pickle
import random
import statistics
import threading
import time
from typing import Any

import redis

from benchmarks.ratios import VALUE, compare
from sentinel_cache.testing import LocalSentinelCluster
from tests.threads import Workers


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _mix(cache: Any, keys: list[str], threads: int, seconds: float) -> float:
    """Operations per second of a 90/10 get/set mix over ``keys`` from ``threads`` threads."""
    done = [0] * threads
    stop = threading.Event()

    def work(n: int) -> None:
        rng = random.Random(n)
        count = 0
        while not stop.is_set():
            key = keys[rng.randrange(len(keys))]
            if rng.random() < 0.9:
                cache.get(key)
            else:
                cache.set(key, VALUE, None)
            count += 1
        done[n] = count

    with Workers(timeout=30) as workers:  # a worker that raised fails the run
        for n in range(threads):
            workers.spawn(work, n, name=f"bench-mix-{n}")
        time.sleep(seconds)
        stop.set()
    return sum(done) / seconds


def run(*, rounds: int = 5, calls: int = 2000, staleness_samples: int = 300) -> dict[str, Any]:
    from sentinel_cache.django import ShardedSentinelCache

    results: dict[str, Any] = {}
    with LocalSentinelCluster(shards=2, replicas=0, sentinels=1) as cluster:
        config = cluster.config()

        def backend(near: bool, db: int) -> Any:
            options = {"MASTERS": config["masters"], "NEAR_CACHE": near, "DB": db}
            return ShardedSentinelCache(config["sentinels"], {"OPTIONS": options})

        near, plain = backend(True, 1), backend(False, 1)
        near.set("hot", VALUE, None)
        address = near.core.shard_for(near.make_key("hot")).address
        raw = redis.Redis(host=address.host, port=address.port, db=1)
        stored = near.make_key("hot")
        raw.set("raw:hot", pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL))
        deadline = time.monotonic() + 5
        while not near.core.status()["shards"][0]["near_cache"]["tracked"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the near cache did not start tracking")
            time.sleep(0.01)
        while near.core.near.get(stored) is None:  # type: ignore[union-attr]
            near.get("hot")
        medians = compare(
            {
                "raw redis-py GET + unpickle, 1 server": lambda: pickle.loads(raw.get("raw:hot")),
                "Django get, near-cache hit": lambda: near.get("hot"),
            },
            rounds=rounds,
            calls=calls // 10,
            batch=10,  # ten calls per clock reading: a hit takes a few microseconds
        )
        floor = medians["raw redis-py GET + unpickle, 1 server"]
        results["hit"] = {name: (us, us / floor) for name, us in medians.items()}

        # Staleness: another writer's acknowledged SET, then reads until the new value shows.
        codec = near.client.codec
        samples = []
        for n in range(staleness_samples):
            near.get("hot")  # kept locally
            new = {"n": n}
            raw.set(stored, codec.dumps(new))
            acked = time.perf_counter()
            while near.get("hot") != new:
                time.sleep(0)  # a request thread yields the GIL (I/O); a pure spin would hold
                # it for the interpreter's whole switch interval (5 ms) against the tracker
            samples.append((time.perf_counter() - acked) * 1000)
        results["staleness_ms"] = {
            "median": statistics.median(samples),
            "p99": _quantile(samples, 0.99),
            "max": max(samples),
            "samples": len(samples),
        }

        keys = [f"mix:{n}" for n in range(1000)]
        for cache in (near, plain):
            cache.set_many(dict.fromkeys(keys, VALUE), None)
        _mix(near, keys, 8, 0.5)  # warm: the copies
        results["mix_ops_per_s"] = {
            "without near cache": _mix(plain, keys, 8, 2.0),
            "with near cache": _mix(near, keys, 8, 2.0),
        }
        raw.close()
        near.core.close()
        plain.core.close()
    return results


def table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    rows = [[name, f"{us:.2f} µs", f"{ratio:.3f}x"] for name, (us, ratio) in results["hit"].items()]
    stale = results["staleness_ms"]
    rows.append(
        [
            f"staleness after an outside write ({stale['samples']} writes)",
            f"median {stale['median']:.3f} ms, p99 {stale['p99']:.3f} ms",
            f"max {stale['max']:.3f} ms",
        ]
    )
    mix = results["mix_ops_per_s"]
    base = mix["without near cache"]
    for name, ops in mix.items():
        rows.append(
            [f"90/10 mix, 1,000 keys, 8 threads, {name}", f"{ops:,.0f} ops/s", f"{ops / base:.2f}x"]
        )
    return ["measure", "value", "ratio"], rows


def main() -> None:
    header, rows = table(run())
    for row in [header, *rows]:
        print(f"{row[0]:58s} {row[1]:>38s} {row[2]:>10s}")


if __name__ == "__main__":
    main()
