"""What every shard connection (sync or asyncio) knows: its shard, the address generation it
was made for, and whether a reply it reads can be trusted. The connection classes themselves
are in ``_async/connection.py`` (and the sync ones generated from it)."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from sentinel_cache.core.config import Address
from sentinel_cache.exceptions import ShardUnavailableError, StaleReplyError


class MasterState(NamedTuple):
    """What every call and every reply reads of its shard, as one value: the shard replaces it
    whole (under its lock) when a part changes, so a reader takes one look without the lock and
    never sees half a change (a new address with the old generation). Defined here, below the
    shard, because its connections read it."""

    address: Address | None
    #: Bumped by every switch: what a connection, a scan or a reply was made for.
    generation: int
    #: Replica promotions announced: a reply in flight across one is moot.
    promotions: int
    #: Writes held: a failover was announced and its end not heard yet.
    fenced: bool
    #: Since when (monotonic) this master is known unreachable with nothing to replace it (an
    #: outage), else None; a switch starts without it. Here so a call's one look sees it too.
    unreachable_since: float | None = None


UNRESOLVED = MasterState(None, 0, 0, False)


class Followed(Protocol):
    """What a connection reads of its shard (:class:`~sentinel_cache.core.topology.shard.Shard`,
    which builds the connections, so this module cannot import it)."""

    label: str

    @property
    def state(self) -> MasterState: ...

    def current(self) -> tuple[Address | None, int]: ...

    def note_run_id(
        self, generation: int, run_id: str, asked_at: float, *, source: str
    ) -> object: ...


class ShardBound:
    """A connection (sync or async) that knows its shard and the address generation it was
    made for; the shard's current master is looked up at connect time."""

    _shard: Followed
    _generation: int
    host: str
    port: int

    def __init__(self, *, shard: Followed, **kwargs: Any) -> None:
        self._shard = shard
        address, self._generation = shard.current()
        self._sent_promotions = shard.state.promotions
        host, port = address if address is not None else ("unresolved", 0)
        super().__init__(host=host, port=port, **kwargs)  # type: ignore[call-arg]

    def _stale(self) -> bool:
        return self._generation != self._shard.state.generation

    def _note_sent(self) -> None:
        self._sent_promotions = self._shard.state.promotions

    def _untrusted_reply(self) -> StaleReplyError | None:
        """The error to raise instead of a reply that cannot be trusted, else None.

        A reply is an acknowledgement only if the node that sent it was still the shard's
        master: not if the shard switched away from it while the command was in flight (an old
        master back from a partition answers, then is demoted and drops the write), nor if the
        sentinels promoted a replica meanwhile (the write may have landed after the promotion).
        Writes are held by the fence from the start of a failover, one sentinel tick or more
        before the promotion, so only a reply that is that late is doubted. Two integer
        comparisons per reply; the caller drops the socket (the rest of its replies are moot).
        """
        shard = self._shard
        state = shard.state
        if self._generation == state.generation and self._sent_promotions == state.promotions:
            return None
        moved = self._generation != state.generation
        return StaleReplyError(
            f"shard {shard.label}: the reply from {self.host}:{self.port} came "
            + (
                "after the shard switched to another master"
                if moved
                else "after the sentinels promoted a replica of the shard"
            )
            + "; the command's outcome is unknown",
            shard=shard.label,
            address=Address(self.host, self.port),
        )

    def _note_run_id(self, reply: Any, asked_at: float) -> None:
        """Tell the shard the run_id a new connection found (a restart forces a reconnect, so
        this costs nothing on the hot path and sees every restart the pool lives through)."""
        run_id = run_id_of(reply)
        if run_id is not None:
            self._shard.note_run_id(
                self._generation,
                run_id,
                asked_at,
                source=f"a new connection to {self.host}:{self.port}",
            )

    def _repoint(self) -> None:
        """Take the shard's current address (after the caller dropped the old socket)."""
        shard = self._shard
        address, self._generation = shard.current()
        if address is None:
            raise ShardUnavailableError(f"shard {shard.label}: master not resolved")
        self.host, self.port = address


def run_id_of(reply: Any) -> str | None:
    """The ``run_id`` in an ``INFO server`` reply (raw text or parsed), or None."""
    if isinstance(reply, dict):
        value = reply.get("run_id")
        return None if value is None else str(value)
    text = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
    for line in text.splitlines():
        if line.startswith("run_id:"):
            return line[len("run_id:") :].strip() or None
    return None
