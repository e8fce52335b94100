"""Prometheus metrics for every core of the process: ``METRICS = True`` in the cache options.

Needs ``prometheus_client`` (``pip install "sentinel-cache[prometheus]"``). The metrics are
created once per process in ``prometheus_client.REGISTRY``, however many caches and cores there
are; each series is labelled with the shard's master name (``shard``). Expose them as usual:
``prometheus_client.start_http_server(port)``, django-prometheus's ``/metrics`` view, or
``prometheus_client.make_wsgi_app()`` in Flask.

Counters and histograms work with ``PROMETHEUS_MULTIPROC_DIR`` (gunicorn, uWSGI): set it before
the workers start, as prometheus_client documents. The gauges (connections in use and idle,
listener state) and the near cache's series are read from the live cores at scrape time, so in
multiprocess mode they show only the process that serves the scrape: alert on the other
counters there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from sentinel_cache.core.metrics import Metrics
from sentinel_cache.core.topology.sharded_pool import live_cores

__all__ = ["PrometheusMetrics", "shared_metrics"]

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
_FENCE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class PrometheusMetrics(Metrics):
    """The core's events as Prometheus counters and histograms (children cached per label set,
    so recording a call is a dictionary lookup, an increment and an observation)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.latency = Histogram(
            "sentinel_cache_command_duration_seconds",
            "Command batches sent to a shard by first command and outcome (hit or miss for a "
            "single-key get, else ok; error): time from sending to the last reply, safety net "
            "included (its _count counts batches).",
            ["shard", "command", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.keys = Counter(
            "sentinel_cache_multi_key_lookups",
            "Keys read by multi-key reads (get_many), by result (hit, miss).",
            ["shard", "result"],
            registry=registry,
        )
        self.switches = Counter(
            "sentinel_cache_master_switches",
            "Master switches applied, by how they were learned (listener, safety_net, ...).",
            ["shard", "source"],
            registry=registry,
        )
        self.fences = Histogram(
            "sentinel_cache_write_fence_hold_seconds",
            "How long writes to a shard were held while a failover was announced.",
            ["shard"],
            buckets=_FENCE_BUCKETS,
            registry=registry,
        )
        self.reresolves = Counter(
            "sentinel_cache_reresolves",
            "Times the safety net asked the sentinels again after a failed call.",
            ["shard"],
            registry=registry,
        )
        self.retries = Counter(
            "sentinel_cache_retries",
            "Batches sent again on a shard's new master by the safety net.",
            ["shard"],
            registry=registry,
        )
        self.outage_reads = Counter(
            "sentinel_cache_outage_reads",
            "Reads answered by a replica while the shard's master was unreachable and not "
            "replaced yet (OUTAGE_READS): as fresh as that replica's replication lag.",
            ["shard"],
            registry=registry,
        )
        self.skips = Counter(
            "sentinel_cache_skipped_shards",
            "Times IGNORE_EXCEPTIONS skipped an unavailable shard, by operation (a command "
            "name, get_many, iter_keys, delete_pattern, clear, ...).",
            ["shard", "operation"],
            registry=registry,
        )
        self.restarts = Counter(
            "sentinel_cache_master_restarts",
            "Masters found restarted without a switch (a new run_id on a new connection, or "
            "the sentinels' +reboot): empty unless they persist their data, and so are their "
            "replicas once resynced.",
            ["shard"],
            registry=registry,
        )
        registry.register(_Gauges())
        self._children: dict[tuple[str, ...], Any] = {}
        self._calls: dict[tuple[str, str, str], Any] = {}

    def __repr__(self) -> str:
        return f"<PrometheusMetrics {len(self._children)} series in use>"

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (str(id(metric)), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def call(self, shard: str, command: str, outcome: str, seconds: float) -> None:
        key = (shard, command, outcome)
        child = self._calls.get(key)
        if child is None:  # the hot path: one dictionary lookup, then the observation
            child = self._calls[key] = self.latency.labels(shard, command, outcome)
        child.observe(seconds)

    def lookups(self, shard: str, hits: int, misses: int) -> None:
        if hits:
            self._child(self.keys, shard, "hit").inc(hits)
        if misses:
            self._child(self.keys, shard, "miss").inc(misses)

    def switch(self, shard: str, source: str) -> None:
        self._child(self.switches, shard, source).inc()

    def fence(self, shard: str, seconds: float) -> None:
        self._child(self.fences, shard).observe(seconds)

    def reresolve(self, shard: str) -> None:
        self._child(self.reresolves, shard).inc()

    def retry(self, shard: str) -> None:
        self._child(self.retries, shard).inc()

    def outage_read(self, shard: str) -> None:
        self._child(self.outage_reads, shard).inc()

    def skipped(self, shard: str, operation: str) -> None:
        self._child(self.skips, shard, operation).inc()

    def restart(self, shard: str) -> None:
        self._child(self.restarts, shard).inc()


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
        "connection lost, tracker ping unanswered, server flush, clear, stopped).",
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


_shared: PrometheusMetrics | None = None
_lock = threading.Lock()


def shared_metrics() -> PrometheusMetrics:
    """The process's metrics, registered in ``prometheus_client.REGISTRY`` on first use."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = PrometheusMetrics()
        return _shared
