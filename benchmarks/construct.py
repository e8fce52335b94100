"""What building the Django backend object costs (issue 37, item 5).

Django builds a new cache backend object for every ASGI request (``caches`` is a context-local)
and per thread, from the same ``CACHES`` entry each time. Timed here, interleaved in a new
random order every round (:func:`benchmarks.ratios.compare`), medians of the rounds' samples,
each sample a batch of builds, as Django's cache handler builds one (a shallow copy of the
entry, its ``OPTIONS`` the same dict):

* ours from settings already seen: a lookup of the parsed configuration, codec and clients;
* ours from settings first seen: the parse every build paid before (now also the memo's key and
  store), each build given options no build saw before (more of them than the memo keeps);
* Django's own ``RedisCache``, the reference: it parses nothing until first use.

No server is needed: construction never connects. Wall time and the thread's CPU time.
``targets(rows)`` turns "settings already seen: <= 25 µs" into a PASS/FAIL line.

``python -m benchmarks.construct`` runs it alone; ``make bench`` includes it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from benchmarks.ratios import compare

SCENARIO = "build the Django backend object"
SEEN, FIRST = "ours, settings already seen", "ours, settings first seen (a parse)"
REDIS_CACHE = "Django RedisCache (parses on first use)"
TARGET_US = 25.0
LOCATION = ["127.0.0.1:26379", "127.0.0.1:26380", "127.0.0.1:26381"]
# A realistic entry: 4 shards, a prefix, a timeout, a few options.
ENTRY: dict[str, Any] = {
    "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
    "LOCATION": LOCATION,
    "TIMEOUT": 300,
    "KEY_PREFIX": "site",
    "OPTIONS": {
        "MASTERS": ["shard_a", "shard_b", "shard_c", "shard_d"],
        "DB": 0,
        "SOCKET_TIMEOUT": 0.5,
        "IGNORE_EXCEPTIONS": True,
    },
}


def _django() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(USE_TZ=True, INSTALLED_APPS=[], CACHES={})
        django.setup()


def _handler_build(cls: type, entry: dict[str, Any]) -> Any:
    """What Django's ``CacheHandler.create_connection`` does with an entry."""
    params = entry.copy()
    params.pop("BACKEND")
    location = params.pop("LOCATION", "")
    return cls(location, params)


def contenders() -> dict[str, Callable[[], Any]]:
    _django()
    from django.core.cache.backends.redis import RedisCache

    from sentinel_cache.django import ShardedSentinelCache

    # 20,000 distinct settings, cycled: far more than the memo keeps, so every build parses.
    fresh = itertools.cycle(
        [
            {**ENTRY, "OPTIONS": {**ENTRY["OPTIONS"], "SOCKET_TIMEOUT": 0.5 + n / 1e6}}
            for n in range(20_000)
        ]
    )
    redis_entry = {**ENTRY, "LOCATION": "redis://127.0.0.1:6379/0", "OPTIONS": {}}
    return {
        SEEN: lambda: _handler_build(ShardedSentinelCache, ENTRY),
        FIRST: lambda: _handler_build(ShardedSentinelCache, next(fresh)),
        REDIS_CACHE: lambda: _handler_build(RedisCache, redis_entry),
    }


def run(*, rounds: int = 5, calls: int = 200, batch: int = 10) -> list[dict[str, Any]]:
    """Median µs per build (wall and thread CPU), and each one's ratio to RedisCache's."""
    builds = contenders()
    wall = compare(builds, rounds=rounds, calls=calls, batch=batch)
    cpu = compare(builds, rounds=rounds, calls=calls, clock=time.thread_time_ns, batch=batch)
    return [
        {
            "scenario": SCENARIO,
            "contender": name,
            "median_us": wall[name],
            "cpu_us": cpu[name],
            "ratio": wall[name] / wall[REDIS_CACHE],
        }
        for name in builds
    ]


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    row = next((r for r in rows if r["contender"] == SEEN), None)
    first = next((r for r in rows if r["contender"] == FIRST), None)
    target = f"building the Django backend object from settings already seen: <= {TARGET_US:g} µs"
    if row is None or first is None:
        return [{"target": target, "result": "N/A", "detail": "not measured"}]
    return [
        {
            "target": target,
            "result": "PASS" if row["median_us"] <= TARGET_US else "FAIL",
            "detail": f"{row['median_us']:.1f} µs (first seen, a parse: {first['median_us']:.1f} µs)",
        }
    ]


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["scenario", "contender", "median", "ratio"]
    return header, [
        [
            r["scenario"],
            r["contender"],
            f"{r['median_us']:.1f} µs (CPU {r['cpu_us']:.1f} µs)",
            f"{r['ratio']:.2f}x RedisCache",
        ]
        for r in rows
    ]


def main() -> None:
    rows = run()
    header, body = table(rows)
    for line in [header, *body]:
        print(f"{line[0]:32s} {line[1]:38s} {line[2]:>28s} {line[3]:>16s}")
    for target in targets(rows):
        print(f"{target['result']}: {target['target']} ({target['detail']})")


if __name__ == "__main__":
    main()
