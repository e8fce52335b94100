"""Helpers for the server-shape tests: a real server in its own process group, HTTP traffic
recorded request by request, and who owns which sentinel pub/sub connection.

Everything here talks to real processes: the point is to see what gunicorn and uvicorn do to
the cache's listeners and connections, which an in-process test cannot show.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from threads import Workers

from sentinel_cache.testing import LocalSentinelCluster

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"
REQUEST_TIMEOUT = 10.0
START_TIMEOUT = 30.0
STOP_GRACE = 5.0


def free_port() -> int:
    """A loopback port free right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str, timeout: float = REQUEST_TIMEOUT) -> tuple[int, Any]:
    """``GET path``: (status, parsed JSON or text). A fresh connection per request, so a sync
    server's workers share the load and a dead worker cannot hide behind keep-alive."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        body = response.read().decode("utf-8", "replace")
    finally:
        conn.close()
    try:
        return response.status, json.loads(body)
    except ValueError:
        return response.status, body


class ServerProcess:
    """One application server (and the workers it forks or spawns) in its own process group.

    ``stop()`` signals the whole group (SIGTERM, then SIGKILL after a grace period) so no worker
    survives the test; it also runs at interpreter exit as a safety net.
    """

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path):
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.port = 0
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, port: int, health: str = "/health", timeout: float = START_TIMEOUT) -> None:
        """Start on ``port`` and return once ``health`` answers 200 (bounded by ``timeout``)."""
        self.port = port
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=HERE,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: one killpg reaches every worker
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if get(port, health, timeout=1.0)[0] == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} not healthy within {timeout}s:\n{self.tail()}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def group_pids(self) -> list[int]:
        """Every live process of the server's group (the server, its workers, their helpers)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            stat = _read(f"/proc/{entry}/stat")
            if stat is None:
                continue
            fields = stat.rpartition(")")[2].split()
            # fields: state ppid pgrp ...; a zombie holds no sockets
            if fields[0] != "Z" and int(fields[2]) == self.pid:
                found.append(int(entry))
        return sorted(found)

    def stop(self) -> None:
        """Terminate the whole process group; safe to repeat."""
        atexit.unregister(self.stop)
        popen = self.popen
        if popen is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, sig)
            deadline = time.monotonic() + STOP_GRACE
            while time.monotonic() < deadline:
                if popen.poll() is not None and not self.group_pids():
                    return
                time.sleep(0.05)
        popen.wait(STOP_GRACE)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"<no log: {exc}>"
        return "\n".join(text.splitlines()[-lines:])


def server_env(
    cluster: LocalSentinelCluster, *, ignore_exceptions: bool, outage_hold: float | None = None
) -> dict[str, str]:
    """The environment the app's settings read the topology from (``outage_hold`` None: the
    default's)."""
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "shapes_settings",
        "SHAPES_SENTINELS": ",".join(f"{h}:{p}" for h, p in cluster.sentinel_addresses),
        "SHAPES_MASTERS": ",".join(cluster.master_names),
        "SHAPES_IGNORE_EXCEPTIONS": "1" if ignore_exceptions else "0",
        "SHAPES_OUTAGE_HOLD": "" if outage_hold is None else str(outage_hold),
    }


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


# --------------------------------------------------------------------------- traffic


@dataclass
class Result:
    """One request: when it ran, its HTTP status (0: no answer) and the view's report."""

    started: float
    ended: float
    status: int
    body: Any
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.status != 200

    @property
    def duration(self) -> float:
        return self.ended - self.started

    def field(self, name: str) -> list[dict[str, Any]]:
        return list(self.body.get(name, [])) if isinstance(self.body, dict) else []


@dataclass
class Traffic:
    """A client thread sending ``path`` back to back until stopped, recording every request."""

    port: int
    path: str
    results: list[Result] = field(default_factory=list)
    _halt: threading.Event = field(default_factory=threading.Event)
    _workers: Workers = field(default_factory=lambda: Workers(timeout=REQUEST_TIMEOUT + 5))

    def __enter__(self) -> Traffic:
        self._workers.spawn(self._run, name="shapes-traffic")
        return self

    def __exit__(self, *exc: object) -> None:
        """Stops the thread; raises what it raised, or that it is still running."""
        self._halt.set()
        self._workers.join()

    def _run(self) -> None:
        while not self._halt.is_set():
            started = time.monotonic()
            try:
                status, body = get(self.port, self.path)
                self.results.append(Result(started, time.monotonic(), status, body))
            except (OSError, http.client.HTTPException) as exc:
                error = f"{type(exc).__name__}: {exc}"
                self.results.append(Result(started, time.monotonic(), 0, None, error))

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Until ``count`` more requests have completed (the traffic really flows)."""
        target = len(self.results) + count
        deadline = time.monotonic() + timeout
        while len(self.results) < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.results)} of {target} requests in {timeout}s")
            time.sleep(0.01)

    def failed(self) -> list[Result]:
        return [r for r in self.results if r.failed]

    def summary(self, since: float) -> str:
        failed = self.failed()
        slowest = max((r.duration for r in self.results), default=0.0)
        text = (
            f"{len(self.results)} requests, {len(failed)} failed, "
            f"{sum(bool(r.field('degraded')) for r in self.results)} degraded, "
            f"slowest {slowest * 1000:.0f} ms"
        )
        if failed:
            first = min(r.started for r in failed) - since
            last = max(r.ended for r in failed) - since
            slowest_failure = max(r.duration for r in failed)
            text += (
                f", failures from {first:+.2f}s to {last:+.2f}s "
                f"(slowest {slowest_failure * 1000:.0f} ms)"
            )
        return text


# --------------------------------------------------------------------------- workers


def probe_workers(
    port: int,
    path: str,
    workers: int,
    *,
    until: Any = None,
    timeout: float = 15.0,
    query: str = "",
) -> dict[int, dict[str, Any]]:
    """``/status``-like answers from ``workers`` distinct processes, each satisfying ``until``.

    Probes go out concurrently and hold their worker for a moment (``?hold=``), so a sync
    server must hand them to different workers; repeated (bounded) until every worker answered.
    """
    seen: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=workers * 2) as executor:
        while True:
            answers = executor.map(
                lambda _: get(port, f"{path}?hold=0.3{query}"), range(workers * 2)
            )
            for status, body in answers:
                if status == 200 and (until is None or until(body)):
                    seen[int(body["pid"])] = body
            if len(seen) >= workers:
                return seen
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(seen)} of {workers} workers answered {path} as wanted "
                    f"within {timeout}s: {sorted(seen)}"
                )
            time.sleep(0.1)


def all_listeners_connected(body: dict[str, Any]) -> bool:
    listeners = body.get("listeners") or {}
    return bool(body.get("started")) and bool(listeners) and all(listeners.values())


# --------------------------------------------------------------------------- sentinel side


def pubsub_clients(cluster: LocalSentinelCluster) -> dict[str, list[dict[str, Any]]]:
    """Per sentinel (``host:port``), its clients in pub/sub mode, from ``CLIENT LIST``.

    The sentinels themselves subscribe only on the data nodes, never to each other, so every
    pub/sub client of a sentinel is an application listener.
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for index, (host, port) in enumerate(cluster.sentinel_addresses):
        client = cluster.sentinel_client(index)
        try:
            entries = client.client_list()
        finally:
            client.close()
        found[f"{host}:{port}"] = [entry for entry in entries if _is_pubsub(entry)]
    return found


def _is_pubsub(entry: dict[str, Any]) -> bool:
    counts = (int(entry.get(name, 0) or 0) for name in ("sub", "psub", "ssub"))
    return any(c > 0 for c in counts) or entry.get("cmd") in ("subscribe", "psubscribe")


def socket_holders(pids: Iterable[int]) -> dict[tuple[int, int], set[int]]:
    """(local TCP port, remote TCP port) -> the pids holding that socket (from ``/proc``).

    ``CLIENT LIST`` gives the client's address; this says which processes hold it, so a test
    can tell a worker's listener from the arbiter's. A forked worker inherits its parent's
    descriptors, so one socket can be held by several processes. Keyed by both ports: Linux
    gives the same ephemeral local port to connections to different servers (one process's
    socket to a data node and another's to a sentinel once shared a local port here, and the
    sentinel's client was counted as the wrong process's).
    """
    holders: dict[tuple[int, int], set[int]] = {}
    for pid in pids:
        inodes = set()
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
        table = _read(f"/proc/{pid}/net/tcp") or ""
        for line in table.splitlines()[1:]:
            columns = line.split()
            if len(columns) > 9 and columns[9] in inodes:
                ports = (_port_of(columns[1]), _port_of(columns[2]))
                holders.setdefault(ports, set()).add(pid)
    return holders


def _port_of(hex_address: str) -> int:
    return int(hex_address.rpartition(":")[2], 16)


def held_by(holders: dict[tuple[int, int], set[int]], entry: dict[str, Any]) -> set[int]:
    """The pids holding the socket of one ``CLIENT LIST`` entry (its ``addr`` is the client's
    end, its ``laddr`` the server's)."""
    ports = (
        int(str(entry["addr"]).rpartition(":")[2]),
        int(str(entry["laddr"]).rpartition(":")[2]),
    )
    return holders.get(ports, set())


def listener_owners(
    cluster: LocalSentinelCluster, parent: int, pids: Sequence[int]
) -> dict[str, dict[int | None, int]]:
    """Per sentinel, how many pub/sub connections each process owns (None: none of ``pids``).

    A socket the ``parent`` holds is the parent's (its workers only inherited it); otherwise
    the one process holding it owns it.
    """
    # The sentinels' client lists first, then the sockets: a connection a sentinel lists was
    # open before /proc is read (read the other way round, a listener that reconnected in
    # between has a socket /proc never showed, and no owner).
    clients = pubsub_clients(cluster)
    holders = socket_holders(pids)
    counted: dict[str, dict[int | None, int]] = {}
    for sentinel, entries in clients.items():
        per_pid: dict[int | None, int] = {}
        for entry in entries:
            held = held_by(holders, entry)
            owner = parent if parent in held else min(held) if len(held) == 1 else None
            per_pid[owner] = per_pid.get(owner, 0) + 1
        counted[sentinel] = per_pid
    return counted


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None
