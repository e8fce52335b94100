"""The fault proxy's helper process (see :mod:`sentinel_cache.testing.faults` for what a fault
looks like and why one process runs every proxy): asyncio proxies, one per node and sentinel,
that forward, hold, delay, stall or reset bytes as the controller says.

It is run as a file (``python -u fault_helper.py``), not imported from the package, so it uses
the stdlib only and starts fast; it reads one JSON command per line on stdin, answers on
stdout, and exits when stdin closes (its parent died).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import struct
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Peer id of every connection from 127.0.0.1 (the test process and its clients).
CLIENT = "client"
#: Wildcard peer in a blocked pair: every node, sentinel and client.
EVERYONE = "*"
#: The stall that stands for one lost segment (Linux's minimum retransmission timeout).
LOSS_STALL = 0.2

_HIGH_WATER = 16 * 1024 * 1024  # stop reading a sender while this much waits in the proxy
_LOW_WATER = 1024 * 1024
_LINGER_RST = struct.pack("ii", 1, 0)


@dataclass(frozen=True)
class Route:
    """One proxied endpoint: ``public`` (what everybody is given) forwards to ``private``."""

    id: str
    public: tuple[str, int]
    private: tuple[str, int]


_EOF = object()  # the sender half-closed: deliver after the queued bytes
_RST = object()  # the sender's socket was reset: abort the receiver after the queued bytes


class _Shape:
    """Egress shaping of one sender."""

    __slots__ = ("delay", "jitter", "loss")

    def __init__(self, delay: float = 0.0, jitter: float = 0.0, loss: float = 0.0) -> None:
        self.delay, self.jitter, self.loss = delay, jitter, loss

    def extra(self) -> float:
        extra = self.delay
        if self.jitter:
            extra = max(0.0, extra + random.uniform(-self.jitter, self.jitter))
        if self.loss and random.random() < self.loss:
            extra += LOSS_STALL
        return extra


class _Pipe:
    """One direction of a proxied connection: a FIFO of chunks, each with its release time."""

    __slots__ = (
        "conn",
        "sender",
        "receiver",
        "src",
        "dst",
        "queue",
        "queued",
        "blocked",
        "shape",
        "last_at",
        "timer",
        "paused",
        "done",
    )

    def __init__(self, conn: _Conn, sender: str, receiver: str) -> None:
        self.conn = conn
        self.sender, self.receiver = sender, receiver
        self.src: _Side | None = None
        self.dst: _Side | None = None
        self.queue: deque[tuple[float, Any]] = deque()
        self.queued = 0
        self.blocked = False
        self.shape: _Shape | None = None
        self.last_at = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.paused = False  # src reading paused (backpressure)
        self.done = False  # EOF/RST delivered or the receiver is gone: nothing more to send

    def push(self, item: Any) -> None:
        if self.done:
            return
        dst = self.dst.transport if self.dst is not None else None
        if (
            not self.queue
            and not self.blocked
            and self.shape is None
            and dst is not None
            and isinstance(item, bytes)
        ):
            dst.write(item)  # the fast path: no fault on this pipe
            return
        loop = self.conn.proxy.loop
        at = loop.time() + (self.shape.extra() if self.shape is not None else 0.0)
        at = max(at, self.last_at)
        self.last_at = at
        self.queue.append((at, item))
        if isinstance(item, bytes):
            self.queued += len(item)
            if self.queued > _HIGH_WATER:
                self.pause_src()
        self.flush()

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        dst = self.dst
        if self.blocked or dst is None or dst.transport is None or self.done:
            return
        loop = self.conn.proxy.loop
        now = loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, item = self.queue.popleft()
            if isinstance(item, bytes):
                self.queued -= len(item)
                dst.transport.write(item)
            elif item is _EOF:
                self.drop()
                dst.send_eof()
                return
            else:
                self.drop()
                dst.abort()
                return
        if self.queue:
            self.timer = loop.call_at(self.queue[0][0], self.flush)
        if self.paused and self.queued < _LOW_WATER:
            self.resume_src()

    def pause_src(self) -> None:
        transport = self.src.transport if self.src is not None else None
        if not self.paused and transport is not None and not transport.is_closing():
            self.paused = True
            transport.pause_reading()

    def resume_src(self) -> None:
        transport = self.src.transport if self.src is not None else None
        if self.paused and transport is not None and not transport.is_closing():
            self.paused = False
            transport.resume_reading()

    def drop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()
        self.queued = 0
        self.done = True


def _abort_with_rst(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    transport.abort()  # type: ignore[attr-defined]


class _Side(asyncio.Protocol):
    """One socket of a proxied connection: reads into one pipe, is written by the other.

    Half-closes are forwarded as such: a FIN read here is delivered (after the queued bytes) as
    a FIN on the other socket, and a socket is closed once both its directions are finished.
    """

    def __init__(self, conn: _Conn, inbound: _Pipe, outbound: _Pipe, *, accepted: bool) -> None:
        self.conn = conn
        self.inbound = inbound  # bytes read here go into this pipe
        self.outbound = outbound  # this pipe writes to our transport
        inbound.src = self
        outbound.dst = self
        self.accepted = accepted
        self.transport: asyncio.Transport | None = None
        self.eof_seen = False
        self.eof_sent = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.accepted:
            self.conn.accepted(transport)
        elif self.conn.client_side.closed and self.inbound.done and self.outbound.done:
            self.abort()  # reset (or gone) while we were connecting: nothing left to carry
            return
        self.outbound.flush()

    def data_received(self, data: bytes) -> None:
        self.conn.proxy.bytes_forwarded += len(data)
        self.inbound.push(data)

    def eof_received(self) -> bool:
        self.eof_seen = True
        self.inbound.push(_EOF)
        return not self.eof_sent  # both directions finished: let asyncio close the socket

    def send_eof(self) -> None:
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            return
        self.eof_sent = True
        if self.eof_seen or not transport.can_write_eof():
            transport.close()
        else:
            transport.write_eof()

    def abort(self) -> None:
        self.outbound.drop()
        if self.transport is not None and not self.closed:
            _abort_with_rst(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.outbound.drop()
        if exc is not None:
            self.inbound.push(_RST)  # the peer reset us: pass the reset on
        elif not self.eof_seen:
            self.inbound.push(_EOF)
        self.conn.side_lost()

    def pause_writing(self) -> None:
        self.outbound.pause_src()

    def resume_writing(self) -> None:
        self.outbound.resume_src()


class _Conn:
    """A proxied connection: ``source`` talks to ``target`` through the target's listener."""

    def __init__(self, proxy: _Proxy, route: Route) -> None:
        self.proxy = proxy
        self.route = route
        self.source, self.target = CLIENT, route.id
        self.up_pipe = _Pipe(self, self.source, self.target)  # client -> server
        self.down_pipe = _Pipe(self, self.target, self.source)  # server -> client
        self.client_side = _Side(self, self.up_pipe, self.down_pipe, accepted=True)
        self.server_side = _Side(self, self.down_pipe, self.up_pipe, accepted=False)

    def __repr__(self) -> str:
        return f"<_Conn {self.source} -> {self.target}>"

    def pipes(self) -> tuple[_Pipe, _Pipe]:
        return self.up_pipe, self.down_pipe

    def accepted(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        self.source = self.proxy.source_id(peer[0] if peer else "")
        self.up_pipe.sender = self.down_pipe.receiver = self.source
        self.proxy.conns.add(self)
        self.proxy.accepted += 1
        self.proxy.configure(self)
        self.proxy.loop.create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        host, port = self.route.private
        try:
            await self.proxy.loop.create_connection(lambda: self.server_side, host, port)
        except OSError:
            # Nothing listens (the node is down): the client sees a reset, as a refused
            # connection would show through a real proxy.
            self.client_side.abort()
            self.up_pipe.drop()
            self.proxy.conns.discard(self)

    def side_lost(self) -> None:
        server = self.server_side
        if self.client_side.closed and (server.closed or server.transport is None):
            self.proxy.conns.discard(self)

    def reset(self) -> None:
        for side in (self.client_side, self.server_side):
            side.inbound.drop()
            side.abort()
        self.proxy.conns.discard(self)


class _Proxy:
    """Every listener, connection and fault of the helper process."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.routes: dict[str, Route] = {}
        self.sources: dict[str, str] = {}
        self.servers: list[asyncio.AbstractServer] = []
        self.conns: set[_Conn] = set()
        self.blocks: set[tuple[str, str]] = set()
        self.shapes: dict[str, _Shape] = {}
        self.bytes_forwarded = 0
        self.accepted = 0

    async def listen(self, routes: list[Route], sources: Mapping[str, str]) -> None:
        self.sources = dict(sources)
        for route in routes:
            self.routes[route.id] = route
            server = await self.loop.create_server(
                lambda r=route: _Conn(self, r).client_side,  # type: ignore[misc]
                route.public[0],
                route.public[1],
                reuse_address=True,
                backlog=512,
            )
            self.servers.append(server)

    def source_id(self, host: str) -> str:
        return self.sources.get(host, CLIENT if host == "127.0.0.1" else f"unknown:{host}")

    def blocked(self, sender: str, receiver: str) -> bool:
        if not self.blocks:
            return False
        return any(s in (EVERYONE, sender) and r in (EVERYONE, receiver) for s, r in self.blocks)

    def configure(self, conn: _Conn) -> None:
        for pipe in conn.pipes():
            pipe.blocked = self.blocked(pipe.sender, pipe.receiver)
            pipe.shape = self.shapes.get(pipe.sender)

    def set_state(self, blocks: list[list[str]], shapes: Mapping[str, list[float]]) -> None:
        self.blocks = {(str(s), str(r)) for s, r in blocks}
        self.shapes = {k: _Shape(*v) for k, v in shapes.items() if any(v)}
        for conn in list(self.conns):
            self.configure(conn)
            for pipe in conn.pipes():
                pipe.flush()

    def reset(self, peer: str) -> int:
        hit = [c for c in self.conns if c.source == peer or c.target == peer]
        for conn in hit:
            conn.reset()
        return len(hit)

    def stats(self) -> dict[str, Any]:
        per_target: dict[str, int] = {}
        per_source: dict[str, int] = {}
        for conn in self.conns:
            per_target[conn.target] = per_target.get(conn.target, 0) + 1
            per_source[conn.source] = per_source.get(conn.source, 0) + 1
        return {
            "connections": len(self.conns),
            "per_target": per_target,
            "per_source": per_source,
            "accepted": self.accepted,
            "bytes_forwarded": self.bytes_forwarded,
            "queued_bytes": sum(p.queued for c in self.conns for p in c.pipes()),
        }

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for conn in list(self.conns):
            conn.reset()
        self.conns.clear()


async def _serve() -> None:
    """Read commands from stdin (one JSON object per line), answer on stdout, until ``stop``."""
    loop = asyncio.get_running_loop()
    proxy = _Proxy(loop)
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer

    def answer(reply: dict[str, Any]) -> None:
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()

    while True:
        line = await reader.readline()
        if not line:
            break  # our parent is gone
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "listen":
                routes = [
                    Route(r["id"], tuple(r["public"]), tuple(r["private"]))
                    for r in request["routes"]
                ]
                await proxy.listen(routes, request["sources"])
                answer({"ok": True, "pid": os.getpid()})
            elif op == "state":
                proxy.set_state(request["blocks"], request["shapes"])
                answer({"ok": True})
            elif op == "reset":
                answer({"ok": True, "reset": proxy.reset(request["peer"])})
            elif op == "stats":
                answer({"ok": True, **proxy.stats()})
            elif op == "stop":
                await proxy.close()
                answer({"ok": True})
                break
            else:
                answer({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # report, keep serving
            answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    await proxy.close()


def _main() -> None:  # pragma: no cover - runs in the helper process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is for the parent
    asyncio.run(_serve())


if __name__ == "__main__":  # pragma: no cover - the helper process
    _main()
