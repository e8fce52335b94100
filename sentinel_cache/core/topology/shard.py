"""A shard: its master address, connection pool, write fence and replicas (``replicas.py``).

Each shard has one redis-py client for its whole life. Its connections resolve the shard's
current address when they connect (redis-py's ``SentinelManagedConnection`` idea), and carry the
generation of the address they were made for; a switch bumps the shard's generation, so stale
connections (idle now, or checked out and coming back later) reconnect to the new master on their
next use. Only the switching shard is touched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, NamedTuple, TypeVar

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sentinel_cache.core.config import Address, PoolConfig, connection_class_and_kwargs
from sentinel_cache.core.metrics import Metrics
from sentinel_cache.core.throttle import Throttle
from sentinel_cache.core.topology.following import UNRESOLVED, MasterState
from sentinel_cache.core.topology.lean import (
    LeanShardConnection,
    LeanShardSSLConnection,
    ShardPool,
)
from sentinel_cache.core.topology.replicas import ShardReplicas
from sentinel_cache.exceptions import (
    FailoverInProgressError,
)

logger = logging.getLogger("sentinel_cache")

T = TypeVar("T")
K = TypeVar("K", bound="str | bytes")


# Errors that mean "this node may no longer be the shard's master".
MASTER_ERRORS = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)

SwitchCallback = Callable[["SwitchEvent"], None]
#: ``restarted(shard, old_run_id, new_run_id, source)``: the core's report of an empty restart.
RestartCallback = Callable[["Shard", "str | None", str, str], None]


class Feature(NamedTuple):
    """A command a master may or may not allow: ``probe`` runs it harmlessly and ``allowed``
    reads the reply; ``without`` says what the cache does where it is not allowed."""

    probe: tuple[Any, ...]
    allowed: Callable[[Any], bool]
    without: str


#: What a master may or may not allow, each asked once per master by running the command itself
#: harmlessly, so the answer covers both whether the server has it and whether our ACL user may
#: run it (``COMMAND INFO`` only says the former): ``MSETEX`` (Valkey 9.1+, Redis 8.4+:
#: ``set_many`` with a timeout in one native command per shard instead of a script; probed with
#: ``XX`` on a key of the cache's own namespace that nothing writes, so it sets nothing), and
#: ``CLIENT REPLY`` (writes nobody waits for, which an ACL or a renamed command may forbid).
FEATURES: dict[str, Feature] = {
    "MSETEX": Feature(
        ("MSETEX", 1, "sentinel_cache:feature-probe", "", "XX", "PX", 1),
        lambda reply: reply in (0, 1),
        "set_many with a timeout uses the SET_EACH script instead",
    ),
    "CLIENT REPLY": Feature(
        ("CLIENT", "REPLY", "ON"),
        lambda reply: reply in (b"OK", "OK"),
        "the resharding's copies wait for their replies",
    ),
}


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

#: How many former masters a shard remembers (for "one node, one shard", see the core).
FORMER_KEPT = 8
#: A fence the events never lifted (messages lost) is re-checked through the sentinels after this.
STALE_FENCE_SECONDS = 5.0


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


class Shard(ShardReplicas):
    """One master name at one ring position: its address, pool, fence and history.

    Its state changes only through its own methods (the failover state machine has this one
    home); the rest of the core reads it through the properties below."""

    def __init__(
        self,
        index: int,
        name: str,
        weight: int,
        config: PoolConfig,
        *,
        metrics: Metrics | None = None,
        restarted: RestartCallback | None = None,
    ) -> None:
        self.index = index
        self.name = name
        self.weight = weight
        self.label = f"{index} ({name})"
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a switch, or an outage's end
        self._state = UNRESOLVED
        self._agreeing = 0
        self._error: BaseException | None = None
        self._switch_count = 0
        self._last_switch: float | None = None
        self._last_switch_source: str | None = None
        self._evidence = NO_EVIDENCE
        self._former: tuple[Address, ...] = ()  # the masters it switched away from, oldest first
        # The safety net's re-resolve: single-flight, rate-limited, its failures logged once
        # per interval with a count of what was suppressed.
        self._resolving = threading.Lock()
        self._last_resolve = 0.0
        self._resolve_failures = Throttle(10.0)
        self._fence_open = threading.Event()
        self._fence_open.set()
        self._fence_reason: str | None = None
        self._fence_since: float | None = None
        self._metrics = metrics  # the core's, if METRICS is on
        # The master's run_id (INFO server), asked on every new connection to it: a new one in
        # the same generation is a restart without a switch (see note_run_id).
        self._run_id: str | None = None
        self._run_id_seen = (-1, float("-inf"))  # (generation, monotonic time asked)
        self._restarts = 0
        self._last_restart: dict[str, Any] | None = None
        self._restarted = restarted  # the core's report of an empty restart
        # What the master of a generation was found to allow (see FEATURES): feature ->
        # (generation, allowed).
        self._features: dict[str, tuple[int, bool]] = {}
        connection_class, kwargs = connection_class_and_kwargs(config.connection_options())
        if config.health_check_interval:
            kwargs.setdefault("health_check_interval", config.health_check_interval)
        ssl = issubclass(connection_class, redis.connection.SSLConnection)
        self.pool = ShardPool(
            label=self.label,
            shard=self,
            connection_class=LeanShardSSLConnection if ssl else LeanShardConnection,
            max_connections=config.max_connections,
            timeout=config.pool_timeout,
            **kwargs,
        )
        self.client = redis.Redis(connection_pool=self.pool)
        super().__init__(config, connection_class, kwargs)  # the replicas' part
        # Reads replicas served during outages (the outage itself is in the state).
        self._outage_reads = 0

    # -- the state, read-only from outside ---------------------------------------------------
    @property
    def state(self) -> MasterState:
        """Master, generation, promotions, fence and outage in one consistent look: what the
        hot path reads (once per call, once per reply)."""
        return self._state

    @property
    def address(self) -> Address | None:
        return self._state.address

    @property
    def generation(self) -> int:
        """Bumped by every switch: what a connection, a scan or a reply was made for."""
        return self._state.generation

    @property
    def error(self) -> BaseException | None:
        """Why the last resolution failed (None once the sentinels answered)."""
        return self._error

    @property
    def agreeing(self) -> int:
        """How many sentinels named the master in the last resolution taken."""
        return self._agreeing

    @property
    def former(self) -> tuple[Address, ...]:
        return self._former

    @property
    def promotions(self) -> int:
        return self._state.promotions

    @property
    def fence_reason(self) -> str | None:
        return self._fence_reason

    @property
    def switch_count(self) -> int:
        return self._switch_count

    @property
    def last_switch_source(self) -> str | None:
        return self._last_switch_source

    @property
    def run_id(self) -> str | None:
        return self._run_id

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def last_restart(self) -> dict[str, Any] | None:
        return None if self._last_restart is None else dict(self._last_restart)

    @property
    def metrics(self) -> Metrics | None:
        return self._metrics

    @property
    def resolve_failures(self) -> Throttle:
        return self._resolve_failures

    def __repr__(self) -> str:
        state = self._state
        fence = f" fenced({self._fence_reason})" if state.fenced else ""
        return (
            f"<Shard {self.label} master={state.address} gen={state.generation} "
            f"replicas={len(self._replicas)} switches={self._switch_count}{fence}>"
        )

    def reset_locks(self) -> None:
        """After a fork: a lock held by a parent thread would never be released in the child."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._resolving = threading.Lock()
        self._resolve_failures.reset_after_fork()
        self._fence_open = threading.Event()
        if not self._state.fenced:
            self._fence_open.set()

    def allows(self, feature: str) -> bool | None:
        """Whether the current master allows ``feature`` (one of :data:`FEATURES`); None until
        it was asked (after a switch the new master is asked again: a rolling upgrade may mix
        versions, and ACLs are set per server)."""
        known = self._features.get(feature)
        return known[1] if known is not None and known[0] == self._state.generation else None

    def learned(self, feature: str, generation: int, allowed: bool) -> None:
        self._features[feature] = (generation, allowed)

    def current(self) -> tuple[Address | None, int]:
        state = self._state
        return state.address, state.generation

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
            state = self._state
            old = state.address
            if old == address:  # a confirmation: keep the newer evidence
                if evidence.newer_than(self._evidence):
                    self._evidence = evidence
                self._error = None
                return "same", old
            if not evidence.newer_than(self._evidence):
                return "stale", old
            self._evidence = evidence
            self._error = None
            self._state = state._replace(
                address=address, generation=state.generation + 1, unreachable_since=None
            )
            if old is not None:
                self._former = (*self._former, old)[-FORMER_KEPT:]
                self._switch_count += 1
                self._last_switch = time.time()
                self._last_switch_source = source
            self._changed.notify_all()
        self.pool.retire_idle()  # network I/O outside the lock
        return "moved", old

    def failed(self, error: BaseException) -> None:
        """A resolution failed (or named a node this shard may not take): kept until the next
        address is taken or confirmed, for the errors raised and the status shown."""
        with self._lock:
            self._error = error

    def note_agreeing(self, agreeing: int) -> None:
        """How many sentinels named the master in the resolution just taken."""
        with self._lock:
            self._agreeing = agreeing

    @contextmanager
    def reresolving(self, interval: float, *, force: bool = False) -> Iterator[bool]:
        """Yield True if the caller is to ask the sentinels again for this shard now: no
        re-resolve running (single-flight) and, unless ``force``, none begun in the last
        ``interval`` seconds (a dead shard does not hammer the sentinels)."""
        now = time.monotonic()
        if not force and now - self._last_resolve < interval:
            yield False
            return
        if not self._resolving.acquire(blocking=False):
            yield False
            return
        try:
            self._last_resolve = now
            yield True
        finally:
            self._resolving.release()

    def note_run_id(
        self, generation: int, run_id: str, asked_at: float, *, source: str, rebooted: bool = False
    ) -> bool:
        """The master of ``generation`` said its run_id is ``run_id`` (asked at ``asked_at``);
        True if that is a restart, which is then reported to the core's ``restarted``.

        A restart is a new run_id without a switch, or (``rebooted``: the sentinels sent
        ``+reboot``) a run_id not reported yet. A master restarted without persistence comes
        back empty, and its replicas resync from it and drop their copies: nothing else says
        so. An answer from an older generation, or asked before the last one noted, is moot.
        """
        with self._lock:
            seen_generation, seen_at = self._run_id_seen
            state = self._state
            if generation != state.generation or (
                generation == seen_generation and asked_at < seen_at
            ):
                return False
            old = self._run_id if seen_generation == generation else None
            self._run_id, self._run_id_seen = run_id, (generation, asked_at)
            reported = self._last_restart is not None and self._last_restart["run_id"] == run_id
            if reported or not ((old is not None and old != run_id) or rebooted):
                return False
            if old == run_id:  # +reboot of the process we met first: its predecessor is unknown
                old = None
            self._restarts += 1
            self._last_restart = {
                "at": time.time(),
                "address": None if state.address is None else str(state.address),
                "previous_run_id": old,
                "run_id": run_id,
                "source": source,
            }
        if self._restarted is not None:
            self._restarted(self, old, run_id, source)
        return True

    # -- write fence -------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        return self._state.fenced

    @property
    def fence_stale(self) -> bool:
        """Fenced for over ``STALE_FENCE_SECONDS``: the end of the failover was never heard (a
        lost message), so the sentinels are asked again and the fence lowered."""
        since = self._fence_since
        return since is not None and time.monotonic() - since > STALE_FENCE_SECONDS

    def raise_fence(self, reason: str) -> None:
        with self._lock:
            if not self._state.fenced:
                self._fence_since = time.monotonic()
                self._state = self._state._replace(fenced=True)
            self._fence_reason = reason
            self._fence_open.clear()

    def note_promotion(self) -> None:
        """The sentinels sent ``SLAVEOF NO ONE`` to a replica of this shard: from now on the old
        master's acknowledgements of commands already in flight prove nothing."""
        with self._lock:
            self._state = self._state._replace(promotions=self._state.promotions + 1)

    def lower_fence(self) -> None:
        with self._lock:
            since = self._fence_since
            self._fence_reason = None
            self._fence_since = None
            self._state = self._state._replace(fenced=False)
            self._fence_open.set()
        if since is not None and self._metrics is not None:
            self._metrics.fence(self.name, time.monotonic() - since)

    def wait_fence(self, hold: float) -> None:
        if self._fence_open.is_set() or self._fence_open.wait(hold):
            return
        raise FailoverInProgressError(
            f"shard {self.label}: writes held for {hold:g}s while a failover is in progress "
            f"({self._fence_reason}); the new master was not confirmed in time"
        )

    # -- outages: a master unreachable that nothing replaced yet ------------------------------
    @property
    def unreachable_since(self) -> float | None:
        """Monotonic time the current master was first found unreachable, None if it was not
        (or it answered since, or the shard moved)."""
        return self._state.unreachable_since

    def note_unreachable(self, generation: int) -> None:
        """A call found the master of ``generation`` unreachable and the sentinels named no
        other: the outage begins (once; moot if the shard moved meanwhile)."""
        with self._lock:
            state = self._state
            if generation == state.generation and state.unreachable_since is None:
                self._state = state._replace(unreachable_since=time.monotonic())

    def reachable_again(self) -> None:
        """The current master answered as a master again (no switch): the outage is over."""
        with self._lock:
            if self._state.unreachable_since is not None:
                self._state = self._state._replace(unreachable_since=None)
                self._changed.notify_all()

    def wait_change(self, generation: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the shard to leave the master of ``generation``
        or for that master's outage to end; True if it did."""
        with self._changed:
            return self._changed.wait_for(lambda: not self.in_outage(generation), timeout)

    def in_outage(self, generation: int) -> bool:
        """Still on the master of ``generation``, and that master found unreachable."""
        state = self._state
        return generation == state.generation and state.unreachable_since is not None

    def note_outage_read(self) -> None:
        with self._lock:
            self._outage_reads += 1

    @property
    def outage_reads(self) -> int:
        """Reads served by a replica while the master was unreachable, since start."""
        return self._outage_reads

    def snapshot(self) -> dict[str, Any]:
        """This shard in ``ShardedSentinelPool.status()``: from memory, no network."""
        since = self.unreachable_since
        return {
            "index": self.index,
            "name": self.name,
            "weight": self.weight,
            "address": None if self.address is None else str(self.address),
            "replicas": [str(a) for a in self._replicas],
            "sentinels_agreeing": self._agreeing,
            "switch_count": self._switch_count,
            "restarts": self._restarts,
            "last_restart": self.last_restart,
            "last_switch": self._last_switch,
            "last_switch_source": self._last_switch_source,
            "fenced": self.fenced,
            "fence_reason": self._fence_reason,
            "unreachable_for": None if since is None else round(time.monotonic() - since, 3),
            "outage_reads": self._outage_reads,
            "error": None if self._error is None else str(self._error),
            "connections": self.pool.connection_count(),
        }

    def close(self) -> None:
        self.pool.disconnect()
        for client in self._replica_clients.values():
            client.connection_pool.disconnect()
