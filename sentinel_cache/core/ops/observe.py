"""Metrics and traces around one call to a shard, in one place for both flavours.

:class:`Observed` is a plain (sync) context manager, so the one async source of the operations
uses it unchanged in both generated flavours. It is entered only when the core has metrics or a
tracer: with neither, a call pays one attribute test. The spans follow OpenTelemetry's database
conventions (``db.system.name``, ``db.operation.name``, ``server.address``/``server.port`` of the
master that answered) and add ``sentinel_cache.shard`` (the master name), and, when they
happened, ``sentinel_cache.fence_wait_ms`` (writes held by a failover),
``sentinel_cache.retried`` (sent again on a new master by the safety net) and
``sentinel_cache.outage_read`` (answered by a replica while the master was unreachable).
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sentinel_cache.core.metrics import command_name
from sentinel_cache.core.ops.plans import Command

if TYPE_CHECKING:
    from sentinel_cache.core.topology.shard import Shard
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

try:  # the API only; without an SDK configured its spans are no-ops
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - the core's tracer is None then, and nothing here runs
    _trace = None  # type: ignore[assignment]


class Observed:
    """One call (``shards`` one shard, or a multi-key batch's shards) timed and traced."""

    __slots__ = ("core", "shard", "commands", "name", "replies", "started", "span", "_scope")

    def __init__(
        self,
        core: ShardedSentinelPool,
        shard: Shard | None,
        commands: Sequence[Command] | None,
        name: str,
        shards: Sequence[Shard] = (),
    ) -> None:
        self.core = core
        self.shard = shard
        self.commands = commands
        self.name = name
        self.replies: Sequence[Any] | None = None
        self.started = 0.0
        self.span: Any = None
        self._scope: Any = None
        if core.tracer is not None:
            names = [s.name for s in shards] if shard is None else [shard.name]
            self.span = core.tracer.start_span(
                f"sentinel_cache {name}",
                kind=_trace.SpanKind.CLIENT,
                attributes={
                    "db.system.name": "redis",
                    "db.operation.name": name,
                    "sentinel_cache.shard" if shard is not None else "sentinel_cache.shards": (
                        names[0] if shard is not None else names
                    ),
                },
            )

    def __enter__(self) -> Observed:
        if self.span is not None:
            self._scope = _trace.use_span(self.span, end_on_exit=False)
            self._scope.__enter__()
        self.started = perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        elapsed = perf_counter() - self.started
        shard, metrics = self.shard, self.core.metrics
        if shard is not None and metrics is not None and self.commands is not None:
            if exc is not None:
                metrics.call(shard.name, self.name, "error", elapsed)
            else:
                metrics.sent(shard.name, self.commands, self.replies or [None], elapsed)
        span = self.span
        if span is None:
            return
        if shard is not None and shard.address is not None:
            span.set_attribute("server.address", shard.address.host)
            span.set_attribute("server.port", shard.address.port)
        if exc is not None:
            span.record_exception(exc)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, str(exc)))
            span.set_attribute("error.type", type(exc).__qualname__)
        self._scope.__exit__(kind, exc, tb)
        span.end()


def observed(core: ShardedSentinelPool, shard: Shard, commands: Sequence[Command]) -> Observed:
    return Observed(core, shard, commands, command_name(commands))


def note(
    core: ShardedSentinelPool,
    shard: Shard,
    *,
    retried: bool = False,
    fence_wait: float = 0.0,
    outage_read: bool = False,
) -> None:
    """Record on the current call what the safety net did: a retry, a wait on a fence, a
    read answered by a replica during an outage (counted on the shard too, for its status)."""
    if outage_read:
        shard.note_outage_read()
    if core.metrics is not None:
        if retried:
            core.metrics.retry(shard.name)
        if outage_read:
            core.metrics.outage_read(shard.name)
    if core.tracer is not None:
        span = _trace.get_current_span()
        if retried:
            span.set_attribute("sentinel_cache.retried", True)
        if outage_read:
            span.set_attribute("sentinel_cache.outage_read", True)
        if fence_wait:
            span.set_attribute("sentinel_cache.fence_wait_ms", round(fence_wait * 1000, 3))
