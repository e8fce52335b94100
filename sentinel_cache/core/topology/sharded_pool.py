"""The sharded core (Jedis's ``ShardedJedisSentinelPool``): the ring, one ``Shard`` per master,
discovery, the listeners, and its life (start, fork, close).

What it decides lives beside it: :mod:`~sentinel_cache.core.topology.placement` (every switch,
"one node, one shard") and :mod:`~sentinel_cache.core.topology.safety` (when to ask the
sentinels again, and whether a failed call is retried); the pool exposes both under its own
method names, which the operations and the listeners call."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import redis

from sentinel_cache.core.arguments import check_key
from sentinel_cache.core.config import Address, PoolConfig
from sentinel_cache.core.metrics import metrics_backend, tracer
from sentinel_cache.core.process import PROCESS
from sentinel_cache.core.ring import HashRing
from sentinel_cache.core.topology import registry
from sentinel_cache.core.topology.discovery import (
    Discovery,
    Resolution,
    SentinelSet,
    direct_client,
)
from sentinel_cache.core.topology.following import run_id_of
from sentinel_cache.core.topology.housekeeping import Housekeeper
from sentinel_cache.core.topology.listener import ListenerGroup
from sentinel_cache.core.topology.near import NearCache
from sentinel_cache.core.topology.placement import Placement
from sentinel_cache.core.topology.safety import SafetyNet
from sentinel_cache.core.topology.shard import Evidence, Shard, SwitchCallback
from sentinel_cache.exceptions import AuthenticationFailedError, ShardUnavailableError

logger = logging.getLogger("sentinel_cache")

T = TypeVar("T")
K = TypeVar("K", bound="str | bytes")


class ShardedSentinelPool:
    """The framework-free core: ring, discovery, one pool per shard, and the sentinel listeners.

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

    @property
    def _names(self) -> list[str]:
        """Every master followed: the ring's, then those leaving it (during a resharding)."""
        return [shard.name for shard in self.every_shard]

    def _setup(self, config: PoolConfig) -> None:
        self.config = config
        self.ring = HashRing(config.weights)
        self.metrics = metrics_backend(config.metrics)
        self.shards: tuple[Shard, ...] = tuple(
            Shard(i, name, weight, config, metrics=self.metrics, restarted=self._report_restart)
            for i, (name, weight) in enumerate(zip(config.masters, config.weights, strict=True))
        )
        # While a resharding migrates keys (PREVIOUS_MASTERS): the old placement, and a shard
        # for each master that leaves the ring (still followed, so its keys can be read).
        self.previous_ring = HashRing(config.previous_weights) if config.previous_masters else None
        current = set(config.masters)
        leaving = [
            (name, weight)
            for name, weight in zip(config.previous_masters, config.previous_weights, strict=True)
            if name not in current
        ]
        self.departed: tuple[Shard, ...] = tuple(
            Shard(
                len(self.shards) + i,
                name,
                weight,
                config,
                metrics=self.metrics,
                restarted=self._report_restart,
            )
            for i, (name, weight) in enumerate(leaving)
        )
        self.every_shard = self.shards + self.departed
        self._by_name = {shard.name: shard for shard in self.every_shard}
        self._previous = tuple(self._by_name[name] for name in config.previous_masters)
        self._closers: list[Callable[[], None]] = []
        self.placement = Placement(self.every_shard, config, self.metrics)
        self.near = NearCache(config, self.shards, self.shard_index) if config.near_cache else None
        self.tracer = tracer(config.tracing)
        self._reset_process_state()
        registry.track(self)

    def _reset_process_state(self) -> None:
        """State that must not cross a fork: locks, sentinel sockets, threads."""
        self._pid = PROCESS.pid
        self._lock = threading.Lock()
        self._started = False
        self.closed = False  # read on every call: an attribute, not a property
        self._initial: dict[str, Resolution | BaseException] = {}
        self.placement.reset_locks()
        self.sentinels = SentinelSet(self.config.sentinels, self.config.sentinel_options())
        self.discovery = Discovery(
            self.sentinels,
            self.config.connection_options(),
            timeout=self.config.discovery_timeout,
            replicas=self.config.read_from_replicas or self.config.outage_reads,
            claimant=self.placement.claimant,
        )
        self.safety = SafetyNet(
            self.every_shard,
            self.discovery,
            self.placement,
            interval=self.config.reresolve_interval,
            metrics=self.metrics,
            outage_reads=self.config.outage_reads,
            outage_hold=self.config.outage_hold,
        )
        for shard in self.every_shard:
            shard.reset_locks()
        if self.near is not None:  # a forked child starts empty and tracks on its own
            self.near.reset()
        self.listeners: ListenerGroup | None = None
        self.housekeeper: Housekeeper | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("started" if self._started else "idle")
        shards = ", ".join(f"{s.name}@{s.address}" for s in self.shards)
        return f"<ShardedSentinelPool {state} [{shards}] sentinels={len(self.sentinels.addresses)}>"

    # -- lifecycle ---------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._pid != PROCESS.pid:
            self._after_fork()
        if self._started:
            return
        with self._lock:
            if self.closed:
                raise ShardUnavailableError("this ShardedSentinelPool is closed")
            if not self._started:
                self._initial = self._discover_all()
                self._start_listeners()
                self._started = True

    def _after_fork(self) -> None:
        logger.debug("fork detected (pid %s -> %s)", self._pid, PROCESS.pid)
        self._reset_process_state()

    def _start_listeners(self) -> None:
        config = self.config
        if config.listeners:
            self.listeners = ListenerGroup(self, config.sentinel_options())
            self.listeners.ensure(self.sentinels.addresses)
        replicas = config.read_from_replicas or config.outage_reads
        if config.listeners or replicas or config.outage_hold:
            self.housekeeper = Housekeeper(
                self, config.connection_options(), replicas=replicas, sentinels=self.sentinels
            )
            self.housekeeper.start()
        if self.near is not None and not self.near.running:  # still running after a fork
            self.near.start(self.shards, config)

    def _stop_background(self, *, wait: bool, near: bool = True) -> None:
        listeners, self.listeners = self.listeners, None
        housekeeper, self.housekeeper = self.housekeeper, None
        if near and self.near is not None:
            self.near.stop(wait=wait)
        if listeners is not None:
            listeners.stop(wait=wait)
        if housekeeper is not None:
            housekeeper.stop(wait=wait)

    def before_fork(self) -> None:
        """This process is about to fork (gunicorn's arbiter after ``--preload``, a prefork
        pool): stop its listeners and housekeeper without waiting, so only the children (which
        start their own) hold sentinel subscriptions. If this process uses the cache again, it
        discovers again and restarts them. The near cache is left as it is: its copies and
        trackers go on serving this process (a child starts its own, empty), as emptying it
        would cost this process a cold cache and a reconnection per fork."""
        if self._started and self._pid == PROCESS.pid:
            self._started = False
            self._stop_background(wait=False, near=False)
            # Idle sockets would be inherited by every child and never used there.
            self.sentinels.disconnect()
            for shard in self.every_shard:
                shard.pool.retire_idle()

    def after_fork_in_child(self) -> None:
        """In a new child, at once: the near cache starts empty. Its copies are the parent's,
        kept correct by the parent's trackers, which do not run here, and a hit is served
        without any other call that would notice the fork."""
        if self.near is not None:
            self.near.reset()

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
        self.placement.confirm_and_switch(
            shard,
            address,
            source=source,
            evidence=Evidence(epoch, received),
            majority=len(self.sentinels.addresses) < 2,  # one sentinel's word
            announced=True,
        )
        if shard.address == address and shard.fenced:
            shard.lower_fence()

    def recheck(self, *, source: str) -> None:
        """Re-ask the sentinels about every shard (after a listener (re)subscribes)."""
        results = self.discovery.resolve(self._names, timeout=0)
        for name, outcome in results.items():
            if isinstance(outcome, Resolution):
                shard = self._by_name[name]
                self.apply_resolution(shard, outcome, source=source)
                self.safety.release_stale_fence(shard, asked=True)
        if self.listeners is not None:
            self.listeners.ensure(self.sentinels.addresses)

    def on_reboot(self, shard: Shard, address: Address, *, source: str) -> None:
        """A sentinel saw the shard's master restart (``+reboot``): ask its run_id now, so a
        restart this process has not reconnected through yet is reported too (once)."""
        current, generation = shard.current()
        if current != address:
            return  # a node the shard has left
        asked_at = time.monotonic()
        client = direct_client(address, self.config.connection_options())
        try:
            run_id = run_id_of(client.info("server"))
        except (redis.RedisError, OSError) as exc:
            logger.warning(
                "shard %s: %s, and its run_id cannot be asked: %s", shard.label, source, exc
            )
            return
        finally:
            client.close()
            client.connection_pool.disconnect()
        if run_id is not None:
            shard.note_run_id(generation, run_id, asked_at, source=source, rebooted=True)

    def _report_restart(self, shard: Shard, old: str | None, new: str, source: str) -> None:
        """A master restarted without a switch (see ``Shard.note_run_id``): say so loudly, count
        it, and drop the shard's near-cache copies (they copy data that is gone)."""
        logger.error(
            "shard %s: master %s restarted without a failover (run_id %s -> %s, seen on %s): "
            "it came back empty unless it persists its data, and its replicas resync from it "
            'and drop theirs (see docs/operations.md, "Empty restarts")',
            shard.label,
            shard.address,
            old or "unknown",
            new,
            source,
        )
        if self.metrics is not None:
            self.metrics.restart(shard.name)
        if self.near is not None and shard.index < len(self.shards):
            self.near.flush_shard(shard.index, "master restarted")

    def on_replica_event(self, shard: Shard) -> None:
        """A sentinel reported a change about one of the shard's replicas."""
        if self.housekeeper is not None:
            self.housekeeper.wake(shard)

    def refresh_replicas(self, name: str) -> None:
        """Ask the sentinels for one shard again (its replica list changed)."""
        outcome = self.discovery.resolve([name], timeout=0)[name]
        if isinstance(outcome, Resolution):
            self.apply_resolution(self._by_name[name], outcome, source="replica change")

    def recheck_failed(self) -> None:
        """Re-resolve the shards whose last resolution failed (see ``SafetyNet``)."""
        self.safety.recheck_failed()

    def check_fences(self) -> None:
        """Lift a fence whose failover we never heard the end of (see ``SafetyNet``)."""
        self.safety.check_fences()

    def check_outages(self) -> None:
        """Ask again about the shards whose master was found unreachable (see ``SafetyNet``)."""
        self.safety.check_outages()

    def _discover_all(self) -> dict[str, Resolution | BaseException]:
        results = self.discovery.resolve(self._names)
        for name, outcome in results.items():
            shard = self._by_name[name]
            if isinstance(outcome, Resolution):
                self.apply_resolution(shard, outcome, source="discovery")
            else:
                shard.failed(outcome)
                logger.error("shard %s: %s", shard.label, outcome)
        return results

    def discover(self) -> dict[str, Address]:
        """Resolve every shard now; raise the first shard's error if any shard failed."""
        if self._started and self._pid == PROCESS.pid:
            results = self._discover_all()
        else:
            self._ensure_started()
            results = self._initial
        for outcome in results.values():
            if isinstance(outcome, BaseException):
                raise outcome
        return {name: self._by_name[name].address for name in results}  # type: ignore[misc]

    def close(self) -> None:
        """Release every socket and thread; idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._started = False  # the next use takes the slow path and sees "closed"
        with _shared_lock:
            if _shared.get(self.config) is self:
                del _shared[self.config]
        self._stop_background(wait=True)
        self.sentinels.close()
        for shard in self.every_shard:
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
    def started(self) -> bool:
        """Discovery done in this process (a forked child starts again)."""
        return self._started and self._pid == PROCESS.pid

    def __enter__(self) -> ShardedSentinelPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routing -----------------------------------------------------------------------------
    def shard_index(self, key: str | bytes) -> int:
        return self.ring.shard_index(key)

    def shard_for(self, key: str | bytes) -> Shard:
        """The shard of a key about to be sent; the key error for one that cannot be (the ring
        places any str, as Java does; a str that is not valid Unicode has no bytes to send)."""
        if type(key) is str and not key.isascii():
            check_key(key)
        return self.shards[self.ring.shard_index(key)]

    def previous_shard_for(self, key: str | bytes) -> Shard | None:
        """The shard that owned ``key`` before the resharding (``PREVIOUS_MASTERS``), if that is
        another shard than its owner now; else None (no resharding, or the key did not move)."""
        ring = self.previous_ring
        if ring is None:
            return None
        if type(key) is str and not key.isascii():
            check_key(key)
        previous = self._previous[ring.shard_index(key)]
        return None if previous is self.shards[self.ring.shard_index(key)] else previous

    def shard(self, name_or_index: str | int) -> Shard:
        if isinstance(name_or_index, int):
            return self.shards[name_or_index]
        return self._by_name[name_or_index]

    def group_by_shard(self, keys: Iterable[K]) -> dict[Shard, list[K]]:
        """Keys grouped per shard, key order kept, so each shard gets one batched command."""
        shards = self.shards
        groups = self.ring.group_by_shard(keys)
        for group in groups.values():  # as in shard_for: keys about to be sent
            for key in group:
                if type(key) is str and not key.isascii():
                    check_key(key)
        return {shards[i]: group for i, group in groups.items()}

    def client_for(self, key: str | bytes, *, write: bool = True) -> redis.Redis:
        """A redis-py client for the key's shard: its master (or a replica for reads, if set)."""
        shard = self.shard_for(key)
        self.ready(shard, write)
        return shard.client if write else shard.read_client()

    def ready(self, shard: Shard, write: bool) -> None:
        """Before a call: the core started, the shard's master known, and (for a write) its
        fence open."""
        if not self._started or self._pid != PROCESS.pid:
            self._ensure_started()
            # The first call ends with the discovery's error, not one more round's after it.
            self.safety.need_master(shard, ask=False)
        self.safety.need_master(shard)
        if write and shard.fenced:
            shard.wait_fence(self.config.failover_hold)

    # -- switches (see Placement) ------------------------------------------------------------
    def claimant(self, name: str, address: Address, majority: bool) -> str | None:
        """Why the shard of master ``name`` may not be on ``address``, or None: "one node, one
        shard" (see ``Placement.claimant``)."""
        return self.placement.claimant(name, address, majority)

    def apply_resolution(self, shard: Shard, resolution: Resolution, *, source: str) -> bool:
        """Take a resolution from the sentinels if it is newer than the shard's evidence."""
        return self.placement.apply_resolution(shard, resolution, source=source)

    def on_switch(self, callback: SwitchCallback) -> Callable[[], None]:
        """Register ``callback(event)`` for every master switch (for metrics); returns an undo."""
        return self.placement.on_switch(callback)

    # -- the safety net (see SafetyNet): what the operations' run and scatter ask ------------
    def should_reresolve(self, shard: Shard, exc: BaseException, generation: int) -> bool:
        return self.safety.should_reresolve(shard, exc, generation)

    def retry_or_raise(
        self, shard: Shard, exc: BaseException, generation: int, *, idempotent: bool
    ) -> None:
        self.safety.retry_or_raise(shard, exc, generation, idempotent=idempotent)

    def refusal(self, shard: Shard, exc: BaseException) -> AuthenticationFailedError | None:
        return self.safety.refusal(shard, exc)

    def unreachable(self, shard: Shard, exc: BaseException, generation: int) -> bool:
        return self.safety.unreachable(shard, exc, generation)

    def held_too_long(
        self, shard: Shard, exc: BaseException | None, hold: float
    ) -> ShardUnavailableError:
        return self.safety.held_too_long(shard, exc, hold)

    def reresolve(
        self,
        shard: Shard,
        *,
        reason: str,
        force: bool = False,
        suspect: Address | None = None,
    ) -> bool:
        return self.safety.reresolve(shard, reason=reason, force=force, suspect=suspect)

    # -- status ------------------------------------------------------------------------------
    def listener_states(self) -> dict[str, bool]:
        """Per sentinel address: is this process's listener subscribed (empty if not started)."""
        return self.listeners.status() if self.listeners is not None and self.started else {}

    def status(self) -> dict[str, Any]:
        """A cheap snapshot from memory (no network); the status module adds live checks."""
        listeners = self.listener_states()
        return {
            "started": self.started,
            "closed": self.closed,
            "shards": [
                {
                    **shard.snapshot(),
                    "near_cache": None if self.near is None else self.near.status(shard.index),
                }
                for shard in self.shards
            ],
            "sentinels": [
                {"address": str(address), "listener_connected": listeners.get(str(address))}
                for address in self.sentinels.addresses
            ],
        }


# -- sharing: equal configurations share one core per process ---------------------------------
_shared: dict[PoolConfig, ShardedSentinelPool] = {}
_shared_lock = threading.Lock()


def shared_pool(config: PoolConfig) -> ShardedSentinelPool:
    """The live core for ``config`` in this process, created on first request."""
    with _shared_lock:
        pool = _shared.get(config)
        if pool is None or pool.closed:
            pool = _shared[config] = ShardedSentinelPool.from_config(config)
        return pool


def close_all() -> None:
    """Close every shared core (tests, and servers that shut down cleanly)."""
    with _shared_lock:
        pools = list(_shared.values())
    for pool in pools:
        pool.close()


def live_cores() -> list[ShardedSentinelPool]:
    """Every core of this process that is not closed (metrics read their gauges here)."""
    return registry.live_cores(ShardedSentinelPool)


def _reset_shared_lock() -> None:  # a child must not inherit a lock held in the parent
    global _shared_lock
    _shared_lock = threading.Lock()


registry.on_fork_in_child(_reset_shared_lock)
