"""The sharded core (Jedis's ``ShardedJedisSentinelPool``): the ring, one ``Shard`` per master,
discovery, the listeners and the safety net that re-resolves a shard and retries once."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

import redis

from sentinel_cache.core.arguments import check_key
from sentinel_cache.core.config import Address, PoolConfig
from sentinel_cache.core.metrics import metrics_backend, source_kind, tracer
from sentinel_cache.core.ring import HashRing
from sentinel_cache.core.topology import registry
from sentinel_cache.core.topology.discovery import (
    Discovery,
    Resolution,
    SentinelSet,
    check_role,
    data_node_refusal,
    direct_client,
)
from sentinel_cache.core.topology.following import run_id_of
from sentinel_cache.core.topology.housekeeping import STALE_FENCE_SECONDS, Housekeeper
from sentinel_cache.core.topology.listener import ListenerGroup
from sentinel_cache.core.topology.near import NearCache
from sentinel_cache.core.topology.shard import (
    Evidence,
    Shard,
    SwitchCallback,
    SwitchEvent,
)
from sentinel_cache.exceptions import (
    AuthenticationFailedError,
    ConflictingMasterError,
    ShardUnavailableError,
    StaleReplyError,
)

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
        self.shards: tuple[Shard, ...] = tuple(
            Shard(i, name, weight, config)
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
            Shard(len(self.shards) + i, name, weight, config)
            for i, (name, weight) in enumerate(leaving)
        )
        self.every_shard = self.shards + self.departed
        self._by_name = {shard.name: shard for shard in self.every_shard}
        self._previous = tuple(self._by_name[name] for name in config.previous_masters)
        self._callbacks: list[SwitchCallback] = []
        self._closers: list[Callable[[], None]] = []
        self.metrics = metrics_backend(config.metrics)
        self.near = NearCache(config, self.shards, self.shard_index) if config.near_cache else None
        self.tracer = tracer(config.tracing)
        for shard in self.every_shard:
            shard.metrics = self.metrics
            shard.restarted = self._report_restart
        self._reset_process_state()
        registry.track(self)

    def _reset_process_state(self) -> None:
        """State that must not cross a fork: locks, sentinel sockets, threads."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._started = False
        self.closed = False  # read on every call: an attribute, not a property
        self._initial: dict[str, Resolution | BaseException] = {}
        self._placement = threading.Lock()  # see _place
        self.sentinels = SentinelSet(self.config.sentinels, self.config.sentinel_options())
        self.discovery = Discovery(
            self.sentinels,
            self.config.connection_options(),
            timeout=self.config.discovery_timeout,
            replicas=self.config.read_from_replicas,
            claimant=self.claimant,
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
        if self._pid != os.getpid():
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
        if self._started and self._pid == os.getpid():
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
        self.confirm_and_switch(
            shard, address, source=source, evidence=Evidence(epoch, received), announced=True
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
                since = shard.fence_since
                if since is not None and time.monotonic() - since > STALE_FENCE_SECONDS:
                    shard.lower_fence()
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
        """Re-resolve the shards whose last resolution failed (rate-limited per shard)."""
        for shard in self.every_shard:
            if shard.error is not None and shard.address is not None:
                self.reresolve(shard, reason="recheck after a failed resolution")

    def check_fences(self) -> None:
        """Lift a fence whose failover we never heard the end of (a lost message)."""
        for shard in self.every_shard:
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
        results = self.discovery.resolve(self._names)
        for name, outcome in results.items():
            shard = self._by_name[name]
            if isinstance(outcome, Resolution):
                self.apply_resolution(shard, outcome, source="discovery")
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

    def claimant(self, name: str, address: Address, majority: bool) -> str | None:
        """Why the shard of master ``name`` may not be on ``address``, or None: the one rule
        of "one node, one shard", which discovery applies to every candidate and every switch
        applies again (:meth:`taken`).

        Two shards on one node would mix their keys, and ``ROLE`` only proves that a node is
        *a* master. So a node another shard is on is refused, whoever names it (that shard
        moves first); a node another shard was on before is refused unless most of the
        sentinels asked name it (a stale old master, or one liar, cannot place it; a node
        reused for another master name, as a recycled address can be, is taken on a majority).
        """
        for other in self.every_shard:
            if other.name == name:
                continue
            if other.address == address:
                return f"the master of shard {other.index} ({other.name!r})"
            if not majority and address in other.former:
                return (
                    f"a former master of shard {other.index} ({other.name!r}), and not named by "
                    "a majority of the sentinels"
                )
        return None

    def taken(self, shard: Shard, address: Address, *, source: str, majority: bool) -> bool:
        """True (with a warning, and the shard's error set) if :meth:`claimant` refuses
        ``address`` for ``shard``: the last check before any switch, against a shard that moved
        while the sentinels or ``ROLE`` were being asked."""
        if shard.address == address:
            return False
        reason = self.claimant(shard.name, address, majority)
        if reason is None:
            return False
        message = (
            f"shard {shard.label}: refusing {source} naming {address}, {reason}: two shards "
            "on one node would mix their keys"
        )
        logger.warning("%s", message)
        shard.error = ConflictingMasterError(message)
        return True

    def apply_resolution(self, shard: Shard, resolution: Resolution, *, source: str) -> bool:
        """Take a resolution from the sentinels if it is newer than the shard's evidence."""
        if not resolution.verified:  # the sentinels still name the node that just failed
            return False
        named = ", ".join(map(str, resolution.named_by)) or "the sentinels"
        outcome, old = self._place(
            shard,
            resolution.address,
            source=source,
            evidence=Evidence(resolution.epoch, resolution.asked_at),
            named=f"{source} (named by {named})",
            majority=resolution.majority,
        )
        if outcome == "taken":
            return False
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
        if self.metrics is not None:
            self.metrics.switch(shard.name, source_kind(source))
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
        return self._started and self._pid == os.getpid()

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
            if self.metrics is not None:
                self.metrics.reresolve(shard.name)
            suspects = {shard.name: suspect} if suspect is not None else None
            outcome = self.discovery.resolve([shard.name], timeout=0, suspects=suspects)
            result = outcome[shard.name]
            if isinstance(result, Resolution):
                return self.apply_resolution(shard, result, source=f"safety net ({reason})")
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

        ``ROLE`` proves a node claims to be *a* master, not *this shard's*: :meth:`taken`
        refuses a node another shard is on (or was on: one sentinel is no majority).
        """
        if shard.address == address:
            shard.switch(address, source=source, evidence=evidence)  # keep the newer evidence
            return False
        majority = len(self.sentinels.addresses) < 2  # one sentinel's word
        if self.taken(shard, address, source=source, majority=majority):  # not worth a ROLE
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
        outcome, old = self._place(
            shard, address, source=source, evidence=evidence, named=source, majority=majority
        )
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

    def _place(
        self,
        shard: Shard,
        address: Address,
        *,
        source: str,
        evidence: Evidence,
        named: str,
        majority: bool,
    ) -> tuple[Literal["taken", "stale", "same", "moved"], Address | None]:
        """``shard.switch(...)`` unless :meth:`taken` refuses the node (``("taken", current)``):
        the one way a shard's master changes, checked and switched under one lock so that two
        shards moving at once cannot land on one node."""
        with self._placement:
            if self.taken(shard, address, source=named, majority=majority):
                return "taken", shard.address
            return shard.switch(address, source=source, evidence=evidence)

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
                    "index": shard.index,
                    "name": shard.name,
                    "weight": shard.weight,
                    "address": None if shard.address is None else str(shard.address),
                    "replicas": [str(a) for a in shard.replicas],
                    "sentinels_agreeing": shard.agreeing,
                    "switch_count": shard.switch_count,
                    "restarts": shard.restarts,
                    "last_restart": None
                    if shard.last_restart is None
                    else dict(shard.last_restart),
                    "last_switch": shard.last_switch,
                    "last_switch_source": shard.last_switch_source,
                    "fenced": shard.fenced,
                    "fence_reason": shard.fence_reason,
                    "error": None if shard.error is None else str(shard.error),
                    "connections": shard.pool.connection_count(),
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
