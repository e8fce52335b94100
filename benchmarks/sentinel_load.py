"""What many idle processes cost the sentinels and the masters (issue 27, item 4).

One local topology (2 shards, 1 replica each, 3 sentinels, ``down-after-milliseconds`` 1000).
For each process count N (and the near cache off and on), N forked worker processes each hold
one ``ShardedSentinelPool`` + ``CacheClient``, write and read one key per shard (a connection to
each master, and the near cache's tracking when it is on) and then sit idle. Measured:

* connections per sentinel and per master (``CLIENT LIST``), minus those open before the
  workers started (the sentinels' own links, the replicas, this harness);
* sentinel commands per second at idle (``INFO commandstats`` deltas over ``--idle`` seconds,
  minus the rate with no worker) and during one planned ``SENTINEL FAILOVER`` (from the command
  until every worker applied the switch), with the commands that made them;
* the time from ``SENTINEL FAILOVER`` (and from the first ``+switch-master``) until each worker
  applied the switch (its switch callback's wall clock): p50, p95, max, and how many did not
  within ``--deadline``;
* listener reconnects over the whole round, and every ``+sdown``/``+odown``/``+switch-master``
  the sentinels published: a ``+switch-master`` beyond the one asked for is an unrequested
  failover.

``python -m benchmarks.sentinel_load --processes 50,100,200`` runs it (``--near off,on``). The
figures depend on the machine: on 2 cores shared with other work, the workers, the servers and
this harness compete for the CPU, and a busy sentinel answers late. Run it under ``nice``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import redis

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

WATCHED = ("+sdown", "+odown", "+switch-master", "+try-failover")


def _worker(
    conn: Connection, events: Any, sentinels: list[str], masters: list[str], near: bool
) -> None:
    """One idle application process: a core, one key per shard, then nothing but the
    background threads until told to report or quit."""
    logging.getLogger("sentinel_cache").setLevel(logging.ERROR)  # N copies of each switch
    pool = ShardedSentinelPool(masters, sentinels, near_cache=near)
    client = CacheClient(pool, Codec())
    pid = os.getpid()
    pool.on_switch(lambda event: events.put((pid, event.name, str(event.new), time.time())))
    seen: set[int] = set()
    errors: list[str] = []  # start-up failures (sentinels too busy to answer), retried
    i = 0
    while len(seen) < len(masters):
        key = f"load:{pid}:{i}"
        i += 1
        shard = pool.shard_index(key)
        if shard not in seen:
            try:
                client.set(key, i, 600)
                client.get(key)
            except Exception as exc:  # an application would fail this request, then retry
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                if len(errors) > 20:
                    raise
                time.sleep(0.5)
                continue
            seen.add(shard)
    conn.send(errors)
    while True:
        message = conn.recv()
        if message == "stats":
            listeners = pool.listeners.listeners() if pool.listeners is not None else []
            conn.send(
                {
                    "listeners": len(listeners),
                    "reconnects": sum(max(0, listener.connects - 1) for listener in listeners),
                }
            )
        else:
            break
    pool.close()
    conn.send("closed")


def _clients(address: tuple[str, int]) -> list[dict[str, str]]:
    client = redis.Redis(*address, socket_timeout=10)
    try:
        listing = client.execute_command("CLIENT", "LIST")
        text = listing.decode() if isinstance(listing, bytes) else str(listing)
        rows = []
        for line in text.splitlines():
            rows.append(dict(field.split("=", 1) for field in line.split() if "=" in field))
        return rows
    finally:
        client.close()


def _connections(address: tuple[str, int]) -> dict[str, int]:
    rows = _clients(address)
    pubsub = sum(1 for r in rows if "P" in r.get("flags", "") or r.get("sub", "0") != "0")
    return {"total": len(rows) - 1, "pubsub": pubsub}  # minus this CLIENT LIST's own


def _counters(address: tuple[str, int]) -> dict[str, int]:
    """Commands processed and connections accepted so far (a sentinel's ``INFO`` has no
    ``commandstats`` section, on Redis 7.0 nor on Valkey 9.1: the totals are all it tells)."""
    client = redis.Redis(*address, socket_timeout=10)
    try:
        info = client.info("stats")
    finally:
        client.close()
    return {
        "commands": int(info["total_commands_processed"]),
        "connections": int(info["total_connections_received"]),
    }


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """What happened between two readings, minus the first reading itself (its INFO and its
    connection are counted by the second)."""
    return {k: v - before[k] - 1 for k, v in after.items()}


class Watcher:
    """Every sentinel's failure-detection and switch events, with their wall clock."""

    def __init__(self, sentinels: Sequence[tuple[str, int]]) -> None:
        self.events: list[tuple[float, str, str, str]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(address,), daemon=True)
            for address in sentinels
        ]
        self._subscribed = threading.Barrier(len(sentinels) + 1)
        for thread in self._threads:
            thread.start()
        self._subscribed.wait(10)

    def _run(self, address: tuple[str, int]) -> None:
        client = redis.Redis(*address, socket_timeout=10)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(*WATCHED)
        pubsub.get_message(timeout=1)
        self._subscribed.wait(10)
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=0.2)
            if message and message["type"] == "message":
                channel, data = message["channel"], message["data"]
                self.events.append((time.time(), f"{address[1]}", channel.decode(), data.decode()))
        pubsub.close()
        client.close()

    def close(self) -> list[tuple[float, str, str, str]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        return list(self.events)


def _quantiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "max": None}
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "max": ordered[-1],
    }


def one_round(
    cluster: LocalSentinelCluster,
    processes: int,
    near: bool,
    shard: str,
    *,
    idle: float,
    deadline: float,
    settle: float,
    baseline: dict[str, Any],
) -> dict[str, Any]:
    config = cluster.config()
    sentinels = cluster.sentinel_addresses
    masters = {name: cluster.master_address(name) for name in cluster.master_names}
    context = multiprocessing.get_context("fork")
    events = context.Queue()
    workers = []
    started = time.monotonic()
    for _ in range(processes):
        parent, child = context.Pipe()
        proc = context.Process(
            target=_worker,
            args=(child, events, config["sentinels"], config["masters"], near),
            daemon=True,
        )
        proc.start()
        workers.append((proc, parent))
    startup_errors: list[str] = []
    for proc, parent in workers:
        if not parent.poll(max(1.0, 120 - (time.monotonic() - started))):
            raise RuntimeError(f"worker {proc.pid} not ready within 120 s")
        startup_errors += parent.recv()
    ready_s = time.monotonic() - started
    watcher = Watcher(sentinels)
    try:
        time.sleep(settle)  # the last resyncs, and idle discovery sockets closed
        result: dict[str, Any] = {"processes": processes, "near_cache": near}
        result["ready_s"] = ready_s
        result["startup_errors"] = len(startup_errors)
        result["startup_error_example"] = startup_errors[0] if startup_errors else None
        per_sentinel = [_connections(a) for a in sentinels]
        per_master = {name: _connections(a) for name, a in masters.items()}
        result["connections_per_sentinel"] = [
            c["total"] - b
            for c, b in zip(per_sentinel, baseline["sentinel_connections"], strict=True)
        ]
        result["pubsub_per_sentinel"] = [c["pubsub"] for c in per_sentinel]
        result["connections_per_master"] = {
            name: c["total"] - baseline["master_connections"][name]
            for name, c in per_master.items()
        }
        before = [_counters(a) for a in sentinels]
        t0 = time.monotonic()
        time.sleep(idle)
        after = [_counters(a) for a in sentinels]
        elapsed = time.monotonic() - t0
        result["idle_commands_per_s_per_sentinel"] = [
            round(_delta(a, b)["commands"] / elapsed - base, 1)
            for a, b, base in zip(after, before, baseline["idle_rate"], strict=True)
        ]
        result["idle_new_connections_per_sentinel"] = [
            _delta(a, b)["connections"] for a, b in zip(after, before, strict=True)
        ]
        while not events.empty():  # switches before this one (an unrequested failover)
            events.get()
        old = cluster.master_address(shard)
        before = [_counters(a) for a in sentinels]
        asked = time.time()
        t0 = time.monotonic()
        cluster.failover(shard)
        times: dict[int, float] = {}
        while len(times) < processes and time.monotonic() - t0 < deadline:
            try:
                pid, name, new, at = events.get(timeout=0.5)
            except Exception:  # queue.Empty: nothing yet
                continue
            if name == shard and new != f"{old[0]}:{old[1]}" and at >= asked:
                times.setdefault(pid, at)
        window = time.monotonic() - t0
        after = [_counters(a) for a in sentinels]
        deltas = [_delta(a, b) for a, b in zip(after, before, strict=True)]
        result["switch_window_s"] = round(window, 2)
        result["switch_commands_per_sentinel"] = [d["commands"] for d in deltas]
        result["switch_commands_per_s_per_sentinel"] = [
            round(d["commands"] / window, 1) for d in deltas
        ]
        result["switch_new_connections_per_sentinel"] = [d["connections"] for d in deltas]
        announced = [
            t
            for t, _, channel, data in watcher.events
            if channel == "+switch-master" and data.split()[0] == shard
        ]
        first = min(announced) if announced else None
        from_ask = [t - asked for t in times.values()]
        result["applied_after_failover_s"] = _quantiles(from_ask)
        result["applied_after_switch_master_s"] = _quantiles(
            [t - first for t in times.values()] if first is not None else []
        )
        result["not_applied"] = processes - len(times)
        time.sleep(1.0)
    finally:
        seen = watcher.close()
    reconnects = 0
    listeners = 0
    for _, parent in workers:
        parent.send("stats")
    for _, parent in workers:
        stats = parent.recv()
        reconnects += stats["reconnects"]
        listeners += stats["listeners"]
    result["listeners"] = listeners
    result["listener_reconnects"] = reconnects
    switched = {
        (data.split()[0], " ".join(data.split()[3:5]))
        for _, _, c, data in seen
        if c == "+switch-master"
    }
    result["unrequested_failovers"] = max(0, len(switched) - 1)
    result["sdown_events"] = sum(1 for _, _, c, _ in seen if c == "+sdown")
    result["odown_events"] = sum(1 for _, _, c, _ in seen if c == "+odown")
    for _, parent in workers:
        parent.send("quit")
    for proc, parent in workers:
        if parent.poll(10):
            parent.recv()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    cluster.wait_for_replication(timeout=60)
    return result


def measure_baseline(cluster: LocalSentinelCluster, idle: float) -> dict[str, Any]:
    sentinels = cluster.sentinel_addresses
    before = [_counters(a) for a in sentinels]
    t0 = time.monotonic()
    time.sleep(idle)
    after = [_counters(a) for a in sentinels]
    elapsed = time.monotonic() - t0
    return {
        "sentinel_connections": [_connections(a)["total"] for a in sentinels],
        "master_connections": {
            name: _connections(cluster.master_address(name))["total"]
            for name in cluster.master_names
        },
        "idle_rate": [
            _delta(a, b)["commands"] / elapsed for a, b in zip(after, before, strict=True)
        ],
    }


def run(
    processes: Sequence[int],
    nears: Sequence[bool],
    *,
    idle: float,
    deadline: float,
    settle: float,
) -> dict[str, Any]:
    cluster = LocalSentinelCluster(shards=2, replicas=1, sentinels=3, down_after_ms=1000)
    cluster.start()
    rounds = []
    try:
        cluster.wait_for_replication(timeout=60)
        names = list(cluster.master_names)
        i = 0
        for near in nears:
            for n in processes:
                baseline = measure_baseline(cluster, idle)
                shard = names[i % len(names)]
                i += 1
                result = one_round(
                    cluster,
                    n,
                    near,
                    shard,
                    idle=idle,
                    deadline=deadline,
                    settle=settle,
                    baseline=baseline,
                )
                result["baseline_idle_commands_per_s"] = [
                    round(r, 1) for r in baseline["idle_rate"]
                ]
                rounds.append(result)
                print(json.dumps(result), flush=True)
    finally:
        cluster.stop()
    return {"load_average": os.getloadavg(), "rounds": rounds}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="50,100,200", help="comma-separated counts")
    parser.add_argument("--near", default="off,on", help="near cache: off, on, or off,on")
    parser.add_argument("--idle", type=float, default=5.0, help="idle window, seconds")
    parser.add_argument("--deadline", type=float, default=30.0, help="switch deadline, seconds")
    parser.add_argument(
        "--settle",
        type=float,
        default=12.0,
        help="seconds idle before measuring (the core closes discovery sockets idle for 10 s)",
    )
    parser.add_argument(
        "--discovery-idle",
        type=float,
        help="seconds after which a core closes idle discovery sockets (default: the library's;"
        " inf keeps them, as before they were closed)",
    )
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.processes.split(",") if n]
    nears = [{"off": False, "on": True}[v] for v in args.near.split(",") if v]
    if args.discovery_idle is not None:  # inherited by the forked workers
        from sentinel_cache.core.topology import sentinels

        sentinels.IDLE_SOCKET_SECONDS = args.discovery_idle
    results = run(counts, nears, idle=args.idle, deadline=args.deadline, settle=args.settle)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
