"""A scriptable fake sentinel (or any RESP server): for replies no real server would send, or
that a real one can only be talked into slowly (a sentinel that names the wrong master).

It speaks just enough RESP3 to be connected to by redis-py (``HELLO``, ``CLIENT``, ``PING``)
and answers every other command from a script; nothing listens until one is made.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from sentinel_cache.core.config import Address
from sentinel_cache.testing.processes import HOST

__all__ = ["HELLO", "FakeSentinel", "Raw", "Script", "resp"]


class Raw:
    """Bytes sent as they are: for replies no well-behaved server would send."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def resp(value: Any) -> bytes:
    if isinstance(value, Raw):
        return value.data
    if value is None:
        return b"_\r\n"
    if isinstance(value, bool):
        return b"#t\r\n" if value else b"#f\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if isinstance(value, dict):
        return b"%%%d\r\n" % len(value) + b"".join(resp(k) + resp(v) for k, v in value.items())
    return b"*%d\r\n" % len(value) + b"".join(resp(v) for v in value)


HELLO = {"server": "redis", "version": "7.0.0", "proto": 3, "role": "sentinel", "modules": []}

Script = dict[tuple[str, ...], Any]


class FakeSentinel:
    """A loopback server speaking just enough RESP to be connected to, answering commands from
    a script: ``{("SENTINEL", "GET-MASTER-ADDR-BY-NAME"): reply, ("ROLE",): reply, ...}``. A
    reply may be a callable of the arguments. Unscripted commands get an error."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.commands: list[list[bytes]] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((HOST, 0))
        self._sock.listen(64)
        self._sock.settimeout(0.05)
        self.address = Address(HOST, self._sock.getsockname()[1])
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._failures: list[BaseException] = []  # raised again by close()
        self._spawn(self._accept, name="fake-sentinel")

    def _spawn(self, target: Callable[..., None], *args: Any, name: str) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:
                self._failures.append(exc)
                raise

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)
            self._spawn(self._serve, conn, name="fake-sentinel-conn")

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while not self._closed.is_set():
                line = reader.readline()
                if not line:
                    return
                if not line.startswith(b"*"):
                    continue  # inline commands: ignore
                args = []
                for _ in range(int(line[1:])):
                    length = int(reader.readline()[1:])
                    args.append(reader.read(length + 2)[:-2])
                self.commands.append(args)
                conn.sendall(self._reply(args))
        except (OSError, ValueError):
            return
        finally:
            reader.close()

    def _reply(self, args: list[bytes]) -> bytes:
        words = tuple(a.decode("latin-1").upper() for a in args[:2])
        for key in (words, words[:1]):
            if key in self.script:
                reply = self.script[key]
                return resp(reply(args) if callable(reply) else reply)
        if words[0] == "HELLO":
            return resp(HELLO)
        if words[0] in ("CLIENT", "PING"):
            return b"+OK\r\n"
        return b"-ERR unknown command\r\n"

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        for thread in list(self._threads):
            thread.join(timeout=2)
        alive = [t.name for t in self._threads if t.is_alive()]
        if self._failures:
            raise RuntimeError(f"a fake sentinel thread failed: {self._failures[0]!r}")
        if alive:
            raise RuntimeError(f"fake sentinel threads still running after close: {alive}")
