"""A shard's replicas: the clients of those the sentinels list, the read rotation
(``READ_FROM_REPLICAS``) and which replicas are in step with the master (``OUTAGE_READS``),
and how fresh each one is (``OUTAGE_READS_MAX_LAG``).

Freshness is measured in replication offsets, not in what a replica says of its link: a link
cut silently (no FIN, no RST) stays ``connected`` in ``ROLE`` for the replica's ``repl-timeout``
(60 s by default) while the master takes writes it never sees. The housekeeper asks the
master's ``ROLE`` (its offset) then each replica's (the offset it applied) about once a second; a
replica that had applied offset ``o`` was *current as of* the last moment the master's offset was
at most ``o``: it holds every write the master had applied then. An outage read goes only to a
replica current as of no more than ``OUTAGE_READS_MAX_LAG`` seconds before the master was last
known alive (its first failed check, or the call that found it unreachable, whichever came first).

Part of :class:`~sentinel_cache.core.topology.shard.Shard` (a base class of it, sharing its lock
and its master's state): a shard's state still changes only through its own methods.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import redis

from sentinel_cache.core.config import Address, PoolConfig
from sentinel_cache.core.topology.fair_pool import FairBlockingConnectionPool
from sentinel_cache.core.topology.following import MasterState

logger = logging.getLogger("sentinel_cache")

#: What a ``ROLE`` check found of a replica and the shard's master: ``connected`` to it,
#: following it with the link ``down`` (``connect``: what the master's crash looks like; the
#: replica keeps what it was given), ``promoted`` (a master now), or ``out`` (another master,
#: a full resync under way, unreachable).
Link = Literal["connected", "down", "promoted", "out"]

#: The master offsets kept per shard (one a check, about a second apart): enough to date a
#: replica up to a minute back; one older than all of them is too old for any sensible bound.
OFFSET_HISTORY = 64


class ShardReplicas:
    """The replica half of a :class:`~sentinel_cache.core.topology.shard.Shard`."""

    # The shard's own (set by Shard.__init__): its name in logs, its master's client, its lock,
    # its master's state.
    label: str
    client: redis.Redis
    _lock: threading.Lock
    _state: MasterState

    def __init__(
        self,
        config: PoolConfig,
        connection_class: type[redis.connection.Connection],
        kwargs: dict[str, Any],
    ) -> None:
        self._replicas: tuple[Address, ...] = ()
        self._replica_kwargs = (connection_class, kwargs, config.max_connections)
        self._replica_clients: dict[Address, redis.Redis] = {}
        self._down: set[Address] = set()  # listed by the sentinels, but failing our checks
        self._serving_replicas: tuple[Address, ...] = ()
        self._rotation: list[tuple[Address, redis.Redis]] = []
        self._replica_turn = itertools.count()
        self._rotating = config.read_from_replicas  # replicas take reads in normal times
        # OUTAGE_READS: replica -> the generation whose master it was seen connected to (and
        # has not been seen leave since).
        self._in_step: dict[Address, int] = {}
        # OUTAGE_READS_MAX_LAG: the master's offsets as the housekeeper saw them (generation,
        # monotonic time, offset), when its ROLE check first failed (None: it answered last),
        # and replica -> the moment it was last seen current as of (see the module's doc).
        self._max_lag = config.outage_reads_max_lag
        self._offsets: deque[tuple[int, float, int]] = deque(maxlen=OFFSET_HISTORY)
        self._master_silent: tuple[int, float] | None = None
        self._current_as_of: dict[Address, tuple[int, float]] = {}

    @property
    def replicas(self) -> tuple[Address, ...]:
        return self._replicas

    @property
    def serving_replicas(self) -> tuple[Address, ...]:
        """The replicas in the read rotation: listed, and passing our checks."""
        return self._serving_replicas

    def replica_client(self, address: Address) -> redis.Redis | None:
        """The client of a listed replica (sync calls), or None if it is no longer listed."""
        return self._replica_clients.get(address)

    def set_replicas(self, replicas: Sequence[Address]) -> None:
        """The replicas the sentinels list; clients are kept for those still listed."""
        replicas = tuple(replicas)
        if replicas == self._replicas:
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
            self._replicas = replicas
            self._down &= set(replicas)
            self._in_step = {a: g for a, g in self._in_step.items() if a in clients}
            self._current_as_of = {
                a: seen for a, seen in self._current_as_of.items() if a in clients
            }
            self._update_rotation()
        for client in dropped:
            client.connection_pool.disconnect()

    def set_replica_health(self, address: Address, healthy: bool, why: str = "") -> None:
        """Take a replica out of the read rotation (a failed read or check), or back in."""
        if not self._rotating:
            return
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
        if not self._rotating:  # listed for OUTAGE_READS only: no reads in normal times
            return
        self._serving_replicas = tuple(a for a in self._replicas if a not in self._down)
        self._rotation = [(a, self._replica_clients[a]) for a in self._serving_replicas]

    def read_replica(self) -> tuple[Address, redis.Redis] | None:
        """The next replica in the read rotation (its address and client), or None."""
        rotation = self._rotation
        if not rotation:
            return None
        return rotation[next(self._replica_turn) % len(rotation)]

    def read_client(self) -> redis.Redis:
        replica = self.read_replica()
        return self.client if replica is None else replica[1]

    def note_replica_link(self, address: Address, generation: int, link: Link) -> None:
        """What the housekeeper's ``ROLE`` check found of a replica of the master of
        ``generation``. Connected, it is in step: it may serve reads while that master is
        unreachable. It stays in step while its link is down (the housekeeper calls that
        ``out`` if the master still answers), and once promoted while a
        failover is announced (the fence is up: it is the new master-to-be, holding what it
        had plus what was written to it since); anything else puts it out of step. The map is
        replaced, never changed in place: readers iterate it without the lock."""
        with self._lock:
            in_step = self._in_step
            if link == "connected":
                if (
                    generation == self._state.generation
                    and address in self._replica_clients
                    and in_step.get(address) != generation
                ):
                    self._in_step = {**in_step, address: generation}
            elif address in in_step and (
                link == "out" or (link == "promoted" and not self._state.fenced)
            ):
                self._in_step = {a: g for a, g in in_step.items() if a != address}

    def note_master_offset(self, generation: int, offset: int | None) -> None:
        """The housekeeper's ``ROLE`` check of the master of ``generation``: its replication
        offset, or None if it did not answer as a master (the first such check dates the
        moment it was last known alive)."""
        now = time.monotonic()
        with self._lock:
            if offset is None:
                if self._master_silent is None or self._master_silent[0] != generation:
                    self._master_silent = (generation, now)
                return
            self._master_silent = None
            self._offsets.append((generation, now, offset))

    def note_replica_offset(self, address: Address, generation: int, offset: int) -> None:
        """The offset a replica of the master of ``generation`` had applied when checked (just
        after that master's own check): it is current as of the last moment that master's
        offset was at most this one; older than every offset kept, it is dated never."""
        current_as_of = float("-inf")
        for seen_generation, at, master_offset in reversed(self._offsets):
            if seen_generation == generation and master_offset <= offset:
                current_as_of = at
                break
        with self._lock:
            self._current_as_of = {**self._current_as_of, address: (generation, current_as_of)}

    def replica_lag(self, address: Address, generation: int) -> float:
        """How far behind the master of ``generation`` the replica may be, in seconds: from the
        moment it was last seen current as of to when that master was last known alive (its
        first failed check, the call that found it unreachable, or now). ``inf`` if unknown."""
        seen = self._current_as_of.get(address)
        if seen is None or seen[0] != generation:
            return float("inf")
        alive = time.monotonic()
        silent = self._master_silent
        if silent is not None and silent[0] == generation:
            alive = min(alive, silent[1])
        state = self._state
        if state.generation == generation and state.unreachable_since is not None:
            alive = min(alive, state.unreachable_since)
        return max(0.0, alive - seen[1])

    def outage_replicas(self, generation: int) -> list[Address]:
        """The replicas in step with the master of ``generation``, to serve a read while it is
        unreachable, beginning at the next in turn (reads spread over them); only those at most
        ``OUTAGE_READS_MAX_LAG`` behind it (:meth:`replica_lag`)."""
        found = [
            a
            for a, g in self._in_step.items()
            if g == generation and self.replica_lag(a, generation) <= self._max_lag
        ]
        if len(found) > 1:
            turn = next(self._replica_turn) % len(found)
            found = found[turn:] + found[:turn]
        return found

    def lagging_replicas(self, generation: int) -> dict[Address, float]:
        """The replicas in step with the master of ``generation`` but further behind it than
        ``OUTAGE_READS_MAX_LAG`` (how far, in seconds): refused for outage reads."""
        lags = {
            a: self.replica_lag(a, generation) for a, g in self._in_step.items() if g == generation
        }
        return {a: lag for a, lag in lags.items() if lag > self._max_lag}

    @property
    def max_lag(self) -> float:
        """``OUTAGE_READS_MAX_LAG``: how far behind its master an outage read's replica may be."""
        return self._max_lag
