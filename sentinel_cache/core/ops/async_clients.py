"""The asyncio side's own connections to the sharded core, on ``redis.asyncio``.

The sync core (:class:`~sentinel_cache.core.topology.sharded_pool.ShardedSentinelPool`) owns everything that is
shared: discovery, the sentinel listeners, each shard's current master and generation, and the
write fences. This module adds only what asyncio needs of its own, because asyncio connections
are bound to the event loop that opened them: per core and per running loop, one
``redis.asyncio`` client per shard (:class:`AsyncShardClients`, shared by every cache object of
the core). Its connections look up ``Shard.current()`` whenever they are checked out and
reconnect when the shard's generation moved, exactly like the sync ``ShardConnection``; so a
switch seen by the sync side is followed here without any coordination and without a thread
hop per call.

A multi-key call checks out, writes to and reads from one connection per shard touched, so the
per-call machinery of redis.asyncio's connections and pools is paid per shard: the masters'
connections take a lean path for it (:class:`AsyncLeanIO`, :class:`AsyncShardPool`,
:class:`QuietReleases`) with redis-py's failures and rules, and redis-py's own path for
anything else (``python -m benchmarks.async_many`` measures the difference).

Only rare, blocking work goes to a thread: the very first discovery of a core nobody has used
yet, and the safety-net re-resolution after a connection error or a READONLY reply.

Per-loop clients are released when the loop shuts down its async generators (``asyncio.run``
and asgiref's ``async_to_sync`` both do), or by ``AsyncCacheClient.aclose`` in that loop
(:mod:`sentinel_cache.core.ops.aio`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import select
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
from redis.asyncio.connection import async_timeout
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ReadOnlyError, ResponseError

from sentinel_cache.core.config import (
    Address,
    PoolConfig,
    connection_class_and_kwargs,
    connection_parameters,
)
from sentinel_cache.core.ops.async_mux import AsyncMuxPool, MuxRedis
from sentinel_cache.core.ops.deadlines import ReadDeadlines, read_deadlines
from sentinel_cache.core.process import PROCESS
from sentinel_cache.core.topology._async.connection import AsyncShardConnectionMixin
from sentinel_cache.core.topology.fair_pool import AsyncFairBlockingConnectionPool
from sentinel_cache.core.topology.following import MasterState
from sentinel_cache.core.topology.lean_rules import (
    CLOSED,
    MIN_BULK_LIMIT,
    broken,
    lean_reader,
    mark_unsent,
    overfull,
    oversized,
    socket_failure,
)
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

logger = logging.getLogger("sentinel_cache")

AsyncRedis = redis.asyncio.Redis


# The sync side validated the options; a few (OCSP stapling, command_packer) exist only there.
ASYNC_CONNECTION_PARAMETERS = connection_parameters(
    redis.asyncio.connection.Connection, redis.asyncio.connection.SSLConnection
) - {"host", "port"}


try:  # redis-py >= 5.1: a pool tells its dispatcher of every connection released
    from redis.event import AsyncAfterConnectionReleasedEvent, EventDispatcher
except ImportError:  # pragma: no cover - older redis-py
    EventDispatcher = None  # type: ignore[assignment, misc]

_READ_SIZE = 65536
_POLL_IN = select.POLLIN if hasattr(select, "poll") else 0
#: Below this many buffered bytes no reply item is looked at (``overfull``'s bound is larger).
_OVERFULL_FROM = MIN_BULK_LIMIT
#: The ``asyncio.StreamReader`` internals the lean read uses (Python 3.10 to 3.13 have them);
#: a connection whose stream lacks one is left to redis-py's own path.
STREAM_INTERNALS = ("_buffer", "_exception", "_paused", "_eof", "_maybe_resume_transport")


class AsyncLeanIO(redis.asyncio.connection.AbstractConnection):
    """What the lean path of :class:`AsyncLeanShardIO` needs of a redis.asyncio connection
    that parses with ``hiredis``: the parser's reader, told apart from redis-py's own path, and
    redis-py's failures for what went wrong on the socket."""

    # What _lean found for the parser's hiredis reader of the moment (a new one per connect).
    _lean_state: tuple[Any, Any, Any] | None = None

    def _lean(self) -> tuple[Any, Any, Any] | None:
        """The connection's hiredis reader, its "no reply yet" value and the RESP3 push type
        (None for RESP2) if the lean path applies, else None."""
        reader: Any = getattr(self._parser, "_reader", None)
        state = self._lean_state
        if state is None or state[0] is not reader:  # connected again: a new reader
            state = lean_reader(self._parser, self.protocol, self.health_check_interval)
            if state is not None and not all(
                hasattr(self._reader, name) for name in STREAM_INTERNALS
            ):
                state = None  # an asyncio without them: redis-py's own path reads
            self._lean_state = state
        return None if state is None or self._writer is None else state

    async def _failed(self, exc: BaseException, writing: bool) -> BaseException:
        """Drop the socket after ``exc`` (whatever was under way leaves it out of step) and
        return redis-py's error for it, as redis-py's own path raises it."""
        await self.disconnect(nowait=True)
        timed_out = isinstance(exc, asyncio.TimeoutError)
        host = "" if writing else self._host_error()
        return socket_failure(
            exc, writing=writing, timed_out=timed_out, host=host, timeout_from=host
        )


class AsyncLeanShardIO(AsyncShardConnectionMixin, AsyncLeanIO):
    """A shard's connection (:mod:`~sentinel_cache.core.topology._async.connection`) on the
    lean path: redis.asyncio's ``send_packed_command`` and ``read_response`` without their
    per-call machinery, the shard's rules (no acknowledgement from a replaced master, READONLY
    drops the socket) in the same call.

    Why: redis.asyncio wraps every write in ``asyncio.wait_for`` (a task per write before
    Python 3.12) and every read in a timeout (a timer per read), and each layer is a coroutine
    more. A batch per shard pays all of it per shard touched: most of an ``aget_many``'s CPU.
    Here a write the transport takes whole waits for nothing, a reply already arrived is fed
    from the stream's buffer to the parser in place, and only a read that must wait for its
    reply is given its socket timeout, under the loop's one timer (:class:`ReadDeadlines`).
    Failures are redis-py's: the same exceptions, the socket dropped; a RESP3 push is handed to
    redis-py's handler, as its parser does. Anything else (a health check interval, a per-read
    timeout, raw replies, no hiredis) takes redis-py's own path, through the shard's rules of
    the mixin.
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        writer = self._writer
        state = self._lean_state
        if state is None or state[0] is not self._parser._reader:  # type: ignore[attr-defined]
            state = self._lean()  # connected again (or never looked): a new reader
        if type(command) is not list or writer is None or state is None:
            await super().send_packed_command(command, check_health)
            return
        self._sent_promotions = self._shard.state.promotions  # ShardBound._note_sent
        try:
            transport = writer.transport
            if transport.is_closing() or self._reader._eof:  # type: ignore[union-attr]
                # Closed before anything was written: the command cannot have run.
                raise mark_unsent(RedisConnectionError(CLOSED))
            if len(command) == 1:
                transport.write(command[0])
            else:
                transport.writelines(command)
            # Not all taken, or the connection is going (a write to it is dropped silently):
            # wait for the drain, which raises in that case, as redis-py always does.
            if transport.get_write_buffer_size() or transport.is_closing():
                await asyncio.wait_for(writer.drain(), self.socket_timeout)
        except BaseException as exc:
            raise await self._failed(exc, writing=True)  # noqa: B904 - _failed chains it

    async def read_response(
        self, disable_decoding: bool = False, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        state = self._lean_state
        if state is None or state[0] is not self._parser._reader:  # type: ignore[attr-defined]
            state = self._lean()
        stream = self._reader
        if state is None or stream is None or disable_decoding or timeout is not None or kwargs:
            return await super().read_response(disable_decoding, timeout, **kwargs)
        parser, pending, push = state
        try:
            response = parser.gets()
            while True:
                while response is pending:
                    buffer = stream._buffer  # type: ignore[attr-defined]
                    if buffer and stream._exception is None:  # type: ignore[attr-defined]
                        # arrived: taken as stream.read() would, without a coroutine or a copy;
                        # the reply guard first: no header declaring a huge size is fed
                        hostile, self._carry = oversized(
                            buffer, len(buffer), self._carry, self.bulk_limit
                        )
                        if hostile is not None:
                            raise self.protocol_error(hostile)
                        parser.feed(buffer)
                        buffer.clear()
                        if stream._paused:  # type: ignore[attr-defined]
                            stream._maybe_resume_transport()  # type: ignore[attr-defined]
                        response = parser.gets()
                        if response is pending and parser.len() > _OVERFULL_FROM:
                            self._overfull(parser)
                        continue
                    limit = self.socket_timeout
                    deadlines = self._deadlines or self._loop_deadlines()
                    task = None if limit is None else deadlines.enter(limit)
                    if task is None:  # no timeout, or outside a task: under a timer of its own
                        async with async_timeout(limit):
                            data = await stream.read(_READ_SIZE)
                    else:  # under the loop's one timer (ReadDeadlines)
                        try:
                            data = await stream.read(_READ_SIZE)
                        except asyncio.CancelledError:
                            if deadlines.timed_out(task):
                                raise asyncio.TimeoutError from None
                            raise
                        finally:
                            deadlines.waiting.pop(task, None)
                    if not data:
                        raise RedisConnectionError(CLOSED)
                    hostile, self._carry = oversized(data, len(data), self._carry, self.bulk_limit)
                    if hostile is not None:
                        raise self.protocol_error(hostile)
                    parser.feed(data)
                    response = parser.gets()
                    if response is pending and parser.len() > _OVERFULL_FROM:
                        self._overfull(parser)
                if push is None or not isinstance(response, push):
                    break
                await self._parser.handle_push_response(response)  # type: ignore[attr-defined]
                response = parser.gets()
            kind = type(response)
            if kind is not bytes and (failure := broken(response)) is not None:
                raise failure
        except InvalidResponse as exc:  # garbage: the socket is out of step
            await self.disconnect(nowait=True)
            raise self.protocol_error(f"sent bytes that are no reply ({exc})") from exc
        except BaseException as exc:
            raise await self._failed(exc, writing=False)  # noqa: B904 - _failed chains it
        if kind is not bytes and kind is not list and isinstance(response, ResponseError):
            if isinstance(response, ReadOnlyError):  # no master: see the mixin
                await self.disconnect()
            raise response from None
        shard = self._shard.state
        if self._generation != shard.generation or self._sent_promotions != shard.promotions:
            untrusted = self._untrusted_reply()  # no acknowledgement from a replaced master
            await self.disconnect()
            raise untrusted  # type: ignore[misc]
        return response

    def _overfull(self, parser: Any) -> None:
        """Raise if the reply item the parser waits for is larger than the master can hold."""
        hostile = overfull(parser.len(), self.bulk_limit)
        if hostile is not None:
            raise self.protocol_error(hostile)

    # -- what the multiplexed connection (core/ops/async_mux.py) asks of the one it took over --
    @property
    def generation(self) -> int:
        """The shard's address generation this connection was made for."""
        return self._generation

    def lean_state(self) -> tuple[Any, Any, Any] | None:
        """The connection's hiredis reader, its "no reply yet" value and the RESP3 push type,
        if the lean path applies (else None): what a multiplexed connection reads with."""
        return self._lean()

    def stream_empty(self) -> bool:
        """Nothing read from the socket is left unparsed (true after the handshake)."""
        stream = self._reader
        return stream is not None and not stream._buffer  # type: ignore[attr-defined]

    def stale_reply(self, promotions: int) -> Any:
        """The ``StaleReplyError`` for a reply to a command sent at ``promotions``, or None if
        such a reply can be trusted (``ShardBound``'s rule)."""
        self._sent_promotions = promotions
        return self._untrusted_reply()

    def host_error(self) -> str:
        """``host:port``, as redis-py names the node in its errors."""
        return self._host_error()

    def forget_socket(self) -> None:
        """Drop the streams of a socket another protocol took over and closed."""
        self._reader = None
        self._writer = None
        self._parser.on_disconnect()

    # The running loop's ReadDeadlines (a connection lives in the loop of its pool).
    _deadlines: ReadDeadlines | None = None

    def _loop_deadlines(self) -> ReadDeadlines:
        self._deadlines = read_deadlines(asyncio.get_running_loop())
        return self._deadlines

    async def connect(self) -> None:
        """Every checkout connects: nothing to do while connected to the shard's current
        master, without redis-py's retry machinery around finding that out."""
        if self._reader is None or self._writer is None or self._stale():
            await super().connect()

    def ready_to_send(self) -> bool:
        """Connected to the shard's current master with nothing unread: what the pool's check
        at every checkout finds out (redis-py's ``ensure_connection``), in one call. False
        means "ask redis-py's check", not "unusable"."""
        state, stream, parser = self._lean_state, self._reader, self._parser
        if state is None or self._writer is None or state[0] is not parser._reader:  # type: ignore[attr-defined]
            state = self._lean()
        if (
            state is None
            or stream is None
            or not parser._connected  # type: ignore[attr-defined]
            or self._generation != self._shard.state.generation  # ShardBound._stale
        ):
            return False
        # stream.at_eof() is "_eof and not _buffer": with _buffer asked too, _eof says it
        if stream._buffer or stream._eof or state[0].has_data():  # type: ignore[attr-defined]
            return False
        return not self.idle_readable()

    # (the writer, a poller registered for its socket, or None without select.poll)
    _poll_for: tuple[Any, Any] | None = None

    def idle_readable(self) -> bool:
        """Whether the socket of this idle connection has something the event loop has not
        read yet: an end of file or a reset (the node closed it: a ``CLIENT KILL``, a restart)
        or bytes out of step. The loop learns it only when it next runs, so without this look a
        call right after a kill was written to a closed connection and could not tell whether
        the node ran it; with it the connection is replaced before anything is sent. One
        ``poll`` per checkout, as the sync pool's (:meth:`LeanShardIO.ready_to_send`)."""
        writer = self._writer
        if writer is None:
            return False
        found = self._poll_for
        if found is None or found[0] is not writer:
            sock = writer.transport.get_extra_info("socket")
            poller = None
            if _POLL_IN and sock is not None:
                poller = select.poll()
                poller.register(sock.fileno(), _POLL_IN)
            found = self._poll_for = (writer, poller)
        return found[1] is not None and bool(found[1].poll(0))


class AsyncShardPool(AsyncFairBlockingConnectionPool):
    """The pool of a shard's master for one event loop: the fair pool, whose checkout skips
    redis-py's connection check for a connection that is :meth:`~AsyncLeanShardIO.ready_to_send`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A release nobody need hear of (see QuietReleases) hands the connection on at once.
        self._quiet = EventDispatcher is not None and (
            type(getattr(self, "_event_dispatcher", None)) is QuietReleases
        )

    async def ensure_connection(self, connection: Any) -> None:
        if not connection.ready_to_send():
            await self._renew_if_closed(connection)
            await super().ensure_connection(connection)

    @staticmethod
    async def _renew_if_closed(connection: Any) -> None:
        """Drop the socket of a connection the node closed while it idled
        (:meth:`AsyncLeanShardIO.idle_readable`), which redis-py's check cannot see until the
        loop has run: the check then connects anew, and nothing was sent on the closed one."""
        if connection.idle_readable():
            await connection.disconnect()

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """The fair pool's checkout; an idle connection ready to send is handed out at once
        (idle ones exist only while nobody waits, so this never jumps the queue)."""
        ledger = self._ledger
        if ledger.idle and self.pid == PROCESS.pid:
            connection = ledger.take()
            if connection.ready_to_send():
                return connection
            try:
                await self._renew_if_closed(connection)
                await super().ensure_connection(connection)
            except BaseException:
                await self._discard(connection)
                raise
            return connection
        return await super().get_connection(command_name, *keys, **options)

    async def release(self, connection: Any) -> None:
        """The fair pool's release; one with nothing to re-authenticate or reconnect for
        (the usual case) is handed on without announcing it."""
        ledger = self._ledger
        if (
            self._quiet
            and connection in ledger.checked_out
            and getattr(connection, "_re_auth_token", None) is None
            and not getattr(connection, "_should_reconnect", False)
        ):
            ledger.give_back(connection)
            return
        await super().release(connection)


class AsyncLeanShardConnection(AsyncLeanShardIO, redis.asyncio.connection.Connection):
    """The asyncio core's connection to a shard's master."""


class AsyncLeanShardSSLConnection(AsyncLeanShardIO, redis.asyncio.connection.SSLConnection):
    """The TLS flavour of :class:`AsyncLeanShardConnection`."""


_UNKNOWN: Any = object()

if EventDispatcher is not None:

    class QuietReleases(EventDispatcher):
        """A pool's event dispatcher: redis-py's, except that a released connection with no new
        token to re-authenticate with is not announced. The event's one listener would find
        nothing to do, after taking an ``asyncio.Lock``: on every release of every shard."""

        async def dispatch_async(self, event: object) -> None:
            if type(event) is AsyncAfterConnectionReleasedEvent:
                connection = event.connection
                if getattr(connection, "_re_auth_token", _UNKNOWN) is None:
                    return
            await super().dispatch_async(event)


class _LoopState:
    """One event loop's clients: a master client per shard and a client per replica address."""

    __slots__ = ("masters", "muxes", "replicas", "guard", "__weakref__")

    def __init__(self) -> None:
        self.masters: dict[int, AsyncRedis] = {}
        #: The masters' shared connections' pools (``ASYNC_MULTIPLEX``), by shard index.
        self.muxes: dict[int, AsyncMuxPool] = {}
        self.replicas: dict[Address, AsyncRedis] = {}
        self.guard: Any = None

    async def aclose(self) -> None:
        clients = [*self.masters.values(), *self.replicas.values()]
        self.masters = {}
        self.muxes = {}
        self.replicas = {}
        results = await asyncio.gather(
            *(client.connection_pool.disconnect() for client in clients), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception):
                logger.debug("closing an asyncio connection failed: %r", result)


class AsyncShardClients:
    """One core's asyncio clients: per running event loop, a client per shard master (and per
    replica address). Shared by every :class:`AsyncCacheClient` of the core, because Django
    builds a cache object per request under ASGI: per-object clients would mean new
    connections for every request."""

    def __init__(self, config: PoolConfig) -> None:
        self._max_connections = config.max_connections
        # ASYNC_MULTIPLEX: the masters' calls share one connection per shard per loop; the pool
        # stays for what needs a connection of its own, and serves every call where the lean
        # path is refused (see async_mux). Its connections are opened only when used.
        self._multiplex = config.async_multiplex
        self._multiplex_explicit = config.async_multiplex_explicit
        #: Whether the masters' clients are multiplexed (``ASYNC_MULTIPLEX``).
        self.multiplexed: bool = config.async_multiplex
        self._pool_timeout = config.pool_timeout
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        # The loop that asked last and its state: found without a weak reference made per call.
        # Forgotten whenever a state leaves _loops, so a closed state is never handed out.
        self._last: tuple[asyncio.AbstractEventLoop, _LoopState] | None = None
        self._replica_turn = itertools.count()
        sync_class, kwargs = connection_class_and_kwargs(config.connection_options())
        if config.health_check_interval:
            kwargs.setdefault("health_check_interval", config.health_check_interval)
        dropped = sorted(set(kwargs) - ASYNC_CONNECTION_PARAMETERS)
        if dropped:
            logger.warning("redis.asyncio does not support %s; the async API ignores them", dropped)
        self._kwargs = {k: v for k, v in kwargs.items() if k in ASYNC_CONNECTION_PARAMETERS}
        self._quiet = EventDispatcher is not None and "event_dispatcher" in (
            ASYNC_CONNECTION_PARAMETERS - set(self._kwargs)
        )
        self._ssl = issubclass(sync_class, redis.connection.SSLConnection)

    def __repr__(self) -> str:
        return f"<AsyncShardClients loops={len(self._loops)}>"

    @property
    def loop_count(self) -> int:
        """Event loops holding connections right now (for tests and status)."""
        return len(self._loops)

    async def state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = await self._new_state(loop)
        return state

    async def _new_state(self, loop: asyncio.AbstractEventLoop) -> _LoopState:
        with self._lock:
            for other in [other for other in self._loops if other.is_closed()]:
                # Closed without shutting down its async generators: nothing can be awaited.
                self._loops.pop(other, None)
                self._last = None
            state = self._loops.get(loop)
            if state is not None:
                return state
            state = self._loops[loop] = _LoopState()
        # An async generator is finalized by the loop's shutdown_asyncgens(), while the loop
        # still runs: the one moment the loop's sockets can be closed cleanly.
        state.guard = self._guard(weakref.ref(loop), state)
        await state.guard.__anext__()
        return state

    async def _guard(
        self, loop_ref: weakref.ref[asyncio.AbstractEventLoop], state: _LoopState
    ) -> AsyncIterator[None]:
        try:
            yield
        finally:
            loop = loop_ref()
            with self._lock:
                if loop is not None and self._loops.get(loop) is state:
                    del self._loops[loop]
                self._last = None
            await state.aclose()

    async def aclose(self) -> None:
        """Close the running loop's connections; they are reopened on next use."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._loops.pop(loop, None)
            self._last = None
        if state is not None:
            guard, state.guard = state.guard, None
            await state.aclose()
            if guard is not None:
                await guard.aclose()

    def close_all(self) -> None:
        """Close every event loop's connections (the core was closed): each still running loop
        is asked to close its own, since asyncio sockets belong to their loop."""
        with self._lock:
            states = list(self._loops.items())
            self._loops.clear()
            self._last = None
        for loop, state in states:
            if loop.is_closed():
                continue
            try:
                loop.call_soon_threadsafe(_spawn, loop, state.aclose())
            except RuntimeError:  # closed meanwhile: its sockets went with it
                continue

    def _pool_kwargs(self) -> dict[str, Any]:
        """A new pool's connection options (with its own :class:`QuietReleases`)."""
        if not self._quiet:
            return self._kwargs
        return {**self._kwargs, "event_dispatcher": QuietReleases()}

    async def master_of(self, shard: Shard) -> AsyncRedis:
        """The running loop's client of the shard's master: :meth:`state` and :meth:`master` in
        one call (every shard of every call asks)."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] is loop:
            state = last[1]
        else:
            state = self._loops.get(loop) or await self.state()
            self._last = (loop, state)
        client = state.masters.get(shard.index)
        return client if client is not None else self.master(state, shard)

    def mux_link(self, shard: Shard, state: MasterState | None = None) -> Any:
        """The running loop's shared connection to the shard's master (``ASYNC_MULTIPLEX``) if
        a call may be queued on it now (:meth:`~sentinel_cache.core.ops.async_mux.AsyncMuxPool.
        ready`; ``state``: the caller's look at the shard), else None: what :meth:`master_of`
        would give, when its connection is open."""
        last = self._last
        if last is None or last[0] is not asyncio.get_running_loop():
            return None
        pool = last[1].muxes.get(shard.index)
        return None if pool is None else pool.ready(state)

    def master(self, state: _LoopState, shard: Shard) -> AsyncRedis:
        client = state.masters.get(shard.index)
        if client is None:
            pool = AsyncShardPool(
                label=shard.label,
                connection_class=(
                    AsyncLeanShardSSLConnection if self._ssl else AsyncLeanShardConnection
                ),
                max_connections=self._max_connections,
                timeout=self._pool_timeout,
                shard=shard,
                **self._pool_kwargs(),
            )
            if self._multiplex:
                mux = state.muxes[shard.index] = AsyncMuxPool(pool, shard, self._multiplex_explicit)
                client = MuxRedis(mux)
            else:
                client = AsyncRedis(connection_pool=pool)
            state.masters[shard.index] = client
        return client

    def reader(self, state: _LoopState, shard: Shard) -> tuple[Address, AsyncRedis] | None:
        """A replica in the shard's read rotation (its address and client), or None."""
        replicas = shard.serving_replicas
        if not replicas:
            return None
        address = replicas[next(self._replica_turn) % len(replicas)]
        return address, self.replica(state, address)

    def replica(self, state: _LoopState, address: Address) -> AsyncRedis:
        """This loop's client of the replica at ``address`` (made on first use)."""
        client = state.replicas.get(address)
        if client is None:
            connection_class = (
                redis.asyncio.connection.SSLConnection
                if self._ssl
                else redis.asyncio.connection.Connection
            )
            pool = AsyncFairBlockingConnectionPool(
                host=address.host,
                port=address.port,
                connection_class=connection_class,
                max_connections=self._max_connections,
                timeout=self._pool_timeout,
                **self._pool_kwargs(),
            )
            client = state.replicas[address] = AsyncRedis(connection_pool=pool)
        return client


# Tasks started from another thread by close_all(): kept until done (a task only weakly held by
# its loop could be collected before it ran).
_closing: set[asyncio.Task[None]] = set()


def _spawn(loop: asyncio.AbstractEventLoop, closing: Any) -> None:
    task = loop.create_task(closing)
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_shared_clients: weakref.WeakKeyDictionary[ShardedSentinelPool, AsyncShardClients] = (
    weakref.WeakKeyDictionary()
)
_shared_clients_lock = threading.Lock()


def shared_async_clients(core: ShardedSentinelPool) -> AsyncShardClients:
    """The asyncio clients of ``core`` (one set per core, created on first request)."""
    with _shared_clients_lock:
        clients = _shared_clients.get(core)
        if clients is None:
            clients = _shared_clients[core] = AsyncShardClients(core.config)
            core.on_close(clients.close_all)
        return clients
