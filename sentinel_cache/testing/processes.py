"""The processes a topology owns: spawning them (with a parent-death signal where that is safe),
stopping them, the safety-net cleanup, and picking their loopback ports."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from sentinel_cache.testing.faults import FaultProxy

HOST = "127.0.0.1"
Address = tuple[str, int]

POLL_INTERVAL = 0.02
_STOP_GRACE = 3.0
_PORT_FLOOR = 20000


# --------------------------------------------------------------------------- ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int) -> list[int]:
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


def log_tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def check_ports_free(ports: Sequence[int]) -> None:
    """Raise :class:`PortTakenError` naming the first of ``ports`` that something listens on.

    The probe binds like the servers do (``SO_REUSEADDR``), so a port that only has connections
    in TIME_WAIT counts as free, as it is for them.
    """
    for port in ports:
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is out of range (1-65535)")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise PortTakenError(port, str(exc.strerror or exc)) from None
                raise


class PortTakenError(RuntimeError):
    """A fixed port (``port_base``) is already in use: nothing was started."""

    def __init__(self, port: int, why: str = "in use") -> None:
        super().__init__(f"port {port} on {HOST} is taken ({why}); choose another port base")
        self.port = port


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs here: trust kill(0)
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


# --------------------------------------------------------------------------- processes


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGKILL the child when we die, so a hard-killed test run leaves nothing."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def preexec() -> Callable[[], None] | None:
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


@dataclass
class Proc:
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
                preexec_fn=preexec(),  # only when safe: see preexec()
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


def terminate_all(procs: Sequence[Proc], grace: float = _STOP_GRACE) -> None:
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
class Runtime:
    """Everything the safety-net finalizer needs; kept apart so the finalizer never holds ``self``."""

    procs: list[Proc] = field(default_factory=list)
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
        terminate_all(self.procs)
        self.procs.clear()
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def cleanup_runtime(runtime: Runtime) -> None:
    runtime.cleanup()


class PortClashError(RuntimeError):
    """A process could not bind its port (another process took it after we probed it)."""

    def __init__(self, message: str, port: int | None = None) -> None:
        super().__init__(message)
        self.port = port
