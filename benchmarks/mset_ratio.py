"""``python -m benchmarks.mset_ratio``: issue 12's set_many target, side by side in one run.

The Django backend's ``set_many`` of 100 keys with a timeout over 4 shards, against raw
redis-py's ``MSET`` of the same 100 pickled values on one server (no timeout: MSET has none),
interleaved over rounds on one local topology; medians and their ratio.
"""

from __future__ import annotations

import gc
import pickle
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import django
from django.conf import settings

from sentinel_cache.testing import LocalSentinelCluster

ROUNDS, CALLS = 7, 200


def timed(call: Callable[[], Any], calls: int) -> list[float]:
    samples = []
    gc.disable()
    try:
        for _ in range(calls):
            started = time.perf_counter_ns()
            call()
            samples.append((time.perf_counter_ns() - started) / 1000)
    finally:
        gc.enable()
    return samples


def main() -> None:
    value = {"id": 1, "name": "Ada Lovelace", "tags": ["a", "b"], "score": 1.5, "n": None}
    with LocalSentinelCluster(shards=4, replicas=0, sentinels=1) as cluster:
        config = cluster.config()
        settings.configure(
            CACHES={
                "default": {
                    "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
                    "LOCATION": config["sentinels"],
                    "OPTIONS": {"MASTERS": config["masters"]},
                }
            }
        )
        django.setup()
        from django.core.cache import cache

        raw = cluster.node_client(cluster.master_address(config["masters"][0]))
        mapping = {f"mset:{i}": value for i in range(100)}
        contenders: dict[str, Callable[[], Any]] = {
            "redis-py MSET, 1 server": lambda: raw.mset(
                {k: pickle.dumps(v, pickle.HIGHEST_PROTOCOL) for k, v in mapping.items()}
            ),
            "Django backend set_many(timeout=300), 4 shards": lambda: cache.set_many(mapping, 300),
        }
        results: dict[str, list[float]] = {name: [] for name in contenders}
        for call in contenders.values():
            timed(call, 20)  # warm up connections and the ring
        for _ in range(ROUNDS):
            for name in random.sample(list(contenders), len(contenders)):
                results[name].extend(timed(contenders[name], CALLS))
        medians = {name: statistics.median(samples) for name, samples in results.items()}
        floor = medians["redis-py MSET, 1 server"]
        for name, median in medians.items():
            print(f"{name:50s} {median:9.1f} µs  {median / floor:.2f}x")
        raw.close()


if __name__ == "__main__":
    main()
