"""The processes of a :class:`~sentinel_cache.testing.cluster.LocalSentinelCluster`: its
settings, start-up (every process at once, retried on a port clash), stop, respawn, and clients
for its nodes and sentinels.

Kept apart from the topology operations (kill, failover, partition... in
:mod:`~sentinel_cache.testing.cluster`), which are written on top of these.
"""

from __future__ import annotations

import os
import random
import secrets
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import redis

from sentinel_cache.testing.binaries import (
    find_server_binary,
    probe_binary,
    server_supports_tls,
)
from sentinel_cache.testing.configs import Configs
from sentinel_cache.testing.fault_control import FaultControl
from sentinel_cache.testing.faults import FaultProxy, Route
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
)
from sentinel_cache.testing.tls import TLSFiles

_START_ATTEMPTS = 3

_Self = TypeVar("_Self", bound="ClusterProcesses")


class ClusterProcesses:
    """Starts, tracks and stops a cluster's processes; see
    :class:`~sentinel_cache.testing.cluster.LocalSentinelCluster` for the arguments."""

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
        self._finalizer: weakref.finalize[[Runtime], ClusterProcesses] | None = None
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

    def __enter__(self: _Self) -> _Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self: _Self) -> _Self:
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

    def _proc_at(self, address: Address | str) -> Proc:
        host, port = as_address(address)
        for proc in self._runtime.procs:
            if proc.port == port and host in (HOST, "localhost", proc.bind_host):
                return proc
        raise KeyError(f"{host}:{port} is not a process of {self!r}")

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

    def describe(self) -> str:
        """A multi-line human summary (ports, roles, pids), e.g. for the CLI."""
        lines = [repr(self)]
        for proc in self._runtime.procs:
            lines.append(f"  {proc.describe()}")
        return "\n".join(lines)
