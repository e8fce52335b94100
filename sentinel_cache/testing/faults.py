"""Real network faults for :class:`~sentinel_cache.testing.LocalSentinelCluster`: a userspace TCP
proxy in front of every node and sentinel, all run by ONE helper process.

Why a proxy: this machine (and CI) has no ``tc netem`` and no packet filter, but the whole of
127.0.0.0/8 is usable. Every server listens on its own loopback IP (``127.a.b.N``, same port) and
makes its outgoing connections from it (``bind-source-addr``); everybody else is given the
public address ``127.0.0.1:port``, where the proxy listens. A connection's source IP tells the
proxy who is talking (``127.0.0.1`` is "client": the test process), its listener tells to whom,
so a partition is a set of blocked (sender, receiver) pairs.

Why one separate process (asyncio, stdlib only): the proxies must not share the GIL with the test
process, whose timings they would otherwise distort, and must forward thousands of small
requests per second. The process is driven over its stdin/stdout with one JSON object per line
and exits when its stdin closes (its parent died). The helper's code is
:mod:`sentinel_cache.testing.fault_helper`; this module is the test process's side.

What a fault looks like to the endpoints:

- **blocked** (partition): no byte flows in the blocked direction; connections stay open (no RST,
  no FIN). Bytes sent meanwhile are kept in order and delivered on heal, like TCP retransmission
  after a partition heals; a FIN sent meanwhile is delivered after them. New connections are
  accepted (the kernel completes the handshake before the proxy can decide anything, and refusing
  would send an RST, which a partition never does), then go silent: a client waits its
  ``socket_timeout``, not its ``socket_connect_timeout``.
- **delay**/jitter: bytes *sent by* the target wait that long (egress, like netem on the target's
  interface), so a round trip with the target gets the delay once; order is kept.
- **loss**: a TCP stream cannot lose bytes, so a lost segment shows as a retransmission stall:
  that fraction of the chunks the target sends wait an extra ~200 ms (Linux's minimum RTO).
- **reset**: every open connection to or from the target is closed on both sides with an RST
  (``SO_LINGER`` 0); queued bytes are dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sentinel_cache.testing.fault_helper import CLIENT, EVERYONE, LOSS_STALL, Route

__all__ = ["CLIENT", "EVERYONE", "LOSS_STALL", "FaultProxy", "Route"]


class FaultProxy:
    """The test process's handle on the helper process (start, send the fault state, stop).

    Thread safe: one request at a time, each answered within ``timeout`` seconds.
    """

    def __init__(
        self,
        routes: Sequence[Route],
        sources: Mapping[str, str],
        *,
        log_path: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.routes = list(routes)
        self.sources = dict(sources)
        self.log_path = log_path
        self.timeout = timeout
        self.popen: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._buffer = b""

    def __repr__(self) -> str:
        pid = self.popen.pid if self.popen is not None else None
        state = "running" if self.alive else "stopped"
        return f"<FaultProxy {len(self.routes)} routes pid={pid} {state}>"

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def start(self, preexec_fn: Any = None) -> FaultProxy:
        """Spawn the helper and return once every proxy listens."""
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        # Run the file, not the package: the helper needs the stdlib only and starts faster.
        helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_helper.py")
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-u", helper],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        finally:
            if not isinstance(log, int):
                log.close()
        try:
            self.request(
                "listen",
                routes=[
                    {"id": r.id, "public": list(r.public), "private": list(r.private)}
                    for r in self.routes
                ],
                sources=self.sources,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one command and wait for its answer; RuntimeError if the helper fails."""
        with self._lock:
            popen = self.popen
            if popen is None or popen.poll() is not None or popen.stdin is None:
                raise RuntimeError(f"{self!r} is not running")
            try:
                popen.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
                popen.stdin.flush()
            except OSError as exc:
                raise RuntimeError(f"{self!r}: cannot send {op!r}: {exc}") from exc
            reply = json.loads(self._readline(popen))
        if not reply.get("ok"):
            raise RuntimeError(f"fault proxy refused {op!r}: {reply.get('error')}")
        return dict(reply)

    def _readline(self, popen: subprocess.Popen[bytes]) -> bytes:
        assert popen.stdout is not None
        fd = popen.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"{self!r} did not answer within {self.timeout}s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"{self!r} exited (rc={popen.poll()}); see {self.log_path}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def set_state(
        self, blocks: Sequence[tuple[str, str]], shapes: Mapping[str, tuple[float, float, float]]
    ) -> None:
        """Replace every fault at once: blocked (sender, receiver) pairs and per-sender
        (delay s, jitter s, loss fraction)."""
        self.request(
            "state",
            blocks=[list(b) for b in blocks],
            shapes={k: list(v) for k, v in shapes.items()},
        )

    def reset(self, peer: str) -> int:
        """RST every open connection to or from ``peer``; returns how many."""
        return int(self.request("reset", peer=peer)["reset"])

    def stats(self) -> dict[str, Any]:
        return self.request("stats")

    def stop(self, grace: float = 3.0) -> None:
        """Stop the helper (politely, then SIGKILL) and reap it; safe to repeat."""
        popen = self.popen
        if popen is None:
            return
        if popen.poll() is None:
            with contextlib.suppress(Exception):
                self.request("stop")
            with contextlib.suppress(OSError):
                if popen.stdin is not None:
                    popen.stdin.close()
            try:
                popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    popen.kill()
                popen.wait()
        for stream in (popen.stdin, popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.popen = None
