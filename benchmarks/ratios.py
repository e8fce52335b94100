"""Side-by-side ratios for targets stated as "at most N x" another call (issues 12 and 15).

Each scenario times its contenders interleaved in random order over rounds, on one topology,
in one process, and reports medians and their ratio to the scenario's floor:

* ``set_many`` of 100 keys with a timeout through the Django backend over 4 shards, against raw
  redis-py's ``MSET`` of the same 100 pickled values on one server (MSET sets no expiry), and the
  same ``set_many`` without a timeout (one ``MSET`` per shard) to tell the two costs apart;
* a single-key ``get`` through the Django backend with ``METRICS = True``, against the same get
  with metrics off.

``python -m benchmarks.ratios`` runs them alone; ``make bench`` includes them.
"""

from __future__ import annotations

import gc
import pickle
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from sentinel_cache.testing import LocalSentinelCluster

VALUE = {"id": 1, "name": "Ada Lovelace", "tags": ["a", "b"], "score": 1.5, "n": None}


def _timed(
    call: Callable[[], Any], calls: int, clock: Callable[[], int], batch: int = 1
) -> list[float]:
    """µs per call, one sample per ``batch`` consecutive calls (a batch keeps the clock's own
    cost, about 0.1 µs a reading, out of calls that take a few microseconds)."""
    samples = []
    repeat = range(batch)
    gc.disable()
    try:
        for _ in range(calls):
            started = clock()
            for _ in repeat:
                call()
            samples.append((clock() - started) / 1000 / batch)
    finally:
        gc.enable()
    return samples


def compare(
    contenders: dict[str, Callable[[], Any]],
    *,
    rounds: int,
    calls: int,
    clock: Callable[[], int] = time.perf_counter_ns,
    batch: int = 1,
) -> dict[str, float]:
    """Median µs per contender, interleaved in a new random order every round. ``clock``:
    wall time (the default), or ``time.thread_time_ns`` for the caller's own CPU time, which
    the other processes of a shared machine disturb far less. ``batch``: calls per sample, the
    same for every contender."""
    results: dict[str, list[float]] = {name: [] for name in contenders}
    for call in contenders.values():
        _timed(call, 20, clock)  # warm up connections and the ring
    for _ in range(rounds):
        for name in random.sample(list(contenders), len(contenders)):
            results[name].extend(_timed(contenders[name], calls, clock, batch))
    return {name: statistics.median(samples) for name, samples in results.items()}


def run(*, rounds: int = 7, calls: int = 200) -> list[dict[str, Any]]:
    """Every scenario: rows of (scenario, contender, median µs, ratio to the floor)."""
    from sentinel_cache.django import ShardedSentinelCache

    rows: list[dict[str, Any]] = []

    def add(scenario: str, medians: dict[str, float], floor: str) -> None:
        for name, median in medians.items():
            rows.append(
                {
                    "scenario": scenario,
                    "contender": name,
                    "median_us": median,
                    "ratio": median / medians[floor],
                }
            )

    with LocalSentinelCluster(shards=4, replicas=0, sentinels=1) as cluster:
        config = cluster.config()
        raw = cluster.node_client(cluster.master_address(config["masters"][0]))
        cache = ShardedSentinelCache(
            config["sentinels"], {"OPTIONS": {"MASTERS": config["masters"]}}
        )
        mapping = {f"mset:{i}": VALUE for i in range(100)}
        mset = "redis-py MSET, 1 server"
        add(
            "set_many of 100 keys",
            compare(
                {
                    mset: lambda: raw.mset(
                        {k: pickle.dumps(v, pickle.HIGHEST_PROTOCOL) for k, v in mapping.items()}
                    ),
                    "Django set_many(timeout=300), 4 shards": lambda: cache.set_many(mapping, 300),
                    # The same without expiry (one MSET per shard): what sharding itself costs;
                    # the rest is the server setting a TTL per key (Redis 7.0 has no MSETEX).
                    "Django set_many(timeout=None), 4 shards": lambda: cache.set_many(
                        mapping, None
                    ),
                },
                rounds=rounds,
                calls=calls,
            ),
            mset,
        )
        caches = {
            flag: ShardedSentinelCache(
                config["sentinels"], {"OPTIONS": {"MASTERS": config["masters"], "METRICS": flag}}
            )
            for flag in (False, True)
        }
        for backend in caches.values():
            backend.set("ratio:get", VALUE, None)
        off = "Django get, METRICS off"
        gets = {
            off: lambda: caches[False].get("ratio:get"),
            "Django get, METRICS on": lambda: caches[True].get("ratio:get"),
        }
        add("single-key get (wall)", compare(gets, rounds=rounds, calls=calls * 5), off)
        add(
            "single-key get (client CPU)",
            compare(gets, rounds=rounds, calls=calls * 5, clock=time.thread_time_ns),
            off,
        )
        raw.close()
    return rows


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["scenario", "contender", "median", "ratio"]
    return header, [
        [r["scenario"], r["contender"], f"{r['median_us']:.1f} µs", f"{r['ratio']:.2f}x"]
        for r in rows
    ]


def main() -> None:
    header, body = table(run())
    for row in [header, *body]:
        print(f"{row[0]:22s} {row[1]:42s} {row[2]:>12s} {row[3]:>7s}")


if __name__ == "__main__":
    main()
