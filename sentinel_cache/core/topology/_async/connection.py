"""Shard connections: they follow their shard's master and doubt replies from a replaced one.

The asyncio source; ``sentinel_cache/core/topology/_sync/connection.py`` is generated from it by
``scripts/unasync.py``. redis-py calls ``connect_check_health`` (>= 5.3) or ``connect`` on every
checkout, so a connection whose shard switched drops its socket and reconnects to the current
master there, without any coordination; only the switching shard's connections are touched.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio.connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ReadOnlyError, ResponseError

from sentinel_cache.core.topology.following import ShardBound
from sentinel_cache.core.topology.lean_rules import DEFAULT_BULK_LIMIT, LINE_START, bulk_limit_of
from sentinel_cache.exceptions import ReplyProtocolError

#: What redis-py's handshake raises when a reply has the wrong kind (``+OK`` where ``HELLO``'s
#: map is expected: ``'bytes' object has no attribute 'get'``) or says nothing it understands.
_HANDSHAKE_GARBAGE = (AttributeError, TypeError, KeyError, IndexError, ValueError, InvalidResponse)
#: redis-py's words for a handshake reply that is not the one expected.
_HANDSHAKE_REFUSALS = ("Invalid RESP version", "Error setting client name")


class AsyncShardConnectionMixin(ShardBound):
    """Drops a stale socket before connecting, so the next one goes to the current master;
    learns the master's ``proto-max-bulk-len`` (``bulk_limit``) when it connects; names the
    shard and the node in every protocol error (:class:`~sentinel_cache.ReplyProtocolError`)."""

    #: The master's ``proto-max-bulk-len``, asked on every new connection (``CONFIG GET``; the
    #: server's default where refused): what a write's arguments are checked against.
    bulk_limit: int = DEFAULT_BULK_LIMIT
    #: What the reply guard carries from the last chunk read to the next (``oversized``).
    _carry: bytes = LINE_START

    async def _follow(self) -> None:
        """The shard switched: drop the socket and take its current master."""
        await self.disconnect()  # type: ignore[attr-defined]
        self._repoint()

    if hasattr(redis.asyncio.connection.AbstractConnection, "connect_check_health"):
        # redis-py >= 5.3: connect() and every reconnect go through here; follow once.
        async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
            if self._stale():
                await self._follow()
            await super().connect_check_health(*args, **kwargs)  # type: ignore[misc]

        async def on_connect_check_health(self, check_health: bool = True) -> None:
            self._carry = LINE_START
            try:
                await super().on_connect_check_health(check_health)  # type: ignore[misc]
            except _HANDSHAKE_GARBAGE as exc:
                raise await self._handshake_failed(exc)  # noqa: B904 - chained there
            except RedisConnectionError as exc:
                if type(exc) is not RedisConnectionError or str(exc) not in _HANDSHAKE_REFUSALS:
                    raise
                raise await self._handshake_failed(exc)  # noqa: B904 - chained there
            await self._ask_run_id()

    else:  # pragma: no cover - older redis-py

        async def connect(self) -> None:
            if self._stale():
                await self._follow()
            await super().connect()  # type: ignore[misc]

        async def on_connect(self) -> None:
            self._carry = LINE_START
            try:
                await super().on_connect()  # type: ignore[misc]
            except _HANDSHAKE_GARBAGE as exc:
                raise await self._handshake_failed(exc)  # noqa: B904 - chained there
            await self._ask_run_id()

    async def _handshake_failed(self, exc: BaseException) -> ReplyProtocolError:
        """The error for a handshake reply of the wrong kind, the socket dropped."""
        await self.disconnect()  # type: ignore[attr-defined]
        error = self.protocol_error(
            f"answered the connection handshake with a reply of the wrong kind "
            f"({type(exc).__name__}: {exc})"
        )
        error.__cause__ = exc
        return error

    def protocol_error(self, what: str) -> ReplyProtocolError:
        """:class:`~sentinel_cache.ReplyProtocolError` for a node that ``what``, naming the
        shard and the node's address (the caller drops the socket)."""
        return ReplyProtocolError(
            f"shard {self._shard.label}: the node at {self.host}:{self.port} {what}; "
            "the connection was dropped"
        )

    async def _ask_run_id(self) -> None:
        """Each new connection asks the master's run_id (see ``ShardBound._note_run_id``) and
        its ``proto-max-bulk-len`` (:attr:`bulk_limit`), in one round trip; either refused (an
        ACL, a renamed command) is left unknown: ``+reboot`` still tells a restart, and the
        server's default limit is assumed."""
        asked_at = time.monotonic()
        asks = [("INFO", "server"), ("CONFIG", "GET", "proto-max-bulk-len")]
        await self.send_packed_command(self.pack_commands(asks), check_health=False)  # type: ignore[attr-defined]
        replies: list[Any] = []
        for _ in asks:
            try:
                replies.append(await self.read_response())
            except ResponseError:
                replies.append(None)
        info, limit = replies
        self.bulk_limit = bulk_limit_of(limit)
        if info is not None:
            self._note_run_id(info, asked_at)

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        self._note_sent()
        await super().send_packed_command(*args, **kwargs)  # type: ignore[misc]

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            reply = await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ReadOnlyError:
            # A demoted master answers writes with READONLY: drop the socket so the next use
            # reconnects to wherever the shard points by then.
            await self.disconnect()  # type: ignore[attr-defined]
            raise
        except InvalidResponse as exc:  # garbage: the socket is out of step
            await self.disconnect()  # type: ignore[attr-defined]
            raise self.protocol_error(f"sent bytes that are no reply ({exc})") from exc
        untrusted = self._untrusted_reply()  # no acknowledgement from a replaced master
        if untrusted is not None:
            await self.disconnect()  # type: ignore[attr-defined]
            raise untrusted
        return reply


class AsyncShardConnection(AsyncShardConnectionMixin, redis.asyncio.connection.Connection):
    pass


class AsyncShardSSLConnection(AsyncShardConnectionMixin, redis.asyncio.connection.SSLConnection):
    pass
