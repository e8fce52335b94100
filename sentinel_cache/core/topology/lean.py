"""The sync masters' connections on a lean path: redis-py's sockets and parsers, without its
per-call machinery.

Why: a call to a shard sent and read through redis-py's ``send_packed_command`` and
``read_response`` pays about forty Python calls (health check, retry wrapper, the host name of
an error formatted before anything fails, the parser's layers), and its checkout a ``poll()``
object made, registered and asked per call. A multi-key call pays them per shard touched: most
of the client's own CPU. Here a connection that parses with ``hiredis`` sends with one
``sendall``, reads with ``recv_into`` into its parser's reader, and answers the pool's check at
checkout in one call (:meth:`LeanShardIO.ready_to_send`). On Linux the socket's timeout is the
kernel's and the checkout asks the kernel's byte count, so a call lets go of the GIL only for its
``send`` and its ``recv`` (:func:`kernel_timeouts`, :meth:`_Lean.unread`). With redis-py's
failures: the same
exception classes (the reader is redis-py's, so an error reply is the class its parser maps it
to: ``READONLY`` a ``ReadOnlyError``, ``LOADING`` a ``BusyLoadingError``), the same messages, the
socket dropped on a failure or an interruption, a RESP3 push handed to redis-py's handler.
Connecting, TLS, AUTH/HELLO, URL parsing and the client we hand out stay redis-py's. Anything
else (no hiredis, RESP3 with a hiredis older than 3.2, a health check interval, raw replies, a
per-read timeout) takes redis-py's own path: the twin of
:class:`~sentinel_cache.core.ops.async_clients.AsyncLeanIO`.
"""

from __future__ import annotations

import select
import socket
import struct
import sys
from typing import Any

import redis.connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ReadOnlyError, ResponseError

from sentinel_cache.core.process import PROCESS
from sentinel_cache.core.topology._sync.connection import ShardConnectionMixin
from sentinel_cache.core.topology.fair_pool import FairBlockingConnectionPool
from sentinel_cache.core.topology.lean_rules import (
    CLOSED,
    MIN_BULK_LIMIT,
    broken,
    lean_reader,
    overfull,
    oversized,
    socket_failure,
)

#: Below this many buffered bytes no reply item is looked at (``overfull``'s bound is larger).
_OVERFULL_FROM = MIN_BULK_LIMIT
_POLL_IN = select.POLLIN if hasattr(select, "poll") else 0


_LINUX = sys.platform.startswith("linux")
_TIMEVAL = struct.Struct("ll")
#: ``struct tcp_info``'s first byte (the state) and its ``tcpi_bytes_received`` (Linux >= 4.1).
_TCP_INFO = struct.Struct("=B127xQ")
_TCP_ESTABLISHED = 1


def kernel_timeouts(sock: Any) -> bool:
    """Hand the socket's timeout to the kernel (``SO_RCVTIMEO``/``SO_SNDTIMEO``) and make it
    blocking in Python's eyes; False (nothing changed) off Linux or with no timeout.

    Why: a socket with a Python timeout ``poll()``s before every ``send`` and ``recv``, and
    every syscall lets go of the GIL. With many threads (gunicorn ``gthread``) each let-go
    hands the GIL to another thread, and the caller sleeps until it gets it back: a context
    switch per syscall. A timed-out ``send`` or ``recv`` raises ``BlockingIOError`` (EAGAIN)
    instead of ``TimeoutError``; :meth:`LeanIO._failed` reads it as the timeout it is."""
    timeout = sock.gettimeout()
    if not _LINUX or timeout is None or not 0 < timeout < 2**31:
        return False
    seconds = int(timeout)
    value = _TIMEVAL.pack(seconds, max(int((timeout - seconds) * 1e6), 0 if seconds else 1))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    sock.settimeout(None)
    return True


def _python_timeouts(lean: _Lean | None) -> None:
    """Give the socket its timeout back in Python's eyes before redis-py's own path uses it:
    that path knows no ``BlockingIOError`` for a timeout. The next checkout hands it to the
    kernel again (:meth:`LeanShardIO.ready_to_send`)."""
    if lean is not None and lean.kernel and lean.sock.gettimeout() is None:
        lean.sock.settimeout(lean.timeout)


def _tcp_info(sock: Any) -> tuple[int, int] | None:
    """The connection's TCP state and the bytes it has received so far, asked of the kernel
    without letting go of the GIL (``getsockopt``, unlike ``poll``, keeps it); None where the
    kernel does not say (not Linux >= 4.1, not TCP)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    except (OSError, AttributeError):
        return None
    if len(info) < _TCP_INFO.size:
        return None
    state, received = _TCP_INFO.unpack(info)
    return state, received


class _Lean:
    """What the lean path found for one socket of a connection and its hiredis reader (new
    ones per connect): them, the reader's "no reply yet" value, the parser's read buffer, a poller
    registered once for the socket (None where ``select.poll`` does not exist), the RESP3 push
    type (None for RESP2), whether the kernel holds the timeouts (:func:`kernel_timeouts`) and
    ``received``: the socket's byte count (``tcpi_bytes_received``) once everything read so far
    is out of the socket, which the lean reads keep up to date (``counted``: the kernel tells
    it; -1: not known yet)."""

    __slots__ = (
        "sock",
        "reader",
        "pending",
        "buffer",
        "poller",
        "tls",
        "push",
        "kernel",
        "counted",
        "received",
        "timeout",
    )

    def __init__(self, reader: Any, pending: Any, buffer: Any, sock: Any, push: Any) -> None:
        self.sock = sock
        self.reader = reader
        self.pending = pending
        self.buffer = buffer
        self.push = push
        self.tls = hasattr(sock, "pending")  # decrypted bytes may wait above the OS socket
        self.poller: Any = None
        self.received = -1
        if _POLL_IN:
            self.poller = select.poll()
            self.poller.register(sock, _POLL_IN)
        self.timeout = sock.gettimeout()  # Python's, given back for redis-py's own path
        # Not for TLS: its reads may raise SSLWantReadError on a kernel timeout, and a check at
        # checkout must ask the TLS layer (``pending``) anyway.
        self.kernel = not self.tls and kernel_timeouts(sock)
        self.counted = self.kernel and self.poller is not None and _tcp_info(sock) is not None
        if self.counted:
            self.drained()

    def drained(self) -> bool:
        """Whether nothing waits on the socket, asked of ``poll`` (which lets go of the GIL)
        and the kernel's byte count taken before it as the socket's drained count if so."""
        info = _tcp_info(self.sock) if self.counted else None
        if self.poller.poll(0):
            return False
        if info is not None and info[0] == _TCP_ESTABLISHED:
            self.received = info[1]
        return True

    def unread(self) -> bool:
        """Whether something waits on the socket (a reply nobody read, a push, an EOF, an
        error). The kernel's byte count against the drained count answers without letting go
        of the GIL; where it is not kept, or they differ (redis-py's path read here, or bytes
        came), ``poll`` answers and the count is taken again."""
        if self.counted and self.received >= 0:
            info = _tcp_info(self.sock)
            if info is not None and info == (_TCP_ESTABLISHED, self.received):
                return False
        return not self.drained()


class LeanIO(redis.connection.AbstractConnection):
    """What the lean path of :class:`LeanShardIO` needs of a redis-py connection that parses
    with ``hiredis`` (see the module's docstring): the socket and the parser's reader, told
    apart from redis-py's own path, and redis-py's failures for what went wrong on the socket.
    (The asyncio twin is :class:`~sentinel_cache.core.ops.async_clients.AsyncLeanIO`.)"""

    # (reader, _Lean or None): what _lean found for the parser's reader of the moment.
    _lean_state: tuple[Any, _Lean | None] = (None, None)
    # The lean path's state while its socket is the connection's: what every call looks at
    # first (one attribute and one identity check), _lean() when it is not.
    _lean_now: _Lean | None = None

    def _lean(self) -> _Lean | None:
        """The lean path's state for this socket, or None if redis-py's path applies."""
        lean = self._lean_now
        if lean is not None and lean.sock is self._sock:
            return lean
        reader = getattr(self._parser, "_reader", None)
        seen, lean = self._lean_state
        if seen is not reader:  # connected again: a new reader (the old one is held here)
            lean = self._lean_for()
            self._lean_state = (reader, lean)
        if lean is None or lean.sock is not self._sock:
            return None
        self._lean_now = lean
        return lean

    def _lean_for(self) -> _Lean | None:
        """The lean path's state for the socket and parser of the moment, or None: the rules of
        :func:`~sentinel_cache.core.topology.lean_rules.lean_reader`, with a socket and the
        parser's read buffer to read into."""
        sock, parser = self._sock, self._parser
        buffer = getattr(parser, "_buffer", None)
        if sock is None or type(buffer) is not bytearray or not buffer:
            return None
        found = lean_reader(parser, self.protocol, self.health_check_interval)
        if found is None:
            return None
        return _Lean(found.reader, found.pending, buffer, sock, found.push)

    def _failed(self, exc: BaseException, writing: bool) -> BaseException:
        """Drop the socket after ``exc`` (whatever was under way leaves it out of step) and
        return redis-py's error for it, as redis-py's own path raises it."""
        self.disconnect()
        timed_out = isinstance(exc, (TimeoutError, BlockingIOError))
        host = "" if writing or timed_out else self._host_error()
        return socket_failure(
            exc, writing=writing, timed_out=timed_out, host=host, timeout_from="socket"
        )


class LeanShardIO(ShardConnectionMixin, LeanIO):
    """A shard's connection (:mod:`~sentinel_cache.core.topology._sync.connection`) on the lean
    path: redis-py's ``send_packed_command`` and ``read_response`` in a few calls, the shard's
    rules (the promotions a command was sent under, no acknowledgement from a replaced master,
    READONLY drops the socket) in the same call, as the asyncio twin
    (:class:`~sentinel_cache.core.ops.async_clients.AsyncLeanShardIO`) has them. Every shard a
    call touches pays these calls, so a layer less each is a multi-key call's CPU. Anything
    that is not the lean path takes redis-py's, through the shard's rules of the mixin."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        sock: Any = self._sock
        lean = self._lean_now
        if lean is None or lean.sock is not sock:
            lean = self._lean()
        if lean is None or type(command) is not list:
            _python_timeouts(lean)
            super().send_packed_command(command, check_health)
            return
        self._sent_promotions = self._shard.state.promotions  # ShardBound._note_sent
        try:
            for item in command:
                sock.sendall(item)
        except BaseException as exc:
            raise self._failed(exc, writing=True)  # noqa: B904 - _failed chains it

    def read_response(self, disable_decoding: bool = False, **kwargs: Any) -> Any:
        lean = self._lean_now
        if lean is None or lean.sock is not self._sock:
            lean = self._lean()
        if lean is None or disable_decoding or kwargs:
            _python_timeouts(lean)
            return super().read_response(disable_decoding, **kwargs)
        reader, pending, push = lean.reader, lean.pending, lean.push
        try:
            response = reader.gets()
            while True:
                if response is pending:
                    sock, buffer = lean.sock, lean.buffer
                    while response is pending:
                        size = sock.recv_into(buffer)
                        if not size:
                            raise RedisConnectionError(CLOSED)
                        lean.received += size
                        # The reply guard: no header declaring a huge size reaches the reader.
                        hostile, self._carry = oversized(buffer, size, self._carry, self.bulk_limit)
                        if hostile is not None:
                            raise self.protocol_error(hostile)
                        reader.feed(buffer, 0, size)
                        response = reader.gets()
                        if response is pending and reader.len() > _OVERFULL_FROM:
                            hostile = overfull(reader.len(), self.bulk_limit)
                            if hostile is not None:
                                raise self.protocol_error(hostile)
                if push is None or type(response) is not push:
                    break
                self._parser.handle_push_response(response)
                response = reader.gets()
            kind = type(response)
            if kind is not bytes and (failure := broken(response)) is not None:
                raise failure
        except InvalidResponse as exc:  # garbage: the socket is out of step
            self.disconnect()
            raise self.protocol_error(f"sent bytes that are no reply ({exc})") from exc
        except BaseException as exc:
            raise self._failed(exc, writing=False)  # noqa: B904 - _failed chains it
        if kind is not bytes and kind is not list and isinstance(response, ResponseError):
            if isinstance(response, ReadOnlyError):  # no master: see the mixin
                self.disconnect()
            raise response from None
        state = self._shard.state
        if self._generation != state.generation or self._sent_promotions != state.promotions:
            untrusted = self._untrusted_reply()  # no acknowledgement from a replaced master
            self.disconnect()
            raise untrusted  # type: ignore[misc]
        return response

    def ready_to_send(self) -> bool:
        """Connected to the shard's current master with nothing unread (the reader's buffer,
        the socket's, an EOF or error): what the pool's check at every checkout finds out
        (``connect`` and ``can_read``), from the kernel's byte count (:meth:`_Lean.unread`) or
        one ``poll`` on a poller made once per socket. False means "ask redis-py's check", not
        "unusable"."""
        lean = self._lean_now
        if lean is None or lean.sock is not self._sock:
            lean = self._lean()
        if (
            lean is None
            or lean.poller is None
            or self._generation != self._shard.state.generation  # ShardBound._stale
            or lean.reader.has_data()
        ):
            return False
        if lean.tls and lean.sock.pending():
            return False
        if lean.kernel and lean.sock.gettimeout() is not None:
            lean.sock.settimeout(None)  # redis-py's path set its own (a read with a timeout)
        return not lean.unread()


class LeanShardConnection(LeanShardIO, redis.connection.Connection):
    """The sync core's connection to a shard's master."""


class LeanShardSSLConnection(LeanShardIO, redis.connection.SSLConnection):
    """The TLS flavour of :class:`LeanShardConnection`."""


class ShardPool(FairBlockingConnectionPool):
    """The pool of a shard's master: the fair pool, whose checkout skips redis-py's connection
    check for a connection that is :meth:`~LeanShardIO.ready_to_send`."""

    lean_checkout = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Nobody to tell of a release (no event dispatcher of the caller's) and no client-side
        # caching (whose proxy connections answer for their own reconnects): see release.
        self._quick_release = self._quiet_releases and getattr(self, "cache", None) is None

    def release(self, connection: Any) -> None:
        """The fair pool's release; one with nothing to re-authenticate or reconnect for
        (the usual case) is handed on at once, as the asyncio twin's
        (:class:`~sentinel_cache.core.ops.async_clients.AsyncShardPool`) is."""
        if (
            self._quick_release
            and self.pid == PROCESS.pid
            and getattr(connection, "_re_auth_token", None) is None
            and not getattr(connection, "_should_reconnect", False)  # redis-py >= 6
        ):
            with self._lock:
                ledger = self._ledger
                if connection in ledger.checked_out and connection.pid == self.pid:
                    ledger.give_back(connection)
                    return
        super().release(connection)
