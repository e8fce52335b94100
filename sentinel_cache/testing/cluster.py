"""A real, local Sentinel topology (data nodes + sentinels) built from ``redis-server``/``valkey-server``.

Tests, the demo and users need real failovers, not mocks, so this module starts real processes on
loopback ports. It imports only the stdlib and redis-py, and importing it starts nothing.

:class:`LocalSentinelCluster` coordinates: its topology operations (who is master, kills,
failovers, restarts, faults) are here, its processes in :mod:`.cluster_processes`; the other
concerns live next to it: :mod:`.binaries` (which server binary), :mod:`.tls` (certificates),
:mod:`.processes` (spawning, stopping, ports), :mod:`.configs` (command lines and sentinel
configs), :mod:`.readiness` (control connections and start-up), :mod:`.fault_control`
(partitions and shaped links) and :mod:`.blackhole`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import redis

from sentinel_cache.testing.binaries import (
    SERVER_ENV,
    find_server_binary,
    server_supports_tls,
)
from sentinel_cache.testing.blackhole import BlackHoleServer
from sentinel_cache.testing.cluster_processes import ClusterProcesses
from sentinel_cache.testing.faults import CLIENT, EVERYONE, FaultProxy
from sentinel_cache.testing.processes import (
    HOST,
    POLL_INTERVAL,
    Address,
    PortTakenError,
    Proc,
    terminate_all,
)
from sentinel_cache.testing.readiness import (
    as_address,
    ask_sentinels,
    parse_pairs,
    stringify,
    wait_for_master_change,
)
from sentinel_cache.testing.tls import TLSFiles

__all__ = [
    "HOST",
    "SERVER_ENV",
    "Address",
    "BlackHoleServer",
    "LocalSentinelCluster",
    "PortTakenError",
    "TLSFiles",
    "find_server_binary",
    "server_supports_tls",
]


class LocalSentinelCluster(ClusterProcesses):
    """Shards of one master + N replicas each, monitored by M sentinels, all on 127.0.0.1.

    Use it as a context manager (or call :meth:`start`/:meth:`stop`). Every process is ours,
    tracked by pid, and stopped by :meth:`stop`, by garbage collection or at interpreter exit.

    **Network faults** (``faults=True``; see :mod:`sentinel_cache.testing.faults` for the
    mechanism): every process really listens on its own loopback IP ``127.a.b.N`` (same port)
    and connects out from it, and a proxy in one helper process listens on the address everybody
    is given, ``127.0.0.1:port``: in settings, ``sentinel monitor``, ``replicaof``, the sentinels'
    and replicas' announced addresses. So every byte between the test process, the nodes and the
    sentinels crosses a proxy that knows who sends it and to whom. :meth:`node_client`,
    :meth:`sentinel_client`, :meth:`config` and :meth:`url` give the proxied addresses (what the
    sentinels report); the harness's own control connections (:meth:`master_address`,
    :meth:`wait_for_master_change`, :meth:`wait_for_replication`, :meth:`failover`...) go
    straight to the real ports, so a partition never cuts the harness off from what it
    observes. ``node_client(address, direct=True)`` does the same for a test.

    A *target* or *peer* is a master name (that shard's master when the call is made), a node or
    sentinel address (``"127.0.0.1:port"`` or a tuple), ``"sentinel:<i>"``, or ``"client"``
    (every connection from 127.0.0.1: the test process).

    - :meth:`partition` ``(target, *, peers=None, direction="both")`` stops the bytes between the
      target and ``peers`` (None: everyone, the test process included); ``"inbound"`` cuts only
      what goes to the target, ``"outbound"`` only what it sends. Open connections go silent
      (no RST, no FIN); new ones are accepted and go silent too (the kernel accepts before the
      proxy can decide, and refusing would be an RST, which a partition never sends). Bytes
      sent during the cut are delivered, in order, on heal (TCP retransmission).
    - :meth:`heal` ``(target=None)`` lifts the partitions of ``target`` (as it was named in
      :meth:`partition`, or its address), or all of them.
    - :meth:`delay` ``(target, ms, *, jitter_ms=0)`` delays every byte the target sends (its
      egress, like netem on its interface: a round trip with it gets ``ms`` once).
    - :meth:`loss` ``(target, fraction)``: a TCP stream cannot lose bytes, so that fraction of the
      chunks the target sends stall ~200 ms, as a retransmission after a lost segment does.
    - :meth:`reset` ``(target)`` closes every open connection to or from the target with an RST
      (``SO_LINGER`` 0) on both sides.
    - :meth:`clear_faults` removes every partition, delay and loss.
    - :meth:`freeze_node`/:meth:`thaw_node` (and :meth:`freeze_sentinel`) are the cheap fallback
      without ``faults``: SIGSTOP/SIGCONT, sockets open and silent.
    """

    def _shard_of(self, name: str) -> int:
        try:
            return self.master_names.index(name)
        except ValueError:
            raise KeyError(f"unknown master name {name!r}; have {self.master_names}") from None

    def _ask_sentinels(self, name: str) -> list[Address | None]:
        """Each live sentinel's current answer for ``name`` (None where it did not answer)."""
        callers = [
            (lambda *args, proc=proc: self._links.call(proc, *args))
            for proc in self._live_sentinels()
        ]
        return ask_sentinels(callers, name)

    def master_address(self, name: str) -> Address:
        """The master of ``name`` as a live sentinel reports it right now."""
        self._require_running()
        self._shard_of(name)
        for answer in self._ask_sentinels(name):
            if answer is not None:
                return answer
        raise RuntimeError(f"no live sentinel reported a master for {name!r}")

    def replica_addresses(self, name: str) -> list[Address]:
        """Running data nodes of the shard other than its current master (whatever their link)."""
        master = self.master_address(name)
        shard = self._shard_of(name)
        return [
            p.address for p in self._nodes if p.shard == shard and p.alive and p.address != master
        ]

    # ----------------------------------------------------------------- chaos

    def kill_master(self, name: str) -> Address:
        """SIGKILL the process that is the master of ``name`` now; returns its address."""
        address = self.master_address(name)
        self.kill_node(address)
        return address

    def kill_node(self, address: Address | str) -> None:
        """SIGKILL one of our data nodes (no shutdown, like a crash) and reap it."""
        proc = self._proc_at(address)
        if proc.popen is None or not proc.alive:
            raise RuntimeError(f"{proc.describe()} is not running")
        proc.popen.kill()
        proc.popen.wait()
        self._links.drop(proc.port)

    def failover(self, name: str) -> None:
        """SENTINEL FAILOVER through a live sentinel (a manual failover, no agreement needed)."""
        self._require_running()
        self._shard_of(name)
        errors: list[str] = []
        for proc in self._live_sentinels():
            try:
                self._links.call(proc, "SENTINEL", "FAILOVER", name)
                return
            except redis.ResponseError:
                raise
            except (redis.RedisError, OSError) as exc:
                errors.append(f"{proc.port}: {exc}")
        raise RuntimeError(f"no live sentinel accepted SENTINEL FAILOVER {name}: {errors}")

    def _role(self, address: Address) -> str | None:
        try:
            proc = self._proc_at(address)
            reply = self._links.call(proc, "ROLE")
        except (KeyError, redis.RedisError, OSError):
            return None
        return str(reply[0]) if reply else None

    def wait_for_master_change(
        self, name: str, old: Address | str, timeout: float = 30.0
    ) -> Address:
        """Wait until every live sentinel reports the same new master and it has ROLE master."""
        self._require_running()
        self._shard_of(name)
        return wait_for_master_change(
            name, as_address(old), lambda: self._ask_sentinels(name), self._role, timeout
        )

    def _replication_pending(self, name: str) -> list[str]:
        master = self.master_address(name)
        shard = self._shard_of(name)
        pending: list[str] = []
        linked_replicas = 0
        for proc in self._nodes:
            if proc.shard != shard or not proc.alive or proc.address == master:
                continue
            try:
                info = stringify(self._links.call(proc, "INFO", "replication"))
            except (redis.RedisError, OSError) as exc:
                pending.append(f"{proc.address}: {exc}")
                continue
            linked = (
                info.get("role") == "slave"
                and int(info.get("master_port", 0)) == master[1]
                and info.get("master_link_status") == "up"
            )
            if not linked:
                pending.append(
                    f"{proc.address}: role={info.get('role')} master_port={info.get('master_port')} "
                    f"link={info.get('master_link_status')}"
                )
            linked_replicas += 1
        if not pending:
            why = self._readiness.streaming_pending(self._proc_at(master), linked_replicas)
            if why is not None:
                pending.append(why)
        return pending

    def wait_for_replication(self, name: str | None = None, timeout: float = 30.0) -> None:
        """Wait until every running replica of the master(s) is linked and receiving writes.

        Linked means ROLE replica of the master the sentinels report, master_link_status:up and
        a fresh write on the master acknowledged (see :meth:`Readiness.streaming_pending`).
        """
        self._require_running()
        names = [name] if name is not None else list(self.master_names)
        deadline = time.monotonic() + timeout
        while True:
            pending = [f"{n}: {why}" for n in names for why in self._replication_pending_safe(n)]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"replication not up within {timeout}s: {pending}")
            time.sleep(POLL_INTERVAL)

    def _replication_pending_safe(self, name: str) -> list[str]:
        try:
            return self._replication_pending(name)
        except RuntimeError as exc:
            return [str(exc)]

    def restart_node(
        self,
        address: Address | str,
        *,
        as_replica: bool = False,
        timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        """Start a killed data node again on its port with its original arguments.

        Like a crashed server coming back with its old config, a former master returns *as a
        master* and a replica follows its original master; the sentinels then reconfigure it,
        which takes them ~10 s (they re-read a replica's INFO every 10 s and wait 8 s before
        converting a node that claims the wrong role). ``as_replica=True`` starts it directly in
        the role the sentinels expect (a replica of the current master, linked within
        milliseconds). Returns once the node answers; :meth:`wait_for_replication` waits for
        its link. ``extra_args``: server arguments added for this start only, e.g. a
        ``--rename-command`` that takes a command away as an older server would.
        """
        self._require_running()
        proc = self._proc_at(address)
        if proc.role != "node":
            raise ValueError(f"{proc.describe()} is not a data node; use start_sentinel()")
        if proc.alive:
            raise RuntimeError(f"{proc.describe()} is still running")
        argv = list(proc.argv)
        if as_replica:
            master = self.master_address(self.master_names[proc.shard])
            if "--replicaof" in argv:
                at = argv.index("--replicaof")
                del argv[at : at + 3]
            if master != proc.address:  # else the sentinels still expect it to be the master
                argv += ["--replicaof", master[0], str(master[1])]
        self._respawn(proc, timeout, [*argv, *extra_args])

    def stop_sentinel(self, index: int) -> None:
        """SIGTERM sentinel ``index``; its config file (rewritten by the sentinel) is kept."""
        self._require_running()
        proc = self._sentinels[index]
        terminate_all([proc])
        self._links.drop(proc.port)

    def freeze_sentinel(self, index: int) -> None:
        """SIGSTOP sentinel ``index``: its sockets stay open but nothing answers, like a host
        that vanished from the network without closing its connections."""
        self._require_running()
        popen = self._sentinels[index].popen
        if popen is not None:
            os.kill(popen.pid, signal.SIGSTOP)

    def thaw_sentinel(self, index: int) -> None:
        """SIGCONT a sentinel frozen by :meth:`freeze_sentinel`."""
        popen = self._sentinels[index].popen
        if popen is not None:
            os.kill(popen.pid, signal.SIGCONT)

    def start_sentinel(self, index: int, timeout: float = 30.0) -> None:
        """Start sentinel ``index`` again on its port with its (rewritten) config file.

        Returns once it answers for every master and every other running sentinel has its link
        to it back (they retry a lost peer once per second), so it counts towards the quorum.
        """
        self._require_running()
        proc = self._sentinels[index]
        if proc.alive:
            raise RuntimeError(f"{proc.describe()} is still running")
        deadline = time.monotonic() + timeout
        self._respawn(proc, timeout)
        while True:
            why = self._sentinel_rejoined(proc)
            if why is None:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{proc.describe()} did not rejoin within {timeout}s: {why}")
            time.sleep(POLL_INTERVAL)

    def _sentinel_rejoined(self, proc: Proc) -> str | None:
        try:
            for name in self.master_names:
                self._links.call(proc, "SENTINEL", "MASTER", name)
            for other in self._live_sentinels():
                if other is proc:
                    continue
                for name in self.master_names:
                    peers = [
                        parse_pairs(r)
                        for r in self._links.call(other, "SENTINEL", "SENTINELS", name)
                    ]
                    flags = [p.get("flags", "") for p in peers if p.get("port") == str(proc.port)]
                    if flags != ["sentinel"]:
                        return f"sentinel {other.port} sees it as {flags} for {name}"
        except (redis.RedisError, OSError) as exc:
            return str(exc)
        return None

    def freeze_node(self, address: Address | str) -> None:
        """SIGSTOP a data node: its sockets stay open and silent (the cheap partition, no
        ``faults`` needed; unlike a partition it also stops its replication and timers)."""
        self._require_running()
        popen = self._proc_at(address).popen
        if popen is not None:
            os.kill(popen.pid, signal.SIGSTOP)

    def thaw_node(self, address: Address | str) -> None:
        """SIGCONT a node frozen by :meth:`freeze_node`."""
        popen = self._proc_at(address).popen
        if popen is not None:
            os.kill(popen.pid, signal.SIGCONT)

    # ----------------------------------------------------------------- network faults

    def _proxy(self) -> FaultProxy:
        self._require_running()
        proxy = self._runtime.proxy
        if proxy is None:
            raise RuntimeError(f"{self!r} was not started with faults=True")
        return proxy

    def fault_peer(self, target: Address | str) -> str:
        """The proxy's id of a target or peer: ``"client"`` or ``"127.0.0.1:port"``."""
        if isinstance(target, str):
            if target == CLIENT:
                return CLIENT
            if target.startswith("sentinel:"):
                port = self._sentinels[int(target.partition(":")[2])].port
                return f"{HOST}:{port}"
            if target in self.master_names:
                host, port = self.master_address(target)
                return f"{HOST}:{port}"
        return f"{HOST}:{self._proc_at(target).port}"

    def partition(
        self,
        target: Address | str,
        *,
        peers: Sequence[Address | str] | None = None,
        direction: str = "both",
    ) -> str:
        """Cut the target off from ``peers`` (None: everyone); returns the target's address.

        See the class docstring for what the endpoints see. Partitions add up; :meth:`heal`
        lifts them.
        """
        if direction not in ("both", "inbound", "outbound"):
            raise ValueError(
                f"direction must be 'both', 'inbound' or 'outbound', not {direction!r}"
            )
        proxy = self._proxy()
        me = self.fault_peer(target)
        others = [EVERYONE] if peers is None else [self.fault_peer(p) for p in peers]
        label = target if isinstance(target, str) else f"{target[0]}:{target[1]}"
        self._faults.partition(proxy, label, me, others, direction)
        return me

    def heal(self, target: Address | str | None = None) -> None:
        """Lift the partitions of ``target`` (named as in :meth:`partition`, or by address),
        or every partition; bytes held by them are delivered now."""
        proxy = self._proxy()
        if target is None:
            self._faults.heal(proxy, None, lambda: "")
            return
        label = target if isinstance(target, str) else f"{target[0]}:{target[1]}"
        self._faults.heal(proxy, label, lambda: self.fault_peer(target))

    def delay(self, target: Address | str, ms: float, *, jitter_ms: float = 0.0) -> None:
        """Delay every byte the target sends by ``ms`` (+/- ``jitter_ms``); 0 removes it."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError("delay and jitter must be >= 0")
        self._shape(target, delay=ms / 1000.0, jitter=jitter_ms / 1000.0)

    def loss(self, target: Address | str, fraction: float) -> None:
        """Stall ``fraction`` of the chunks the target sends by ~200 ms (a TCP retransmission
        after a lost segment: a stream cannot lose bytes); 0 removes it."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"loss fraction must be between 0 and 1, not {fraction}")
        self._shape(target, loss=fraction)

    def _shape(self, target: Address | str, **changes: float) -> None:
        proxy = self._proxy()
        self._faults.shape(proxy, self.fault_peer(target), **changes)

    def reset(self, target: Address | str) -> int:
        """RST every open connection to or from the target; returns how many were reset."""
        proxy = self._proxy()
        return proxy.reset(self.fault_peer(target))

    def clear_faults(self) -> None:
        """Remove every partition, delay and loss (frozen processes stay frozen)."""
        self._faults.clear(self._proxy())

    def fault_stats(self) -> dict[str, Any]:
        """The proxy's counters: open connections (per target), accepted, bytes, queued bytes."""
        return self._proxy().stats()
