"""A listener that accepts connections and never answers (a black-holed or hung sentinel)."""

from __future__ import annotations

import socket
import threading
from types import TracebackType

from sentinel_cache.testing.processes import HOST, Address

__all__ = ["BlackHoleServer"]


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
