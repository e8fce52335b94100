"""One background thread per core for what must happen on a clock rather than on traffic.

- A write fence whose failover never announced its end (a lost message) is re-checked through
  the sentinels after ``STALE_FENCE_SECONDS`` (``Shard.fence_stale``).
- A shard whose last re-resolve failed (sentinels unreachable) is re-resolved again, so its error
  clears once the sentinels answer, even if no call fails meanwhile.

Those two are the safety net's (``core/topology/safety.py``); this thread is only their clock.
- With ``READ_FROM_REPLICAS``, every replica in a shard's read rotation is asked ``ROLE`` about
  once a second: a replica that no longer follows the shard's current master (detached by hand,
  demoted link, still syncing, unreachable) leaves the rotation until it does again, instead of
  serving wrong misses until something fails. Sentinel events about replicas (``+sdown``,
  ``-sdown``, ``+slave``, ``+convert-to-slave``) bring the check forward, to a random moment
  within :data:`REFRESH_SPREAD` (see :meth:`Housekeeper.wake`).
- With ``OUTAGE_READS``, the same checks tell each shard which replicas are in step with its
  master (:func:`link_state`; a replica whose link is down while that master still answers is
  not) and how far behind it each is (the master's offset, then each replica's: a link cut
  silently still says ``connected``), to serve reads while that master is unreachable from one
  at most ``OUTAGE_READS_MAX_LAG`` behind; and a shard whose
  master was found unreachable is re-resolved on this clock (the safety net's ``check_outages``).
- The discovery sockets of sentinels asked nothing for a while are closed
  (``SentinelSet.close_idle``): an idle process then holds one connection per sentinel, its
  listener's.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import redis

from sentinel_cache.core.config import Address
from sentinel_cache.core.topology.discovery import direct_client, reply_text
from sentinel_cache.core.topology.replicas import Link
from sentinel_cache.core.topology.sentinels import SentinelSet
from sentinel_cache.core.topology.shard import Shard

logger = logging.getLogger("sentinel_cache")

#: Replica ROLE checks use their own short timeouts: a hung replica must not stall the others.
CHECK_TIMEOUT = 0.5

#: Seconds after a sentinel event about a replica within which its shard is asked about again:
#: every sentinel publishes its own copy of the event, to every process at once, and each
#: question asks every sentinel; a random moment in this window takes the copies in one
#: question and spreads the processes' questions out instead of all in the same millisecond.
REFRESH_SPREAD = (0.1, 1.0)


def same_node(a: Address, b: Address) -> bool:
    """Equal addresses, or the same port on host names that resolve alike (a replica may have
    been configured with a host name where the sentinels report an IP)."""
    if a == b:
        return True
    if a.port != b.port:
        return False
    try:
        return socket.gethostbyname(a.host) == socket.gethostbyname(b.host)
    except OSError:
        return False


#: ROLE link states of a replica whose master went away: it reconnects, keeping its data.
LINK_DOWN = ("connect", "connecting", "handshake")


def link_state(role: Any, master: Address | None) -> Link:
    """What a ``ROLE`` reply says of a replica and ``master`` (see :data:`Link`)."""
    if not isinstance(role, (list, tuple)) or master is None:
        return "out"
    kind = reply_text(role[0]) if role else ""
    if kind == "master":
        return "promoted"
    if kind not in ("slave", "replica") or len(role) < 4:
        return "out"
    try:
        following = Address(reply_text(role[1]), int(role[2]))
    except (TypeError, ValueError):
        return "out"
    if not same_node(following, master):
        return "out"
    state = reply_text(role[3])
    if state == "connected":
        return "connected"
    return "down" if state in LINK_DOWN else "out"


def master_offset(role: Any) -> int | None:
    """A master's replication offset from its ``ROLE`` reply, None if it is not one."""
    if not isinstance(role, (list, tuple)) or len(role) < 2 or reply_text(role[0]) != "master":
        return None
    try:
        return int(role[1])
    except (TypeError, ValueError):
        return None


def replica_offset(role: Any) -> int | None:
    """The offset a replica applied, from its ``ROLE`` reply; None if unknown (Redis says -1
    while its link is down: it keeps what it had, dated by the checks before)."""
    if not isinstance(role, (list, tuple)) or len(role) < 5:
        return None
    try:
        offset = int(role[4])
    except (TypeError, ValueError):
        return None
    return offset if offset >= 0 else None


def replica_problem(role: Any, master: Address | None) -> str | None:
    """Why a ``ROLE`` reply disqualifies a replica of ``master`` from serving reads, or None."""
    if not isinstance(role, (list, tuple)) or len(role) < 4:
        return f"malformed ROLE reply {role!r:.60}"
    kind = reply_text(role[0])
    if kind not in ("slave", "replica"):
        return f"ROLE is {kind!r}"
    try:
        following = Address(reply_text(role[1]), int(role[2]))
    except (TypeError, ValueError):
        return f"malformed ROLE reply {role!r:.60}"
    if master is None or not same_node(following, master):
        return f"replicates from {following}, not the master {master}"
    state = reply_text(role[3])
    if state != "connected":
        return f"replication link {state!r}"
    return None


class Kept(Protocol):
    """What the housekeeper drives: the sharded pool, which owns it."""

    @property
    def shards(self) -> Sequence[Shard]: ...

    def check_fences(self) -> None: ...

    def recheck_failed(self) -> None: ...

    def check_outages(self) -> None: ...

    def refresh_replicas(self, name: str) -> None: ...


class Housekeeper:
    """The clock of one core: stale fences every ``interval``, replicas every ``replica_interval``."""

    def __init__(
        self,
        core: Kept,
        connection_kwargs: Mapping[str, Any],
        *,
        replicas: bool,
        interval: float = 0.5,
        replica_interval: float = 1.0,
        sentinels: SentinelSet | None = None,
    ) -> None:
        self._core = core
        self._sentinels = sentinels
        self._kwargs = {
            **connection_kwargs,
            "socket_timeout": min(
                CHECK_TIMEOUT, float(connection_kwargs.get("socket_timeout") or CHECK_TIMEOUT)
            ),
            "socket_connect_timeout": CHECK_TIMEOUT,
        }
        self._replicas = replicas
        self._interval = interval
        self._replica_interval = replica_interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._pending: set[str] = set()
        self._due: float | None = None  # when the pending shards are asked about
        self._clients: dict[Address, redis.Redis] = {}
        self.checks = 0
        self._thread = threading.Thread(
            target=self._run, name="sentinel_cache-housekeeper", daemon=True
        )

    def __repr__(self) -> str:
        state = "running" if self._thread.is_alive() else "stopped"
        return f"<Housekeeper {state} replicas={self._replicas} checks={self.checks}>"

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        self._stop.set()
        self._wake.set()
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.connection_pool.disconnect()

    def wake(self, shard: Shard) -> None:
        """Check ``shard``'s replicas soon (a sentinel reported a change about one): at a
        random moment within :data:`REFRESH_SPREAD`, with every shard woken meanwhile."""
        if self._replicas:
            self._pending.add(shard.name)
            if self._due is None:
                self._due = time.monotonic() + random.uniform(*REFRESH_SPREAD)
            self._wake.set()

    def _run(self) -> None:
        next_replicas = time.monotonic()
        while not self._stop.is_set():
            due = self._due
            wait = self._interval if due is None else due - time.monotonic()
            self._wake.wait(max(0.0, min(self._interval, wait)))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self._core.check_fences()
                self._core.recheck_failed()
                self._core.check_outages()
                if self._sentinels is not None:
                    self._sentinels.close_idle()
                pending: set[str] = set()
                due = self._due
                if due is not None and time.monotonic() >= due:
                    # cleared first: a shard woken from here on is asked about at a new moment
                    self._due = None
                    pending, self._pending = self._pending, set()
                for name in pending:
                    self._core.refresh_replicas(name)
                now = time.monotonic()
                if self._replicas and (pending or now >= next_replicas):
                    next_replicas = now + self._replica_interval
                    self.check_replicas()
            except Exception:  # the clock must keep ticking whatever one round hit
                logger.exception("housekeeping round failed")

    def check_replicas(self) -> None:
        """Ask every listed replica ``ROLE`` and update each shard's read rotation."""
        self.checks += 1
        listed: set[Address] = set()
        for shard in self._core.shards:
            master, generation = shard.current()
            answers = False  # does the master still answer? asked first, once a round
            if master is not None and shard.replicas:
                # Its offset first, then each replica's: what dates a replica (replicas.py).
                # Its connection is kept, as the replicas' are: asked every round, one opened
                # and closed each time would cost every master a connect per process a second.
                listed.add(master)
                offset = master_offset(self._role(master)[0])
                answers = offset is not None
                shard.note_master_offset(generation, offset)
            for address in shard.replicas:
                listed.add(address)
                role, problem = self._role(address)
                if role is not None:
                    problem = replica_problem(role, master)
                shard.set_replica_health(address, problem is None, problem or "")
                link = link_state(role, master)
                if link in ("connected", "down"):
                    applied = replica_offset(role)
                    if applied is not None:
                        shard.note_replica_offset(address, generation, applied)
                if link == "down" and master is not None and answers:
                    # A link down is a crash's mark only if the master is gone: one that still
                    # answers goes on taking writes this replica misses. Asked again: it may
                    # have died since its check at the round's start.
                    answers = self._is_master(master)
                    if answers:
                        link = "out"
                shard.note_replica_link(address, generation, link)
        for address in set(self._clients) - listed:
            self._clients.pop(address).connection_pool.disconnect()

    def _is_master(self, address: Address) -> bool:
        """Whether the node at ``address`` answers ``ROLE`` as a master (short timeouts)."""
        role, _ = self._role(address)
        return isinstance(role, (list, tuple)) and bool(role) and reply_text(role[0]) == "master"

    def _role(self, address: Address) -> tuple[Any, str | None]:
        """The node's ``ROLE`` reply, or (None, why it could not be asked)."""
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = direct_client(address, self._kwargs)
        try:
            return client.execute_command("ROLE"), None
        except (redis.RedisError, OSError) as exc:
            client.connection_pool.disconnect()
            return None, f"{type(exc).__name__}: {exc}"
