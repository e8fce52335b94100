"""What the core tells a metrics backend, and when.

The core calls a :class:`Metrics` at a few points: each command batch sent to a shard (its
outcome and latency), the hits and misses of reads, master switches (and how they were learned),
write-fence holds, safety-net re-resolves and retries, shards skipped by ``IGNORE_EXCEPTIONS``.
``METRICS = True`` installs the Prometheus backend (:mod:`sentinel_cache.prometheus`); without
it the core holds ``None`` and pays one attribute test per call. Gauges (connections, listeners)
are not pushed: a backend reads them from :func:`sentinel_cache.core.topology.registry.live_cores` when
it is scraped.
"""

from __future__ import annotations


class Metrics:
    """The events, as no-ops: a backend overrides what it records. Labels are master names."""

    def call(self, shard: str, command: str, outcome: str, seconds: float) -> None:
        """One batch on one shard; ``command`` is its first command (``get``, ``mget``, ...),
        ``outcome`` ``hit`` or ``miss`` (a single-key ``get``), ``ok`` or ``error``."""

    def lookups(self, shard: str, hits: int, misses: int) -> None:
        """Keys read on one shard by a multi-key read: found, and not found."""

    def switch(self, shard: str, source: str) -> None:
        """The shard's master moved; ``source`` is how it was learned (``listener``, ...)."""

    def fence(self, shard: str, seconds: float) -> None:
        """Writes to the shard were held (a failover was announced) for ``seconds``."""

    def reresolve(self, shard: str) -> None:
        """The safety net asked the sentinels again after a failed call."""

    def retry(self, shard: str) -> None:
        """The safety net sent a batch again, on the shard's new master."""

    def skipped(self, shard: str, operation: str) -> None:
        """``IGNORE_EXCEPTIONS`` skipped the unavailable shard in ``operation`` (a command
        name, ``get_many``, ``iter_keys``, ``delete_pattern``, ``clear``, ...)."""

    def restart(self, shard: str) -> None:
        """The shard's master restarted without a switch (its data is gone unless it persists)."""


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
