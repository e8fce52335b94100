"""Per-shard connection pools that follow their master, and the sharded core that owns them.

Each shard has one redis-py client for its whole life. Its connections resolve the shard's
current address when they connect (redis-py's ``SentinelManagedConnection`` idea), and carry the
generation of the address they were made for; a switch bumps the shard's generation, so stale
connections (idle now, or checked out and coming back later) reconnect to the new master on their
next use. Only the switching shard is touched.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple, TypeVar

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sentinel_cache._sync.connection import ShardConnection, ShardSSLConnection
from sentinel_cache.config import Address, PoolConfig, connection_class_and_kwargs
from sentinel_cache.discovery import (
    Discovery,
    Resolution,
    SentinelSet,
    check_role,
    data_node_refusal,
)
from sentinel_cache.exceptions import (
    AuthenticationFailedError,
    FailoverInProgressError,
    PoolExhaustedError,
    ShardUnavailableError,
    StaleReplyError,
)
from sentinel_cache.fair_pool import EXHAUSTED, FairBlockingConnectionPool
from sentinel_cache.housekeeping import STALE_FENCE_SECONDS, Housekeeper
from sentinel_cache.listener import ListenerGroup
from sentinel_cache.ring import HashRing
from sentinel_cache.throttle import Throttle

logger = logging.getLogger("sentinel_cache")

T = TypeVar("T")
K = TypeVar("K", bound="str | bytes")

# Errors that mean "this node may no longer be the shard's master".
MASTER_ERRORS = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)

SwitchCallback = Callable[["SwitchEvent"], None]


class Evidence(NamedTuple):
    """Where a shard's address came from: the sentinels' config epoch for it (0 when unknown)
    and the monotonic time the information was obtained (the sentinels asked, or the event
    received). State only moves forward: a shard takes an address only on newer evidence."""

    epoch: int
    at: float

    def newer_than(self, other: Evidence) -> bool:
        if self.epoch and other.epoch and self.epoch != other.epoch:
            return self.epoch > other.epoch  # Sentinel's own rule: the higher epoch wins
        return self.at >= other.at


NO_EVIDENCE = Evidence(0, float("-inf"))


class SwitchEvent:
    """What a switch callback receives: which shard moved, from where to where, learned how."""

    __slots__ = ("shard_index", "name", "old", "new", "source", "lag", "at")

    def __init__(
        self,
        shard_index: int,
        name: str,
        old: Address | None,
        new: Address,
        source: str,
        lag: float | None,
    ) -> None:
        self.shard_index = shard_index
        self.name = name
        self.old = old
        self.new = new
        self.source = source
        self.lag = lag
        self.at = time.time()

    def __repr__(self) -> str:
        lag = "" if self.lag is None else f" lag={self.lag * 1000:.1f}ms"
        return (
            f"<SwitchEvent shard={self.shard_index} {self.name} {self.old} -> {self.new} "
            f"via {self.source}{lag}>"
        )


class ShardConnectionPool(FairBlockingConnectionPool):
    """A fair blocking pool (Jedis ``maxTotal`` + ``maxWaitMillis``, waiters served in order)
    whose exhaustion names the shard."""

    def __init__(self, shard: Shard, **kwargs: Any) -> None:
        self._shard_label = shard.label
        super().__init__(shard=shard, **kwargs)

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().get_connection(*args, **kwargs)
        except RedisConnectionError as exc:
            if str(exc) == EXHAUSTED:
                raise PoolExhaustedError(
                    f"shard {self._shard_label}: no free connection within {self.timeout}s "
                    f"(max_connections={self.max_connections})"
                ) from None
            raise


class Shard:
    """One master name at one ring position: its address, pool, fence and history."""

    def __init__(self, index: int, name: str, weight: int, config: PoolConfig) -> None:
        self.index = index
        self.name = name
        self.weight = weight
        self.label = f"{index} ({name})"
        self._lock = threading.Lock()
        self.address: Address | None = None
        self.generation = 0
        self.replicas: tuple[Address, ...] = ()
        self.agreeing = 0
        self.error: BaseException | None = None
        self.switch_count = 0
        self.last_switch: float | None = None
        self.last_switch_source: str | None = None
        self.evidence = NO_EVIDENCE
        # The safety net's re-resolve: single-flight, rate-limited, its failures logged once
        # per interval with a count of what was suppressed.
        self.resolving = threading.Lock()
        self.last_resolve = 0.0
        self.resolve_failures = Throttle(10.0)
        self._fence_open = threading.Event()
        self._fence_open.set()
        self.promotions = 0  # replica promotions announced: a reply in flight across one is moot
        self.fence_reason: str | None = None
        self.fence_since: float | None = None
        connection_class, kwargs = connection_class_and_kwargs(config.connection_options())
        if config.health_check_interval:
            kwargs.setdefault("health_check_interval", config.health_check_interval)
        ssl = issubclass(connection_class, redis.connection.SSLConnection)
        self.pool = ShardConnectionPool(
            self,
            connection_class=ShardSSLConnection if ssl else ShardConnection,
            max_connections=config.max_connections,
            timeout=config.pool_timeout,
            **kwargs,
        )
        self.client = redis.Redis(connection_pool=self.pool)
        self._replica_kwargs = (connection_class, kwargs, config.max_connections)
        self._replica_clients: dict[Address, redis.Redis] = {}
        self._down: set[Address] = set()  # listed by the sentinels, but failing our checks
        self.serving_replicas: tuple[Address, ...] = ()
        self._rotation: list[tuple[Address, redis.Redis]] = []
        self._replica_turn = itertools.count()

    def __repr__(self) -> str:
        fence = f" fenced({self.fence_reason})" if not self._fence_open.is_set() else ""
        return (
            f"<Shard {self.label} master={self.address} gen={self.generation} "
            f"replicas={len(self.replicas)} switches={self.switch_count}{fence}>"
        )

    def reset_locks(self) -> None:
        """After a fork: a lock held by a parent thread would never be released in the child."""
        self._lock = threading.Lock()
        self.resolving = threading.Lock()
        self.resolve_failures.reset_after_fork()
        fenced = self.fenced
        self._fence_open = threading.Event()
        if not fenced:
            self._fence_open.set()

    def current(self) -> tuple[Address | None, int]:
        with self._lock:
            return self.address, self.generation

    def switch(
        self, address: Address, *, source: str, evidence: Evidence | None = None
    ) -> tuple[Literal["stale", "same", "moved"], Address | None]:
        """Point this shard at ``address`` if ``evidence`` (default: learned now, epoch
        unknown) is newer than what it holds.

        Returns ``("moved", old)`` (old is None for the first address), ``("same", address)``
        or ``("stale", current)``: an answer obtained before a newer switch never undoes it,
        however late it arrives (a re-resolve that waited on a node back from a partition).
        """
        if evidence is None:
            evidence = Evidence(0, time.monotonic())
        with self._lock:
            old = self.address
            if old == address:  # a confirmation: keep the newer evidence
                if evidence.newer_than(self.evidence):
                    self.evidence = evidence
                self.error = None
                return "same", old
            if not evidence.newer_than(self.evidence):
                return "stale", old
            self.evidence = evidence
            self.error = None
            self.address = address
            self.generation += 1
            if old is not None:
                self.switch_count += 1
                self.last_switch = time.time()
                self.last_switch_source = source
        self.pool.retire_idle()  # network I/O outside the lock
        return "moved", old

    # -- write fence -------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        return not self._fence_open.is_set()

    def raise_fence(self, reason: str) -> None:
        with self._lock:
            if self._fence_open.is_set():
                self.fence_since = time.monotonic()
            self.fence_reason = reason
            self._fence_open.clear()

    def note_promotion(self) -> None:
        """The sentinels sent ``SLAVEOF NO ONE`` to a replica of this shard: from now on the old
        master's acknowledgements of commands already in flight prove nothing."""
        with self._lock:
            self.promotions += 1

    def lower_fence(self) -> None:
        with self._lock:
            self.fence_reason = None
            self.fence_since = None
            self._fence_open.set()

    def wait_fence(self, hold: float) -> None:
        if self._fence_open.is_set() or self._fence_open.wait(hold):
            return
        raise FailoverInProgressError(
            f"shard {self.label}: writes held for {hold:g}s while a failover is in progress "
            f"({self.fence_reason}); the new master was not confirmed in time"
        )

    # -- replicas ----------------------------------------------------------------------------
    def set_replicas(self, replicas: Sequence[Address]) -> None:
        """The replicas the sentinels list; clients are kept for those still listed."""
        replicas = tuple(replicas)
        if replicas == self.replicas:
            return
        connection_class, kwargs, max_connections = self._replica_kwargs
        with self._lock:
            current = self._replica_clients
            clients = {
                address: current.get(address)
                or redis.Redis(
                    connection_pool=FairBlockingConnectionPool(
                        host=address.host,
                        port=address.port,
                        connection_class=connection_class,
                        max_connections=max_connections,
                        **kwargs,
                    )
                )
                for address in replicas
            }
            dropped = [c for a, c in current.items() if a not in clients]
            self._replica_clients = clients
            self.replicas = replicas
            self._down &= set(replicas)
            self._update_rotation()
        for client in dropped:
            client.connection_pool.disconnect()

    def set_replica_health(self, address: Address, healthy: bool, why: str = "") -> None:
        """Take a replica out of the read rotation (a failed read or check), or back in."""
        with self._lock:
            if address not in self._replica_clients or (address not in self._down) == healthy:
                return
            if healthy:
                self._down.discard(address)
            else:
                self._down.add(address)
            self._update_rotation()
        logger.info(
            "shard %s: replica %s %s the read rotation%s",
            self.label,
            address,
            "rejoins" if healthy else "leaves",
            f" ({why})" if why else "",
        )

    def _update_rotation(self) -> None:
        self.serving_replicas = tuple(a for a in self.replicas if a not in self._down)
        self._rotation = [(a, self._replica_clients[a]) for a in self.serving_replicas]

    def read_replica(self) -> tuple[Address, redis.Redis] | None:
        """The next replica in the read rotation (its address and client), or None."""
        rotation = self._rotation
        if not rotation:
            return None
        return rotation[next(self._replica_turn) % len(rotation)]

    def read_client(self) -> redis.Redis:
        replica = self.read_replica()
        return self.client if replica is None else replica[1]

    def close(self) -> None:
        self.pool.disconnect()
        for client in self._replica_clients.values():
            client.connection_pool.disconnect()


class ShardedSentinelPool:
    """The framework-free core: ring, discovery, one pool per shard, and (later) listeners.

    Nothing connects in the constructor; the first use discovers every shard at once.
    """

    def __init__(
        self,
        masters: Sequence[str] | str,
        sentinels: Any,
        *,
        weights: Sequence[int] | None = None,
        sentinel_kwargs: dict[str, Any] | None = None,
        **connection_kwargs: Any,
    ) -> None:
        config = PoolConfig.create(
            masters,
            sentinels,
            weights=weights,
            sentinel_kwargs=sentinel_kwargs,
            **connection_kwargs,
        )
        self._setup(config)

    @classmethod
    def from_config(cls, config: PoolConfig) -> ShardedSentinelPool:
        pool = cls.__new__(cls)
        pool._setup(config)
        return pool

    def _setup(self, config: PoolConfig) -> None:
        self.config = config
        self.ring = HashRing(config.weights)
        self.shards: tuple[Shard, ...] = tuple(
            Shard(i, name, weight, config)
            for i, (name, weight) in enumerate(zip(config.masters, config.weights, strict=True))
        )
        self._by_name = {shard.name: shard for shard in self.shards}
        self._callbacks: list[SwitchCallback] = []
        self._closers: list[Callable[[], None]] = []
        self._reset_process_state()
        _live.add(self)

    def _reset_process_state(self) -> None:
        """State that must not cross a fork: locks, sentinel sockets, threads."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._initial: dict[str, Resolution | BaseException] = {}
        self.sentinels = SentinelSet(self.config.sentinels, self.config.sentinel_options())
        self.discovery = Discovery(
            self.sentinels,
            self.config.connection_options(),
            timeout=self.config.discovery_timeout,
            replicas=self.config.read_from_replicas,
        )
        for shard in self.shards:
            shard.reset_locks()
        self.listeners: ListenerGroup | None = None
        self.housekeeper: Housekeeper | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("started" if self._started else "idle")
        shards = ", ".join(f"{s.name}@{s.address}" for s in self.shards)
        return f"<ShardedSentinelPool {state} [{shards}] sentinels={len(self.sentinels.addresses)}>"

    # -- lifecycle ---------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()
        if self._started:
            return
        with self._lock:
            if self._closed:
                raise ShardUnavailableError("this ShardedSentinelPool is closed")
            if not self._started:
                self._initial = self._discover_all()
                self._start_listeners()
                self._started = True

    def _after_fork(self) -> None:
        logger.debug("fork detected (pid %s -> %s)", self._pid, os.getpid())
        self._reset_process_state()

    def _start_listeners(self) -> None:
        config = self.config
        if config.listeners:
            self.listeners = ListenerGroup(self, config.sentinel_options())
            self.listeners.ensure(self.sentinels.addresses)
        if config.listeners or config.read_from_replicas:
            self.housekeeper = Housekeeper(
                self, config.connection_options(), replicas=config.read_from_replicas
            )
            self.housekeeper.start()

    def _stop_background(self, *, wait: bool) -> None:
        listeners, self.listeners = self.listeners, None
        housekeeper, self.housekeeper = self.housekeeper, None
        if listeners is not None:
            listeners.stop(wait=wait)
        if housekeeper is not None:
            housekeeper.stop(wait=wait)

    def before_fork(self) -> None:
        """This process is about to fork (gunicorn's arbiter after ``--preload``, a prefork
        pool): stop its listeners and housekeeper without waiting, so only the children (which
        start their own) hold sentinel subscriptions. If this process uses the cache again, it
        discovers again and restarts them."""
        if self._started and self._pid == os.getpid():
            self._started = False
            self._stop_background(wait=False)
            # Idle sockets would be inherited by every child and never used there.
            self.sentinels.disconnect()
            for shard in self.shards:
                shard.pool.retire_idle()

    # -- push path: called by the listener threads ---------------------------------------------
    def shard_by_name(self, name: str) -> Shard | None:
        return self._by_name.get(name)

    def on_switch_announced(
        self,
        shard: Shard,
        address: Address,
        *,
        source: str,
        received: float,
        sentinel: Address | None = None,
    ) -> None:
        """A sentinel announced a new master: confirm it, switch, and release held writes.

        The announcing sentinel is asked for the new configuration's epoch (it has just
        adopted it), so a later answer from sentinels that have not heard of the failover yet
        cannot move the shard back."""
        epoch = 0 if sentinel is None else self.sentinels.config_epoch(sentinel, shard.name)
        self.confirm_and_switch(
            shard, address, source=source, evidence=Evidence(epoch, received), announced=True
        )
        if shard.address == address and shard.fenced:
            shard.lower_fence()

    def recheck(self, *, source: str) -> None:
        """Re-ask the sentinels about every shard (after a listener (re)subscribes)."""
        results = self.discovery.resolve(self.config.masters, timeout=0)
        for name, outcome in results.items():
            if isinstance(outcome, Resolution):
                shard = self._by_name[name]
                self._apply(shard, outcome, source=source)
                since = shard.fence_since
                if since is not None and time.monotonic() - since > STALE_FENCE_SECONDS:
                    shard.lower_fence()
        if self.listeners is not None:
            self.listeners.ensure(self.sentinels.addresses)

    def on_replica_event(self, shard: Shard) -> None:
        """A sentinel reported a change about one of the shard's replicas."""
        if self.housekeeper is not None:
            self.housekeeper.wake(shard)

    def refresh_replicas(self, name: str) -> None:
        """Ask the sentinels for one shard again (its replica list changed)."""
        outcome = self.discovery.resolve([name], timeout=0)[name]
        if isinstance(outcome, Resolution):
            self._apply(self._by_name[name], outcome, source="replica change")

    def recheck_failed(self) -> None:
        """Re-resolve the shards whose last resolution failed (rate-limited per shard)."""
        for shard in self.shards:
            if shard.error is not None and shard.address is not None:
                self.reresolve(shard, reason="recheck after a failed resolution")

    def check_fences(self) -> None:
        """Lift a fence whose failover we never heard the end of (a lost message)."""
        for shard in self.shards:
            since = shard.fence_since
            if since is not None and time.monotonic() - since > STALE_FENCE_SECONDS:
                self.reresolve(shard, reason="stale write fence", force=True)
                logger.warning(
                    "shard %s: no end of failover seen for %.0fs; releasing writes to %s",
                    shard.label,
                    STALE_FENCE_SECONDS,
                    shard.address,
                )
                shard.lower_fence()

    def _discover_all(self) -> dict[str, Resolution | BaseException]:
        results = self.discovery.resolve(self.config.masters)
        for name, outcome in results.items():
            shard = self._by_name[name]
            if isinstance(outcome, Resolution):
                self._apply(shard, outcome, source="discovery")
            else:
                shard.error = outcome
                logger.error("shard %s: %s", shard.label, outcome)
        return results

    def discover(self) -> dict[str, Address]:
        """Resolve every shard now; raise the first shard's error if any shard failed."""
        if self._started and self._pid == os.getpid():
            results = self._discover_all()
        else:
            self._ensure_started()
            results = self._initial
        for outcome in results.values():
            if isinstance(outcome, BaseException):
                raise outcome
        return {name: self._by_name[name].address for name in results}  # type: ignore[misc]

    def _apply(self, shard: Shard, resolution: Resolution, *, source: str) -> bool:
        """Take a resolution from the sentinels if it is newer than the shard's evidence."""
        if not resolution.verified:  # the sentinels still name the node that just failed
            return False
        outcome, old = shard.switch(
            resolution.address,
            source=source,
            evidence=Evidence(resolution.epoch, resolution.asked_at),
        )
        if outcome == "stale":
            logger.info(
                "shard %s: ignoring %s naming %s: a newer switch to %s came first",
                shard.label,
                source,
                resolution.address,
                old,
            )
            return False
        shard.agreeing = resolution.agreeing
        if self.config.read_from_replicas:
            shard.set_replicas(resolution.replicas)
        if outcome == "same":
            return False
        if old is not None:
            self._announce(shard, old, resolution.address, source, None)
        else:
            logger.info(
                "shard %s master %s (%d sentinels agree)",
                shard.label,
                resolution.address,
                resolution.agreeing,
            )
        return True

    def _announce(
        self, shard: Shard, old: Address | None, new: Address, source: str, lag: float | None
    ) -> None:
        event = SwitchEvent(shard.index, shard.name, old, new, source, lag)
        logger.warning(
            "shard %s switched %s -> %s (via %s%s)",
            shard.label,
            old,
            new,
            source,
            "" if lag is None else f", {lag * 1000:.1f} ms after the sentinels announced it",
        )
        for callback in list(self._callbacks):
            try:
                callback(event)
            except Exception:
                logger.exception("switch callback %r failed", callback)

    def on_switch(self, callback: SwitchCallback) -> Callable[[], None]:
        """Register ``callback(event)`` for every master switch (for metrics); returns an undo."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    def close(self) -> None:
        """Release every socket and thread; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._started = False  # the next use takes the slow path and sees "closed"
        _forget(self)
        self._stop_background(wait=True)
        self.sentinels.close()
        for shard in self.shards:
            shard.close()
        for closer in self._closers:
            try:
                closer()
            except Exception:
                logger.exception("closing %r failed", closer)

    def on_close(self, closer: Callable[[], None]) -> None:
        """Call ``closer()`` when this core closes (the asyncio clients close their sockets)."""
        self._closers.append(closer)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def started(self) -> bool:
        """Discovery done in this process (a forked child starts again)."""
        return self._started and self._pid == os.getpid()

    def __enter__(self) -> ShardedSentinelPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routing -----------------------------------------------------------------------------
    def shard_index(self, key: str | bytes) -> int:
        return self.ring.shard_index(key)

    def shard_for(self, key: str | bytes) -> Shard:
        return self.shards[self.ring.shard_index(key)]

    def shard(self, name_or_index: str | int) -> Shard:
        if isinstance(name_or_index, int):
            return self.shards[name_or_index]
        return self._by_name[name_or_index]

    def group_by_shard(self, keys: Iterable[K]) -> dict[Shard, list[K]]:
        """Keys grouped per shard, key order kept, so each shard gets one batched command."""
        shards = self.shards
        return {shards[i]: group for i, group in self.ring.group_by_shard(keys).items()}

    def client_for(self, key: str | bytes, *, write: bool = True) -> redis.Redis:
        """A redis-py client for the key's shard: its master (or a replica for reads, if set)."""
        shard = self.shard_for(key)
        self.ready(shard, write)
        return shard.client if write else shard.read_client()

    def ready(self, shard: Shard, write: bool) -> None:
        if not self._started or self._pid != os.getpid():
            self._ensure_started()
        if shard.address is None:
            self.reresolve(shard, reason="no master known yet")
            if shard.address is None:
                if isinstance(shard.error, AuthenticationFailedError):
                    raise type(shard.error)(f"shard {shard.label}: {shard.error}") from None
                raise ShardUnavailableError(
                    f"shard {shard.label}: no master known ({shard.error})"
                ) from None
        if write and shard.fenced:
            shard.wait_fence(self.config.failover_hold)

    def execute(
        self,
        shard: Shard,
        operation: Callable[[redis.Redis], T],
        *,
        write: bool = True,
        idempotent: bool = True,
    ) -> T:
        """Run ``operation(client)`` on the shard, with the pull-path safety net.

        A connection error, timeout or READONLY reply makes the shard re-resolve its master
        (rate-limited, and without waiting on the node that just failed); an idempotent
        operation is retried once if the master moved. A reply that arrived after the shard
        moved (or began a failover) is no acknowledgement: idempotent operations are retried,
        others raise :class:`StaleReplyError`.
        """
        self.ready(shard, write)
        replica = None if write else shard.read_replica()
        client = shard.client if replica is None else replica[1]
        address, generation = shard.current()
        try:
            return operation(client)
        except PoolExhaustedError:
            raise
        except MASTER_ERRORS as exc:
            if replica is not None:  # a replica failed: the master still serves reads
                shard.set_replica_health(replica[0], False, f"{type(exc).__name__}: {exc}")
                return operation(shard.client)
            if self.should_reresolve(shard, exc, generation):
                self.reresolve(shard, reason=f"{type(exc).__name__}: {exc}", suspect=address)
            self.retry_or_raise(shard, exc, generation, idempotent=idempotent)
        if write and shard.fenced:
            shard.wait_fence(self.config.failover_hold)
        return operation(shard.client)

    def should_reresolve(self, shard: Shard, exc: BaseException, generation: int) -> bool:
        """The safety net's first step after ``exc`` on the shard's master: True if the
        sentinels should be asked again. Raises at once what asking cannot fix (credentials,
        TLS). False when the shard already moved since the attempt began (nothing to ask)."""
        if isinstance(exc, StaleReplyError):
            return False
        refusal = self.refusal(shard, exc)
        if refusal is not None:
            raise refusal from exc
        return shard.generation == generation

    def retry_or_raise(
        self, shard: Shard, exc: BaseException, generation: int, *, idempotent: bool
    ) -> None:
        """The safety net's last step: return if the failed attempt may be retried once on the
        shard's (new) master, else raise. A stale reply is retried even if the shard did not
        move (a failover that began and was aborted): the retry's reply can be trusted."""
        if isinstance(exc, StaleReplyError):
            if idempotent:
                return
            raise exc
        if idempotent and shard.generation != generation and shard.address is not None:
            return
        raise ShardUnavailableError(
            f"shard {shard.label} at {shard.address}: {type(exc).__name__}: {exc}"
        ) from exc

    def refusal(self, shard: Shard, exc: BaseException) -> AuthenticationFailedError | None:
        """The error to raise if ``exc`` says the shard's data node refused our credentials or
        certificates (re-resolving cannot help), else None."""
        return data_node_refusal(exc, f"shard {shard.label}", shard.address, self.discovery.secrets)

    def reresolve(
        self,
        shard: Shard,
        *,
        reason: str,
        force: bool = False,
        suspect: Address | None = None,
    ) -> bool:
        """Ask the sentinels for this shard's master again; True if it moved.

        Rate-limited and single-flight, so a dead shard does not hammer the sentinels; with
        every sentinel down the shard keeps its last known master. ``suspect`` is the node the
        caller just saw fail: if the sentinels still name it, it is not asked for ``ROLE`` (a
        hung node would hold the caller for a second timeout) and nothing changes.
        """
        now = time.monotonic()
        if not force and now - shard.last_resolve < self.config.reresolve_interval:
            return False
        if not shard.resolving.acquire(blocking=False):
            return False
        try:
            shard.last_resolve = now
            suspects = {shard.name: suspect} if suspect is not None else None
            outcome = self.discovery.resolve([shard.name], timeout=0, suspects=suspects)
            result = outcome[shard.name]
            if isinstance(result, Resolution):
                return self._apply(shard, result, source=f"safety net ({reason})")
            shard.error = result
            shard.resolve_failures.warn(
                logger,
                "shard %s re-resolve after %s failed: %s",
                shard.label,
                reason,
                result,
            )
            return False
        finally:
            shard.resolving.release()

    def confirm_and_switch(
        self,
        shard: Shard,
        address: Address,
        *,
        source: str,
        evidence: Evidence,
        announced: bool = False,
    ) -> bool:
        """Switch to ``address`` once ``ROLE`` says it is a master (an event is only a hint),
        unless newer evidence moved the shard while ``ROLE`` was being asked.

        ``ROLE`` proves a node claims to be *a* master, not *this shard's*: an address that is
        another shard's master is refused outright (two shards on one node would mix keys).
        """
        if shard.address == address:
            shard.switch(address, source=source, evidence=evidence)  # keep the newer evidence
            return False
        owner = next((s for s in self.shards if s is not shard and s.address == address), None)
        if owner is not None:
            logger.warning(
                "shard %s: ignoring %s naming %s, the master of shard %s",
                shard.label,
                source,
                address,
                owner.label,
            )
            return False
        try:
            role = check_role(address, self.config.connection_options())
        except (redis.RedisError, OSError) as exc:
            logger.warning(
                "shard %s: %s announced %s, unreachable: %s",
                shard.label,
                source,
                address,
                exc,
            )
            return False
        if role != "master":
            logger.info(
                "shard %s: ignoring %s naming %s (ROLE is %s)",
                shard.label,
                source,
                address,
                role,
            )
            return False
        outcome, old = shard.switch(address, source=source, evidence=evidence)
        if outcome != "moved":
            if outcome == "stale":
                logger.info(
                    "shard %s: ignoring %s naming %s: a newer switch to %s came first",
                    shard.label,
                    source,
                    address,
                    old,
                )
            return False
        lag = time.monotonic() - evidence.at if announced else None
        self._announce(shard, old, address, source, lag)
        return True

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """A cheap snapshot from memory (no network); the status module adds live checks."""
        listeners = self.listeners.status() if self.listeners is not None and self.started else {}
        return {
            "started": self.started,
            "closed": self._closed,
            "shards": [
                {
                    "index": shard.index,
                    "name": shard.name,
                    "weight": shard.weight,
                    "address": None if shard.address is None else str(shard.address),
                    "replicas": [str(a) for a in shard.replicas],
                    "sentinels_agreeing": shard.agreeing,
                    "switch_count": shard.switch_count,
                    "last_switch": shard.last_switch,
                    "last_switch_source": shard.last_switch_source,
                    "fenced": shard.fenced,
                    "fence_reason": shard.fence_reason,
                    "error": None if shard.error is None else str(shard.error),
                    "connections": len(shard.pool._connections),
                }
                for shard in self.shards
            ],
            "sentinels": [
                {"address": str(address), "listener_connected": listeners.get(str(address))}
                for address in self.sentinels.addresses
            ],
        }


# -- process-wide registry: equal configurations share one core --------------------------------
_registry: dict[PoolConfig, ShardedSentinelPool] = {}
_registry_lock = threading.Lock()


def shared_pool(config: PoolConfig) -> ShardedSentinelPool:
    """The live core for ``config`` in this process, created on first request."""
    with _registry_lock:
        pool = _registry.get(config)
        if pool is None or pool.closed:
            pool = ShardedSentinelPool.from_config(config)
            _registry[config] = pool
        return pool


def _reinit_registry_lock() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()


def _before_fork() -> None:
    for pool in list(_live):
        pool.before_fork()


# Every core of this process, for the fork hook (weak: a core nobody holds is not kept alive).
_live: weakref.WeakSet[ShardedSentinelPool] = weakref.WeakSet()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_reinit_registry_lock)


def _forget(pool: ShardedSentinelPool) -> None:
    with _registry_lock:
        if _registry.get(pool.config) is pool:
            del _registry[pool.config]


def close_all() -> None:
    """Close every shared core (tests, and servers that shut down cleanly)."""
    with _registry_lock:
        pools = list(_registry.values())
    for pool in pools:
        pool.close()
