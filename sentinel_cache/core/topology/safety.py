"""The safety net's policy, in one place: when to ask the sentinels again about a shard, and
whether a failed call may be retried.

The operations' loop runs it (``run``, and ``scatter`` for a batch per shard): on a connection
error, timeout or READONLY reply from a shard's master it asks
:meth:`SafetyNet.should_reresolve`, then :meth:`SafetyNet.reresolve`, then
:meth:`SafetyNet.retry_or_raise`, through the pool's methods of the same names. The rest is the
same policy at the start of a call (no master known yet) or on the housekeeper's clock (a shard
whose last resolution failed, a write fence whose failover never announced its end, a master
found unreachable).

An outage is a master found unreachable that the sentinels did not replace yet
(:meth:`SafetyNet.unreachable`): a read may then be served by a replica in step with that master
(``OUTAGE_READS``), and an operation that may be sent again waits up to ``OUTAGE_HOLD`` for the
switch (:meth:`SafetyNet.held_too_long` is the error once the hold is spent).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sentinel_cache.core.config import Address
from sentinel_cache.core.metrics import Metrics
from sentinel_cache.core.topology.discovery import Discovery, Resolution, data_node_refusal
from sentinel_cache.core.topology.placement import Placement
from sentinel_cache.core.topology.shard import STALE_FENCE_SECONDS, Shard
from sentinel_cache.exceptions import (
    AuthenticationFailedError,
    ShardUnavailableError,
    StaleReplyError,
)

logger = logging.getLogger("sentinel_cache")


class SafetyNet:
    """The pull path of one core: re-resolve a shard (rate-limited, single-flight) and decide.

    Holds no state of its own (each shard keeps its resolution state), so a forked child
    builds a new one around its new discovery."""

    def __init__(
        self,
        shards: Sequence[Shard],
        discovery: Discovery,
        placement: Placement,
        *,
        interval: float,
        metrics: Metrics | None,
        outage_reads: bool = True,
        outage_hold: float = 10.0,
    ) -> None:
        self._shards = tuple(shards)
        self._discovery = discovery
        self._placement = placement
        self._interval = interval
        self._metrics = metrics
        # Only to name, in an outage's error, the option that would have carried the call.
        self._outage_reads = outage_reads
        self._outage_hold = outage_hold

    def __repr__(self) -> str:
        return (
            f"<SafetyNet shards={len(self._shards)} interval={self._interval:g}s "
            f"outage_reads={self._outage_reads} outage_hold={self._outage_hold:g}s>"
        )

    def should_reresolve(self, shard: Shard, exc: BaseException, generation: int) -> bool:
        """The safety net's first step after ``exc`` on the shard's master: True if the
        sentinels should be asked again. Raises at once what asking cannot fix (credentials,
        TLS). False when the shard already moved since the attempt began (nothing to ask)."""
        if isinstance(exc, StaleReplyError):
            return False
        refusal = self.refusal(shard, exc)
        if refusal is not None:
            raise refusal from exc
        return shard.generation == generation

    def retry_or_raise(
        self, shard: Shard, exc: BaseException, generation: int, *, idempotent: bool
    ) -> None:
        """The safety net's last step: return if the failed attempt may be retried once on the
        shard's (new) master, else raise. A stale reply is retried even if the shard did not
        move (a failover that began and was aborted): the retry's reply can be trusted."""
        if isinstance(exc, StaleReplyError):
            if idempotent:
                return
            raise exc
        if idempotent and shard.generation != generation and shard.address is not None:
            return
        raise ShardUnavailableError(
            f"shard {shard.label} at {shard.address}: {type(exc).__name__}: {exc}"
            f"{self.outage_hint(shard, generation)}"
        ) from exc

    def outage_hint(self, shard: Shard, generation: int) -> str:
        """What to add to the error of a call that failed in an outage of the master of
        ``generation``: the options switched off that would have carried it (a reader cannot
        tell from the error that one option would have spared its users a 500), else ""."""
        if not shard.in_outage(generation):
            return ""
        off = []
        if not self._outage_reads:
            off.append("OUTAGE_READS is off: set it to answer reads from a replica in step")
        elif not shard.outage_replicas(generation):
            lagging = shard.lagging_replicas(generation)
            if lagging:
                behind = ", ".join(
                    f"{a} {lag:.1f}s behind" if lag != float("inf") else f"{a} never seen current"
                    for a, lag in sorted(lagging.items())
                )
                off.append(
                    f"no replica within OUTAGE_READS_MAX_LAG ({shard.max_lag:g}s) of the "
                    f"master to answer reads ({behind})"
                )
        if not self._outage_hold:
            off.append(
                "OUTAGE_HOLD is 0: set it to hold calls until the sentinels replace the master"
            )
        return f" ({'; '.join(off)})" if off else ""

    def unreachable(self, shard: Shard, exc: BaseException, generation: int) -> bool:
        """After the re-resolve step: True (and the outage noted on the shard) if ``exc`` left
        the shard's master of ``generation`` unreachable and nothing replaced it, so the outage
        rules apply. A stale reply is no outage: the node answered; nor is a shard with no
        master known (nothing to wait for the replacement of: its error is the resolution's)."""
        if isinstance(exc, StaleReplyError) or shard.generation != generation:
            return False
        if shard.address is None:
            return False
        shard.note_unreachable(generation)
        return True

    def held_too_long(
        self, shard: Shard, exc: BaseException | None, hold: float
    ) -> ShardUnavailableError:
        """The error of an operation held ``hold`` seconds for a switch that did not come
        (``exc``: what its master answered, None for a write held before it was sent)."""
        why = "" if exc is None else f": {type(exc).__name__}: {exc}"
        return ShardUnavailableError(
            f"shard {shard.label} at {shard.address}: master unreachable and not replaced "
            f"within OUTAGE_HOLD ({hold:g}s){why}"
        )

    def check_outages(self) -> None:
        """Ask the sentinels again about every shard in an outage (the housekeeper's clock,
        rate-limited per shard), asking its master's ``ROLE`` too: a master back without a
        switch ends the outage, a new one moves the shard."""
        for shard in self._shards:
            if shard.unreachable_since is not None:
                self.reresolve(shard, reason="master unreachable")

    def refusal(self, shard: Shard, exc: BaseException) -> AuthenticationFailedError | None:
        """The error to raise if ``exc`` says the shard's data node refused our credentials or
        certificates (re-resolving cannot help), else None."""
        return data_node_refusal(
            exc, f"shard {shard.label}", shard.address, self._discovery.secrets
        )

    def reresolve(
        self,
        shard: Shard,
        *,
        reason: str,
        force: bool = False,
        suspect: Address | None = None,
    ) -> bool:
        """Ask the sentinels for this shard's master again; True if it moved.

        Rate-limited and single-flight, so a dead shard does not hammer the sentinels; with
        every sentinel down the shard keeps its last known master. ``suspect`` is the node the
        caller just saw fail: if the sentinels still name it, it is not asked for ``ROLE`` (a
        hung node would hold the caller for a second timeout) and nothing changes.
        """
        with shard.reresolving(self._interval, force=force) as ours:
            if not ours:
                return False
            if self._metrics is not None:
                self._metrics.reresolve(shard.name)
            suspects = {shard.name: suspect} if suspect is not None else None
            outcome = self._discovery.resolve([shard.name], timeout=0, suspects=suspects)
            result = outcome[shard.name]
            if isinstance(result, Resolution):
                source = f"safety net ({reason})"
                return self._placement.apply_resolution(shard, result, source=source)
            shard.failed(result)
            shard.resolve_failures.warn(
                logger,
                "shard %s re-resolve after %s failed: %s",
                shard.label,
                reason,
                result,
            )
            return False

    def need_master(self, shard: Shard, *, ask: bool = True) -> None:
        """Raise unless a master is known for ``shard``, asking the sentinels once if none is
        (unless not ``ask``: the discovery that just ran for DISCOVERY_TIMEOUT was that)."""
        if shard.address is not None:
            return
        if ask:
            self.reresolve(shard, reason="no master known yet")
        if shard.address is None:
            if isinstance(shard.error, AuthenticationFailedError):
                raise type(shard.error)(f"shard {shard.label}: {shard.error}") from None
            raise ShardUnavailableError(
                f"shard {shard.label}: no master known ({shard.error})"
            ) from None

    def recheck_failed(self) -> None:
        """Re-resolve the shards whose last resolution failed (rate-limited per shard)."""
        for shard in self._shards:
            if shard.error is not None and shard.address is not None:
                self.reresolve(shard, reason="recheck after a failed resolution")

    def release_stale_fence(self, shard: Shard, *, asked: bool) -> None:
        """Lower a fence whose failover we never heard the end of (a lost message), once the
        sentinels were asked about the shard: by the caller (``asked``), else here, now."""
        if not shard.fence_stale:
            return
        if not asked:
            self.reresolve(shard, reason="stale write fence", force=True)
            logger.warning(
                "shard %s: no end of failover seen for %.0fs; releasing writes to %s",
                shard.label,
                STALE_FENCE_SECONDS,
                shard.address,
            )
        shard.lower_fence()

    def check_fences(self) -> None:
        """Release every stale fence (the housekeeper's clock)."""
        for shard in self._shards:
            self.release_stale_fence(shard, asked=False)
