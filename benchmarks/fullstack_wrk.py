"""The load generator of the full-stack benchmark: ``wrk``, found or installed, run bounded in
time, and its text output (with ``--latency``) parsed into figures.

wrk prints times with a unit (``us``, ``ms``, ``s``, ``m``, ``h``), counts with an optional
``k``/``M``/``G`` suffix, ``Socket errors: connect N, read N, write N, timeout N`` only when
there were some and ``Non-2xx or 3xx responses: N`` only when there were some; both are errors
here (a 500 is the app's answer to a cache error).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

INSTALL_HINT = (
    "wrk is not installed and could not be installed: install the Debian package "
    "(`apt-get install -y wrk`, as root) or put a wrk binary on PATH, then run again"
)
_TIME_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}  # -> milliseconds
_COUNT_UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}
_TIME = r"([0-9.]+)(us|ms|s|m|h)"
_LATENCY_LINE = re.compile(rf"^\s*(50|75|90|99)%\s+{_TIME}\s*$", re.MULTILINE)
_REQUESTS = re.compile(r"^\s*([0-9.]+)([kMG]?) requests in ([0-9.]+)(us|ms|s|m|h)", re.MULTILINE)
_RATE = re.compile(r"^Requests/sec:\s+([0-9.]+)([kMG]?)\s*$", re.MULTILINE)
_SOCKET = re.compile(
    r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", re.MULTILINE
)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")


class WrkError(RuntimeError):
    """wrk is missing, failed, or printed something this parser does not understand."""


def ms(value: str, unit: str) -> float:
    """A wrk time (``"442.35"``, ``"ms"``) in milliseconds."""
    return float(value) * _TIME_UNITS[unit]


def parse(text: str) -> dict[str, Any]:
    """Figures of one wrk run: requests, seconds, req/s, p50/p75/p90/p99 (ms), socket errors
    by kind, non-2xx answers, and ``errors`` (their sum). Raises ``WrkError`` naming what is
    missing when the text is not a complete ``wrk --latency`` report."""
    percentiles = {f"p{p}_ms": ms(v, u) for p, v, u in _LATENCY_LINE.findall(text)}
    requests, rate = _REQUESTS.search(text), _RATE.search(text)
    missing = [
        name
        for name, found in (
            ("the latency distribution (run wrk with --latency)", len(percentiles) == 4),
            ("'N requests in T'", requests),
            ("'Requests/sec:'", rate),
        )
        if not found
    ]
    if missing:
        raise WrkError(f"wrk output lacks {', '.join(missing)}:\n{text.strip()[:2000]}")
    assert requests is not None and rate is not None
    sockets = _SOCKET.search(text)
    socket_errors = dict(
        zip(("connect", "read", "write", "timeout"), map(int, sockets.groups()), strict=True)
        if sockets
        else {"connect": 0, "read": 0, "write": 0, "timeout": 0}
    )
    non_2xx = int(m[1]) if (m := _NON_2XX.search(text)) else 0
    return {
        "requests": int(float(requests[1]) * _COUNT_UNITS[requests[2]]),
        "seconds": ms(requests[3], requests[4]) / 1000,
        "req_per_s": float(rate[1]) * _COUNT_UNITS[rate[2]],
        **percentiles,
        "socket_errors": socket_errors,
        "non_2xx": non_2xx,
        "errors": non_2xx + sum(socket_errors.values()),
    }


def whole_seconds(name: str, value: float, *, zero: bool = False) -> int:
    """``value`` as wrk's ``-d`` takes it: a whole number of seconds, at least 1 (``zero``: or
    0, "no run"); else a ``ValueError`` naming ``name`` and the value (wrk would refuse
    ``-d0.5s`` only once the servers were up)."""
    if not math.isfinite(value) or value != int(value) or value < (0 if zero else 1):
        least = "0" if zero else "1"
        raise ValueError(f"{name} must be a whole number of seconds, {least} or more: {value!r}")
    return int(value)


def command(url: str, *, connections: int, seconds: float, threads: int = 2) -> list[str]:
    """A time-bounded wrk run (a request slower than 10 s is a timeout, counted as an error)."""
    whole = whole_seconds("seconds", seconds)
    return [
        "wrk", f"-t{min(threads, connections)}", f"-c{connections}", f"-d{whole}s",
        "--timeout", "10s", "--latency", url,
    ]  # fmt: skip


def run(
    url: str, *, connections: int, seconds: float, threads: int = 2, cpus: str | None = None
) -> dict[str, Any]:
    """One wrk run's figures; ``cpus``: the CPUs wrk may run on (``taskset -c``), else any."""
    argv = command(url, connections=connections, seconds=seconds, threads=threads)
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise WrkError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[:500]}")
    return {**parse(done.stdout), "command": " ".join(argv)}


def ensure(log: Callable[[str], None]) -> str:
    """The path of wrk; installs the Debian package when it is missing and apt-get can."""
    found = shutil.which("wrk")
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt:
        log("wrk is missing: apt-get install -y wrk")
        for argv in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", "wrk"]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise WrkError(f"{INSTALL_HINT} ({' '.join(argv)}: {done.stderr.strip()[-500:]})")
        found = shutil.which("wrk")
        if found:
            return found
    raise WrkError(INSTALL_HINT)
