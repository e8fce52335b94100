"""``make demo``'s near-cache step: a feature flag read by hundreds of requests is served from
this process's memory (hit ratio, and a get timed against the network one), then another writer
(a plain ``redis.Redis`` client, as a Java service would) changes it and the next read returns
the new value."""

from __future__ import annotations

import time
from typing import Any

from example_project.demo_tools import Browser, DemoFailure, sentinel_status, wait_for

HOT_READS = 200  # requests that read the feature flag through the near cache
TIMED_READS = 1000  # gets timed with and without the near cache
STALE_LIMIT = 2.0  # seconds an outside write may take to reach the near cache


def near_cache(demo: Any) -> None:
    """The step, on the running demo."""
    import redis
    from django.conf import settings
    from django.core.cache import caches

    from example_project.views import FLAG_KEY

    demo.out.step("Near cache: a hot feature flag served from this process's memory")
    near, plain = caches["near"], caches["default"]
    core = near.core  # type: ignore[attr-defined]
    key = near.make_key(FLAG_KEY)
    index = core.shard_index(key)
    name = demo.masters[index]

    def stats() -> dict[str, Any]:
        counters: dict[str, Any] = core.status()["shards"][index]["near_cache"]
        return counters

    started = time.monotonic()
    near.get(FLAG_KEY)  # the first use starts the core, and a tracker per shard
    wait_for(
        lambda: all(s["near_cache"]["tracked"] for s in core.status()["shards"]),
        5,
        "near-cache tracking on every shard",
    )
    prefixes = settings.CACHES["near"]["OPTIONS"]["NEAR_CACHE_PREFIXES"]
    demo.out.say(
        f"the 'near' cache alias (same servers and keys as 'default', with NEAR_CACHE and "
        f"NEAR_CACHE_PREFIXES {prefixes}): every master announces changes of those keys "
        f"to this process (CLIENT TRACKING BCAST), tracked "
        f"{(time.monotonic() - started) * 1000:.0f} ms after its first use"
    )
    before = stats()["invalidations"]
    near.set(FLAG_KEY, 10)
    # BCAST tracking tells every client about every write, ours too: wait for the echo of
    # this one, or it could evict the first copy read after it (one extra miss, harmless).
    wait_for(lambda: stats()["invalidations"] > before, 2, "echo of our own write")
    demo.out.say(f"{key} = 10 (set through the cache; its key is on shard {index}, {name})")

    assert demo.browser is not None
    reader = Browser(demo.browser.base)
    start = stats()
    for _ in range(HOT_READS):
        flag = reader.json("/api/flag/")
        if flag["percent"] != 10:
            raise DemoFailure(f"/api/flag/ answered {flag['percent']!r}, expected 10")
    end = stats()
    hits, misses = end["hits"] - start["hits"], end["misses"] - start["misses"]
    demo.out.say(
        f"{HOT_READS} requests to /api/flag/: {hits} reads served from this process's "
        f"memory, {misses} from {name} (hit ratio {hits / max(1, hits + misses):.1%}); "
        f"kept: {end['entries']} entry, {end['bytes']} bytes"
    )
    if hits < HOT_READS * 0.9:
        raise DemoFailure(f"only {hits} of {HOT_READS} reads were near-cache hits")

    local, network = [], []
    for _ in range(TIMED_READS):  # interleaved: both see the same load on this machine
        started = time.perf_counter_ns()
        got_near = near.get(FLAG_KEY)
        middle = time.perf_counter_ns()
        got_plain = plain.get(FLAG_KEY)
        local.append(middle - started)
        network.append(time.perf_counter_ns() - middle)
        if got_near != 10 or got_plain != 10:
            raise DemoFailure(f"read {got_near!r} and {got_plain!r}, expected 10")
    fast, slow = median(local) / 1000, median(network) / 1000
    demo.out.say(
        f"one get() in this process, median of {TIMED_READS}: {fast:.1f} µs from the near "
        f"cache, {slow:.1f} µs through the 'default' alias (a GET round trip to {name}): "
        f"{slow / fast:.0f}x"
    )
    if fast >= slow:
        raise DemoFailure("a near-cache hit was not faster than a network get")

    address = core.shard_for(key).address
    db = core.config.connection_options().get("db", 0)
    seen = stats()["invalidations"]
    with redis.Redis(host=address.host, port=address.port, db=db) as other:
        other.set(key, 50)  # integers are stored as plain decimal: any client can write one
        written = time.monotonic()
    stale = 0
    while (value := near.get(FLAG_KEY)) != 50:
        if value != 10:
            raise DemoFailure(f"read {value!r} after the outside write, expected 10 or 50")
        if time.monotonic() - written > STALE_LIMIT:
            raise DemoFailure(
                f"the near cache still served the old value {STALE_LIMIT:g}s after another "
                f"writer changed {key}: no invalidation arrived"
            )
        stale += 1
    took = time.monotonic() - written
    demo.out.say(
        f"another writer (a plain redis.Redis client on {address.host}:{address.port}, "
        f"standing for another process or a Java service): SET {key} 50"
    )
    demo.out.say(
        f"the cache read 50 {took * 1000:.2f} ms after that write was acknowledged "
        f"({stale} reads before it still saw 10, while the invalidation was on its way); "
        f"invalidations received: +{stats()['invalidations'] - seen}"
    )
    flag = reader.json("/api/flag/")
    if flag["percent"] != 50:
        raise DemoFailure(f"/api/flag/ still answers {flag['percent']!r} after the change")
    demo.out.say("/api/flag/ answers 50 too")
    text, _ = sentinel_status("near")
    rows = text.splitlines()
    head = next((i for i, row in enumerate(rows) if row.startswith("near cache")), None)
    if head is None:
        raise DemoFailure("sentinel_status --cache near printed no near-cache table")
    end_row = next((i for i in range(head, len(rows)) if not rows[i].strip()), len(rows))
    demo.out.say("sentinel_status --cache near, its near-cache table:")
    demo.out.block("\n".join(rows[head:end_row]))


def median(values: list[int]) -> float:
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2])
