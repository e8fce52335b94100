"""A real, local Sentinel topology (data nodes + sentinels) built from ``redis-server``/``valkey-server``.

Tests, the demo and users need real failovers, not mocks, so this module starts real processes on
loopback ports. It imports only the stdlib and redis-py, and importing it starts nothing.

:class:`LocalSentinelCluster` coordinates; the concerns live next to it: :mod:`.binaries` (which
server binary), :mod:`.tls` (certificates), :mod:`.processes` (spawning, stopping, ports),
:mod:`.configs` (command lines and sentinel configs), :mod:`.readiness` (control connections and
start-up), :mod:`.fault_control` (partitions and shaped links) and :mod:`.blackhole`.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode

import redis

from sentinel_cache.testing.binaries import (
    SERVER_ENV,
    find_server_binary,
    probe_binary,
    server_supports_tls,
)
from sentinel_cache.testing.blackhole import BlackHoleServer
from sentinel_cache.testing.configs import Configs
from sentinel_cache.testing.fault_control import FaultControl
from sentinel_cache.testing.faults import CLIENT, EVERYONE, FaultProxy, Route
from sentinel_cache.testing.processes import (
    HOST,
    POLL_INTERVAL,
    Address,
    PortClashError,
    PortTakenError,
    Proc,
    Runtime,
    check_ports_free,
    cleanup_runtime,
    free_ports,
    log_tail,
    preexec,
    terminate_all,
)
from sentinel_cache.testing.readiness import (
    Links,
    Readiness,
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

_START_ATTEMPTS = 3


class LocalSentinelCluster:
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

    def __init__(
        self,
        shards: int = 2,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 10000,
        quorum: int | None = None,
        server: str | None = None,
        master_names: Sequence[str] | None = None,
        requirepass: str | None = None,
        sentinel_requirepass: str | None = None,
        extra_server_args: Sequence[str] = (),
        start_timeout: float = 30.0,
        tls: TLSFiles | None = None,
        faults: bool = False,
        port_base: int | None = None,
    ) -> None:
        if shards < 1 or replicas < 0 or sentinels < 1:
            raise ValueError(
                f"need shards >= 1, replicas >= 0, sentinels >= 1 "
                f"(got {shards}, {replicas}, {sentinels})"
            )
        self.shards = shards
        self.replicas = replicas
        self.sentinels = sentinels
        self.quorum = quorum if quorum is not None else sentinels // 2 + 1
        if not 1 <= self.quorum <= sentinels:
            raise ValueError(f"quorum must be between 1 and {sentinels}, got {self.quorum}")
        names = (
            list(master_names) if master_names is not None else [f"shard{i}" for i in range(shards)]
        )
        if len(names) != shards or len(set(names)) != shards:
            raise ValueError(f"master_names must be {shards} distinct names, got {names!r}")
        for name in names:
            if not name or any(c.isspace() for c in name):
                raise ValueError(f"master name {name!r} must be non-empty without whitespace")
        if port_base is not None:
            last = port_base + shards * (1 + replicas) + sentinels - 1
            if port_base < 1 or last > 65535:
                raise ValueError(
                    f"port_base {port_base} needs ports {port_base}-{last}, beyond 1-65535"
                )
        self.master_names: list[str] = names
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.requirepass = requirepass
        self.sentinel_requirepass = sentinel_requirepass
        self.extra_server_args = list(extra_server_args)
        self.start_timeout = start_timeout
        self.port_base = port_base
        self.server_binary, self.server_kind = find_server_binary(server)
        self.server_version: str = probe_binary(self.server_binary)[1]
        self.tls = tls
        if tls is not None and not server_supports_tls(self.server_binary):
            raise RuntimeError(
                f"tls requested but {self.server_binary} ({self.server_kind} "
                f"{self.server_version}) was built without TLS support"
            )
        self.faults = faults
        self.startup_seconds: float | None = None
        self._runtime = Runtime()
        self._finalizer: weakref.finalize[[Runtime], LocalSentinelCluster] | None = None
        self._running = False
        self._lock = threading.RLock()
        # Collaborators hold the runtime and the lock, never the cluster, so dropping the
        # cluster still lets the safety-net finalizer run at once.
        self._links = Links(
            self._runtime,
            self._lock,
            requirepass=requirepass,
            sentinel_requirepass=sentinel_requirepass,
            tls_kwargs=self._tls_kwargs(),
        )
        self._readiness = Readiness(
            self._links,
            self._runtime,
            master_names=self.master_names,
            replicas=replicas,
            sentinels=sentinels,
            start_timeout=start_timeout,
            server=f"{self.server_kind} {self.server_version}",
        )
        self._faults = FaultControl(self._lock)

    # ----------------------------------------------------------------- introspection

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        if self.faults:
            state += f" {self._faults.describe()}"
        return (
            f"<LocalSentinelCluster {self.server_kind} {self.server_version} "
            f"shards={self.shards} replicas={self.replicas} sentinels={self.sentinels} {state}>"
        )

    @property
    def running(self) -> bool:
        return self._running

    @property
    def tmpdir(self) -> str | None:
        """The directory holding configs, logs and node dirs (removed by :meth:`stop`)."""
        return self._runtime.tmpdir

    @property
    def pids(self) -> list[int]:
        """Pids of our processes that are running now (killed/stopped ones are left out)."""
        return [p.popen.pid for p in self._runtime.procs if p.alive and p.popen is not None]

    @property
    def fault_proxy(self) -> FaultProxy | None:
        """With ``faults=True`` and running: the helper process running the proxies (its
        ``pid``, ``alive``); else None."""
        return self._runtime.proxy

    def processes(self) -> list[dict[str, Any]]:
        """One dict per process: ``role`` (``"node"``/``"sentinel"``), ``index``, ``address``
        (``"127.0.0.1:port"``), ``port``, ``pid`` (None if never started), ``alive``, ``shard``
        (the master name of a node's shard, None for a sentinel) and ``log``."""
        table = []
        for proc in self._runtime.procs:
            table.append(
                {
                    "role": proc.role,
                    "index": proc.index,
                    "address": f"{HOST}:{proc.port}",
                    "port": proc.port,
                    "pid": proc.popen.pid if proc.popen is not None else None,
                    "alive": proc.alive,
                    "shard": self.master_names[proc.shard] if proc.role == "node" else None,
                    "log": proc.log_path,
                }
            )
        return table

    @property
    def _nodes(self) -> list[Proc]:
        return [p for p in self._runtime.procs if p.role == "node"]

    @property
    def _sentinels(self) -> list[Proc]:
        return [p for p in self._runtime.procs if p.role == "sentinel"]

    @property
    def sentinel_addresses(self) -> list[Address]:
        return [p.address for p in self._sentinels]

    def node_addresses(self) -> list[Address]:
        """Every data node's address (running or not), shard by shard, initial master first."""
        return [p.address for p in self._nodes]

    def config(self) -> dict[str, Any]:
        """What a client needs: sentinel ``host:port`` strings, master names and passwords
        (and with ``tls``, the CA file both sides are verified with)."""
        config: dict[str, Any] = {
            "sentinels": [f"{h}:{p}" for h, p in self.sentinel_addresses],
            "masters": list(self.master_names),
            "password": self.requirepass,
            "sentinel_password": self.sentinel_requirepass,
        }
        if self.tls is not None:
            ca = self.tls.ca_cert
            config.update(ssl=True, ssl_ca_certs=ca, sentinel_ssl=True, sentinel_ssl_ca_certs=ca)
        return config

    def url(self, *, credentials: bool = True) -> str:
        """:meth:`config` as one ``sentinel://[:password@]h1:p1,h2:p2/shard0,shard1`` URL that
        works as pasted: the data nodes' password in the user info, the sentinels' as
        ``?sentinel_password=``; with ``tls``, ``sentinels://`` with the CA file as
        ``ssl_ca_certs``/``sentinel_ssl_ca_certs``. ``credentials=False`` leaves the passwords
        out (for logs)."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
        scheme = "sentinel" if self.tls is None else "sentinels"
        userinfo = ""
        query: list[tuple[str, str]] = []
        if credentials and self.requirepass is not None:
            userinfo = f":{quote(self.requirepass, safe='')}@"
        if credentials and self.sentinel_requirepass is not None:
            query.append(("sentinel_password", self.sentinel_requirepass))
        if self.tls is not None:
            query += [
                ("ssl_ca_certs", self.tls.ca_cert),
                ("sentinel_ssl_ca_certs", self.tls.ca_cert),
            ]
        masters = ",".join(quote(name, safe="") for name in self.master_names)
        url = f"{scheme}://{userinfo}{hosts}/{masters}"
        if query:
            url += "?" + urlencode(query, quote_via=quote, safe="")
        return url

    def log_paths(self) -> dict[str, str]:
        """Log file per process (``"node 127.0.0.1:P"`` / ``"sentinel 127.0.0.1:P"``), for debugging."""
        return {f"{p.role} {HOST}:{p.port}": p.log_path for p in self._runtime.procs}

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalSentinelCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalSentinelCluster:
        """Start every process in parallel and return once the topology is fully formed.

        With ``port_base``, a port that is taken raises :class:`PortTakenError` naming it
        (random ports are picked again instead, up to three times).
        """
        with self._lock:
            if self._running:
                return self
            began = time.monotonic()
            deadline = began + self.start_timeout
            for attempt in range(1, _START_ATTEMPTS + 1):
                try:
                    self._launch()
                    self._readiness.wait_ready(deadline)
                except PortClashError as exc:
                    self._teardown()
                    if self.port_base is not None:
                        port = exc.port if exc.port is not None else self.port_base
                        raise PortTakenError(port, str(exc)) from None
                    if attempt == _START_ATTEMPTS:
                        raise
                    continue
                except BaseException:
                    self._teardown()
                    raise
                break
            self._running = True
            self.startup_seconds = time.monotonic() - began
            return self

    def stop(self) -> None:
        """Stop our processes (SIGTERM, then SIGKILL) and remove the temp dir; safe to repeat."""
        with self._lock:
            self._teardown()
            self._running = False

    def _teardown(self) -> None:
        self._faults.forget()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._runtime.cleanup()

    def _ports(self, count: int) -> list[int]:
        if self.port_base is None:
            return free_ports(count)
        ports = list(range(self.port_base, self.port_base + count))
        check_ports_free(ports)
        return ports

    def _launch(self) -> None:
        """Pick ports, write configs and spawn the masters; :meth:`Readiness.wait_ready` does
        the rest.

        Processes start in three waves (masters, replicas, sentinels), each spawned all at once:
        every wave only starts once the one it connects to answers, which avoids the once-a-second
        retries that dominate a naive all-at-once start.
        """
        runtime = self._runtime
        per_shard = 1 + self.replicas
        ports = self._ports(self.shards * per_shard + self.sentinels)
        runtime.tmpdir = tempfile.mkdtemp(prefix="sentinel-cache-")
        self._finalizer = weakref.finalize(self, cleanup_runtime, runtime)
        configs = Configs(
            server_binary=self.server_binary,
            master_names=list(self.master_names),
            replicas=self.replicas,
            quorum=self.quorum,
            down_after_ms=self.down_after_ms,
            failover_timeout_ms=self.failover_timeout_ms,
            requirepass=self.requirepass,
            sentinel_requirepass=self.sentinel_requirepass,
            extra_server_args=list(self.extra_server_args),
            tls=self.tls,
        )
        node_ports = ports[: self.shards * per_shard]
        sentinel_ports = ports[self.shards * per_shard :]
        hosts = self._bind_hosts(len(ports))
        for shard in range(self.shards):
            master_port = node_ports[shard * per_shard]
            for i in range(per_shard):
                index = shard * per_shard + i
                port = node_ports[index]
                node_dir = os.path.join(runtime.tmpdir, f"node{index}")
                os.mkdir(node_dir)
                argv = configs.node_argv(port, node_dir, hosts[index])
                if i > 0:
                    argv += ["--replicaof", HOST, str(master_port)]
                log = os.path.join(node_dir, "server.log")
                runtime.procs.append(
                    Proc("node", index, port, argv, log, shard, bind_host=hosts[index])
                )
        ids = [secrets.token_hex(20) for _ in range(self.sentinels)]
        for index, port in enumerate(sentinel_ports):
            conf = os.path.join(runtime.tmpdir, f"sentinel{index}.conf")
            host = hosts[len(node_ports) + index]
            Path(conf).write_text(
                configs.sentinel_conf(
                    index, port, sentinel_ports, ids, node_ports, runtime.tmpdir, host
                )
            )
            argv = [self.server_binary, conf, "--sentinel"]
            log = os.path.join(runtime.tmpdir, f"sentinel{index}.log")
            runtime.procs.append(Proc("sentinel", index, port, argv, log, bind_host=host))
        if self.faults:
            self._start_proxy()
        # Masters first: a replica whose first attempt finds no master retries only a second
        # later, so replicas (and then sentinels) are spawned by wait_ready in later waves.
        for proc in self._readiness.masters_at_start():
            proc.spawn()

    def _bind_hosts(self, count: int) -> list[str]:
        """Where each process listens: 127.0.0.1, or with faults its own 127.a.b.N (a random
        /24 per cluster, so concurrent clusters rarely share one)."""
        if not self.faults:
            return [HOST] * count
        if count > 254:
            raise ValueError(f"faults=True supports up to 254 processes, not {count}")
        rng = random.SystemRandom()
        base = f"127.{rng.randrange(1, 255)}.{rng.randrange(2, 255)}"
        return [f"{base}.{i + 1}" for i in range(count)]

    def _start_proxy(self) -> None:
        """Start the helper process with one proxy per process, before any server starts."""
        runtime = self._runtime
        assert runtime.tmpdir is not None
        routes = [
            Route(f"{HOST}:{p.port}", (HOST, p.port), (p.bind_host, p.port)) for p in runtime.procs
        ]
        sources = {p.bind_host: f"{HOST}:{p.port}" for p in runtime.procs}
        runtime.proxy = FaultProxy(
            routes, sources, log_path=os.path.join(runtime.tmpdir, "faults.log")
        )
        try:
            runtime.proxy.start(preexec())
        except RuntimeError as exc:
            if "in use" in str(exc):
                raise PortClashError(f"fault proxy: {exc}") from exc
            raise

    # ----------------------------------------------------------------- queries

    def _require_running(self) -> None:
        if not self._running:
            raise RuntimeError(f"{self!r} is not running")

    def _live_sentinels(self) -> list[Proc]:
        return [p for p in self._sentinels if p.alive]

    def _shard_of(self, name: str) -> int:
        try:
            return self.master_names.index(name)
        except ValueError:
            raise KeyError(f"unknown master name {name!r}; have {self.master_names}") from None

    def _proc_at(self, address: Address | str) -> Proc:
        host, port = as_address(address)
        for proc in self._runtime.procs:
            if proc.port == port and host in (HOST, "localhost", proc.bind_host):
                return proc
        raise KeyError(f"{host}:{port} is not a process of {self!r}")

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

    def _tls_kwargs(self) -> dict[str, Any]:
        """The harness's own TLS links: verified against the CA, presenting the client
        certificate, without host name checks (tests may use certificates for other names)."""
        if self.tls is None:
            return {}
        return {**self.tls.client_kwargs(client_cert=True), "ssl_check_hostname": False}

    def node_client(
        self, address: Address | str, *, direct: bool = False, **kwargs: Any
    ) -> redis.Redis:
        """A new client for a data node (password and TLS filled in); the caller closes it.

        ``direct=True`` (with ``faults``) connects to the node's real port, past its proxy, so no
        fault applies to it.
        """
        host, port = as_address(address)
        if direct:
            host = self._proc_at(address).bind_host
        kwargs.setdefault("password", self.requirepass)
        for name, value in self._tls_kwargs().items():
            kwargs.setdefault(name, value)
        return redis.Redis(host=host, port=port, **kwargs)

    def sentinel_client(self, index: int = 0, **kwargs: Any) -> redis.Redis:
        """A new client for sentinel ``index`` (password and TLS filled in); the caller closes it."""
        host, port = self.sentinel_addresses[index]
        kwargs.setdefault("password", self.sentinel_requirepass)
        for name, value in self._tls_kwargs().items():
            kwargs.setdefault(name, value)
        return redis.Redis(host=host, port=port, **kwargs)

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
        self, address: Address | str, *, as_replica: bool = False, timeout: float = 30.0
    ) -> None:
        """Start a killed data node again on its port with its original arguments.

        Like a crashed server coming back with its old config, a former master returns *as a
        master* and a replica follows its original master; the sentinels then reconfigure it,
        which takes them ~10 s (they re-read a replica's INFO every 10 s and wait 8 s before
        converting a node that claims the wrong role). ``as_replica=True`` starts it directly in
        the role the sentinels expect (a replica of the current master, linked within
        milliseconds). Returns once the node answers; :meth:`wait_for_replication` waits for
        its link.
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
        self._respawn(proc, timeout, argv)

    def _respawn(self, proc: Proc, timeout: float, argv: list[str] | None = None) -> None:
        """Spawn ``proc`` again on its own port and wait until it answers as our process."""
        self._links.drop(proc.port)
        deadline = time.monotonic() + timeout
        while True:
            proc.spawn(argv)
            assert proc.popen is not None
            while proc.popen.poll() is None:
                try:
                    self._links.verify_owner(proc)
                    return
                except PortClashError:
                    terminate_all([proc])
                    raise
                except (redis.RedisError, OSError):
                    pass
                if time.monotonic() > deadline:
                    terminate_all([proc])
                    raise TimeoutError(f"{proc.describe()} did not answer within {timeout}s")
                time.sleep(POLL_INTERVAL)
            log = log_tail(proc.log_path)
            if "Address already in use" not in log or time.monotonic() > deadline:
                raise RuntimeError(f"{proc.describe()} exited on restart; log tail:\n{log}")
            time.sleep(0.2)  # a stranger holds the port for now; try again until the deadline

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

    def describe(self) -> str:
        """A multi-line human summary (ports, roles, pids), e.g. for the CLI."""
        lines = [repr(self)]
        for proc in self._runtime.procs:
            lines.append(f"  {proc.describe()}")
        return "\n".join(lines)
