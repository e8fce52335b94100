"""Interleaved measurements: per-call latency, 8-thread mixed throughput, async latency.

The machine is shared and noisy, so nothing is measured in one block per contender. Every round
shuffles the operations, and every operation is split into chunks; before each chunk the
contenders are shuffled again. So each contender sees the same noise, spread over the whole run,
and medians and ratios come from measurements taken side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.contenders import Contender
from tests.threads import Workers

KEYSPACE = 1000
VALUE = {
    "id": 12345,
    "name": "user-12345",
    "email": "user-12345@example.com",
    "roles": ["reader", "writer"],
    "score": 3.14159,
    "active": True,
}

# (operation id, batch size)
OPERATIONS: tuple[tuple[str, int], ...] = (
    ("get", 1),
    ("set", 1),
    ("get_many[10]", 10),
    ("get_many[100]", 100),
    ("set_many[10]", 10),
    ("set_many[100]", 100),
    ("delete_many[10]", 10),
    ("delete_many[100]", 100),
    ("incr", 1),
)


@dataclass
class Keys:
    """One contender's keys (its own namespace, so contenders never touch each other's)."""

    prefix: str
    data: list[str] = field(default_factory=list)
    doomed: list[str] = field(default_factory=list)  # for delete_many: re-set before each call
    counter: str = ""
    cursor: int = 0

    def __post_init__(self) -> None:
        self.data = [f"{self.prefix}:k{i}" for i in range(KEYSPACE)]
        self.doomed = [f"{self.prefix}:d{i}" for i in range(KEYSPACE)]
        self.counter = f"{self.prefix}:counter"

    def batches(self, keys: list[str], size: int, count: int = 10) -> list[list[str]]:
        return [keys[i * size : (i + 1) * size] for i in range(min(count, len(keys) // size))]


def prepare(contender: Contender, keys: Keys) -> None:
    """Fill the keyspace and the counter through the contender itself, then warm it up."""
    for batch in keys.batches(keys.data, 100, KEYSPACE // 100):
        contender.set_many(dict.fromkeys(batch, VALUE))
    contender.set(keys.counter, 0)
    for _ in range(20):
        contender.get(keys.data[0])
        contender.set(keys.data[0], VALUE)
        contender.incr(keys.counter)
    contender.get_many(keys.data[:100])


def _timed_calls(
    contender: Contender, op: str, size: int, keys: Keys, n: int, out: list[int]
) -> int:
    """Run ``op`` ``n`` times, appending each call's duration in ns to ``out``; returns the
    thread CPU time (ns) spent in the timed calls (the client's own work, whatever the wait)."""
    clock = time.perf_counter_ns
    cpu = time.thread_time_ns
    cpu0 = cpu()
    if op == "get":
        data, count, call = keys.data, len(keys.data), contender.get
        for i in range(keys.cursor, keys.cursor + n):
            key = data[i % count]
            t0 = clock()
            call(key)
            out.append(clock() - t0)
        keys.cursor += n
    elif op == "set":
        data, count, setter = keys.data, len(keys.data), contender.set
        for i in range(keys.cursor, keys.cursor + n):
            key = data[i % count]
            t0 = clock()
            setter(key, VALUE)
            out.append(clock() - t0)
        keys.cursor += n
    elif op == "incr":
        counter, incr = keys.counter, contender.incr
        for _ in range(n):
            t0 = clock()
            incr(counter)
            out.append(clock() - t0)
    elif op.startswith("get_many"):
        batches = keys.batches(keys.data, size)
        for i in range(n):
            batch = batches[i % len(batches)]
            t0 = clock()
            contender.get_many(batch)
            out.append(clock() - t0)
    elif op.startswith("set_many"):
        mappings = [dict.fromkeys(b, VALUE) for b in keys.batches(keys.data, size)]
        for i in range(n):
            mapping = mappings[i % len(mappings)]
            t0 = clock()
            contender.set_many(mapping)
            out.append(clock() - t0)
    elif op.startswith("delete_many"):
        batches = keys.batches(keys.doomed, size)
        mappings = [dict.fromkeys(b, VALUE) for b in batches]
        untimed = 0
        for i in range(n):
            j = i % len(batches)
            u0 = cpu()
            contender.set_many(mappings[j])  # untimed: delete keys that exist
            untimed += cpu() - u0
            t0 = clock()
            contender.delete_many(batches[j])
            out.append(clock() - t0)
        return cpu() - cpu0 - untimed
    else:  # pragma: no cover - a typo in OPERATIONS
        raise ValueError(op)
    return cpu() - cpu0


@contextlib.contextmanager
def pinned(pids: Iterable[int], cpu: int = 0) -> Iterator[None]:
    """Every thread of this process and the processes ``pids`` (the servers) on CPU ``cpu``,
    put back as they were afterwards: a round trip then costs a context switch, not a wake-up
    on another CPU, so the figures are steadier and the client's CPU is its own work."""
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    saved = {}
    for pid in [*tids, *pids]:
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            saved[pid] = os.sched_getaffinity(pid)
            os.sched_setaffinity(pid, {cpu})
    try:
        yield
    finally:
        for pid, mask in saved.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(pid, mask)


def pin_threads(pids: Iterable[int], cpus: set[int]) -> None:
    """Every thread of the processes ``pids`` (0: this one) on ``cpus``, and left there (unlike
    :func:`pinned`, which puts them back): a run's servers, a worker told to pin itself."""
    for pid in pids:
        base = "/proc/self/task" if pid == 0 else f"/proc/{pid}/task"
        with contextlib.suppress(FileNotFoundError):
            for tid in os.listdir(base):
                with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                    os.sched_setaffinity(int(tid), cpus)


def calls_per_round(size: int, scale: float) -> int:
    base = 400 if size == 1 else 160 if size <= 10 else 48
    return max(8, int(base * scale))


def latency(
    contenders: Mapping[str, Contender],
    *,
    rounds: int,
    chunks: int,
    scale: float,
    seed: int,
    operations: Sequence[tuple[str, int]] = OPERATIONS,
    prefix: str = "bench",
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, dict[str, Any]]:
    """Per-call latency samples for every (contender, operation), interleaved.

    Returns ``{op: {contender: {"samples_ns": [...], "round_medians_ns": [...]}}}``.
    """
    rng = random.Random(seed)
    keys = {cid: Keys(f"{prefix}:{cid}") for cid in contenders}
    for cid, contender in contenders.items():
        prepare(contender, keys[cid])
    results: dict[str, dict[str, Any]] = {
        op: {cid: {"samples_ns": [], "round_medians_ns": [], "cpu_ns": 0} for cid in contenders}
        for op, _ in operations
    }
    for r in range(rounds):
        ops = list(operations)
        rng.shuffle(ops)
        for op, size in ops:
            n = calls_per_round(size, scale)
            per_chunk = max(1, n // chunks)
            this_round: dict[str, list[int]] = {cid: [] for cid in contenders}
            for _ in range(chunks):
                order = list(contenders)
                rng.shuffle(order)
                gc.collect()
                gc.disable()  # as timeit does: no collection lands on one contender's calls
                try:
                    for cid in order:
                        try:
                            results[op][cid]["cpu_ns"] += _timed_calls(
                                contenders[cid], op, size, keys[cid], per_chunk, this_round[cid]
                            )
                        except Exception as exc:  # count it; one failure must not end the run
                            results[op][cid]["errors"] = results[op][cid].get("errors", 0) + 1
                            results[op][cid]["last_error"] = f"{type(exc).__name__}: {exc}"[:300]
                            progress(f"{cid} {op}: {type(exc).__name__}: {exc}")
                finally:
                    gc.enable()
            for cid, samples in this_round.items():
                results[op][cid]["samples_ns"].extend(samples)
                if samples:
                    results[op][cid]["round_medians_ns"].append(statistics.median(samples))
        progress(f"latency round {r + 1}/{rounds} done")
    return results


# -- 8-thread mixed workload ---------------------------------------------------------------------


def _mixed_once(
    contender: Contender, keys: Keys, threads: int, duration: float, seed: int
) -> tuple[float, int]:
    """One timed run: ``threads`` threads doing 90 % get / 10 % set for ``duration`` seconds."""
    start = threading.Barrier(threads + 1)
    stop = threading.Event()
    counts = [0] * threads
    errors = [0] * threads

    def worker(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        data = keys.data
        get, setter = contender.get, contender.set
        done = failed = 0
        start.wait()
        while not stop.is_set():
            key = data[rng.randrange(KEYSPACE)]
            try:
                if rng.random() < 0.9:
                    get(key)
                else:
                    setter(key, VALUE)
            except Exception:
                failed += 1
            done += 1
        counts[index] = done
        errors[index] = failed

    workers = Workers(timeout=30)  # a worker that raised, or hangs, fails the run
    for i in range(threads):
        workers.spawn(worker, i, name=f"bench-mixed-{i}")
    start.wait()
    began = time.perf_counter()
    time.sleep(duration)
    stop.set()
    workers.join()
    elapsed = time.perf_counter() - began
    return sum(counts) / elapsed, sum(errors)


def throughput(
    contenders: Mapping[str, Contender],
    *,
    rounds: int,
    threads: int,
    duration: float,
    seed: int,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, dict[str, Any]]:
    """Mixed-workload ops/s per contender, one run each per round, order shuffled per round."""
    rng = random.Random(seed + 1)
    keys = {cid: Keys(f"bench:{cid}") for cid in contenders}
    results: dict[str, dict[str, Any]] = {
        cid: {"round_ops_per_s": [], "errors": 0} for cid in contenders
    }
    for cid, contender in contenders.items():  # warm the pools up to `threads` connections
        _mixed_once(contender, keys[cid], threads, 0.1, seed)
    for r in range(rounds):
        order = list(contenders)
        rng.shuffle(order)
        for cid in order:
            ops, errors = _mixed_once(contenders[cid], keys[cid], threads, duration, seed + r)
            results[cid]["round_ops_per_s"].append(ops)
            results[cid]["errors"] += errors
        progress(f"throughput round {r + 1}/{rounds} done")
    return results


# -- async API -----------------------------------------------------------------------------------


async def _async_main(
    contenders: Mapping[str, Contender],
    rounds: int,
    n: int,
    chunks: int,
    concurrency: int,
    duration: float,
    seed: int,
) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed + 2)
    keys = {cid: Keys(f"bench:{cid}") for cid in contenders}
    out: dict[str, dict[str, Any]] = {
        cid: {
            "aget_samples_ns": [],
            "aset_samples_ns": [],
            "aget_concurrent_ops_per_s": [],
        }
        for cid in contenders
    }
    for cid, contender in contenders.items():  # warm up (connections, first discovery)
        for key in keys[cid].data[:20]:
            await contender.aset(key, VALUE)
            await contender.aget(key)
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for op in rng.sample(["aget", "aset"], 2):
            for _ in range(chunks):
                order = list(contenders)
                rng.shuffle(order)
                for cid in order:
                    contender, data = contenders[cid], keys[cid].data
                    samples = out[cid][f"{op}_samples_ns"]
                    for i in range(n // chunks):
                        key = data[i % len(data)]
                        t0 = clock()
                        if op == "aget":
                            await contender.aget(key)
                        else:
                            await contender.aset(key, VALUE)
                        samples.append(clock() - t0)
        order = list(contenders)
        rng.shuffle(order)
        for cid in order:
            contender, data = contenders[cid], keys[cid].data
            stop = time.perf_counter() + duration
            done = 0

            async def task(
                offset: int, c: Contender = contender, d: list[str] = data, end: float = stop
            ) -> None:
                nonlocal done
                i = offset
                while time.perf_counter() < end:
                    await c.aget(d[i % len(d)])
                    i += concurrency
                    done += 1

            began = time.perf_counter()
            await asyncio.gather(*(task(i) for i in range(concurrency)))
            out[cid]["aget_concurrent_ops_per_s"].append(done / (time.perf_counter() - began))
    for contender in contenders.values():
        await contender.aclose()
    return out


def async_latency(
    contenders: Mapping[str, Contender],
    *,
    rounds: int,
    scale: float,
    chunks: int,
    concurrency: int,
    duration: float,
    seed: int,
) -> dict[str, dict[str, Any]]:
    """Sequential ``aget``/``aset`` latency and ``concurrency``-wide ``aget`` throughput, all in
    one event loop (as one ASGI worker would run them)."""
    n = max(chunks, int(300 * scale))
    return asyncio.run(_async_main(contenders, rounds, n, chunks, concurrency, duration, seed))


def summarize(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    count = len(ordered)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(count - 1, int(count * 0.9))],
        "n": count,
    }
