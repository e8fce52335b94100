"""Stampede protection and crash figures (issue 26), against its four targets:

1. **Cold key**: 4 processes x 16 threads call ``get_or_set`` on one cold key whose computation
   takes 200 ms (``STAMPEDE_PROTECTION``): how many computations ran, how many callers got its
   value, and when the slowest caller returned after the first call began (target: 1, 64,
   within 200 ms + 20 ms). The computation is the 200 ms and nothing else (each process counts
   its own); each process opens 16 connections to every master before the race, as a process
   that has served 16 requests at once has (``--cold-pools``: it opens them in the race).
2. **Holder killed**: a process holding the key's lock is SIGKILLed mid-computation; a waiter
   in another process, begun just after the lock was taken, computes once the lock expires
   (target: within ``STAMPEDE_LOCK_TIMEOUT`` + 100 ms of the lock; no caller waits longer than
   that plus one computation).
3. **Early refresh**: a key read 500 times a second with a 2 s timeout and
   ``STAMPEDE_EARLY_REFRESH`` 1: computations per timeout period, whether two ever ran for one
   stored value, and the misses readers met after the first computation (target: at most one
   computation per stored value, 0 misses).
4. **Crash under sessions** (:mod:`benchmarks.stampede_sessions`): a master SIGKILLed under
   200 requests/s of Django cache-session reads and writes (4 logged-in users at 50/s, their
   sessions on that master), sentinels' ``down-after-milliseconds`` 1000; ``OUTAGE_READS`` +
   ``OUTAGE_HOLD`` 5 against both off, side by side on fresh topologies (target, options on:
   0 failed, 0 logged out, no request longer than the switch + 0.5 s).

Each process and topology is a real one on 127.0.0.1. ``python -m benchmarks.stampede`` runs it
alone (``--parts cold,killed`` some of it, ``--repeats`` times each of those two; ``--json``
the figures too); ``make bench`` includes it (``--skip-stampede`` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import asdict
from typing import Any

from benchmarks.stampede_sessions import (
    HOLD_S,
    SESSION_RATE,
    SESSION_USERS,
    sessions_through_a_crash,
)
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster
from tests.threads import Workers

DB = 3
COMPUTE_S = 0.2
PROCESSES, THREADS = 4, 16
COLD_SLACK_MS = 20.0
KILL_LOCK_TIMEOUT_S = 1.0
KILL_SLACK_MS = 100.0
EARLY_TIMEOUT_S, EARLY_READS_PER_S, EARLY_READERS, EARLY_SECONDS = 2, 500, 5, 12.0
EARLY_COMPUTE_S = 0.1
SWITCH_SLACK_S = 0.5


def _pool(masters: list[str], sentinels: list[Any]) -> ShardedSentinelPool:
    return ShardedSentinelPool(masters, sentinels, db=DB)


# -- 1. a cold key, 4 processes x 16 threads ---------------------------------------------------


def warm_pools(pool: ShardedSentinelPool, connections: int) -> None:
    """Open ``connections`` connections to every shard's master (as a process that has served
    that many requests at once has): the race is on a cold key, not on cold connections."""
    for shard in pool.shards:
        connection_pool = shard.client.connection_pool
        held = [connection_pool.get_connection() for _ in range(connections)]
        for connection in held:
            connection_pool.release(connection)


def _cold_callers(
    masters: list[str], sentinels: list[Any], key: str, ready: Any, go: Any, out: Any, warm: bool
) -> None:
    """One process: THREADS threads call get_or_set on ``key`` once ``go`` is set; sends
    (start, end, value) per call, when its computations ended, and when the computation began
    (``warm``: its pools opened first, see :func:`warm_pools`)."""
    pool = _pool(masters, sentinels)
    client = CacheClient(pool, Codec())
    computed: list[float] = []  # when a computation of this process ended (then it stores)
    mine = threading.local()
    detail: dict[str, float] = {}  # when the computation began, and when its caller's call did

    def compute() -> str:
        detail["computation_began"] = time.monotonic()
        detail["holder_began"] = mine.began
        time.sleep(COMPUTE_S)
        computed.append(time.monotonic())
        return f"value of {key}"

    client.get(f"{key}:warm-up")  # the core started, its masters known
    if warm:
        warm_pools(pool, THREADS)
    calls: list[tuple[float, float, Any]] = []
    lock = threading.Lock()

    def call() -> None:
        go.wait(60)
        began = mine.began = time.monotonic()
        value = client.get_or_set(key, compute, 60, lock_timeout=10)
        with lock:
            calls.append((began, time.monotonic(), value))

    with Workers(timeout=60) as workers:
        for _ in range(THREADS):
            workers.spawn(call)
        ready.put(os.getpid())
    out.put((calls, computed, detail))
    pool.close()


def cold_key(cluster: LocalSentinelCluster, repeats: int, warm: bool = True) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    runs = []
    for n in range(repeats):
        key = f"bench:cold:{time.time_ns()}:{n}"
        ready, go, out = context.Queue(), context.Event(), context.Queue()
        args = (cluster.master_names, cluster.sentinel_addresses, key, ready, go, out, warm)
        procs = [context.Process(target=_cold_callers, args=args) for _ in range(PROCESSES)]
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=60)
        time.sleep(0.2)  # every thread is at go.wait()
        go.set()
        sent = [out.get(timeout=60) for _ in procs]
        calls = [call for got, _, _ in sent for call in got]
        computed = [end for _, ends, _ in sent for end in ends]
        detail = {k: v for _, _, d in sent for k, v in d.items()}
        for proc in procs:
            proc.join(30)
        computations = len(computed)  # each process's computations (200 ms, nothing else)
        first = min(began for began, _, _ in calls)
        done = min(computed, default=math.nan)  # the store follows it: one round trip
        waited = [end - done for began, end, _ in calls if began < done]  # began before it
        runs.append(
            {
                "computations": computations,
                "callers": len(calls),
                "served": sum(value == f"value of {key}" for _, _, value in calls),
                "slowest_after_first_ms": (max(end for _, end, _ in calls) - first) * 1000,
                "computed_after_first_ms": (min(computed, default=math.nan) - first) * 1000,
                "last_start_after_first_ms": (max(b for b, _, _ in calls) - first) * 1000,
                "slowest_waiter_after_computed_ms": max(waited, default=math.nan) * 1000,
                **{f"{k}_after_first_ms": (v - first) * 1000 for k, v in detail.items()},
            }
        )
    return {"warm_pools": warm, "runs": runs}


# -- 2. the holder SIGKILLed mid-computation -------------------------------------------------


def _holder(masters: list[str], sentinels: list[Any], key: str, locked: Any) -> None:
    pool = _pool(masters, sentinels)
    client = CacheClient(pool, Codec())

    def compute() -> str:
        locked.put(time.monotonic())  # the lock is ours (SET NX answered), computing
        time.sleep(60)  # killed long before
        return "never"

    client.get_or_set(key, compute, 60, lock_timeout=KILL_LOCK_TIMEOUT_S)


def _one_kill(cluster: LocalSentinelCluster, client: CacheClient, key: str) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    client.get(key)  # the key's shard connected
    locked = context.Queue()
    args = (cluster.master_names, cluster.sentinel_addresses, key, locked)
    holder = context.Process(target=_holder, args=args)
    holder.start()
    locked_at = locked.get(timeout=60)
    took_over: list[float] = []

    def compute() -> str:
        took_over.append(time.monotonic())
        time.sleep(COMPUTE_S)
        return "taken over"

    outcome: list[Any] = []
    began = time.monotonic()
    with Workers(timeout=30) as workers:
        workers.spawn(
            lambda: outcome.append(
                client.get_or_set(key, compute, 60, lock_timeout=KILL_LOCK_TIMEOUT_S)
            )
        )
        time.sleep(0.1)
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join(10)
    return {
        "value": outcome[0] if outcome else None,
        "takeover_after_lock_ms": (took_over[0] - locked_at) * 1000,
        "waiter_waited_ms": (time.monotonic() - began) * 1000,
    }


def holder_killed(cluster: LocalSentinelCluster, repeats: int) -> dict[str, Any]:
    pool = _pool(cluster.master_names, cluster.sentinel_addresses)
    client = CacheClient(pool, Codec())
    try:
        runs = [
            _one_kill(cluster, client, f"bench:killed:{time.time_ns()}") for _ in range(repeats)
        ]
    finally:
        pool.close()
    return {"lock_timeout_s": KILL_LOCK_TIMEOUT_S, "runs": runs}


# -- 3. early refresh under steady reads -----------------------------------------------------


def early_refresh(cluster: LocalSentinelCluster) -> dict[str, Any]:
    pool = _pool(cluster.master_names, cluster.sentinel_addresses)
    key = f"bench:early:{time.time_ns()}"
    raw = pool.client_for(key)
    computations: list[tuple[float, float, bool]] = []  # (start, end, the key was there)
    lock = threading.Lock()
    absent_gets = 0

    def compute() -> float:
        began = time.monotonic()
        there = raw.pttl(key) > 0
        time.sleep(EARLY_COMPUTE_S)
        with lock:
            computations.append((began, time.monotonic(), there))
        return began

    client = CacheClient(pool, Codec())
    client.get_or_set(key, compute, EARLY_TIMEOUT_S, lock_timeout=5, early=1.0)  # warm-up
    warm = time.monotonic()
    interval = EARLY_READERS / EARLY_READS_PER_S
    reads = [0] * EARLY_READERS

    def reader(n: int, stop: threading.Event) -> None:
        mine = CacheClient(pool, Codec())
        due = time.monotonic()
        while not stop.is_set():
            mine.get_or_set(key, compute, EARLY_TIMEOUT_S, lock_timeout=5, early=1.0)
            reads[n] += 1
            due += interval
            time.sleep(max(0.0, due - time.monotonic()))

    def prober(stop: threading.Event) -> None:
        nonlocal absent_gets
        while not stop.is_set():
            absent_gets += raw.get(key) is None
            time.sleep(0.002)

    try:
        with Workers(timeout=30) as workers:
            for n in range(EARLY_READERS):
                workers.spawn(reader, n, workers.stop)
            workers.spawn(prober, workers.stop)
            time.sleep(EARLY_SECONDS)
        elapsed = time.monotonic() - warm
    finally:
        pool.close()
    later = sorted(c for c in computations if c[0] >= warm)
    overlapping = sum(b[0] < a[1] for a, b in zip(later, later[1:], strict=False))
    return {
        "reads_per_s": sum(reads) / elapsed,
        "seconds": elapsed,
        "periods": elapsed / EARLY_TIMEOUT_S,
        "computations": len(later),
        "computations_per_period": len(later) / (elapsed / EARLY_TIMEOUT_S),
        "overlapping": overlapping,
        "on_a_missing_key": sum(not there for _, _, there in later),
        "absent_gets": absent_gets,
        "shortest_gap_s": min((b[0] - a[0] for a, b in zip(later, later[1:], strict=False)),
                              default=math.inf),
    }  # fmt: skip


PARTS = ("cold", "killed", "early", "sessions")


def run(
    *,
    rounds: int = 5,
    log: Any = lambda message: None,
    parts: tuple[str, ...] = PARTS,
    repeats: int | None = None,
    warm: bool = True,
) -> dict[str, Any]:
    """The figures of ``parts`` (all by default); ``rounds`` (make bench's) caps the repeats of
    the first two (at most 3) unless ``repeats`` is given; ``warm=False``: the cold key's
    processes race with cold connection pools."""
    repeats = max(1, min(3, rounds)) if repeats is None else repeats
    results: dict[str, Any] = {}
    with LocalSentinelCluster(shards=2, replicas=1, sentinels=3) as cluster:
        if "cold" in parts:
            results["cold_key"] = cold_key(cluster, repeats, warm)
            log("stampede: cold key done")
        if "killed" in parts:
            results["holder_killed"] = holder_killed(cluster, repeats)
            log("stampede: holder killed done")
        if "early" in parts:
            results["early_refresh"] = early_refresh(cluster)
            log("stampede: early refresh done")
    if "sessions" in parts:
        on = {"OUTAGE_READS": True, "OUTAGE_HOLD": HOLD_S}
        results["sessions"] = {
            "on": asdict(sessions_through_a_crash(on, DB)),
            "off": asdict(sessions_through_a_crash({"OUTAGE_READS": False, "OUTAGE_HOLD": 0}, DB)),
        }
        log("stampede: sessions through a crash done")
    return results


def _worst(runs: list[dict[str, Any]], field: str) -> float:
    return max(run[field] for run in runs)


def table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per scenario run (``results`` may hold only some: see :func:`run`)."""
    rows: list[list[str]] = []
    if "cold_key" in results:
        _cold_row(results, rows)
    if "holder_killed" in results:
        _killed_row(results, rows)
    if "early_refresh" in results:
        _early_row(results, rows)
    if "sessions" in results:
        _sessions_rows(results, rows)
    return ["scenario", "outcome", "times"], rows


def _cold_row(results: dict[str, Any], rows: list[list[str]]) -> None:
    cold = results["cold_key"]["runs"]
    rows.append(
        [
            f"cold key, {PROCESSES} processes x {THREADS} threads, {COMPUTE_S * 1000:.0f} ms "
            f"computation ({len(cold)} runs"
            + ("" if results["cold_key"].get("warm_pools", True) else ", cold pools") + ")",
            "computations " + ", ".join(str(r["computations"]) for r in cold)
            + "; callers served " + ", ".join(f"{r['served']}/{r['callers']}" for r in cold),
            "slowest caller after the first call: "
            + ", ".join(f"{r['slowest_after_first_ms']:.0f} ms" for r in cold)
            + " (the computation ended "
            + ", ".join(f"{r['computed_after_first_ms']:.0f}" for r in cold)
            + " ms after it; the last call began "
            + ", ".join(f"{r['last_start_after_first_ms']:.0f}" for r in cold) + " ms after; "
            + "the slowest caller that began before the computation ended returned "
            + ", ".join(f"{r['slowest_waiter_after_computed_ms']:.0f}" for r in cold)
            + " ms after that end)",
        ]
    )  # fmt: skip


def _killed_row(results: dict[str, Any], rows: list[list[str]]) -> None:
    killed = results["holder_killed"]
    rows.append(
        [
            f"holder SIGKILLed mid-computation, lock timeout {killed['lock_timeout_s']:g} s "
            f"({len(killed['runs'])} runs)",
            "a waiter computed "
            + ", ".join(f"{r['takeover_after_lock_ms']:.0f} ms" for r in killed["runs"])
            + " after the lock was taken",
            "the waiter returned after "
            + ", ".join(f"{r['waiter_waited_ms']:.0f} ms" for r in killed["runs"]),
        ]
    )


def _early_row(results: dict[str, Any], rows: list[list[str]]) -> None:
    early = results["early_refresh"]
    rows.append(
        [
            f"early refresh, {early['reads_per_s']:.0f} reads/s, {EARLY_TIMEOUT_S} s timeout, "
            f"{EARLY_COMPUTE_S * 1000:.0f} ms computation, {early['seconds']:.1f} s",
            f"{early['computations']} computations in {early['periods']:.1f} periods "
            f"({early['computations_per_period']:.2f} per period, shortest gap "
            f"{early['shortest_gap_s']:.2f} s, {early['overlapping']} overlapping)",
            f"misses after warm-up: {early['on_a_missing_key']} computations on a missing key, "
            f"{early['absent_gets']} plain GETs found it absent",
        ]
    )


def _sessions_rows(results: dict[str, Any], rows: list[list[str]]) -> None:
    for label, side in (("on", "OUTAGE_READS + OUTAGE_HOLD 5"), ("off", "both off")):
        s = results["sessions"][label]
        rows.append(
            [
                f"master SIGKILLed under {SESSION_USERS} x {SESSION_RATE:.0f} session "
                f"requests/s, {side}",
                f"{s['requests']} requests ({s['rate']:.0f}/s), {s['failed']} failed, "
                f"{s['logged_out']} found the user logged out, {s['new_keys']} new sessions",
                f"longest request {s['slowest_s'] * 1000:.0f} ms; the cache switched "
                f"{s['switch_s'] * 1000:.0f} ms after the kill",
            ]
        )


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The four targets of issue 26 as PASS/FAIL lines."""
    out: list[dict[str, Any]] = []
    if "cold_key" in results:
        out.append(_cold_target(results))
    if "holder_killed" in results:
        out.append(_killed_target(results))
    if "early_refresh" in results:
        out.append(_early_target(results))
    if "sessions" in results:
        out.append(_sessions_target(results))
    return out


def _cold_target(results: dict[str, Any]) -> dict[str, Any]:
    cold = results["cold_key"]["runs"]
    bound = COMPUTE_S * 1000 + COLD_SLACK_MS
    slowest = _worst(cold, "slowest_after_first_ms")
    ok = all(r["computations"] == 1 and r["served"] == r["callers"] == 64 for r in cold)
    return {
        "target": f"cold key, {PROCESSES} x {THREADS} callers: 1 computation, all 64 served, "
        f"slowest within {bound:.0f} ms of the first call",
        "result": "PASS" if ok and slowest <= bound else "FAIL",
        "detail": f"computations {[r['computations'] for r in cold]}, served "
        f"{[r['served'] for r in cold]}, slowest {slowest:.0f} ms (stored "
        f"{_worst(cold, 'computed_after_first_ms'):.0f} ms after the first call; waiters "
        "are woken by the store)",
    }


def _killed_target(results: dict[str, Any]) -> dict[str, Any]:
    killed = results["holder_killed"]
    bound = killed["lock_timeout_s"] * 1000 + KILL_SLACK_MS
    takeover = _worst(killed["runs"], "takeover_after_lock_ms")
    waited = _worst(killed["runs"], "waiter_waited_ms")
    ok = all(r["value"] == "taken over" for r in killed["runs"])
    return {
        "target": f"holder SIGKILLed: a waiter computes within {bound:.0f} ms of the lock, "
        f"waits at most that + one computation",
        "result": "PASS"
        if ok and takeover <= bound and waited <= bound + COMPUTE_S * 1000
        else "FAIL",
        "detail": f"takeover {takeover:.0f} ms, longest wait {waited:.0f} ms",
    }


def _early_target(results: dict[str, Any]) -> dict[str, Any]:
    early = results["early_refresh"]
    ok = early["overlapping"] == 0 and early["on_a_missing_key"] == 0
    return {
        "target": f"early refresh at {EARLY_READS_PER_S} reads/s, {EARLY_TIMEOUT_S} s "
        "timeout: at most one computation per stored value (each replaced once, shortly "
        "before its end), 0 misses after warm-up",
        "result": "PASS" if ok and early["absent_gets"] == 0 else "FAIL",
        "detail": f"{early['computations_per_period']:.2f} computations per period, "
        f"{early['overlapping']} overlapping, {early['on_a_missing_key']} on a missing "
        f"key, {early['absent_gets']} absent GETs",
    }


def _sessions_target(results: dict[str, Any]) -> dict[str, Any]:
    on = results["sessions"]["on"]
    bound_s = on["switch_s"] + SWITCH_SLACK_S
    ok = on["failed"] == 0 and on["logged_out"] == 0 and on["new_keys"] == 0
    return {
        "target": f"master SIGKILLed under {SESSION_USERS * SESSION_RATE:.0f} session "
        f"requests/s, OUTAGE_HOLD {HOLD_S:g}: 0 failed, 0 logged out, no request longer "
        f"than the switch + {SWITCH_SLACK_S:g} s",
        "result": "PASS" if ok and on["slowest_s"] <= bound_s else "FAIL",
        "detail": f"{on['failed']} failed, {on['logged_out']} logged out, longest "
        f"{on['slowest_s'] * 1000:.0f} ms vs {bound_s * 1000:.0f} ms (off: "
        f"{results['sessions']['off']['failed']} failed, "
        f"{results['sessions']['off']['logged_out']} logged out)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of cold and killed")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument(
        "--cold-pools",
        action="store_true",
        help="cold key: each process opens its connections in the race (not before it)",
    )
    args = parser.parse_args()
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or args.repeats < 1:
        parser.error(f"--parts: unknown {unknown}" if unknown else "--repeats must be >= 1")
    results = run(log=print, parts=parts, repeats=args.repeats, warm=not args.cold_pools)
    header, rows = table(results)
    for row in [header, *rows]:
        print(" | ".join(row))
    for target in targets(results):
        print(f"{target['result']}: {target['target']} ({target['detail']})")
    if args.json:
        print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
