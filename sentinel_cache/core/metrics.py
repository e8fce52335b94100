"""What the core tells a metrics backend and a tracer, and when.

The core calls a :class:`Metrics` at a few points: each command batch sent to a shard (its
outcome and latency; a multi-key call's batches in one event), the hits and misses of reads,
master switches (and how they were learned), write-fence holds, safety-net re-resolves and
retries, reads served by a replica during an outage, shards skipped by ``IGNORE_EXCEPTIONS``.
``METRICS = True`` installs the Prometheus backend (:mod:`sentinel_cache.prometheus`); without
it the core holds ``None`` and pays one attribute test per call. Gauges (connections, listeners)
are not pushed: a backend reads them from
:func:`sentinel_cache.core.topology.sharded_pool.live_cores` when it is scraped.

The exporter is a layer above the core, so the core loads it by name (:data:`EXPORTER`), as
Django loads a cache ``BACKEND``, and never imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Any

from sentinel_cache.exceptions import ConfigurationError
from sentinel_cache.version import __version__

try:  # the API only; without an SDK configured its spans are no-ops
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - exercised by the TRACING option's error
    _trace = None  # type: ignore[assignment]

# The module whose ``shared_metrics()`` is the process's backend when ``METRICS`` is on.
EXPORTER = "sentinel_cache.prometheus"


class Metrics:
    """The events, as no-ops: a backend overrides what it records. Labels are master names."""

    def call(self, shard: str, command: str, outcome: str, seconds: float) -> None:
        """One batch on one shard; ``command`` is its first command (``get``, ``mget``, ...),
        ``outcome`` ``hit`` or ``miss`` (a single-key ``get``), ``ok`` or ``error``."""

    def sent(
        self, shard: str, commands: Sequence[Any], replies: Sequence[Any], seconds: float
    ) -> None:
        """One batch on one shard that succeeded: :meth:`call` with the labels its commands and
        replies give (:func:`command_name`, :func:`outcome`). A backend may derive them its own
        way, as long as it records the same: this is the call of every single-key operation."""
        self.call(shard, command_name(commands), outcome(commands, replies), seconds)

    def batches(self, batches: Iterable[tuple[str, Sequence[Any], bool, float]]) -> None:
        """The batches of one multi-key call (a scatter), recorded once for the call: per shard
        its name, its commands, whether its replies were read (``ok``) or not (``error``), and
        the seconds from the call's start to its replies. The same series as a :meth:`call` per
        batch: the metric is labelled by shard, so each shard's batch is still counted, but the
        backend is called once, not once per shard."""
        for shard, commands, ok, seconds in batches:
            self.call(shard, command_name(commands), "ok" if ok else "error", seconds)

    def lookups(self, counts: Iterable[tuple[str, int, int]]) -> None:
        """Keys read by one multi-key read, recorded once for the call: per shard, its name and
        how many keys were found and not found."""

    def switch(self, shard: str, source: str) -> None:
        """The shard's master moved; ``source`` is how it was learned (``listener``, ...)."""

    def fence(self, shard: str, seconds: float) -> None:
        """Writes to the shard were held (a failover was announced) for ``seconds``."""

    def reresolve(self, shard: str) -> None:
        """The safety net asked the sentinels again after a failed call."""

    def retry(self, shard: str) -> None:
        """The safety net sent a batch again, on the shard's new master."""

    def outage_read(self, shard: str) -> None:
        """A read was answered by a replica while the shard's master was unreachable
        (``OUTAGE_READS``)."""

    def skipped(self, shard: str, operation: str) -> None:
        """``IGNORE_EXCEPTIONS`` skipped the unavailable shard in ``operation`` (a command
        name, ``get_many``, ``iter_keys``, ``delete_pattern``, ``clear``, ...)."""

    def restart(self, shard: str) -> None:
        """The shard's master restarted without a switch (its data is gone unless it persists)."""


def command_name(commands: Sequence[Any]) -> str:
    """A batch's metrics label: its first command, lower case (``get``, ``mget``, ``eval``)."""
    return str(commands[0][0]).lower()


def outcome(commands: Sequence[Any], replies: Sequence[Any]) -> str:
    """A successful batch's metrics outcome: ``hit`` or ``miss`` for a single-key read, else
    ``ok`` (multi-key reads count their keys with ``Metrics.lookups``)."""
    if commands[0][0] == "GET":
        return "miss" if replies[0] is None else "hit"
    return "ok"


_SOURCE_KINDS = (
    ("+switch-master", "listener"),
    ("resync", "listener_resync"),
    ("safety net", "safety_net"),
    ("discovery", "discovery"),
    ("replica", "replica_change"),
)


def source_kind(source: str) -> str:
    """A bounded label for a switch's source (``safety net (ConnectionError: ...)`` ->
    ``safety_net``), so a metric never gets one series per error message or address."""
    for prefix, kind in _SOURCE_KINDS:
        if source.startswith(prefix):
            return kind
    return "other"


def metrics_backend(enabled: bool) -> Metrics | None:
    """The process's metrics backend when ``METRICS`` is on (shared by every core), else None."""
    if not enabled:
        return None
    try:
        exporter = importlib.import_module(EXPORTER)
    except ImportError as exc:
        raise ConfigurationError(
            option="METRICS",
            value=True,
            reason='needs prometheus_client: pip install "sentinel-cache[prometheus]"',
        ) from exc
    backend: Metrics = exporter.shared_metrics()
    return backend


def tracer(enabled: bool) -> Any:
    """This library's OpenTelemetry tracer when ``TRACING`` is on, else None."""
    if not enabled:
        return None
    if _trace is None:
        raise ConfigurationError(
            option="TRACING",
            value=True,
            reason='needs opentelemetry-api: pip install "sentinel-cache[opentelemetry]"',
        )
    return _trace.get_tracer("sentinel_cache", __version__)
