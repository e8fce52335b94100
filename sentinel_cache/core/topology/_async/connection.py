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
from redis.exceptions import ReadOnlyError, ResponseError

from sentinel_cache.core.topology.following import ShardBound


class AsyncShardConnectionMixin(ShardBound):
    """Drops a stale socket before connecting, so the next one goes to the current master."""

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
            await super().on_connect_check_health(check_health)  # type: ignore[misc]
            await self._ask_run_id()

    else:  # pragma: no cover - older redis-py

        async def connect(self) -> None:
            if self._stale():
                await self._follow()
            await super().connect()  # type: ignore[misc]

        async def on_connect(self) -> None:
            await super().on_connect()  # type: ignore[misc]
            await self._ask_run_id()

    async def _ask_run_id(self) -> None:
        """Each new connection asks the master's run_id (see ``ShardBound._note_run_id``)."""
        asked_at = time.monotonic()
        try:
            await self.send_command("INFO", "server", check_health=False)  # type: ignore[attr-defined]
            reply = await self.read_response()
        except ResponseError:  # INFO refused (an ACL, a renamed command): +reboot still tells
            return
        self._note_run_id(reply, asked_at)

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
        untrusted = self._untrusted_reply()  # no acknowledgement from a replaced master
        if untrusted is not None:
            await self.disconnect()  # type: ignore[attr-defined]
            raise untrusted
        return reply


class AsyncShardConnection(AsyncShardConnectionMixin, redis.asyncio.connection.Connection):
    pass


class AsyncShardSSLConnection(AsyncShardConnectionMixin, redis.asyncio.connection.SSLConnection):
    pass
