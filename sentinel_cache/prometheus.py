"""Prometheus metrics for every core of the process: ``METRICS = True`` in the cache options.

Needs ``prometheus_client`` (``pip install "sentinel-cache[prometheus]"``). The metrics are
registered once per process in ``prometheus_client.REGISTRY``, however many caches and cores
there are; each series is labelled with the shard's master name (``shard``). Expose them as
usual: ``prometheus_client.start_http_server(port)``, django-prometheus's ``/metrics`` view, or
``prometheus_client.make_wsgi_app()`` in Flask.

A call records into plain numbers (:class:`PrometheusMetrics`), made into samples when scraped.
With ``PROMETHEUS_MULTIPROC_DIR`` (gunicorn, uWSGI; set before the workers start, as
prometheus_client documents) the counters and histograms are prometheus_client's own
(:class:`MultiprocessMetrics`), which add up over the workers. The gauges (connections in use
and idle, listener state) and the near cache's series are read from the live cores at scrape
time, so in multiprocess mode they show only the process that serves the scrape: alert on the
other counters there.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, values
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from sentinel_cache.core.metrics import Metrics, command_name, outcome
from sentinel_cache.core.topology.registry import on_fork_in_child
from sentinel_cache.core.topology.sharded_pool import live_cores

__all__ = ["MultiprocessMetrics", "PrometheusMetrics", "shared_metrics"]

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
_FASTEST = _LATENCY_BUCKETS[0]  # most calls: their bucket found by one comparison
_FENCE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True, eq=False)  # hashed by identity: a key looked up on every call
class Family:
    """One metric as scraped: name (a counter's without ``_total``), help, label names, and
    for a histogram its buckets (None: a counter). Declared once for both backends."""

    name: str
    doc: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] | None = None


CALLS = Family(
    "sentinel_cache_command_duration_seconds",
    "Command batches sent to a shard by first command and outcome (hit or miss for a "
    "single-key get, else ok; error): time from sending to the last reply, safety net "
    "included (its _count counts batches).",
    ("shard", "command", "outcome"),
    _LATENCY_BUCKETS,
)
LOOKUPS = Family(
    "sentinel_cache_multi_key_lookups",
    "Keys read by multi-key reads (get_many), by result (hit, miss).",
    ("shard", "result"),
)
SWITCHES = Family(
    "sentinel_cache_master_switches",
    "Master switches applied, by how they were learned (listener, safety_net, ...).",
    ("shard", "source"),
)
FENCES = Family(
    "sentinel_cache_write_fence_hold_seconds",
    "How long writes to a shard were held while a failover was announced.",
    ("shard",),
    _FENCE_BUCKETS,
)
RERESOLVES = Family(
    "sentinel_cache_reresolves",
    "Times the safety net asked the sentinels again after a failed call.",
    ("shard",),
)
RETRIES = Family(
    "sentinel_cache_retries",
    "Batches sent again on a shard's new master by the safety net.",
    ("shard",),
)
OUTAGE_READS = Family(
    "sentinel_cache_outage_reads",
    "Reads answered by a replica while the shard's master was unreachable and not "
    "replaced yet (OUTAGE_READS): as fresh as that replica's replication lag.",
    ("shard",),
)
SKIPS = Family(
    "sentinel_cache_skipped_shards",
    "Times IGNORE_EXCEPTIONS skipped an unavailable shard, by operation (a command "
    "name, get_many, iter_keys, delete_pattern, clear, ...).",
    ("shard", "operation"),
)
RESTARTS = Family(
    "sentinel_cache_master_restarts",
    "Masters found restarted without a switch (a new run_id on a new connection, or "
    "the sentinels' +reboot): empty unless they persist their data, and so are their "
    "replicas once resynced.",
    ("shard",),
)
FAMILIES = (CALLS, LOOKUPS, SWITCHES, FENCES, RERESOLVES, RETRIES, OUTAGE_READS, SKIPS, RESTARTS)


class _Events(Metrics):
    """Which family and labels each event of the core moves; how a backend keeps a number is
    its ``_count`` and ``_observe``."""

    def _count(self, family: Family, labels: tuple[str, ...], amount: int = 1) -> None:
        raise NotImplementedError

    def _observe(self, family: Family, labels: tuple[str, ...], seconds: float) -> None:
        raise NotImplementedError

    def call(self, shard: str, command: str, outcome: str, seconds: float) -> None:
        self._observe(CALLS, (shard, command, outcome), seconds)

    def lookups(self, counts: Iterable[tuple[str, int, int]]) -> None:
        for shard, hits, misses in counts:
            if hits:
                self._count(LOOKUPS, (shard, "hit"), hits)
            if misses:
                self._count(LOOKUPS, (shard, "miss"), misses)

    def switch(self, shard: str, source: str) -> None:
        self._count(SWITCHES, (shard, source))

    def fence(self, shard: str, seconds: float) -> None:
        self._observe(FENCES, (shard,), seconds)

    def reresolve(self, shard: str) -> None:
        self._count(RERESOLVES, (shard,))

    def retry(self, shard: str) -> None:
        self._count(RETRIES, (shard,))

    def outage_read(self, shard: str) -> None:
        self._count(OUTAGE_READS, (shard,))

    def skipped(self, shard: str, operation: str) -> None:
        self._count(SKIPS, (shard, operation))

    def restart(self, shard: str) -> None:
        self._count(RESTARTS, (shard,))


Rows = dict[tuple[str, ...], list[Any]]  # label values -> a series' numbers
Table = dict[Family, Rows]


class PrometheusMetrics(_Events):
    """The core's events kept as plain numbers, turned into Prometheus samples only when
    scraped (:class:`_Exporter`): recording a call is a lookup, a bisect and two additions,
    where prometheus_client's ``Histogram.observe`` walks its buckets and takes two locks.

    Per series: a counter is ``[value, created]``, a histogram ``[count per bucket ..., count
    above the last, sum, created]``. Each thread writes its own table, so no lock is taken and
    counts from many threads add up exactly; a scrape adds the tables up (those of threads
    that ended are folded into one). A forked child starts from zero: it reports its own calls,
    never its parent's a second time."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.reset()
        registry.register(_Exporter(self))
        registry.register(_Gauges())
        on_fork_in_child(_reset_in_child(self))

    def __repr__(self) -> str:
        return f"<PrometheusMetrics {len(self._tables)} threads' tables>"

    def reset(self) -> None:
        """Forget every count (a new lock too: one held by a parent's thread stays held)."""
        self._local = threading.local()
        self._lock = threading.Lock()  # for the list of tables, not for a count
        self._tables: list[tuple[threading.Thread, Table]] = []
        self._ended: Table = _table()

    def _mine(self) -> Table:
        """This thread's table, made and listed on its first event."""
        local = self._local
        table = local.table = _table()
        local.calls = {}
        local.sent = {}
        local.lookups = {}
        local.batches = {}
        with self._lock:
            self._prune()
            self._tables.append((threading.current_thread(), table))
        return table

    def _prune(self) -> None:
        """Fold the tables of threads that ended into one (the lock held): threads that come
        and go leave no table behind."""
        live = []
        for thread, table in self._tables:
            if thread.is_alive():
                live.append((thread, table))
            else:
                _fold(self._ended, table)
        self._tables = live

    # The two events of every call, each in one frame (no per-event helper: on the hot path a
    # Python call costs as much as the rest). A series' row is found by lookups by string
    # (hashed once, when the string was made) in this thread's index of its table, not by a
    # tuple of labels built and hashed per call; the table holds the same row for the scrape.
    # The other events go through _count/_observe.
    def call(self, shard: str, command: str, outcome: str, seconds: float) -> None:
        try:
            row = self._local.calls[shard][command][outcome]
        except (AttributeError, KeyError):
            row = self._call_row(shard, command, outcome)
        row[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        row[-2] += seconds

    def _call_row(self, shard: str, command: str, outcome: str) -> list[Any]:
        """A call's series, made (and indexed) on its first call in this thread."""
        try:
            rows, calls = self._local.table[CALLS], self._local.calls
        except AttributeError:
            rows, calls = self._mine()[CALLS], self._local.calls
        labels = (shard, command, outcome)
        row = rows.get(labels)
        if row is None:
            row = rows[labels] = _histogram_row(_LATENCY_BUCKETS)
        calls.setdefault(shard, {}).setdefault(command, {})[outcome] = row
        return row

    def sent(
        self, shard: str, commands: Sequence[Any], replies: Sequence[Any], seconds: float
    ) -> None:
        # Every single-key call's one event: its rows found by the shard and the first command
        # as sent (no label derived per call), the outcome by whether the first reply is None.
        try:
            rows = self._local.sent[shard][commands[0][0]]
        except (AttributeError, KeyError):
            rows = self._sent_rows(shard, commands[0][0])
        row = rows[replies[0] is None]
        row[0 if seconds <= _FASTEST else bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        row[-2] += seconds

    def _sent_rows(self, shard: str, first: Any) -> tuple[list[Any], list[Any]]:
        """A first command's two rows on the shard (when its first reply is not None, when it
        is), labelled as :meth:`Metrics.sent` says, made on its first call in this thread."""
        batch = ((first,),)
        command = command_name(batch)
        rows = (
            self._call_row(shard, command, outcome(batch, (b"",))),
            self._call_row(shard, command, outcome(batch, (None,))),
        )
        self._local.sent.setdefault(shard, {})[first] = rows
        return rows

    def batches(self, batches: Iterable[tuple[str, Sequence[Any], bool, float]]) -> None:
        # A multi-key call's batches in one event: each row found by the shard, the first
        # command as sent and the outcome (no label derived per batch).
        try:
            index = self._local.batches
        except AttributeError:
            self._mine()
            index = self._local.batches
        for shard, commands, ok, seconds in batches:
            first = commands[0][0]
            try:
                row = index[shard][first][ok]
            except KeyError:
                row = None
            if row is None:
                row = self._batch_row(shard, first, ok)
            row[0 if seconds <= _FASTEST else bisect_left(_LATENCY_BUCKETS, seconds)] += 1
            row[-2] += seconds

    def _batch_row(self, shard: str, first: Any, ok: bool) -> list[Any]:
        """A first command's row on the shard for an outcome (``error``, ``ok``: indexed by
        success), made on its first batch with it in this thread."""
        pair = self._local.batches.setdefault(shard, {}).setdefault(first, [None, None])
        command = command_name(((first,),))
        row = pair[ok] = self._call_row(shard, command, "ok" if ok else "error")
        return row

    def lookups(self, counts: Iterable[tuple[str, int, int]]) -> None:
        try:
            index = self._local.lookups
        except AttributeError:
            self._mine()
            index = self._local.lookups
        for shard, hits, misses in counts:
            pair = index.get(shard)  # its hit and miss rows, each made on its first count
            if pair is None:
                pair = index[shard] = [None, None]
            if hits:
                (pair[0] or self._lookup_row(pair, shard, 0))[0] += hits
            if misses:
                (pair[1] or self._lookup_row(pair, shard, 1))[0] += misses

    def _lookup_row(self, pair: list[Any], shard: str, n: int) -> list[Any]:
        rows, labels = self._local.table[LOOKUPS], (shard, ("hit", "miss")[n])
        row = pair[n] = rows.get(labels) or _counter_row(rows, labels)
        return row

    def _count(self, family: Family, labels: tuple[str, ...], amount: int = 1) -> None:
        try:
            rows = self._local.table[family]
        except AttributeError:
            rows = self._mine()[family]
        (rows.get(labels) or _counter_row(rows, labels))[0] += amount

    def _observe(self, family: Family, labels: tuple[str, ...], seconds: float) -> None:
        try:
            rows = self._local.table[family]
        except AttributeError:
            rows = self._mine()[family]
        buckets = family.buckets or ()
        row = rows.get(labels)
        if row is None:
            row = rows[labels] = _histogram_row(buckets)
        row[bisect_left(buckets, seconds)] += 1
        row[-2] += seconds

    def snapshot(self) -> Table:
        """Every thread's numbers added up (what a scrape reads). A live thread's rows are
        copied by single C-level calls (``dict.copy``, ``list``), which no other thread can
        interleave with; a series it is changing meanwhile may lag by that one event."""
        with self._lock:
            self._prune()
            total = _table()
            _fold(total, self._ended)
            for _, table in self._tables:
                _fold(total, {family: rows.copy() for family, rows in table.items()})
        return total


def _counter_row(rows: Rows, labels: tuple[str, ...]) -> list[Any]:
    """A new counter series in ``rows``: its value and its creation time."""
    row = rows[labels] = [0, time.time()]
    return row


def _histogram_row(buckets: tuple[float, ...]) -> list[Any]:
    """A new histogram series: a count per bucket and one above the last, the sum, created."""
    return [0] * (len(buckets) + 2) + [time.time()]


def _table() -> Table:
    return {family: {} for family in FAMILIES}


def _fold(into: Table, table: Table) -> None:
    """Add ``table``'s numbers to ``into``'s (the earliest creation time kept)."""
    for family, rows in table.items():
        target = into[family]
        for labels, row in list(rows.items()):
            row = list(row)
            total = target.get(labels)
            if total is None:
                target[labels] = row
                continue
            for n in range(len(row) - 1):
                total[n] += row[n]
            total[-1] = min(total[-1], row[-1])


def _reset_in_child(metrics: PrometheusMetrics) -> Any:
    ref = weakref.ref(metrics)

    def reset() -> None:
        alive = ref()
        if alive is not None:
            alive.reset()

    return reset


_CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in (
    "true",
    "1",
    "t",
)  # as prometheus_client reads it


class _Exporter(Collector):
    """:class:`PrometheusMetrics`'s numbers as the samples prometheus_client's own counters and
    histograms would give: the same names, labels, buckets and ``_created`` series."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snapshot = self._metrics.snapshot()
        for family in FAMILIES:
            yield _family(family, snapshot[family])


def _family(family: Family, rows: dict[tuple[str, ...], list[Any]]) -> Metric:
    labels = list(family.labels)
    if family.buckets is None:
        counter = CounterMetricFamily(family.name, family.doc, labels=labels)
        for values_, (value, created) in rows.items():
            counter.add_metric(values_, value, created=created if _CREATED else None)
        return counter
    histogram = HistogramMetricFamily(family.name, family.doc, labels=labels)
    bounds = [floatToGoString(b) for b in (*family.buckets, float("inf"))]
    for values_, row in rows.items():
        cumulative = list(accumulate(row[: len(bounds)]))
        histogram.add_metric(values_, list(zip(bounds, cumulative, strict=True)), row[-2])
        if _CREATED:
            histogram.samples.append(
                Sample(f"{family.name}_created", dict(zip(labels, values_, strict=True)), row[-1])
            )
    return histogram


class MultiprocessMetrics(_Events):
    """With ``PROMETHEUS_MULTIPROC_DIR`` set: prometheus_client's own counters and histograms,
    whose values live in the files its ``MultiProcessCollector`` adds up over the workers
    (numbers kept in one process's memory would reach no scrape there)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self._metrics: dict[Family, Any] = {
            f: (
                Counter(f.name, f.doc, f.labels, registry=registry)
                if f.buckets is None
                else Histogram(f.name, f.doc, f.labels, buckets=f.buckets, registry=registry)
            )
            for f in FAMILIES
        }
        registry.register(_Gauges())
        self._children: dict[tuple[Family, tuple[str, ...]], Any] = {}

    def __repr__(self) -> str:
        return f"<MultiprocessMetrics {len(self._children)} series in use>"

    def _child(self, family: Family, labels: tuple[str, ...]) -> Any:
        child = self._children.get((family, labels))
        if child is None:
            child = self._children[family, labels] = self._metrics[family].labels(*labels)
        return child

    def _count(self, family: Family, labels: tuple[str, ...], amount: int = 1) -> None:
        self._child(family, labels).inc(amount)

    def _observe(self, family: Family, labels: tuple[str, ...], seconds: float) -> None:
        self._child(family, labels).observe(seconds)


class _Gauges(Collector):
    """Connections and listeners, read from the live cores when scraped (summed over cores
    that share a master name)."""

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        in_use = GaugeMetricFamily(
            "sentinel_cache_connections_in_use",
            "Connections to a shard's master checked out (or being made), this process.",
            labels=["shard"],
        )
        idle = GaugeMetricFamily(
            "sentinel_cache_connections_idle",
            "Idle connections to a shard's master, this process.",
            labels=["shard"],
        )
        listening = GaugeMetricFamily(
            "sentinel_cache_listener_connected",
            "1 if this process's listener on the sentinel is subscribed, else 0.",
            labels=["sentinel"],
        )
        busy: dict[str, int] = {}
        free: dict[str, int] = {}
        sentinels: dict[str, int] = {}
        for core in live_cores():
            for shard in core.shards:
                busy[shard.name] = busy.get(shard.name, 0) + shard.pool.in_use()
                free[shard.name] = free.get(shard.name, 0) + shard.pool.idle()
            for address, connected in core.listener_states().items():
                sentinels[address] = max(sentinels.get(address, 0), int(connected))
        for name, value in busy.items():
            in_use.add_metric([name], value)
        for name, value in free.items():
            idle.add_metric([name], value)
        for address, value in sentinels.items():
            listening.add_metric([address], value)
        yield from (in_use, idle, listening)
        yield from _near_cache_metrics()


def _near_cache_metrics() -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The near caches of this process (``NEAR_CACHE``), read from their counters at scrape
    time, summed over cores that share a master name (a core's counters start at zero)."""
    tracked = GaugeMetricFamily(
        "sentinel_cache_near_cache_tracked",
        "1 if the near cache tracks the shard's master (its copies may be served), else 0; "
        "the lowest over this process's cores.",
        labels=["shard"],
    )
    entries = GaugeMetricFamily(
        "sentinel_cache_near_cache_entries",
        "Copies held by the near cache for the shard, this process.",
        labels=["shard"],
    )
    lookups = CounterMetricFamily(
        "sentinel_cache_near_cache_lookups",
        "Near-cache lookups by result (hit: served locally; miss: asked the shard).",
        labels=["shard", "result"],
    )
    invalidations = CounterMetricFamily(
        "sentinel_cache_near_cache_invalidations",
        "Keys the shard's master named as changed (each evicts its copy).",
        labels=["shard"],
    )
    flushes = CounterMetricFamily(
        "sentinel_cache_near_cache_flushes",
        "Times the shard's copies were all dropped, by cause (master switched, tracker "
        "connection lost, tracker ping unanswered, server flush, master restarted, clear, "
        "stopped).",
        labels=["shard", "cause"],
    )
    rows: dict[str, list[int]] = {}  # shard -> tracked, entries, hits, misses, invalidations
    causes: dict[tuple[str, str], int] = {}
    for core in live_cores():
        near = core.near
        if near is None:
            continue
        for shard in core.shards:
            state = near.status(shard.index)
            row = rows.setdefault(shard.name, [1, 0, 0, 0, 0])
            row[0] = min(row[0], int(state["tracked"]))
            for n, name in enumerate(("entries", "hits", "misses", "invalidations"), 1):
                row[n] += state[name]
            for cause, count in state["flushes"].items():
                causes[(shard.name, cause)] = causes.get((shard.name, cause), 0) + count
    for name, (live, held, hits, misses, named) in rows.items():
        tracked.add_metric([name], live)
        entries.add_metric([name], held)
        lookups.add_metric([name, "hit"], hits)
        lookups.add_metric([name, "miss"], misses)
        invalidations.add_metric([name], named)
    for (name, cause), count in causes.items():
        flushes.add_metric([name, cause], count)
    yield from (tracked, entries, lookups, invalidations, flushes)


_shared: Metrics | None = None
_lock = threading.Lock()


def multiprocess() -> bool:
    """Whether prometheus_client keeps its values in ``PROMETHEUS_MULTIPROC_DIR``'s files."""
    return values.ValueClass is not values.MutexValue


def shared_metrics() -> Metrics:
    """The process's metrics, registered in ``prometheus_client.REGISTRY`` on first use."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = MultiprocessMetrics() if multiprocess() else PrometheusMetrics()
        return _shared
