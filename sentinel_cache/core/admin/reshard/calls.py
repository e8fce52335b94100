"""The migration's and the plan's way to the servers: commands on a shard's master through the
core's safety net, retried while a failover is in progress; a token bucket for the rate limit;
each scanned key's owner."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import AuthenticationError

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ops.plans import Command
from sentinel_cache.core.ring import HashRing
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.shard import MASTER_ERRORS, Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

__all__ = ["DEFAULT_RETRY_FOR", "Calls", "TokenBucket", "owner_lookup", "sources"]

logger = logging.getLogger("sentinel_cache")

DEFAULT_RETRY_FOR = 30.0


def owner_lookup(core: ShardedSentinelPool) -> Callable[[Any], Shard]:
    """``core.shard_for`` for keys scanned once each: the same ring, without its LRU cache (a
    scan would only fill it with keys never asked for again, and evict the hot ones)."""
    index = HashRing(core.config.weights).uncached_index
    shards = core.shards
    shard_for = core.shard_for

    def owner(key: Any) -> Shard:
        if type(key) is not bytes:
            return shard_for(key)
        return shards[index(key)]

    return owner


def sources(core: ShardedSentinelPool) -> list[Shard]:
    """The shards of the previous placement, in its order (masters leaving the ring included)."""
    return [core.shard(name) for name in core.config.previous_masters]


class TokenBucket:
    """At most ``rate`` tokens a second on average, ``burst`` at once: :meth:`take` sleeps off
    any debt."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = float(rate)
        self.capacity = float(burst if burst is not None else max(1.0, rate / 10))
        self.tokens = self.capacity
        self._clock = clock
        self._sleep = sleep
        self._last = clock()

    def take(self, n: float) -> None:
        now = self._clock()
        self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.rate)
        self._last = now
        self.tokens -= n
        if self.tokens < 0:
            self._sleep(-self.tokens / self.rate)


class Calls:
    """Commands on one shard's master through the core's safety net (re-resolve, one retry after
    a switch), retried with a backoff while the shard is unavailable (a failover in progress),
    for at most ``retry_for`` seconds. Credentials refused are raised at once. ``durable_*``:
    the DURABLE_REPLICAS of the caches on ``core``, for :meth:`written`."""

    def __init__(
        self,
        core: ShardedSentinelPool,
        retry_for: float,
        *,
        durable_replicas: int = 0,
        durable_timeout_ms: int = 100,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ops = CacheClient(
            core, Codec(), durable_replicas=durable_replicas, durable_timeout_ms=durable_timeout_ms
        )
        self.retry_for = retry_for
        self.clock = clock
        self.sleep = sleep

    def _retrying(self, shard: Shard, attempt: Callable[[], Any]) -> Any:
        deadline: float | None = None
        delay = 0.05
        while True:
            try:
                return attempt()
            except AuthenticationError:
                raise
            except MASTER_ERRORS as exc:
                now = self.clock()
                if deadline is None:
                    deadline = now + self.retry_for
                    logger.warning(
                        "reshard: shard %s unavailable (%s: %s); retrying for up to %gs",
                        shard.label,
                        type(exc).__name__,
                        exc,
                        self.retry_for,
                    )
                if now >= deadline:
                    raise
                self.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 1.0)

    def run(self, shard: Shard, commands: Sequence[Command], *, retry: bool = True) -> list[Any]:
        attempt = lambda: self.ops.execute(shard, commands, write=True)  # noqa: E731
        return self._retrying(shard, attempt) if retry else attempt()

    def one(self, shard: Shard, command: Command, *, retry: bool = True) -> Any:
        return self.run(shard, [command], retry=retry)[0]

    def scatter(self, plan: Mapping[Shard, Sequence[Command]]) -> dict[Shard, list[Any]]:
        """Every shard's batch sent before any reply is read. After a failure, each shard's
        batch is sent again on its own, with the retries of :meth:`run`: every command sent here
        is idempotent (a restore that had been applied then counts as already present)."""
        try:
            replies = self.ops.scatter(plan, write=True, operation="reshard")
        except AuthenticationError:
            raise
        except MASTER_ERRORS:
            replies = {}
        return {
            shard: replies.get(shard) or self.run(shard, commands)
            for shard, commands in plan.items()
        }

    def written(self, plan: Mapping[Shard, Sequence[Command]]) -> dict[Shard, list[Any]]:
        """:meth:`scatter` of writes, each shard's batch followed by the WAIT of
        DURABLE_REPLICAS (the client's rule: a shortfall logged); the replies without it."""
        replies = self.scatter(self.ops.durable_plan(plan))
        self.ops.durable_checked(replies)
        return replies
