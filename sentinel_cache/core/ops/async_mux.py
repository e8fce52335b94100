"""One auto-pipelined connection per shard master per event loop (``ASYNC_MULTIPLEX``).

Why: with a pool, every task in flight holds a connection of its own (up to ``MAX_CONNECTIONS``
per shard per loop) and every call pays a checkout, a write and a read wakeup on it. Here every
task of a loop shares one socket per shard: a call's packed commands are appended to a write
buffer flushed once per loop turn (one ``write`` for every call queued meanwhile), and one
reader (an ``asyncio.Protocol`` feeding the connection's ``hiredis.Reader``) hands each reply
to the call at the head of a FIFO queue, since a server answers in the order it was asked. No
task, no ``wait_for`` and no timer per call: a call waits on one future, woken once all its
replies are in.

:class:`AsyncMuxPool` is the ``connection_pool`` of the loop's master client of a shard. The
runner's round trip (``send``) on it is, once the connection is open, one coroutine on the
connection (:meth:`MuxLink.roundtrip`, via :func:`sender`): no handle, no reply count parsed.
A single-key call's ``execute`` awaits that coroutine itself where ``run`` would send to this
connection at once (:meth:`AsyncShardClients.mux_link`), and enters ``run``'s safety net with
the failure only if it fails. ``get``, ``set`` and the runner's ``keyed`` go further: no
coroutine below their own (:meth:`MuxLink.start`, the call's future, :meth:`MuxLink.finish`).
Every other use (the first call, which connects; ``scatter``'s batches; ``post``) goes through
``get_connection``, which hands out a :class:`MuxCall`, a cheap per-call handle with what the
runner uses of a connection (``send_packed_command``, ``read_response``, ``disconnect``,
``bulk_limit``, ``pack_commands``).

The failover rules, as the pooled lean path's (:class:`~sentinel_cache.core.ops.async_clients.
AsyncLeanShardIO`):

* a reply read after the shard switched master, or after a replica promotion since the call
  was queued, is no acknowledgement (``StaleReplyError``); the connection is closed and the
  calls behind it fail too; a connection to a replaced master is closed at the next checkout;
* a call whose bytes never left (still in the write buffer when the socket died, or queued on a
  connection already closed) fails marked unsent (``lean_rules.mark_unsent``: it may be sent
  again whatever it does); one whose bytes were written fails as a plain connection error;
* ``SOCKET_TIMEOUT`` is per call, counted from when it was queued, under one timer per
  connection armed at the head call's deadline: the head fails alone with redis-py's
  ``TimeoutError``, and since every reply behind it would be out of step, the connection is
  closed and the calls behind it fail as connection errors;
* the reply guard (``oversized``/``overfull``) on every chunk, garbage, ``READONLY`` and a
  reply nobody asked for close the connection;
* a cancelled task's call stays in the queue: its replies are read and dropped, so the others
  stay in step; ``disconnect`` on a handle abandons that call and nothing else (the runner
  calls it after any failure, a cancellation or an error reply included; whenever the shared
  connection itself is out of step it has closed itself already);
* fork safety (a new process starts a new connection) and loop safety (one per loop, kept by
  :class:`~sentinel_cache.core.ops.async_clients.AsyncShardClients`).

What needs a connection of its own keeps the pool (:attr:`AsyncMuxPool.dedicated`, its
connections opened only when used: none for the cache's own calls):
anything a redis-py client method sends (``execute_command``, pipelines, transactions, pub/sub,
blocking commands) through :class:`MuxRedis`. The runner's ``post`` (``CLIENT REPLY SKIP``
before each command) stays on the shared connection: a call's batch is appended whole, so the
skipped replies cannot interleave with another call's. Replicas keep their pools.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sentinel_cache.core.ops.plans import REPLY_SKIP, Command, pack
from sentinel_cache.core.process import PROCESS
from sentinel_cache.core.topology.following import MasterState
from sentinel_cache.core.topology.lean_rules import (
    CLOSED,
    LINE_START,
    MIN_BULK_LIMIT,
    broken,
    mark_unsent,
    overfull,
    oversized,
    socket_failure,
)

try:
    import hiredis
except ImportError:  # pragma: no cover - no link is made without it (the pool serves)
    hiredis = None  # type: ignore[assignment]

logger = logging.getLogger("sentinel_cache")

#: The runner's one round trip on a client (``runner.send``).
Send = Callable[[Any, Sequence[Command]], Awaitable[list[Any]]]

#: What ``CLIENT REPLY SKIP`` looks like packed: it and the command after it have no reply.
_SKIP = b"".join(b"$%d\r\n%s\r\n" % (len(part), part.encode()) for part in REPLY_SKIP)
_SKIP = b"*%d\r\n" % len(REPLY_SKIP) + _SKIP

_SKIP_PARSED = [part.encode() for part in REPLY_SKIP]

#: Write a call at once when nothing is queued or in flight (the loop idle), instead of at the
#: end of the loop turn: one call alone gains a turn; under load calls are batched anyway.
#: Not while other calls woken since the last write may still queue theirs (see
#: :attr:`MuxLink.woken`): the first of them written alone would split every batch in two.
WRITE_AT_ONCE_WHEN_IDLE = True
#: Reads (of up to the transport's 256 KiB each) a flush makes at most to reach what the socket
#: holds before writing (the replies ahead of an end of file).
READ_BEFORE_WRITE = 16


def replies_due(data: Any) -> int:
    """How many replies the packed commands ``data`` (a list of chunks) will get: one per
    command, none for ``CLIENT REPLY SKIP`` and the command after it. Read from the RESP
    headers (a ``find`` and an ``int`` per argument), since the runner hands over bytes."""
    chunk = data[0] if len(data) == 1 else b"".join(data)
    end = len(chunk)
    pos = count = 0
    skipping = 0
    find = chunk.find
    while pos < end:
        if chunk[pos] != 42:  # "*": every command is an array of bulk strings
            raise ValueError(f"not a packed command at byte {pos}")
        if skipping:
            skipping -= 1
        elif chunk.startswith(_SKIP, pos):
            skipping = 1
        else:
            count += 1
        line = find(b"\r\n", pos)
        args = int(chunk[pos + 1 : line])
        pos = line + 2
        for _ in range(args):
            line = find(b"\r\n", pos)
            pos = line + 4 + int(chunk[pos + 1 : line])
    return count


class MuxCall:
    """One call's handle on a shard's shared connection: what the runner uses of a connection.
    Its replies are collected by the connection's reader; ``read_response`` hands them out in
    order, waiting (on one future) only until all of them are in."""

    __slots__ = ("link", "due", "replies", "taken", "waiter", "error", "promotions", "deadline")

    def __init__(
        self,
        link: MuxLink,
        due: int = 0,
        waiter: asyncio.Future[MuxCall] | None = None,
        promotions: int = 0,
    ) -> None:
        self.link = link
        self.due = due
        self.replies: list[Any] = []
        self.taken = 0
        self.waiter = waiter
        self.error: BaseException | None = None
        self.promotions = promotions
        self.deadline = 0.0

    def __repr__(self) -> str:
        return f"<MuxCall due={self.due} read={self.taken} got={len(self.replies)}>"

    @property
    def bulk_limit(self) -> int:
        return self.link.bulk_limit

    def pack_commands(self, commands: Any) -> Any:
        return self.link.connection.pack_commands(commands)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        link = self.link
        if link.closed is not None or link.transport.is_closing():
            # Closed before anything was queued: the command cannot have run.
            raise mark_unsent(RedisConnectionError(CLOSED))
        data = command if type(command) is list else [command]
        self.due = link.due(data)
        self.promotions = link.shard.state.promotions
        link.queue(self, data)
        if link.paused:
            await link.drained()

    async def read_response(
        self, disable_decoding: bool = False, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        replies = self.replies
        taken = self.taken
        if taken == len(replies):
            if self.error is None:
                waiter = self.waiter = self.link.loop.create_future()
                try:
                    await waiter
                finally:
                    self.waiter = None
            if taken == len(replies):
                raise self.error  # type: ignore[misc]
        reply = replies[taken]
        self.taken = taken + 1
        error = self.link.checked(self, reply)
        if error is not None:
            raise error
        return reply

    async def disconnect(self, nowait: bool = False) -> None:
        """Abandon this call: its replies still come, in order, and are dropped by the reader.
        The shared connection closes itself whenever it is out of step."""
        self.waiter = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(self)  # the call itself: what a round trip finishes with


class MuxLink(asyncio.Protocol):
    """A shard master's connection shared by every task of one event loop: the write buffer,
    the calls waiting for replies in order, and the reader that hands each reply to its call.
    Made by redis-py's own connect (handshake, TLS, credentials, the shard's ``INFO`` and
    ``proto-max-bulk-len``), then its transport is handed to this protocol."""

    def __init__(self, pool: AsyncMuxPool, connection: Any, lean: Any) -> None:
        self.pool = pool
        self.connection = connection
        self.shard = pool.shard
        self.loop = asyncio.get_running_loop()
        #: The loop's clock, ``time.monotonic`` itself where the loop's ``time`` is asyncio's
        #: own (its value, without a Python call per call's deadline).
        self.clock: Callable[[], float] = (
            time.monotonic if type(self.loop).time is asyncio.BaseEventLoop.time else self.loop.time
        )
        self.transport: Any = connection._writer.transport
        self.generation: int = connection.generation
        state = self.shard.state
        #: The master's address of that generation: what the safety net is told a failed
        #: direct round trip was sent to (a connection of an older generation is never used).
        self.address: Any = state.address if state.generation == self.generation else None
        self.bulk_limit: int = connection.bulk_limit
        self.timeout: float | None = connection.socket_timeout
        self.reader, self.pending, self.push = lean
        self.calls: deque[MuxCall] = deque()
        self.out: list[Any] = []
        self.unflushed = 0  # calls at the tail of `calls` whose bytes are still in `out`
        self.flushing = False
        #: Calls whose last reply came since the last write: when more than one, their tasks
        #: run in this loop turn and may queue their next calls, to be written together.
        self.woken = 0
        self.paused = False
        self._drained: asyncio.Future[None] | None = None
        self.closed: BaseException | None = None
        self.carry = LINE_START
        self.timer: asyncio.TimerHandle | None = None
        self.pushes: set[asyncio.Task[Any]] = set()
        self.counter = hiredis.Reader()  # counts the commands of a call (due)
        # The selector transport's own read (CPython's; None elsewhere, e.g. uvloop): see _flush.
        self.read_now: Any = getattr(self.transport, "_read_ready", None)
        self.transport.set_protocol(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed is not None else "open"
        return (
            f"<MuxLink shard={self.shard.label} {self.connection.host}:{self.connection.port} "
            f"{state} calls={len(self.calls)} generation={self.generation}>"
        )

    # -- writing ------------------------------------------------------------------------------
    def due(self, data: list[Any]) -> int:
        """:func:`replies_due`, parsed in C (this connection's own ``hiredis.Reader`` reads
        our packed commands as the arrays they are) for a batch up to 1 MiB: a third of the
        cost of the Python walk for a ``GET``, a fifth for a ``SET``."""
        if len(data) != 1 or len(data[0]) > MIN_BULK_LIMIT:
            return replies_due(data)
        counter = self.counter
        counter.feed(data[0])
        count = skipping = 0
        command = counter.gets()
        while command is not False:
            if skipping:
                skipping = 0
            elif command[0] == b"CLIENT" and command == _SKIP_PARSED:
                skipping = 1
            else:
                count += 1
            command = counter.gets()
        if counter.has_data():  # not whole commands: never from pack()
            self.counter = hiredis.Reader()
            raise ValueError("a batch of packed commands ends inside a command")
        return count

    def queue(self, call: MuxCall, data: list[Any]) -> None:
        """Append a call's bytes to the write buffer; written at the end of the loop turn."""
        if call.due:
            if self.timeout is not None:
                call.deadline = self.clock() + self.timeout
                if self.timer is None:
                    self.timer = self.loop.call_at(call.deadline, self._expired)
            calls = self.calls
            if WRITE_AT_ONCE_WHEN_IDLE and not calls and not self.out and self.woken <= 1:
                self.woken = 0
                calls.append(call)
                transport = self.transport
                clean = not transport.get_write_buffer_size()
                transport.writelines(data)
                if clean and transport.is_closing():  # failed at once: see _flush
                    self.unflushed += 1
                return
            calls.append(call)
            self.unflushed += 1
        self.out.extend(data)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flushing = False
        if self.closed is not None:
            return
        if self.read_now is not None and self.connection.idle_readable():
            # Read what the socket holds before writing: the loop may not have run its reader
            # since the node closed the connection (a CLIENT KILL while calls were in flight).
            # Its end of file then fails the calls still in `out` as unsent (resent anew)
            # instead of writing them where they could not be told from calls the node ran.
            for _ in range(READ_BEFORE_WRITE):
                self.read_now()
                if self.closed is not None or not self.connection.idle_readable():
                    break
            if self.closed is not None:
                return
        out, self.out = self.out, []
        flushed, self.unflushed = self.unflushed, 0
        self.woken = 0  # their tasks ran: what they queued is in this write
        transport = self.transport
        clean = not transport.get_write_buffer_size()
        transport.writelines(out)
        if clean and transport.is_closing():
            # The send failed at once (a reset, a broken pipe): nothing of it left, so these
            # calls fail as never sent when the loss is reported (connection_lost, soon).
            self.unflushed = flushed

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drained(self) -> None:
        """Wait (``SOCKET_TIMEOUT`` at most) until the transport took its buffer."""
        if self._drained is None:
            self._drained = self.loop.create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._drained), self.timeout)
        except asyncio.TimeoutError:
            raise RedisTimeoutError("Timeout writing to socket") from None

    # -- reading ------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed is not None:
            return
        hostile, self.carry = oversized(data, len(data), self.carry, self.bulk_limit)
        if hostile is not None:
            self.fail(self._protocol_error(hostile))
            return
        reader, pending, push, calls = self.reader, self.pending, self.push, self.calls
        reader.feed(data)
        woken = self.woken
        try:
            reply = reader.gets()
            while reply is not pending:
                if push is not None and isinstance(reply, push):
                    self._pushed(reply)
                elif not calls:
                    self.fail(self._protocol_error("sent a reply nobody asked for"))
                    return
                else:
                    call = calls[0]
                    replies = call.replies
                    replies.append(reply)
                    if len(replies) == call.due:
                        calls.popleft()
                        woken += 1
                        waiter = call.waiter  # call.wake(), inline: once per call
                        if waiter is not None and not waiter.done():
                            waiter.set_result(call)
                reply = reader.gets()
        except InvalidResponse as exc:
            self.fail(self._protocol_error(f"sent bytes that are no reply ({exc})"))
            return
        finally:
            self.woken = woken
        if reader.len() > MIN_BULK_LIMIT:
            hostile = overfull(reader.len(), self.bulk_limit)
            if hostile is not None:
                self.fail(self._protocol_error(hostile))

    def _pushed(self, reply: Any) -> None:
        """A RESP3 push: handed to redis-py's handler, as its parser does."""
        task = self.loop.create_task(
            self.connection._parser.handle_push_response(reply)  # redis-py's parser
        )
        self.pushes.add(task)
        task.add_done_callback(self.pushes.discard)

    def eof_received(self) -> bool:
        self.fail(lambda: RedisConnectionError(CLOSED))
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.closed is not None:
            return
        if exc is None:
            self.fail(lambda: RedisConnectionError(CLOSED))
            return
        host = self.connection.host_error()
        self.fail(
            lambda: socket_failure(
                exc, writing=False, timed_out=False, host=host, timeout_from=host
            )
        )

    def _expired(self) -> None:
        """The one timer: fail the head call if its deadline passed, else re-arm for it."""
        self.timer = None
        calls = self.calls
        if not calls or self.closed is not None:
            return
        head = calls[0]
        if head.deadline > self.loop.time():
            self.timer = self.loop.call_at(head.deadline, self._expired)
            return
        host = self.connection.host_error()
        timed_out = RedisTimeoutError(f"Timeout reading from {host}")
        self.fail(
            self.dropped(f"a call before it timed out after {self.timeout}s"),
            first=(head, timed_out),
        )

    # -- failing ------------------------------------------------------------------------------
    def dropped(self, why: str) -> Any:
        """An error factory for the calls behind one that failed: a connection error."""
        host = self.connection.host_error()

        def error() -> BaseException:
            return RedisConnectionError(
                f"Error while reading from {host}: the shared connection was dropped ({why})"
            )

        return error

    def _protocol_error(self, what: str) -> Any:
        return lambda: self.connection.protocol_error(what)

    def untrusted(self, call: MuxCall) -> BaseException | None:
        """The ``StaleReplyError`` for ``call``'s reply read now (the shard switched away from
        this connection's master, or promoted a replica since the call was queued), else None.
        """
        return self.connection.stale_reply(call.promotions)

    def fail(
        self,
        error: Any,
        *,
        first: tuple[MuxCall, BaseException] | None = None,
        stale: bool = False,
    ) -> None:
        """Close the connection and fail every call waiting on it: ``first`` (a call and its
        own error) aside, a call whose bytes were written gets ``error()`` (or, ``stale``, its
        own stale-reply error), one still in the write buffer the same, marked unsent."""
        if self.closed is not None:
            return
        self.closed = error()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        calls, self.calls = self.calls, deque()
        written = len(calls) - self.unflushed
        self.out = []
        self.unflushed = 0
        for index, call in enumerate(calls):
            if first is not None and call is first[0]:
                exc = first[1]
            elif index >= written:
                exc = mark_unsent(RedisConnectionError(CLOSED))
            elif stale:
                exc = self.untrusted(call) or error()
            else:
                exc = error()
            call.error = exc
            call.wake()
        if first is not None and first[0].error is None:
            first[0].error = first[1]
        self.transport.abort()
        self.connection.forget_socket()
        self.resume_writing()

    def close(self) -> None:
        """Close it (a checkout found the shard switched, or the pool was closed)."""
        self.fail(self.dropped("closed by the client"))

    def checked(self, call: MuxCall, reply: Any) -> ResponseError | None:
        """The rules every reply of ``call`` passes, whichever way it is read: the reply guard,
        ``READONLY`` (the connection dropped), no acknowledgement from a replaced master (each
        raised here); an error reply is returned, for the caller to raise."""
        kind = type(reply)
        if kind is not bytes:
            if (failure := broken(reply)) is not None:
                self.fail(lambda: RedisConnectionError(f"{failure}"), first=(call, failure))
                raise failure
            if kind is not list and isinstance(reply, ResponseError):
                if isinstance(reply, ReadOnlyError):  # no master any more: drop the socket
                    self.fail(self.dropped("the node answered READONLY"), first=(call, reply))
                    raise reply
                return reply
        state = self.shard.state
        if self.generation != state.generation or call.promotions != state.promotions:
            untrusted = self.untrusted(call)  # no acknowledgement from a replaced master
            if untrusted is not None:
                self.fail(self.dropped("the shard switched"), first=(call, untrusted), stale=True)
                raise untrusted
        return None

    # -- the runner's round trip, in one coroutine ---------------------------------------------
    def start(self, commands: Sequence[Command], promotions: int | None = None) -> MuxCall:
        """A round trip's first half, no coroutine: ``commands`` packed and queued as one call
        whose ``waiter`` is resolved (with the call) once every reply is in, or by ``fail``.
        ``promotions``: the shard's count the caller just read (else read here), what the
        call's replies are checked against. Raises, marked unsent, if the connection is
        closing: nothing was queued."""
        data = pack(self.connection, commands)
        if self.transport.is_closing():  # closed before anything was queued: never ran
            raise mark_unsent(RedisConnectionError(CLOSED))
        if promotions is None:
            promotions = self.shard.state.promotions
        call = MuxCall(self, len(commands), self.loop.create_future(), promotions)
        self.queue(call, data)
        return call

    def finish(self, call: MuxCall) -> list[Any]:
        """A round trip's second half, once ``call``'s waiter is done: its replies, each
        through :meth:`checked` (the reply guard, ``READONLY``, the stale-reply check), the
        first error reply raised after the others were checked; ``call``'s own error if the
        connection failed before all its replies came."""
        replies = call.replies
        if len(replies) == 1 == call.due:  # one command: checked inline when plain data
            reply = replies[0]
            if type(reply) is bytes or reply is None or type(reply) is int:
                state = self.shard.state
                if self.generation == state.generation and call.promotions == state.promotions:
                    return replies
            refused = self.checked(call, reply)
            if refused is not None:
                raise refused
            return replies
        error: ResponseError | None = None
        for reply in replies:  # every reply checked; the first error reply raised after
            found = self.checked(call, reply)
            error = error or found
        if len(replies) != call.due:  # failed before all its replies came
            raise call.error  # type: ignore[misc]
        if error is not None:
            raise error
        return replies

    async def roundtrip(self, commands: Sequence[Command]) -> list[Any]:
        """What the runner's ``send`` does on a :class:`MuxCall` (pack, queue, read every reply,
        an error reply raised after the others), in one coroutine instead of five: the
        checkout, ``send_packed_command``, a ``read_response`` per reply and the release are
        one call's work here. The reply count is the number of commands (``send`` never sends
        ``CLIENT REPLY SKIP``), not parsed from the bytes. Every rule of ``read_response``
        holds, reply by reply: the reply guard, ``READONLY``, the stale-reply check
        (:meth:`start`, then :meth:`finish`)."""
        call = self.start(commands)
        if self.paused:
            await self.drained()
        # woken once every reply is in, or by fail(): never left pending
        return self.finish(await call.waiter)  # type: ignore[misc]


class AsyncMuxPool:
    """The pool-like ``connection_pool`` of a shard master's client in one event loop with
    ``ASYNC_MULTIPLEX``: ``get_connection`` hands out a :class:`MuxCall` on the one shared
    connection (connecting it first if needed), ``release`` does nothing. Where hiredis is
    missing (or a health check interval, raw replies... make the lean path refuse), it hands
    out the dedicated pool's connections instead: with a warning if the user asked for the mux
    (``explicit``), quietly (a debug line) if it was only the default."""

    def __init__(self, dedicated: Any, shard: Any, explicit: bool = True) -> None:
        self.dedicated = dedicated
        self.shard = shard
        self.explicit = explicit
        self.link: MuxLink | None = None
        self.pid = PROCESS.pid
        self._connecting: asyncio.Task[MuxLink | None] | None = None
        self.multiplexed = True  # False once the lean path was refused: the dedicated pool
        self.connection_kwargs = dedicated.connection_kwargs

    def __repr__(self) -> str:
        return f"<AsyncMuxPool shard={self.shard.label} link={self.link!r}>"

    def get_encoder(self) -> Any:
        return self.dedicated.get_encoder()

    def ready(self, state: MasterState | None = None) -> MuxLink | None:
        """The shared connection if a call may be queued on it now without connecting: open,
        to the shard's master of the moment (``state``: the caller's look at the shard, else
        one taken here), this process's; else None."""
        link = self.link
        if (
            link is not None
            and link.closed is None
            and link.generation == (state or self.shard.state).generation
            and self.pid == PROCESS.pid
            # idle: the node may have closed it (a kill) unseen by the loop yet; looked at
            # before anything is written, as the pool's checkout does
            and (link.calls or link.out or not link.connection.idle_readable())
        ):
            return link
        return None

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        link = self.ready()
        if link is not None:
            return MuxCall(link)
        if not self.multiplexed:
            return await self.dedicated.get_connection(command_name, *keys, **options)
        link = await self._open()
        if link is None:
            return await self.dedicated.get_connection(command_name, *keys, **options)
        return MuxCall(link)

    async def _open(self) -> MuxLink | None:
        """The shared connection, connected anew (by one task; the others wait for it)."""
        if self.pid != PROCESS.pid:  # forked: the parent's socket is not ours to touch
            self.pid, self.link, self._connecting = PROCESS.pid, None, None
        link = self.link
        if link is not None and link.closed is None:
            if link.generation == self.shard.state.generation and (
                link.calls or link.out or not link.connection.idle_readable()
            ):
                return link  # another task opened it while this one waited
            link.close()  # a replaced master, or closed by the node while idle
        self.link = None
        task = self._connecting
        if task is None:
            task = self._connecting = asyncio.get_running_loop().create_task(self._connect())
            task.add_done_callback(self._connected)
        return await asyncio.shield(task)

    def _connected(self, task: asyncio.Task[MuxLink | None]) -> None:
        if self._connecting is task:
            self._connecting = None
        if not task.cancelled() and task.exception() is None:
            self.link = task.result()

    async def _connect(self) -> MuxLink | None:
        dedicated = self.dedicated
        connection = dedicated.connection_class(**dedicated.connection_kwargs)
        await connection.connect()
        lean = connection.lean_state()
        if lean is None or not connection.stream_empty():
            await connection.disconnect()
            self.multiplexed = False
            logger.log(
                logging.WARNING if self.explicit else logging.DEBUG,
                "shard %s: ASYNC_MULTIPLEX needs hiredis and no HEALTH_CHECK_INTERVAL; "
                "this shard's asyncio calls use the connection pool",
                self.shard.label,
            )
            return None
        return MuxLink(self, connection, lean)

    async def release(self, connection: Any) -> None:
        if type(connection) is not MuxCall:
            await self.dedicated.release(connection)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """Close the shared connection (and the dedicated pool's). Without
        ``inuse_connections`` (the runner's ``reconnected``, after the node closed a
        connection) only if no call is pending on it: a connection with calls in flight was
        opened after that close, by another call's resend."""
        link = self.link
        if link is not None and (inuse_connections or not link.calls):
            link.close()
            self.link = None
        await self.dedicated.disconnect(inuse_connections=inuse_connections)


def sender(send: Send) -> Send:
    """The runner's ``send`` with the multiplexed round trip (:meth:`MuxLink.roundtrip`) where
    the client is a shard master's :class:`MuxRedis` whose connection is ready; ``send`` itself
    otherwise (a replica, the dedicated pool, a connection to open or reopen: its checkout's
    rules apply, a failed connect marked unsent)."""

    def mux_send(client: Any, commands: Sequence[Command]) -> Awaitable[list[Any]]:
        # Not a coroutine itself: the runner awaits the one it returns (a frame less per call).
        pool = client.connection_pool
        if type(pool) is AsyncMuxPool:
            link = pool.ready()
            if link is not None:
                return link.roundtrip(commands)
        return send(client, commands)

    return mux_send


class MuxRedis(redis.asyncio.Redis):
    """A shard master's client with ``ASYNC_MULTIPLEX``: its ``connection_pool`` is the
    :class:`AsyncMuxPool` (what the runner uses), while whatever redis-py's own methods send
    (commands, pipelines, transactions, pub/sub, blocking commands) goes to the dedicated pool:
    they rely on a connection's state or hold it."""

    def __init__(self, pool: AsyncMuxPool) -> None:
        super().__init__(connection_pool=pool.dedicated)
        self.own = redis.asyncio.Redis(connection_pool=pool.dedicated)
        self.connection_pool = pool  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<MuxRedis {self.connection_pool!r}>"

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        return await self.own.execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return self.own.pipeline(transaction, shard_hint)

    def pubsub(self, **kwargs: Any) -> Any:
        return self.own.pubsub(**kwargs)

    def monitor(self) -> Any:
        return self.own.monitor()

    def client(self) -> Any:
        return self.own.client()
