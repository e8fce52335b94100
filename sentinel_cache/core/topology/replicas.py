"""A shard's replicas: the clients of those the sentinels list, the read rotation
(``READ_FROM_REPLICAS``) and which replicas are in step with the master (``OUTAGE_READS``).

Part of :class:`~sentinel_cache.core.topology.shard.Shard` (a base class of it, sharing its lock
and its master's state): a shard's state still changes only through its own methods.
"""

from __future__ import annotations

import itertools
import logging
import threading
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

    def outage_replicas(self, generation: int) -> list[Address]:
        """The replicas in step with the master of ``generation``, to serve a read while it is
        unreachable, beginning at the next in turn (reads spread over them)."""
        found = [a for a, g in self._in_step.items() if g == generation]
        if len(found) > 1:
            turn = next(self._replica_turn) % len(found)
            found = found[turn:] + found[:turn]
        return found
