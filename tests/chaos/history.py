"""A Jepsen-style history of writes and its checker, shared by the chaos tests and
``benchmarks/chaos.py``.

Writers write unique keys (each key once, a unique value, no TTL) through the public
``CacheClient.set`` and record every call: when it started and ended and how it came out. Once
the fault is over and the topology has settled, every key is read straight from its shard's
final master (not through the cache) and the history is judged: an acknowledged write whose key
is absent or holds another value is *lost*.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

OK = "ok"
REFUSED = "refused"


@dataclass(frozen=True)
class Call:
    """One ``set`` call: ``outcome`` is "ok", "refused" (set returned False) or the error type."""

    key: str
    value: str
    shard: int
    start: float
    end: float
    outcome: str
    message: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def acked(self) -> bool:
        return self.outcome == OK


def keys_on(pool: ShardedSentinelPool, index: int, prefix: str) -> Iterator[str]:
    """An endless supply of fresh keys that the ring places on shard ``index``."""
    for n in itertools.count():
        key = f"{prefix}:{n}"
        if pool.shard_index(key) == index:
            yield key


class Writers:
    """``per_shard`` threads per shard, each writing fresh keys back to back (with a short
    pause, so the test process does not starve the servers of CPU) and recording every call.

    While they run, the test process's own objects stay out of the garbage collector's way, so
    that its pauses, which stop every thread, do not show as slow calls: whatever existed
    before :meth:`start` (pytest's collected suite, 170,000 objects under ``make chaos``) is
    frozen (``gc.freeze``) until :meth:`stop`, and a call is recorded as a plain tuple, which
    the collector stops tracking, not as a :class:`Call` (25,000 per round). A full collection
    of both took 100-290 ms on the 2 shared cores, and one in the fault window was the round's
    slowest call of the other shard. What the library allocates is still collected as usual.
    One at a time."""

    def __init__(
        self,
        cache: CacheClient,
        shards: Sequence[int],
        *,
        per_shard: int = 2,
        pause: float = 0.001,
        prefix: str = "chaos",
    ) -> None:
        self.cache = cache
        self.pause = pause
        self.halt = threading.Event()
        self.calls: list[list[tuple[Any, ...]]] = []
        self._threads: list[threading.Thread] = []
        for shard in shards:
            for n in range(per_shard):
                log: list[tuple[Any, ...]] = []
                self.calls.append(log)
                keys = keys_on(cache.core, shard, f"{prefix}:{shard}.{n}")
                self._threads.append(
                    threading.Thread(
                        target=self._run,
                        args=(shard, keys, log),
                        name=f"chaos-writer-{shard}.{n}",
                        daemon=True,
                    )
                )

    def __repr__(self) -> str:
        state = "stopped" if self.halt.is_set() else "running"
        return f"<Writers {len(self._threads)} threads {sum(map(len, self.calls))} calls {state}>"

    def _run(self, shard: int, keys: Iterator[str], log: list[tuple[Any, ...]]) -> None:
        while not self.halt.is_set():
            key = next(keys)
            value = f"v:{key}:{time.monotonic_ns()}"
            start = time.monotonic()
            try:
                outcome = OK if self.cache.set(key, value, None) else REFUSED
                message = ""
            except Exception as exc:  # every failure is part of the history
                outcome, message = type(exc).__name__, str(exc)[:200]
            log.append((key, value, shard, start, time.monotonic(), outcome, message))
            if self.pause:
                self.halt.wait(self.pause)

    def start(self) -> Writers:
        gc.collect()  # garbage is not worth freezing
        gc.freeze()
        try:
            for thread in self._threads:
                thread.start()
        except BaseException:
            self.halt.set()
            gc.unfreeze()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> list[Call]:
        """Stop and return every call, in start order."""
        self.halt.set()
        for thread in self._threads:
            thread.join(timeout)
        gc.unfreeze()
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            raise AssertionError(f"writer threads still blocked {timeout}s after stop: {stuck}")
        return sorted((Call(*c) for log in self.calls for c in log), key=lambda c: c.start)


@dataclass
class ShardFigures:
    """One shard's part of the history."""

    calls: int = 0
    acked: int = 0
    refused: int = 0  # set returned False: not an error, not acknowledged, never expected here
    lost: int = 0
    errors: int = 0
    error_types: Counter[str] = field(default_factory=Counter)
    longest: float = 0.0
    longest_in_window: float = 0.0  # calls that started while the fault was on


@dataclass
class Report:
    """The judged history of one scenario round."""

    scenario: str
    socket_timeout: float
    calls: int = 0
    acked: int = 0
    refused: int = 0
    lost: int = 0
    lost_sample: list[str] = field(default_factory=list)
    unacked_present: int = 0  # failed or indeterminate writes that did land: allowed
    errors: int = 0
    error_types: Counter[str] = field(default_factory=Counter)
    longest: float = 0.0
    recovery: float | None = None  # heal -> first successful write on the affected shard
    over_bound: list[Call] = field(default_factory=list)
    shards: dict[int, ShardFigures] = field(default_factory=dict)
    affected: int | None = None  # the shard the fault hit (None: no shard, e.g. a sentinel)
    #: The longest calls of the shards the fault does not touch (in flight while the fault was
    #: on, when it hit a shard; all of them otherwise), longest first: a call held by it shows here.
    untouched_slowest: list[Call] = field(default_factory=list)
    #: What shows that the fault took effect: name -> (seen, figure), filled by the scenario.
    effects: dict[str, tuple[bool, str]] = field(default_factory=dict)
    switched: bool = False
    notes: list[str] = field(default_factory=list)
    fault: tuple[float, float] = (0.0, 0.0)  # (start, heal), monotonic
    history: list[Call] = field(default_factory=list, repr=False)

    @property
    def unconfirmed(self) -> list[str]:
        """The effects the scenario looked for and did not see (none looked for: a gap too)."""
        if not self.effects:
            return ["no effect of the fault was looked for"]
        return [f"{name}: {figure}" for name, (seen, figure) in self.effects.items() if not seen]

    def summary(self) -> str:
        recovery = "-" if self.recovery is None else f"{self.recovery * 1000:.0f} ms"
        per_shard = "; ".join(
            f"shard {i}: {f.calls} calls, {f.acked} acked, {f.errors} errors {dict(f.error_types)}, "
            f"longest {f.longest * 1000:.0f} ms (in fault {f.longest_in_window * 1000:.0f} ms)"
            for i, f in sorted(self.shards.items())
        )
        worst = max(self.over_bound, key=lambda c: c.duration, default=None)
        over = (
            f", {len(self.over_bound)} calls over their bound (worst {worst.duration:.3f}s "
            f"{worst.outcome} on shard {worst.shard}, started {worst.start - self.fault[1]:+.3f}s "
            f"from the heal; shards {sorted({c.shard for c in self.over_bound})})"
            if worst
            else ""
        )
        effects = ", ".join(
            f"{name} {figure}" + ("" if seen else " (NOT SEEN)")
            for name, (seen, figure) in self.effects.items()
        )
        return (
            f"{self.scenario} (SOCKET_TIMEOUT {self.socket_timeout:g}s): acked {self.acked}, "
            f"refused {self.refused}, lost {self.lost}, errors {self.errors}, "
            f"longest call {self.longest:.3f}s, recovery {recovery}, "
            f"switched={self.switched}{over}; {per_shard}; fault seen: {effects or '-'}"
            + (f"; {'; '.join(self.notes)}" if self.notes else "")
        )


def judge(
    scenario: str,
    calls: Sequence[Call],
    cluster: LocalSentinelCluster,
    codec: Any,
    *,
    socket_timeout: float,
    fault: tuple[float, float],
    affected: int | None,
    bound: Any = None,
) -> Report:
    """Read every key on its shard's final master and judge the history.

    ``fault`` is (start, heal). ``bound(call) -> seconds`` is the longest a call may take (calls
    above it land in ``over_bound``); ``affected`` is the shard the fault hit, whose recovery is
    measured from the heal.
    """
    report = Report(
        scenario,
        socket_timeout,
        calls=len(calls),
        fault=fault,
        affected=affected,
        history=list(calls),
    )
    fault_start, heal = fault
    untouched: list[Call] = []
    by_shard: dict[int, list[Call]] = {}
    for call in calls:
        by_shard.setdefault(call.shard, []).append(call)
    for shard, shard_calls in sorted(by_shard.items()):
        figures = report.shards.setdefault(shard, ShardFigures())
        name = cluster.master_names[shard]
        final = cluster.master_address(name)
        stored = _read(cluster, final, [c.key for c in shard_calls])
        for call in shard_calls:
            figures.calls += 1
            figures.longest = max(figures.longest, call.duration)
            in_window = fault_start <= call.start <= heal
            if in_window:
                figures.longest_in_window = max(figures.longest_in_window, call.duration)
            if shard != affected and (
                affected is None or (call.start <= heal and call.end >= fault_start)
            ):
                untouched.append(call)
            raw = stored.get(call.key)
            present = raw is not None and codec.loads(raw) == call.value
            if call.acked:
                figures.acked += 1
                if not present:
                    figures.lost += 1
                    if len(report.lost_sample) < 5:
                        report.lost_sample.append(call.key)
            else:
                if call.outcome == REFUSED:
                    figures.refused += 1
                else:
                    figures.errors += 1
                    figures.error_types[call.outcome] += 1
                if present:
                    report.unacked_present += 1
            if bound is not None and call.duration > bound(call):
                report.over_bound.append(call)
        report.acked += figures.acked
        report.refused += figures.refused
        report.lost += figures.lost
        report.errors += figures.errors
        report.error_types.update(figures.error_types)
        report.longest = max(report.longest, figures.longest)
    report.untouched_slowest = sorted(untouched, key=lambda c: c.duration, reverse=True)[:5]
    if affected is not None:
        after = [c.end for c in by_shard.get(affected, []) if c.acked and c.start >= heal]
        report.recovery = min(after) - heal if after else None
    return report


def _read(
    cluster: LocalSentinelCluster, address: tuple[str, int], keys: list[str]
) -> dict[str, bytes]:
    """The stored value of each key, read on the node itself (past any proxy)."""
    found: dict[str, bytes] = {}
    client = cluster.node_client(address, direct=True, socket_timeout=10)
    try:
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            for key, value in zip(chunk, client.mget(chunk), strict=True):
                if value is not None:
                    found[key] = value
    finally:
        client.close()
    return found
