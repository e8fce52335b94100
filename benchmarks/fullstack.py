"""The full-stack benchmark (issue 37, item 4): Django served by real application servers under
a real load generator, every contender side by side.

A tiny Django app (``benchmarks/fullstack_app``) does 6 cache operations per request (get,
get_many of 3, set, set of a 4 KB value, incr, get of a 4 KB value) in an async view under
uvicorn (1 worker) and in a sync view under gunicorn (sync workers; gthread, 1 worker x 8
threads). ``wrk`` (installed by the setup if missing) loads it for a fixed time at 100 and 300
connections. Per contender x server x connections: req/s, p50, p99, errors (non-2xx + socket
errors), the connections the app holds on every data node (``CLIENT LIST`` sampled during the
run) and the peak RSS of the server's processes (``/proc``).

One topology for everyone: 4 masters, no replica, 1 sentinel (``LocalSentinelCluster``). Its
first master is *the* plain server: the peers connect to it directly, ours on 1 shard reaches
the same server through the sentinel (``MASTERS`` = that master), ours on 4 shards spreads over
the 4 masters. Rounds are interleaved: every round runs every contender x server pair in a new
random order (and the two connection counts in a random order), each on a fresh server
process; the tables give medians and the rounds' spread, and the targets of issue 37 are
PASS/FAIL lines (ratios of the medians of this run).

``python -m benchmarks.fullstack --seconds N --rounds R`` runs it alone; ``make bench`` runs it
as a section (``--skip-fullstack`` leaves it out).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import fullstack_env, fullstack_wrk, plots
from benchmarks.fullstack_app.caches import BY_ID, CONTENDERS
from benchmarks.measure import pin_threads

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
CONNECTIONS = (100, 300)
SAMPLE_EVERY = 0.25  # seconds between CLIENT LIST / RSS samples
START_TIMEOUT = 60.0
DRAIN_TIMEOUT = 60.0  # seconds a server may take to finish the requests of a run that ended
OURS, VCACHE, DJANGO_REDIS, REDIS_CACHE, FLOOR = (
    "ours_1",
    "django_vcache",
    "dr_default",
    "django_redis_cache",
    "floor_1",
)
CONNECTIONS_PER_SHARD = 2  # the target: per shard per uvicorn worker
CHART = "bench-fullstack.svg"


@dataclass(frozen=True)
class Server:
    """An application server shape: its id, the API it serves, the path wrk loads, its argv
    after ``python -m``, and how many processes serve requests (for the connection target)."""

    id: str
    api: str
    path: str
    argv: tuple[str, ...]
    workers: int


def servers(sync_workers: int = 2) -> tuple[Server, ...]:
    log = ("--log-level", "warning")
    gunicorn = ("gunicorn", "benchmarks.fullstack_app.wsgi:application", "--timeout", "60", *log)
    return (
        Server(
            "uvicorn", "asgi", "/amix",
            ("uvicorn", "benchmarks.fullstack_app.asgi:application", "--workers", "1",
             "--loop", "asyncio", "--http", "h11", "--no-access-log", *log),
            1,
        ),
        Server("gunicorn-sync", "wsgi", "/mix",
               (*gunicorn, "-k", "sync", "-w", str(sync_workers)), sync_workers),
        Server("gunicorn-gthread", "wsgi", "/mix",
               (*gunicorn, "-k", "gthread", "-w", "1", "--threads", "8"), 1),
    )  # fmt: skip


SERVER_LABELS = {
    "uvicorn": "ASGI, uvicorn 1 worker",
    "gunicorn-sync": "WSGI, gunicorn sync workers",
    "gunicorn-gthread": "WSGI, gunicorn gthread 1 worker x 8 threads",
}


# --------------------------------------------------------------------------- connections


def app_clients(entries: Iterable[Mapping[str, Any]], exclude_ids: Iterable[int]) -> int:
    """How many of a data node's ``CLIENT LIST`` entries are the app's: not the sampler's own
    connection nor one open before the app server started (``exclude_ids``), not a sentinel's
    (named ``sentinel-...``), not a replication link (flags ``S`` or ``M``)."""
    excluded = {int(i) for i in exclude_ids}
    count = 0
    for entry in entries:
        flags = str(entry.get("flags", ""))
        if int(entry.get("id", -1)) in excluded:
            continue
        if str(entry.get("name", "") or "").startswith("sentinel-"):
            continue
        if "S" in flags or "M" in flags:
            continue
        count += 1
    return count


class NodeSampler:
    """Samples, every ``SAMPLE_EVERY`` s in a thread, the app's connections on every data node
    and the RSS of the server's process group; ``peaks()`` after ``stop()``."""

    def __init__(
        self, nodes: Sequence[tuple[str, int]], group: int, baseline: Sequence[set[int]]
    ) -> None:
        import redis

        self.nodes = [f"{h}:{p}" for h, p in nodes]
        self.clients = [redis.Redis(host=h, port=p, socket_timeout=2.0) for h, p in nodes]
        self.group = group
        self.baseline = list(baseline)  # each node's clients before the app server started
        self.samples: list[dict[str, Any]] = []
        self.failure: BaseException | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fullstack-sampler", daemon=True)

    def __repr__(self) -> str:
        return (
            f"<NodeSampler group={self.group} nodes={self.nodes} samples={len(self.samples)}"
            f"{' failed' if self.failure else ''}>"
        )

    def start(self) -> NodeSampler:
        self._thread.start()
        return self

    def sample(self) -> dict[str, Any]:
        per_node = {}
        for name, client, seen in zip(self.nodes, self.clients, self.baseline, strict=True):
            per_node[name] = app_clients(client.client_list(), seen | {client.client_id()})
        return {"per_node": per_node, "rss_kb": group_rss_kb(self.group)}

    def _loop(self) -> None:
        try:
            while not self._halt.is_set():
                self.samples.append(self.sample())
                self._halt.wait(SAMPLE_EVERY)
        except BaseException as exc:  # reported by stop(): a sampler that died measured nothing
            self.failure = exc

    def stop(self) -> dict[str, Any]:
        self._halt.set()
        self._thread.join(10)
        for client in self.clients:
            client.close()
        if self._thread.is_alive():
            raise RuntimeError("the connection sampler did not stop within 10 s")
        if self.failure is not None:
            raise RuntimeError(f"the connection sampler failed: {self.failure!r}")
        return peaks(self.samples)


def client_ids(nodes: Sequence[tuple[str, int]]) -> list[set[int]]:
    """Each node's client ids right now (taken before an app server starts: not the app's)."""
    import redis

    found = []
    for host, port in nodes:
        client = redis.Redis(host=host, port=port, socket_timeout=2.0)
        try:
            found.append({int(e["id"]) for e in client.client_list()})
        finally:
            client.close()
    return found


def peaks(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's peaks: total app connections (summed over nodes in one sample), the most on
    any one node, per node, and the server processes' RSS (MB)."""
    if not samples:
        return {"connections": None, "max_per_node": None, "per_node": {}, "rss_mb": None}
    per_node: dict[str, int] = {}
    for s in samples:
        for node, n in s["per_node"].items():
            per_node[node] = max(per_node.get(node, 0), n)
    return {
        "connections": max(sum(s["per_node"].values()) for s in samples),
        "max_per_node": max(per_node.values()) if per_node else 0,
        "per_node": per_node,
        "rss_mb": max(s["rss_kb"] for s in samples) / 1024,
        "samples": len(samples),
    }


# --------------------------------------------------------------------------- processes


def group_pids(group: int) -> list[int]:
    """Live processes of a process group (a server and the workers it forked)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry))
    return found


def group_rss_kb(group: int) -> int:
    total = 0
    for pid in group_pids(group):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def group_cpu_ticks(group: int) -> int:
    """User + system CPU ticks of a process group's live processes so far."""
    total = 0
    for pid in group_pids(group):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
    return total


def wait_idle(group: int, *, timeout: float = DRAIN_TIMEOUT, window: float = 0.2) -> float:
    """Wait until the server's processes are idle (under 5 % of a CPU over ``window``): wrk
    closes its connections at the end of a run, but the server still works through the
    requests it had accepted, and that backlog must not run into the next measured run.
    Returns the seconds waited; raises ``TimeoutError`` past ``timeout``."""
    began = time.monotonic()
    hz = os.sysconf("SC_CLK_TCK")
    before = group_cpu_ticks(group)
    while True:
        time.sleep(window)
        after = group_cpu_ticks(group)
        if (after - before) / hz < 0.05 * window:
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"the server was still busy {timeout:g} s after the load stopped")
        before = after


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def http_get(port: int, path: str, timeout: float = 30.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


class AppServer:
    """One application server in its own process group (one killpg stops every worker)."""

    def __init__(
        self, python: str, server: Server, env: dict[str, str], log: Path, cpus: str | None = None
    ) -> None:
        self.argv = [python, "-m", *server.argv]
        if cpus is not None:  # every process of the server on these CPUs (its workers inherit)
            self.argv = ["taskset", "-c", cpus, *self.argv]
        self.server = server
        self.env = env
        self.log = log
        self.port = free_port()
        self.popen: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        pid = None if self.popen is None else self.popen.pid
        return f"<AppServer {self.server.id} port={self.port} pid={pid}>"

    def __enter__(self) -> AppServer:
        bind = ["--host", HOST, "--port", str(self.port)]
        if self.server.argv[0] == "gunicorn":
            bind = ["-b", f"{HOST}:{self.port}"]
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                [*self.argv, *bind], cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{' '.join(self.argv)} exited: {self.tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if http_get(self.port, "/health", timeout=1.0)[0] == 200:
                    return self
            if time.monotonic() > deadline:
                self.__exit__()
                raise TimeoutError(
                    f"{self.server.id} not up within {START_TIMEOUT:g} s: {self.tail()}"
                )
            time.sleep(0.1)

    @property
    def group(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def __exit__(self, *exc: object) -> None:
        if self.popen is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if self.popen.poll() is not None and not group_pids(self.popen.pid):
                    return
                time.sleep(0.05)

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "<no log>"

    def errors_logged(self) -> list[str]:
        """The app's error lines so far (each process logs its first few)."""
        with contextlib.suppress(OSError):
            text = self.log.read_text(errors="replace")
            return [line[16:] for line in text.splitlines() if line.startswith("FULLSTACK-ERROR ")]
        return []


# --------------------------------------------------------------------------- setup


def setup(
    ids: Sequence[str], *, same_python: bool, log: Callable[[str], None]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Where each contender runs ({id: python, python_version, package version}) and the
    missing ones with the reason (pip's error, no Python 3.12)."""
    ready: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    py312: str | None = None
    py312_error: str | None = None
    for cid in ids:
        spec = BY_ID[cid]
        python = fullstack_env.this_python()
        try:
            if spec.py312 or same_python:
                if py312 is None and py312_error is None:
                    try:
                        py312 = fullstack_env.py312(log)
                    except fullstack_env.EnvError as exc:
                        py312_error = str(exc)
                if py312 is None:
                    raise fullstack_env.EnvError(py312_error or "no 3.12 virtualenv")
                python = py312
            version = (
                fullstack_env.install(python, spec.package, log)
                if spec.package
                else fullstack_env.package_version(python, spec.reported)
            )
        except fullstack_env.EnvError as exc:
            missing[cid] = str(exc)
            log(f"{spec.label} is missing: {exc}")
            continue
        ready[cid] = {
            "python": python,
            "python_version": fullstack_env.python_version(python),
            "version": version,
        }
    return ready, missing


# --------------------------------------------------------------------------- the run


def pinned_cpus() -> tuple[set[int], set[int]]:
    """(the application server's CPUs, the load's: wrk and the data nodes): the server alone
    on the first CPU this process may use, everything else on the rest, as a deployment with
    one worker per core has it. Its throughput is then bounded by its own CPU per request, not
    by where the scheduler put it next to wrk and the data nodes (which does not make a shared
    machine quiet: see docs/benchmarks.md)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise ValueError(f"--pin needs 2 CPUs at least, this process may use {allowed}")
    return {allowed[0]}, set(allowed[1:])


def _list(cpus: Iterable[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def run(
    *,
    rounds: int = 3,
    seconds: float = 10.0,
    warmup: float = 2.0,
    connections: Sequence[int] = CONNECTIONS,
    only: Sequence[str] | None = None,
    server_ids: Sequence[str] | None = None,
    sync_workers: int = 2,
    same_python: bool = False,
    pin: bool = False,
    seed: int = 37,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every round, every ready contender x server in a new random order; returns the settings,
    where each contender ran, the missing ones, and per cell the rounds' figures. ``pin``: the
    application server alone on one CPU, wrk and the data nodes on the others
    (:func:`pinned_cpus`)."""
    from sentinel_cache.testing import LocalSentinelCluster

    fullstack_wrk.ensure(progress)
    ids = [c.id for c in CONTENDERS if not only or c.id in only]
    ready, missing = setup(ids, same_python=same_python, log=progress)
    shapes = [s for s in servers(sync_workers) if not server_ids or s.id in server_ids]
    rng = random.Random(seed)
    cells: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    failures: dict[str, str] = {}
    data: dict[str, Any] = {
        "settings": {
            "rounds": rounds, "seconds": seconds, "warmup_s": warmup,
            "connections": list(connections), "sync_workers": sync_workers,
            "same_python": same_python, "pinned": None, "seed": seed,
            "servers": {s.id: " ".join(s.argv) for s in shapes},
        },
        "contenders": ready, "missing": missing, "cells": cells, "failures": failures,
    }  # fmt: skip
    progress("starting the topology: 4 masters, no replica, 1 sentinel")
    with LocalSentinelCluster(shards=4, replicas=0, sentinels=1) as cluster, \
            tempfile.TemporaryDirectory(prefix="bench-fullstack-") as tmp:  # fmt: skip
        cpus = pinned_cpus() if pin else None
        if cpus is not None:
            pin_threads(cluster.pids, cpus[1])
            data["settings"]["pinned"] = {
                "server": sorted(cpus[0]),
                "wrk and data nodes": sorted(cpus[1]),
            }
        masters = list(cluster.master_names)
        nodes: list[tuple[str, int]] = []
        for m in masters:
            host, port = cluster.master_address(m)
            nodes.append((str(host), int(port)))
        plain = "{}:{}".format(*nodes[0])
        data["topology"] = {
            "server": f"{cluster.server_kind} {cluster.server_version}",
            "plain_server": plain,
            "masters": dict(zip(masters, ["{}:{}".format(*n) for n in nodes], strict=True)),
        }
        base_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
            ),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "benchmarks.fullstack_app.settings",
            "FULLSTACK_SENTINELS": ",".join(f"{h}:{p}" for h, p in cluster.sentinel_addresses),
            "FULLSTACK_MASTERS": ",".join(masters),
            "FULLSTACK_REDIS": plain,
        }
        for r in range(rounds):
            pairs = [(cid, s) for cid in ready for s in shapes]
            rng.shuffle(pairs)
            for n, (cid, shape) in enumerate(pairs, 1):
                progress(f"round {r + 1}/{rounds}, {n}/{len(pairs)}: {cid} on {shape.id}")
                env = {**base_env, "FULLSTACK_CONTENDER": cid, "FULLSTACK_API": shape.api}
                log_path = Path(tmp) / f"{cid}-{shape.id}-{r}.log"
                try:
                    results = _one_server(
                        ready[cid]["python"], shape, env, log_path, nodes=nodes,
                        connections=rng.sample(list(connections), len(connections)),
                        seconds=seconds, warmup=warmup, cpus=cpus,
                    )  # fmt: skip
                except Exception as exc:  # one broken contender must not stop the others
                    failures[f"{cid}/{shape.id}"] = f"{type(exc).__name__}: {exc}"[:1500]
                    progress(f"{cid} on {shape.id} failed: {exc}")
                    continue
                for conns, figures in results.items():
                    cells.setdefault(cid, {}).setdefault(shape.id, {}).setdefault(
                        str(conns), []
                    ).append(figures)
    data["summary"] = summarize(cells)
    return data


def _one_server(
    python: str,
    shape: Server,
    env: dict[str, str],
    log_path: Path,
    *,
    nodes: Sequence[tuple[str, int]],
    connections: Sequence[int],
    seconds: float,
    warmup: float,
    cpus: tuple[set[int], set[int]] | None = None,
) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    baseline = client_ids(nodes)  # before the server starts
    server_cpus, load_cpus = (None, None) if cpus is None else (_list(cpus[0]), _list(cpus[1]))
    with AppServer(python, shape, env, log_path, server_cpus) as app:
        status, body = http_get(app.port, "/afill" if shape.api == "asgi" else "/fill")
        if status != 200:
            raise RuntimeError(f"filling the keyspace answered {status}: {body[:500]}")
        url = f"http://{HOST}:{app.port}{shape.path}"
        for conns in connections:
            if warmup > 0:
                fullstack_wrk.run(url, connections=conns, seconds=warmup, cpus=load_cpus)
            drained = wait_idle(app.group)  # the warm-up's (or the last run's) backlog
            sampler = NodeSampler(nodes, app.group, baseline).start()
            ticks = group_cpu_ticks(app.group)
            try:
                figures = fullstack_wrk.run(url, connections=conns, seconds=seconds, cpus=load_cpus)
            finally:
                ticks = group_cpu_ticks(app.group) - ticks
                held = sampler.stop()
            figures["server"] = held
            # The server's CPU while wrk ran, per request answered: what a backend costs per
            # request, less noisy than req/s (another process on the machine slows the server
            # without charging its CPU). The requests still queued when wrk stops are not
            # counted, the work begun on them is: a small overestimate, alike for everyone.
            if figures["requests"]:
                figures["cpu_ms_per_request"] = (
                    ticks / os.sysconf("SC_CLK_TCK") * 1000 / figures["requests"]
                )
            figures["drained_before_s"] = round(drained, 2)
            if figures["non_2xx"]:  # what the server's processes answered 500 with so far
                figures["first_errors"] = sorted(set(app.errors_logged()))
            out[conns] = figures
            wait_idle(app.group)
    return out


# --------------------------------------------------------------------------- figures


def summarize(cells: Mapping[str, Any]) -> dict[str, Any]:
    """Per contender / server / connections: medians of the rounds and the req/s spread."""
    summary: dict[str, Any] = {}
    for cid, per_server in cells.items():
        for sid, per_conns in per_server.items():
            for conns, rounds in per_conns.items():
                rates = [r["req_per_s"] for r in rounds]
                conn_peaks = [
                    r["server"]["connections"]
                    for r in rounds
                    if r["server"]["connections"] is not None
                ]
                node_peaks = [
                    r["server"]["max_per_node"]
                    for r in rounds
                    if r["server"]["max_per_node"] is not None
                ]
                rss = [r["server"]["rss_mb"] for r in rounds if r["server"]["rss_mb"] is not None]
                cpu = [r["cpu_ms_per_request"] for r in rounds if r.get("cpu_ms_per_request")]
                summary.setdefault(cid, {}).setdefault(sid, {})[conns] = {
                    "rounds": len(rounds),
                    "req_per_s": statistics.median(rates),
                    "req_per_s_min": min(rates),
                    "req_per_s_max": max(rates),
                    "p50_ms": statistics.median(r["p50_ms"] for r in rounds),
                    "p99_ms": statistics.median(r["p99_ms"] for r in rounds),
                    "errors": statistics.median(r["errors"] for r in rounds),
                    "errors_total": sum(r["errors"] for r in rounds),
                    "requests": statistics.median(r["requests"] for r in rounds),
                    # Connections: the most any round held (a peak, not a typical value).
                    "connections": max(conn_peaks) if conn_peaks else None,
                    "max_per_node": max(node_peaks) if node_peaks else None,
                    "rss_mb": statistics.median(rss) if rss else None,
                    "cpu_ms_per_request": statistics.median(cpu) if cpu else None,
                }
    return summary


def _cell(summary: Mapping[str, Any], cid: str, sid: str, conns: int) -> dict[str, Any] | None:
    cell: dict[str, Any] | None = summary.get(cid, {}).get(sid, {}).get(str(conns))
    return cell


def ratio(
    summary: Mapping[str, Any], cid: str, ref: str, sid: str, conns: int, key: str = "req_per_s"
) -> float | None:
    a, b = _cell(summary, cid, sid, conns), _cell(summary, ref, sid, conns)
    if a is None or b is None or not b[key]:
        return None
    return float(a[key]) / float(b[key])


def targets(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Issue 37's full-stack targets as PASS/FAIL lines (N/A names what was not measured)."""
    summary = data.get("summary", {})
    missing = data.get("missing", {})
    conns_list = data.get("settings", {}).get("connections", list(CONNECTIONS))
    out: list[dict[str, Any]] = []

    def why_not(*cids: str) -> str:
        absent = [c for c in cids if c in missing or c not in summary]
        if not absent:
            return "a reference completed no request within the run (0 req/s)"
        return (
            "; ".join(
                f"{BY_ID[c].label} "
                + (f"missing ({missing[c][:200]})" if c in missing else "not measured")
                for c in absent
            )
            or "not measured"
        )

    def add(
        target: str, value: float | None, bound: float, higher: bool, detail: str, *cids: str
    ) -> None:
        if value is None:
            out.append({"target": target, "result": "N/A", "detail": why_not(*cids)})
            return
        ok = value >= bound if higher else value <= bound
        out.append({"target": target, "result": "PASS" if ok else "FAIL", "detail": detail})

    for conns in conns_list:
        sid = "uvicorn"
        label = f"full stack, ASGI (uvicorn 1 worker), {conns} connections"
        ours = _cell(summary, OURS, sid, conns)
        x = ratio(summary, OURS, VCACHE, sid, conns)
        vc = _cell(summary, VCACHE, sid, conns)
        add(f"{label}: ours (1 shard) req/s >= 1.0x django-vcache", x, 1.0, True,
            f"{x:.2f}x ({ours['req_per_s']:,.0f} vs {vc['req_per_s']:,.0f} req/s)" if x and ours and vc else "",
            OURS, VCACHE)  # fmt: skip
        p = ratio(summary, OURS, VCACHE, sid, conns, "p99_ms")
        add(f"{label}: ours p99 <= django-vcache's p99", p, 1.0, False,
            f"{ours['p99_ms']:.0f} vs {vc['p99_ms']:.0f} ms" if p and ours and vc else "", OURS, VCACHE)  # fmt: skip
        for ref in (DJANGO_REDIS, REDIS_CACHE):
            xr = ratio(summary, OURS, ref, sid, conns)
            rc = _cell(summary, ref, sid, conns)
            add(f"{label}: ours req/s >= 2x {BY_ID[ref].label}", xr, 2.0, True,
                f"{xr:.2f}x ({ours['req_per_s']:,.0f} vs {rc['req_per_s']:,.0f} req/s)" if xr and ours and rc else "",
                OURS, ref)  # fmt: skip
        for cid, shards in ((OURS, 1), ("ours_4", 4)):
            cell = _cell(summary, cid, sid, conns)
            held = None if cell is None else cell["max_per_node"]
            add(f"{label}: {BY_ID[cid].label} holds <= {CONNECTIONS_PER_SHARD} connections per shard per uvicorn worker",
                held, CONNECTIONS_PER_SHARD, False,
                f"at most {held} on a shard ({cell['connections']} on {shards} shard{'s' if shards > 1 else ''})" if cell else "",
                cid)  # fmt: skip
    for sid in ("gunicorn-sync", "gunicorn-gthread"):
        for conns in conns_list:
            label = f"full stack, {SERVER_LABELS[sid]}, {conns} connections"
            others = [
                c.id for c in CONTENDERS if c.id not in (OURS, "ours_4") and not c.reference
            ]
            measured = {c: ratio(summary, OURS, c, sid, conns) for c in others}
            present = {c: v for c, v in measured.items() if v is not None}
            worst = min(present, key=lambda c: present[c]) if present else None
            unmeasured = [c for c in others if measured[c] is None]
            detail = ""
            if worst is not None:
                detail = f"lowest ratio {present[worst]:.2f}x ({BY_ID[worst].label})"
                if unmeasured:
                    detail += "; not measured: " + ", ".join(BY_ID[c].label for c in unmeasured)
            add(f"{label}: ours (1 shard) req/s >= 1.0x every contender",
                present[worst] if worst else None, 1.0, True, detail, OURS, *others)  # fmt: skip
    return out


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def tables(data: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """One table per server: (note, header, rows), rows contender x connections."""
    summary = data.get("summary", {})
    ready = data.get("contenders", {})
    out = []
    header = [
        "contender", "Python", "conns", "req/s (median)", "rounds min-max", "p50 ms", "p99 ms",
        "errors", "server CPU ms/request", "server conns (most on a node)", "peak RSS MB",
        "x django-vcache",
        "x django-redis", "x RedisCache",
    ]  # fmt: skip
    settings = data.get("settings", {})
    for sid, label in SERVER_LABELS.items():
        rows = []
        for spec in CONTENDERS:
            for conns in settings.get("connections", CONNECTIONS):
                cell = _cell(summary, spec.id, sid, conns)
                if cell is None:
                    continue

                rows.append([
                    spec.label, ready.get(spec.id, {}).get("python_version", "?"), str(conns),
                    f"{cell['req_per_s']:,.0f}",
                    f"{cell['req_per_s_min']:,.0f}-{cell['req_per_s_max']:,.0f}",
                    f"{cell['p50_ms']:.0f}", f"{cell['p99_ms']:.0f}", f"{cell['errors']:g}",
                    "-" if not cell.get("cpu_ms_per_request") else f"{cell['cpu_ms_per_request']:.2f}",
                    "-" if cell["connections"] is None else f"{cell['connections']} ({cell['max_per_node']})",
                    "-" if cell["rss_mb"] is None else f"{cell['rss_mb']:.0f}",
                    *(_x(ratio(summary, spec.id, ref, sid, conns))
                      for ref in (VCACHE, DJANGO_REDIS, REDIS_CACHE)),
                ])  # fmt: skip
        if not rows:
            continue
        note = (
            f"{label}: {settings.get('rounds')} interleaved rounds of {settings.get('seconds'):g} s "
            f"per connection count (wrk --latency, after a {settings.get('warmup_s'):g} s warm-up); "
            "medians of the rounds, req/s spread min-max; errors = non-2xx + socket errors "
            "(median per round); server connections: the most the app held on all data nodes "
            "at one sample (and on one node), CLIENT LIST every 0.25 s; RSS: the server's "
            "processes summed, peak of the samples; server CPU: the server's processes' CPU "
            "time while wrk ran, per request answered (median of the rounds)."
        )
        pinned = settings.get("pinned")
        if pinned:
            note += (
                f" Pinned: the app server alone on CPU {_list(pinned['server'])}, wrk and the "
                f"data nodes on CPU {_list(pinned['wrk and data nodes'])}."
            )
        out.append((note, header, rows))
    return out


def notes(data: Mapping[str, Any]) -> list[str]:
    """Where each contender ran, what was missing or failed: lines for the report."""
    lines = []
    topo = data.get("topology", {})
    if topo:
        lines.append(
            f"Topology: {topo['server']}, 4 masters, no replica, 1 sentinel; the plain server "
            f"(the peers' LOCATION, and ours on 1 shard through the sentinel) is {topo['plain_server']}."
        )
    for cid, where in data.get("contenders", {}).items():
        lines.append(
            f"{BY_ID[cid].label} {where['version']} on Python {where['python_version']}: {BY_ID[cid].note}."
        )
    for cid, why in data.get("missing", {}).items():
        lines.append(f"{BY_ID[cid].label} missing: {why}")
    summary = data.get("summary", {})
    against = [
        f"{sid} x{conns}: {x:.2f}x"
        for sid in SERVER_LABELS
        for conns in data.get("settings", {}).get("connections", CONNECTIONS)
        if (x := ratio(summary, OURS, FLOOR, sid, conns)) is not None
    ]
    if against:
        lines.append(
            f"{BY_ID[OURS].label} over the {BY_ID[FLOOR].label}, req/s (the cost of ours' "
            f"rules and layers in the whole request): {'; '.join(against)}."
        )
    for what, why in data.get("failures", {}).items():
        lines.append(f"{what} failed in a round: {why}")
    for cid, per_server in data.get("cells", {}).items():
        for sid, per_conns in per_server.items():
            for conns, rounds in per_conns.items():
                short = [r["requests"] for r in rounds if r["requests"] < int(conns)]
                if short:
                    lines.append(
                        f"{BY_ID[cid].label} on {sid} at {conns} connections completed fewer "
                        f"requests than connections in {len(short)} of {len(rounds)} rounds "
                        f"({', '.join(map(str, short))}): each request waited about as long as "
                        "the run, so its figures say little; run longer (--seconds)."
                    )
            seen = sorted(
                {
                    e
                    for rounds in per_conns.values()
                    for r in rounds
                    for e in r.get("first_errors", ())
                }
            )
            if seen:
                lines.append(f"{BY_ID[cid].label} on {sid} answered 500: {'; '.join(seen[:3])}")
    return lines


def chart(data: Mapping[str, Any]) -> str | None:
    """req/s per contender, one group per server x connections (None without figures)."""
    summary = data.get("summary", {})
    conns_list = data.get("settings", {}).get("connections", CONNECTIONS)
    categories = [(sid, c) for sid in SERVER_LABELS for c in conns_list
                  if any(_cell(summary, cid, sid, c) for cid in summary)]  # fmt: skip
    if not categories:
        return None
    series = []
    for spec in CONTENDERS:
        if spec.id not in summary:
            continue
        values = []
        for sid, c in categories:
            cell = _cell(summary, spec.id, sid, c)
            values.append(None if cell is None else float(cell["req_per_s"]))
        series.append((spec.label, values))
    return plots.bar_chart(
        "Full stack: 6 cache operations per request (median req/s)",
        [f"{sid} x{c}" for sid, c in categories],
        series,
        unit="req/s",
    )


# --------------------------------------------------------------------------- alone


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fullstack", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="wrk run per cell (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="wrk warm-up per cell, not measured"
    )
    parser.add_argument(
        "--connections", type=int, action="append", help="repeatable (default 100, 300)"
    )
    parser.add_argument(
        "--only", action="append", choices=[c.id for c in CONTENDERS], help="repeatable"
    )
    parser.add_argument(
        "--server", action="append", choices=[s.id for s in servers()], help="repeatable"
    )
    parser.add_argument(
        "--sync-workers", type=int, default=2, help="gunicorn sync workers (default 2)"
    )
    parser.add_argument(
        "--same-python",
        action="store_true",
        help="run every contender from the 3.12 virtualenv (one Python for all)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the application server alone on one CPU, wrk and the data nodes on the others",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser


def main(argv: list[str] | None = None) -> int:
    from benchmarks.page import text_table

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        fullstack_wrk.whole_seconds("--seconds", args.seconds)
        fullstack_wrk.whole_seconds("--warmup", args.warmup, zero=True)
    except ValueError as exc:
        parser.error(str(exc))

    def log(message: str) -> None:
        print(f"[fullstack {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    data = run(
        rounds=args.rounds, seconds=args.seconds, warmup=args.warmup,
        connections=args.connections or CONNECTIONS, only=args.only, server_ids=args.server,
        sync_workers=args.sync_workers, same_python=args.same_python, pin=args.pin,
        progress=log,
    )  # fmt: skip
    for note, header, rows in tables(data):
        print(note)
        print(text_table(header, rows))
        print()
    for line in notes(data):
        print(line)
    for t in targets(data):
        print(f"{t['result']}: {t['target']} ({t['detail']})")
    if args.json:
        args.json.write_text(json.dumps(data, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
