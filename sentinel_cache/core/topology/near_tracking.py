"""The near cache's tracker threads and their connections: per shard, either one RESP3 writer
connection whose ``CLIENT TRACKING ON BCAST NOLOOP`` invalidations arrive on it as push frames
(*push* mode), or, where the server refuses ``HELLO 3``, an invalidation connection subscribed
to ``__redis__:invalidate`` and a RESP2 writer connection whose tracking redirects there
(*redirect* mode); see :mod:`~sentinel_cache.core.topology.near` for why, and what keeps a copy
correct.

Apart from the copies so that each side reads alone; a tracker reports to its near cache only
through :class:`Sessions` (so this module does not import the one that starts it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sentinel_cache.core.config import connection_class_and_kwargs
from sentinel_cache.core.throttle import Throttle
from sentinel_cache.core.topology._sync.connection import ShardConnection, ShardSSLConnection
from sentinel_cache.exceptions import ReplyProtocolError

if TYPE_CHECKING:
    from sentinel_cache.core.config import PoolConfig
    from sentinel_cache.core.topology.shard import Shard

logger = logging.getLogger("sentinel_cache.near")


CHANNEL = b"__redis__:invalidate"
PING_EVERY = 1.0  # seconds between two pings on a quiet tracker connection
PONG_WITHIN = 1.0  # a ping unanswered this long ends the session
RETRY_EVERY = 0.2  # seconds between two attempts to start tracking a shard
#: The one parser whose push handler every supported redis-py calls, in order, from inside
#: ``read_response`` (pure Python: hiredis's handles pushes only in newer redis-py).
_PUSH_PARSER = redis.connection._RESP3Parser
_APPLIED = object()  # what the push handler returns for a push it applied


class Sessions(Protocol):
    """What a tracker and its writer tell the near cache: a session began, ended, or the server
    invalidated keys (:class:`~sentinel_cache.core.topology.near.NearCache` is one)."""

    @property
    def prefixes(self) -> tuple[str, ...]: ...

    def begin(self, index: int, writer: Writer, generation: int) -> int: ...

    def end(self, index: int, session: int | None, cause: str) -> None: ...

    def invalidate(self, index: int, keys: Sequence[bytes] | None) -> None: ...


class _WriterMixin:
    """A writer connection never reconnects: a new socket would not be tracked (nothing would
    tell us about other writers), so once lost it stays lost and its session ends. In push
    mode, whoever reads it raises ``arrivals.draining`` first (a push may come before a
    reply, and the parser may take several frames in one read)."""

    lost = False
    arrivals: Arrivals | None = None  # push mode: its session's arrivals, once tracked

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        arrivals = self.arrivals
        if arrivals is not None:
            # The parser holds nothing while the flag is down: it is raised only once the
            # reply's first bytes are here, not for the whole round trip (until then a hit sees
            # the socket empty and the flag down, rightly). The socket's timeout bounds the
            # wait (SOCKET_TIMEOUT; PONG_WITHIN for the tracker's ping).
            sock = self._sock  # type: ignore[attr-defined]
            if sock is not None and not arrivals.draining:
                if not _readable(sock, sock.gettimeout()):
                    self.disconnect()
                    raise RedisTimeoutError("Timeout reading from the near cache's writer")
                line = arrivals.reply_line()
                if line:
                    # A whole simple reply heads the stream: the parser takes exactly it (one
                    # recv of that many bytes), so no push comes along and the flag stays down
                    # (raised, it would refuse every hit while this thread waits for the GIL
                    # after its recv).
                    buffer = self._parser._buffer  # type: ignore[attr-defined]
                    size, buffer.socket_read_size = buffer.socket_read_size, line
                    try:
                        reply = super().read_response(*args, **kwargs)  # type: ignore[misc]
                    finally:
                        buffer.socket_read_size = size
                    if parser_holds(self):  # took more after all: Writer.drain applies it
                        arrivals.draining = True
                    return reply
            arrivals.draining = True  # before the socket is read: see Arrivals.pending
        reply = super().read_response(*args, **kwargs)  # type: ignore[misc]
        if arrivals is not None and not parser_holds(self):
            # Every push read came before the reply and was applied (the parser's handler):
            # nothing read is unapplied. Else Writer.drain lowers it.
            arrivals.draining = False
        return reply

    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        if self.lost:
            raise RedisConnectionError("the near cache's writer connection is gone")
        super().send_packed_command(*args, **kwargs)  # type: ignore[misc]

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self.lost = True
        super().disconnect(*args, **kwargs)  # type: ignore[misc]


class _WriterConnection(_WriterMixin, ShardConnection):
    pass


class _WriterSSLConnection(_WriterMixin, ShardSSLConnection):
    pass


_POLL_IN = select.POLLIN if hasattr(select, "poll") else 0
PEEK_BYTES = 64  # what a hit peeks at on a readable push-mode socket (a write's reply?)
_PEEK_FLAGS = socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)


def read_within(connection: Any, read: Callable[[], Any]) -> Any:
    """``read()`` from ``connection`` waiting at most ``PONG_WITHIN`` for its bytes, then the
    connection's own timeout again (``SOCKET_TIMEOUT``, for the writes)."""
    sock = connection._sock
    sock.settimeout(PONG_WITHIN)
    try:
        return read()
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(connection.socket_timeout)


def parser_holds(connection: Any) -> bool:
    """Bytes the connection's parser (or TLS, decrypted) took off the socket and has not
    parsed yet (True when it cannot tell: the flag then stays up until a drain)."""
    try:
        sock = connection._sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        return bool(connection._parser._buffer.unread_bytes())
    except (AttributeError, ValueError, OSError, RedisConnectionError):
        return True


def _only_replies(head: bytes) -> bool:
    """``head`` (peeked off a push-mode socket) is whole simple replies (``+``, ``-``, ``:``)
    and no push: a write's reply waiting for its caller, which hides no invalidation."""
    if not head.endswith(b"\r\n") or len(head) >= PEEK_BYTES:
        return False
    return all(line[:1] in (b"+", b"-", b":") for line in head[:-2].split(b"\r\n"))


def _readable(sock: Any, timeout: float | None = 0.0) -> bool:
    """Bytes wait on ``sock``, or in its TLS layer, within ``timeout`` seconds (None: as long
    as it takes); True too if it broke (the read that follows finds out)."""
    try:
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        return bool(select.select([sock], [], [], timeout)[0])
    except (OSError, ValueError, TypeError):
        return True


class Arrivals:
    """Whether invalidations of a session may have reached this process and not been applied
    yet: bytes on the socket they come on (the subscriber's in redirect mode; in push mode the
    writer's, where a write's reply waiting also counts: a conservative miss), or bytes a
    reader took off it and has not applied yet (``draining``: raised by the tracker, or by a
    write's caller, before it reads; lowered once the parser holds nothing). A hit looks
    before it serves a copy (:meth:`NearCache.get`), so a copy is never served after its
    invalidation arrived, however long the tracker thread waits for the GIL or the CPU: the
    server sends a write's invalidation before the writer's reply, so an acknowledged write's
    invalidation is here before any read that begins after it. One ``poll`` per hit, on a
    poller of the calling thread's own (a poller refuses two threads at once)."""

    __slots__ = ("_fd", "_peek", "_pollers", "draining")

    def __init__(self, sock: Any, *, peek: bool = False) -> None:
        self.draining = False
        self._fd = sock.fileno() if _POLL_IN and sock is not None else -1
        self._pollers = threading.local()
        # Push mode: a readable socket may hold only a write's reply. A second socket object
        # on a copy of the descriptor peeks without waiting (a blocking-mode object: no poll
        # before its recv, and nothing changed on the shared descriptor's flags). Not on TLS
        # (the bytes are records), nor where a default timeout would make it non-blocking.
        self._peek: socket.socket | None = None
        if (
            peek
            and self._fd >= 0
            and hasattr(socket, "MSG_DONTWAIT")
            and socket.getdefaulttimeout() is None
            and not isinstance(sock, ssl.SSLSocket)
        ):
            self._peek = socket.socket(fileno=os.dup(self._fd))

    def reply_line(self) -> int:
        """The length of the whole simple reply (``+``, ``-``, ``:`` line) heading the socket,
        peeked; 0 if something else heads it, or it cannot peek."""
        if self._peek is None:
            return 0
        try:
            head = self._peek.recv(PEEK_BYTES, _PEEK_FLAGS)
        except OSError:
            return 0
        end = head.find(b"\r\n")
        return end + 2 if end > 0 and head[:1] in (b"+", b"-", b":") else 0

    def close(self) -> None:
        """The session ended: the peeking copy of the descriptor goes."""
        peek, self._peek = self._peek, None
        if peek is not None:
            peek.close()

    def __repr__(self) -> str:
        return f"<Arrivals fd={self._fd} draining={self.draining}>"

    def pending(self) -> bool:
        """The socket first, then the flag: the tracker raises the flag before it reads."""
        if self._fd < 0:  # no select.poll: only the flag (the tracker's scheduling bounds it)
            return self.draining
        try:
            poll = self._pollers.poll
        except AttributeError:
            poller = select.poll()
            poller.register(self._fd, _POLL_IN)
            poll = self._pollers.poll = poller.poll
        if not poll(0):
            return self.draining
        if self._peek is None:
            return True
        try:
            head = self._peek.recv(PEEK_BYTES, _PEEK_FLAGS)
        except BlockingIOError:  # taken by its reader meanwhile: the flag says the rest
            return self.draining
        except OSError:
            return True
        return (bool(head) and not _only_replies(head)) or self.draining


class Writer:
    """One shard's writer connection for one tracking session: it holds the session's
    tracking (``CLIENT TRACKING ON [REDIRECT <subscriber>] BCAST NOLOOP``), so the server tells
    us of every write but the ones made on it, and a value written on it can be kept (see
    :meth:`NearCache.own`). In push mode the invalidations arrive on it too, and whoever holds
    it applies those it reads (:meth:`on_push`, :meth:`drain`). Leased to one caller at a time;
    to the operations it looks like a redis-py client
    (``connection_pool.get_connection``/``release``)."""

    def __init__(self, near: Sessions, index: int, connection: Any, mode: str) -> None:
        self.near = near
        self.index = index
        self.connection = connection
        self.mode = mode  # "push": invalidations arrive on this connection; "redirect"
        self.lock = threading.Lock()
        #: Set by :meth:`done`: the push tracker waits on it while a write holds the writer,
        #: rather than take the lock after each write (it would keep the next write off it).
        self.released = threading.Event()
        self.session = 0
        self.cause = "tracker connection lost"  # what ends the session if the connection goes
        self.ping_due = False  # the tracker waits to ping it: writes leave it alone meanwhile
        self.connection_pool = self
        #: The session's invalidations not applied yet (set once its connection is up).
        self.arrivals: Arrivals | None = None

    def __repr__(self) -> str:
        lost = self.connection.lost
        return (
            f"<NearCache writer shard={self.index} session={self.session} mode={self.mode} "
            f"lost={lost}>"
        )

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        return self.connection

    def release(self, connection: Any = None) -> None:
        """The pool's side: the lease is given back with :meth:`done`."""

    def done(self) -> None:
        """The lease holder is done; a connection lost meanwhile ends the session at once (its
        tracking went with it). In push mode it first applies the pushes its reads left in the
        parser's buffer (or that came meanwhile), so nothing read stays unapplied."""
        if self.mode == "push":
            self.drain(PONG_WITHIN / 10)
        lost = self.connection.lost
        self.lock.release()
        self.released.set()
        if lost:
            self.near.end(self.index, self.session, self.cause)

    def on_push(self, push: Any) -> object:
        """The parser's push handler, called by whoever reads the socket, in order, before the
        reply (if any) that follows the push is returned."""
        if isinstance(push, list) and push and push[0] in (b"invalidate", "invalidate"):
            self.near.invalidate(self.index, push[1] if len(push) > 1 else None)
            return _APPLIED
        return None  # no push of ours: the connection is out of step (see drain)

    def drain(self, budget: float) -> bool:
        """Push mode, holding the lease: apply every push readable now (buffered by the parser
        or on the socket), for at most ``budget`` seconds; ``arrivals.draining`` is lowered only
        once none is left. False if some may be left (the tracker goes on) or the connection
        was lost (garbage, a reply nobody asked for, a partial frame held ``PONG_WITHIN``)."""
        connection = self.connection
        arrivals = self.arrivals
        if connection.lost or arrivals is None:
            return False
        if not arrivals.draining and not _readable(connection._sock):
            return True  # the parser holds nothing (the flag is down) and nothing came
        arrivals.draining = True  # before the socket is read: see Arrivals.pending
        began = time.monotonic()
        try:
            while connection.can_read(timeout=0):
                if time.monotonic() - began >= budget:
                    return False  # still draining: the flag stays up
                # The parser's own read: a push comes back as what on_push returned, and
                # nothing else is owed to a writer nobody is using. A frame delivered in part,
                # then held, times out: lost.
                applied = read_within(
                    connection, lambda: connection._parser.read_response(push_request=True)
                )
                if applied is not _APPLIED:
                    connection.disconnect()
                    return False
        except (RedisConnectionError, RedisTimeoutError, OSError, redis.ResponseError):
            connection.disconnect()
            return False
        arrivals.draining = False  # applied all: what comes next is polled
        return True


class Tracker(threading.Thread):
    """Keeps one shard tracked: connect to its master (push mode: one RESP3 writer connection
    whose invalidations are pushed on it; redirect mode, where ``HELLO 3`` is refused or
    ``NEAR_CACHE_PUSH`` is False: an invalidation connection subscribed to
    ``__redis__:invalidate`` and a writer connection whose tracking redirects there), apply
    invalidations; any error, a switch or an unanswered ping ends the session (its copies go)
    and it starts over. A master that refused ``HELLO 3`` is tracked in redirect mode until
    the shard's master changes ("auto")."""

    def __init__(self, near: Sessions, shard: Shard, config: PoolConfig) -> None:
        super().__init__(name=f"sentinel_cache-near-{shard.name}", daemon=True)
        self.near = near
        self.shard = shard
        cls, kwargs = connection_class_and_kwargs(config.connection_options())
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        kwargs["protocol"] = 2  # RESP2 pub/sub messages, whatever redis-py's default protocol
        self._connection_class, self._kwargs = cls, kwargs
        self._push_kwargs = {**kwargs, "protocol": 3, "parser_class": _PUSH_PARSER}
        self._push: bool | str = config.near_cache_push
        self._refused: Any = None  # the master whose HELLO 3 was refused ("auto": redirect)
        # The invalidation connection never waits longer than a ping may (a message delivered
        # in part, then held, must not stall the invalidations), whatever SOCKET_TIMEOUT says.
        self._tracker_kwargs = {**kwargs, "socket_timeout": PONG_WITHIN}
        ssl = issubclass(cls, redis.connection.SSLConnection)
        self._writer_class = _WriterSSLConnection if ssl else _WriterConnection
        self._prefixes = [arg for prefix in near.prefixes for arg in ("PREFIX", prefix)]
        self._stopped = threading.Event()
        self._failures = Throttle(30.0)

    def __repr__(self) -> str:
        return f"<NearCache tracker {self.shard.label} alive={self.is_alive()}>"

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        index = self.shard.index
        while not self._stopped.is_set():
            address, generation = self.shard.current()
            if address is None:
                self._stopped.wait(RETRY_EVERY)
                continue
            if self._push is True or (self._push == "auto" and self._refused != address):
                if not self._track_push(address, generation):  # else refused: the redirect
                    self._stopped.wait(RETRY_EVERY)
                continue
            connection = self._connection_class(
                host=address.host, port=address.port, **self._tracker_kwargs
            )
            writer = Writer(
                self.near,
                index,
                self._writer_class(shard=self.shard, **self._kwargs),
                "redirect",
            )
            session = None
            cause = "tracker connection lost"
            try:
                connection.connect()
                connection.send_command("CLIENT", "ID")
                own_id = connection.read_response()
                connection.send_command("SUBSCRIBE", CHANNEL)
                connection.read_response()
                writer.connection.connect()
                writer.connection.send_command(
                    "CLIENT",
                    "TRACKING",
                    "ON",
                    "REDIRECT",
                    own_id,
                    "BCAST",
                    "NOLOOP",
                    *self._prefixes,
                )
                writer.connection.read_response()
                writer.arrivals = Arrivals(connection._sock)
                session = self.near.begin(index, writer, generation)
                logger.debug(
                    "near cache: shard %s at %s tracked (redirect mode, 2 connections), session %s",
                    self.shard.label,
                    address,
                    session,
                )
                cause = self._follow(connection, writer, generation)
            except (RedisConnectionError, RedisTimeoutError, OSError, redis.ResponseError) as exc:
                self._failed(address, exc)
            finally:
                self.near.end(index, session, cause)
                connection.disconnect()
                with writer.lock:  # not under a write in flight
                    writer.connection.disconnect()
            self._stopped.wait(RETRY_EVERY)

    def _failed(self, address: Any, exc: BaseException) -> None:
        """A session (either mode) could not start or broke: said once per 30 s per shard."""
        self._failures.warn(
            logger,
            "near cache: tracking shard %s at %s failed (its copies are not served "
            "until tracking resumes): %s: %s",
            self.shard.label,
            address,
            type(exc).__name__,
            exc,
        )

    def _track_push(self, address: Any, generation: int) -> bool:
        """One push-mode session on the master at ``address``; True only if ``HELLO 3`` was
        refused ("auto" then tracks that master in redirect mode at once), else the session
        ended or could not start and the caller waits ``RETRY_EVERY``."""
        index = self.shard.index
        connection = self._writer_class(shard=self.shard, **self._push_kwargs)
        writer = Writer(self.near, index, connection, "push")
        session = None
        cause = "tracker connection lost"
        try:
            try:
                connection.connect()  # HELLO 3
            except (redis.ResponseError, ReplyProtocolError) as exc:
                if self._push is True:
                    raise
                self._refused = address  # an older server: the redirect, until a switch
                logger.info(
                    "near cache: shard %s at %s refused RESP3 (%s): tracking it in redirect "
                    "mode (2 connections)",
                    self.shard.label,
                    address,
                    exc,
                )
                return True
            if str(getattr(connection, "protocol", 3)) != "3":  # redis-py fell back to RESP2
                if self._push is True:
                    raise RedisConnectionError("the server did not accept HELLO 3")
                self._refused = address
                return True
            self._set_push_handler(connection, writer.on_push)
            connection.send_command("CLIENT", "TRACKING", "ON", "BCAST", "NOLOOP", *self._prefixes)
            connection.read_response()
            writer.arrivals = connection.arrivals = Arrivals(connection._sock, peek=True)
            # The read of the tracking's +OK may have taken a push behind it: the tracker
            # drains (and lowers the flag) before anything else reads the socket.
            writer.arrivals.draining = True
            session = self.near.begin(index, writer, generation)
            logger.debug(
                "near cache: shard %s at %s tracked (push mode, 1 connection), session %s",
                self.shard.label,
                address,
                session,
            )
            cause = self._follow_push(writer, generation)
        except (
            RedisConnectionError,
            RedisTimeoutError,
            OSError,
            redis.ResponseError,
            ReplyProtocolError,
        ) as exc:
            self._failed(address, exc)
        finally:
            self.near.end(index, session, cause)
            with writer.lock:  # not under a write in flight
                connection.disconnect()
                if writer.arrivals is not None:
                    writer.arrivals.close()
        return False

    @staticmethod
    def _set_push_handler(connection: Any, handler: Any) -> None:
        """redis-py >= 5.1 calls an invalidation handler, 5.0 one handler for every push."""
        parser = connection._parser
        setter = getattr(parser, "set_invalidation_push_handler", None)
        if setter is None:
            setter = parser.set_push_handler
        setter(handler)

    def _follow_push(self, writer: Writer, generation: int) -> str:
        """Push mode: apply the pushes on the writer connection until something ends the
        session; returns the cause.

        The tracker reads the socket only holding the writer (a write's caller reads it
        otherwise, and applies what it reads: see :meth:`Writer.done`). It pings every
        ``PING_EVERY`` whatever the traffic and reads the answer (applying the pushes before
        it) within ``PONG_WITHIN``; a write holding the writer past a ping's due time plus
        ``PONG_WITHIN`` has its socket shut (it fails) and the session ends.
        """
        connection = writer.connection
        arrivals = writer.arrivals
        assert arrivals is not None  # set before the session began
        next_ping = time.monotonic() + PING_EVERY
        try:
            while not self._stopped.is_set():
                if self.shard.generation != generation:
                    return "master switched"
                if connection.lost:
                    return writer.cause
                now = time.monotonic()
                if now >= next_ping:
                    if writer.lock.acquire(blocking=False):
                        writer.ping_due = False
                        try:
                            cause = self._ping_push(writer)
                            if cause is not None:
                                writer.cause = cause
                                return cause
                        finally:
                            writer.lock.release()
                        next_ping = time.monotonic() + PING_EVERY
                        continue
                    writer.ping_due = True  # the next writes go through the pool meanwhile
                    if now - next_ping > PONG_WITHIN:  # a write held it all that while
                        writer.cause = "tracker ping unanswered"
                        with contextlib.suppress(OSError, AttributeError):
                            # Wakes that write (it reads an end of stream and fails) without
                            # pulling the connection from under it.
                            connection._sock.shutdown(socket.SHUT_RDWR)
                        return writer.cause
                wait = max(0.0, min(next_ping - now, 0.01 if writer.ping_due else 0.1))
                if arrivals.draining:  # left to the tracker (the session's start, a budget)
                    wait = 0.0
                try:
                    ready, _, _ = select.select([connection._sock], [], [], wait)
                except (OSError, ValueError, TypeError):  # a socket closed under us
                    return "tracker connection lost"
                if not ready and not arrivals.draining:
                    continue
                # A write in flight: its caller reads the socket (and applies what it read
                # before it gives the writer back); the tracker looks again once it has.
                writer.released.clear()
                if not writer.lock.acquire(blocking=False):
                    writer.released.wait(wait or 0.01)
                    continue
                try:
                    # Only if something is left: the flag raised by a drain that finds nothing
                    # would refuse the hits right after every write for nothing. The parser
                    # holds nothing unless the flag is up (a drain lowers it only once empty).
                    if arrivals.draining or _readable(connection._sock):
                        writer.drain(0.1)  # what is left stays flagged: the next turn goes on
                finally:
                    writer.lock.release()
            return "stopped"
        finally:
            writer.ping_due = False

    @staticmethod
    def _ping_push(writer: Writer) -> str | None:
        """Holding the writer: ``PING`` and read its answer within ``PONG_WITHIN`` (the pushes
        before it are applied as they are read), then what the parser holds after it; what
        ends the session, or None."""
        connection = writer.connection
        try:
            connection.send_command("PING")
            pong = read_within(connection, connection.read_response)
        except (RedisTimeoutError, TimeoutError):
            connection.disconnect()
            return "tracker ping unanswered"
        except (RedisConnectionError, OSError, redis.ResponseError):
            connection.disconnect()
            return "tracker connection lost"
        if pong not in (b"PONG", "PONG", True):
            connection.disconnect()
            return "tracker connection lost"  # out of step
        writer.drain(0.1)
        return "tracker connection lost" if connection.lost else None

    def _follow(self, connection: Any, writer: Writer, generation: int) -> str:
        """Apply invalidations until something ends the session; returns the cause.

        Both connections are pinged every ``PING_EVERY`` whatever the traffic, and each ping
        must be answered within ``PONG_WITHIN``: a connection silently cut, or an invalidation
        stream that lags that much, ends the session. Nothing here blocks longer than that: the
        invalidation connection reads with ``PONG_WITHIN`` as its socket timeout (a message
        delivered in part, then held, raises), and the writer's ping is sent, then its answer
        read when the socket says it is there, while the tracker goes on reading invalidations.
        """
        index = self.shard.index
        arrivals = writer.arrivals
        assert arrivals is not None  # set before the session began
        now = time.monotonic()
        pinged_at: float | None = None  # our PING on the invalidation connection, unanswered
        next_ping = writer_next = now + PING_EVERY
        writer_pinged_at: float | None = None  # our PING on the writer (we hold its lock)
        writer_busy_until = 0.0
        try:
            while not self._stopped.is_set():
                if self.shard.generation != generation:
                    return "master switched"
                if writer.connection.lost:
                    return writer.cause
                now = time.monotonic()
                watched = [connection._sock]  # redis-py's socket: waited on with the writer's
                if writer_pinged_at is not None or now >= writer_busy_until:
                    watched.append(writer.connection._sock)
                wait = 0.01 if writer.ping_due else 0.1
                try:
                    ready, _, _ = select.select(watched, [], [], wait)
                except (OSError, ValueError, TypeError):  # a socket closed under us
                    return "tracker connection lost"
                if len(ready) > (connection._sock in ready):  # the writer's socket stirred
                    if writer_pinged_at is not None:
                        # Our PONG (the socket's timeout, not read_response's, which
                        # redis-py 5.0 does not take).
                        read_within(writer.connection, writer.connection.read_response)
                        writer_pinged_at = None
                        writer.lock.release()
                    elif not self._check_writer(writer):
                        writer_busy_until = now + 0.01  # a write in flight: its caller reads it
                arrivals.draining = True  # before the socket is read: see Arrivals.pending
                began = time.monotonic()
                while True:
                    if not connection.can_read(timeout=0):
                        arrivals.draining = False  # applied all: what comes next is polled
                        break
                    if time.monotonic() - began >= 0.1:
                        break  # still draining: the next turn goes on
                    reply = connection.read_response()
                    kind = reply[0] if isinstance(reply, list) and reply else None
                    if kind == b"message" and reply[1] == CHANNEL:
                        self.near.invalidate(index, reply[2])
                    elif kind == b"pong":
                        pinged_at = None
                now = time.monotonic()
                if pinged_at is not None and now - pinged_at > PONG_WITHIN:
                    return "tracker ping unanswered"
                if writer_pinged_at is not None and now - writer_pinged_at > PONG_WITHIN:
                    writer.cause = "tracker ping unanswered"
                    return writer.cause
                if pinged_at is None and now >= next_ping:
                    connection.send_command("PING")
                    pinged_at, next_ping = now, now + PING_EVERY
                if writer_pinged_at is None and now >= writer_next:
                    writer_pinged_at = self._ping_writer(writer, now)
                    if writer_pinged_at is not None:
                        writer_next = now + PING_EVERY
                    elif now - writer_next > PONG_WITHIN:  # a write held it all that while
                        writer.cause = "tracker ping unanswered"
                        with contextlib.suppress(OSError, AttributeError):
                            # Wakes that write (it reads an end of stream and fails) without
                            # pulling the connection from under it.
                            writer.connection._sock.shutdown(socket.SHUT_RDWR)
                        return writer.cause
            return "stopped"
        finally:
            writer.ping_due = False
            if writer_pinged_at is not None:
                writer.lock.release()

    @staticmethod
    def _check_writer(writer: Writer) -> bool:
        """The writer's socket is readable: if no write holds it, that is the server closing it
        (or something out of step): either way the writer is lost. False if a write held it."""
        if not writer.lock.acquire(blocking=False):
            return False
        try:
            if writer.connection.can_read(timeout=0):
                writer.connection.disconnect()  # nothing is owed to us on an idle writer
        except (RedisConnectionError, RedisTimeoutError, OSError):
            writer.connection.disconnect()
        finally:
            writer.lock.release()
        return True

    @staticmethod
    def _ping_writer(writer: Writer, now: float) -> float | None:
        """Send a ``PING`` on the writer (keeping it from an idle ``timeout``, and checking it
        answers) and hold the writer until its answer is read; when it was sent, or None if a
        write held the writer (the next writes then leave it to the ping, going through the
        pool, so a stream of writes cannot starve it)."""
        if not writer.lock.acquire(blocking=False):
            writer.ping_due = True
            return None
        writer.ping_due = False
        try:
            writer.connection.send_command("PING")
        except BaseException:
            writer.connection.disconnect()
            writer.lock.release()
            raise
        return now
