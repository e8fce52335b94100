"""Side-by-side ratios for targets stated as "at most N x" another call (issues 12 and 15).

Each scenario times its contenders interleaved in random order over rounds, on one topology,
in one process, and reports medians and their ratio to the scenario's floor:

* ``set_many`` of 100 keys with a timeout through the Django backend over 4 shards, against raw
  redis-py's ``MSET`` of the same 100 pickled values on one server (MSET sets no expiry), and the
  same ``set_many`` without a timeout (one ``MSET`` per shard) to tell the two costs apart;
* a single-key ``get`` and a ``get_many`` of 10 keys over the 4 shards through the Django
  backend with ``METRICS = True``, against the same calls with metrics off: one cache whose
  core's backend is set or unset before each call (the same connections and objects, only the
  recording differs), beside a second cache with metrics off (what two caches differ by);
  each sample one call of each, back to back (:func:`paired`: the ratio is the median of the
  samples' ratios), since the difference looked for is a few percent;
* one thread's (and one asyncio task's) back-to-back ``GET`` through the core's fair pool,
  against redis-py's ``BlockingConnectionPool`` (target: at least 0.6x its rate);
* a round trip through the chaos harness's fault proxy to a node that has no fault, while
  another node is delayed 100 ms, against the same round trip past the proxy (target: more than
  1,000 round trips/s on one connection, so far under the 50 ms that would look delayed).

``targets(rows)`` turns each stated target into a PASS/FAIL line for the report.

``python -m benchmarks.ratios`` runs them alone; ``make bench`` includes them.
"""

from __future__ import annotations

import asyncio
import gc
import pickle
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

from sentinel_cache.core.topology.fair_pool import (
    AsyncFairBlockingConnectionPool,
    FairBlockingConnectionPool,
)
from sentinel_cache.testing import LocalSentinelCluster

VALUE = {"id": 1, "name": "Ada Lovelace", "tags": ["a", "b"], "score": 1.5, "n": None}
SET_MANY = "set_many of 100 keys"
MSET = "redis-py MSET, 1 server"
SET_MANY_TTL = "Django set_many(timeout=300), 4 shards"
GET_WALL = "single-key get (wall)"
METRICS_OFF, METRICS_ON = "Django get, METRICS off", "Django get, METRICS on"
MANY_OFF, MANY_ON = "Django get_many[10], METRICS off", "Django get_many[10], METRICS on"
OTHER_CACHE = "Django get, another cache, METRICS off"
OTHER_CACHE_MANY = "Django get_many[10], another cache, METRICS off"
GET_MANY_WALL = "get_many of 10 keys (wall)"
POOL_SYNC, POOL_ASYNC = "one thread's GETs (wall)", "one asyncio task's GETs (wall)"
REDIS_POOL, FAIR_POOL = (
    "redis-py BlockingConnectionPool",
    "sentinel_cache FairBlockingConnectionPool",
)
PROXY = "round trip to a node without faults, another delayed 100 ms"
DIRECT, PROXIED = "GET past the fault proxy", "GET through the fault proxy"
AWAITS = 50  # awaited GETs per run_until_complete: the event loop's own entry cost amortised


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


def paired(
    contenders: dict[str, Callable[[], Any]],
    floor: str,
    *,
    samples: int,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, float]:
    """Median µs per contender, and (under ``"<name> ratio"``) the median of its per-sample
    ratios to ``floor``: each sample one call of every contender, back to back in a new random
    order. For a difference of a few percent, which :func:`compare`'s rounds (a block of calls
    per contender) cannot resolve on a shared VM: the machine's state drifts between blocks
    by more than that, not between two adjacent calls."""
    names = list(contenders)
    for call in contenders.values():
        _timed(call, 20, clock)
    times: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    gc.disable()
    try:
        for _ in range(samples):
            took = {}
            for name in random.sample(names, len(names)):
                started = clock()
                contenders[name]()
                took[name] = (clock() - started) / 1000
            for name in names:
                times[name].append(took[name])
                ratios[name].append(took[name] / took[floor])
    finally:
        gc.enable()
    medians = {name: statistics.median(values) for name, values in times.items()}
    medians.update({f"{name} ratio": statistics.median(ratios[name]) for name in names})
    return medians


def run(*, rounds: int = 7, calls: int = 200) -> list[dict[str, Any]]:
    """Every scenario: rows of (scenario, contender, median µs, ratio to the floor)."""
    from sentinel_cache.django import ShardedSentinelCache

    rows: list[dict[str, Any]] = []

    def add(scenario: str, medians: dict[str, float], floor: str) -> None:
        # A paired comparison's ratio is the median of its samples' ratios (see paired).
        for name, median in medians.items():
            if name.endswith(" ratio"):
                continue
            rows.append(
                {
                    "scenario": scenario,
                    "contender": name,
                    "median_us": median,
                    "ratio": medians.get(f"{name} ratio", median / medians[floor]),
                }
            )

    with LocalSentinelCluster(shards=4, replicas=0, sentinels=1) as cluster:
        config = cluster.config()
        raw = cluster.node_client(cluster.master_address(config["masters"][0]))
        cache = ShardedSentinelCache(
            config["sentinels"], {"OPTIONS": {"MASTERS": config["masters"]}}
        )
        mapping = {f"mset:{i}": VALUE for i in range(100)}
        add(
            SET_MANY,
            compare(
                {
                    MSET: lambda: raw.mset(
                        {k: pickle.dumps(v, pickle.HIGHEST_PROTOCOL) for k, v in mapping.items()}
                    ),
                    SET_MANY_TTL: lambda: cache.set_many(mapping, 300),
                    # The same without expiry (one MSET per shard): what sharding itself costs;
                    # the rest is the server setting a TTL per key (Redis 7.0 has no MSETEX).
                    "Django set_many(timeout=None), 4 shards": lambda: cache.set_many(
                        mapping, None
                    ),
                },
                rounds=rounds,
                calls=calls,
            ),
            MSET,
        )
        # METRICS on and off: one cache (METRICS = True), its core's backend set or unset
        # before each call, so both sides share the connections and objects and only the
        # recording differs; a second cache with metrics off shows what two caches differ by
        # anyway (3.4 % once, with metrics off in both).
        caches = {
            flag: ShardedSentinelCache(
                config["sentinels"], {"OPTIONS": {"MASTERS": config["masters"], "METRICS": flag}}
            )
            for flag in (False, True)
        }
        many = [f"ratio:many:{n}" for n in range(10)]
        for backend in caches.values():
            backend.set("ratio:get", VALUE, None)
            backend.set_many(dict.fromkeys(many, VALUE), None)
        core = caches[True].core
        recording = core.metrics

        def metrics(on: bool, call: Callable[[], Any]) -> Callable[[], Any]:
            backend = recording if on else None

            def timed() -> Any:
                core.metrics = backend
                return call()

            return timed

        def get() -> Any:
            return caches[True].get("ratio:get")

        def get_many() -> Any:
            return caches[True].get_many(many)

        gets = {
            METRICS_OFF: metrics(False, get),
            METRICS_ON: metrics(True, get),
            OTHER_CACHE: lambda: caches[False].get("ratio:get"),
        }
        samples = rounds * calls * 5
        add(GET_WALL, paired(gets, METRICS_OFF, samples=samples), METRICS_OFF)
        add(
            "single-key get (client CPU)",
            paired(gets, METRICS_OFF, samples=samples, clock=time.thread_time_ns),
            METRICS_OFF,
        )
        reads = {
            MANY_OFF: metrics(False, get_many),
            MANY_ON: metrics(True, get_many),
            OTHER_CACHE_MANY: lambda: caches[False].get_many(many),
        }
        add(GET_MANY_WALL, paired(reads, MANY_OFF, samples=rounds * calls * 2), MANY_OFF)
        core.metrics = recording
        host, port = cluster.master_address(config["masters"][0])
        node = {"host": host, "port": port, "password": cluster.requirepass}
        add(POOL_SYNC, _pools(node, rounds=rounds, calls=calls * 5), REDIS_POOL)
        add(POOL_ASYNC, _async_pools(node, rounds=rounds, calls=calls), REDIS_POOL)
        raw.close()
    with LocalSentinelCluster(shards=2, replicas=0, sentinels=1, faults=True) as cluster:
        add(PROXY, _proxy(cluster, rounds=rounds, calls=calls * 5), DIRECT)
    return rows


def _pools(node: dict[str, Any], *, rounds: int, calls: int) -> dict[str, float]:
    """One thread's back-to-back GETs through each pool (two connections allowed)."""
    pools = {
        REDIS_POOL: redis.BlockingConnectionPool(max_connections=2, timeout=2, **node),
        FAIR_POOL: FairBlockingConnectionPool(max_connections=2, timeout=2, **node),
    }
    clients = {name: redis.Redis(connection_pool=pool) for name, pool in pools.items()}
    clients[REDIS_POOL].set("ratio:pool", b"v")
    try:
        return compare(
            {name: lambda c=client: c.get("ratio:pool") for name, client in clients.items()},
            rounds=rounds,
            calls=calls,
        )
    finally:
        for pool in pools.values():
            pool.disconnect()


def _async_pools(node: dict[str, Any], *, rounds: int, calls: int) -> dict[str, float]:
    """One task's back-to-back awaited GETs through each asyncio pool, in one event loop."""
    loop = asyncio.new_event_loop()

    async def make() -> dict[str, redis.asyncio.Redis]:
        pools = {
            REDIS_POOL: redis.asyncio.BlockingConnectionPool(max_connections=2, timeout=2, **node),
            FAIR_POOL: AsyncFairBlockingConnectionPool(max_connections=2, timeout=2, **node),
        }
        return {name: redis.asyncio.Redis(connection_pool=pool) for name, pool in pools.items()}

    async def gets(client: redis.asyncio.Redis) -> None:
        for _ in range(AWAITS):
            await client.get("ratio:pool")

    try:
        clients = loop.run_until_complete(make())
        medians = compare(
            {name: lambda c=client: loop.run_until_complete(gets(c))
             for name, client in clients.items()},
            rounds=rounds,
            calls=calls,
        )  # fmt: skip
        for client in clients.values():
            loop.run_until_complete(client.connection_pool.disconnect())
    finally:
        loop.close()
    return {name: us / AWAITS for name, us in medians.items()}


def _proxy(cluster: LocalSentinelCluster, *, rounds: int, calls: int) -> dict[str, float]:
    """A GET on one connection through the fault proxy and past it, another node delayed."""
    name, other = cluster.master_names
    address = cluster.master_address(name)
    clients = {
        DIRECT: cluster.node_client(address, direct=True),
        PROXIED: cluster.node_client(address),
    }
    clients[DIRECT].set("ratio:proxy", b"v")
    cluster.delay(other, 100)
    try:
        return compare(
            {label: lambda c=client: c.get("ratio:proxy") for label, client in clients.items()},
            rounds=rounds,
            calls=calls,
        )
    finally:
        cluster.clear_faults()
        for client in clients.values():
            client.close()


def _ratio(rows: list[dict[str, Any]], scenario: str, contender: str) -> dict[str, Any] | None:
    return next((r for r in rows if (r["scenario"], r["contender"]) == (scenario, contender)), None)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stated targets of these scenarios as PASS/FAIL lines (the report's "Targets")."""
    out: list[dict[str, Any]] = []

    def add(target: str, ok: bool | None, detail: str) -> None:
        result = "N/A" if ok is None else "PASS" if ok else "FAIL"
        out.append({"target": target, "result": result, "detail": detail})

    for target, scenario, contender, bound in (
        ("set_many(timeout=300) of 100 keys <= 2x raw MSET", SET_MANY, SET_MANY_TTL, 2.0),
        ("Django get with METRICS on <= 1.03x off (wall)", GET_WALL, METRICS_ON, 1.03),
        ("Django get_many[10] with METRICS on <= 1.05x off (wall)", GET_MANY_WALL, MANY_ON, 1.05),
    ):
        row = _ratio(rows, scenario, contender)
        if row is None:
            add(target, None, "not measured")
        else:
            add(target, row["ratio"] <= bound, f"{row['median_us']:.1f} µs, {row['ratio']:.3f}x")
    for scenario in (POOL_SYNC, POOL_ASYNC):
        row = _ratio(rows, scenario, FAIR_POOL)
        target = f"fair pool, {scenario.split(' (')[0]}: >= 0.6x the rate of redis-py's pool"
        if row is None:
            add(target, None, "not measured")
        else:
            rate = 1 / row["ratio"]  # a rate is the inverse of the time per call
            add(target, rate >= 0.6, f"{rate:.2f}x ({row['median_us']:.1f} µs per GET)")
    row = _ratio(rows, PROXY, PROXIED)
    target = "fault proxy, a node without faults while another is delayed: > 1,000 round trips/s"
    if row is None:
        add(target, None, "not measured")
    else:
        per_s = 1e6 / row["median_us"]
        add(
            target,
            per_s > 1000,
            f"{per_s:,.0f}/s ({row['median_us']:.1f} µs, {row['ratio']:.2f}x direct)",
        )
    return out


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
