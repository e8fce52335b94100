"""Placing each shard on its master: every change of a shard's address goes through here.

One rule, "one node, one shard" (:meth:`Placement.claimant`), is applied to every candidate
discovery weighs and again before every switch, under one lock so that two shards moving at
once cannot land on one node. A switch is then announced: logged, counted, and handed to the
switch callbacks (``ShardedSentinelPool.on_switch``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal

import redis

from sentinel_cache.core.config import Address, PoolConfig
from sentinel_cache.core.metrics import Metrics, source_kind
from sentinel_cache.core.topology.discovery import Resolution, check_role
from sentinel_cache.core.topology.shard import Evidence, Shard, SwitchCallback, SwitchEvent
from sentinel_cache.exceptions import ConflictingMasterError

logger = logging.getLogger("sentinel_cache")


class Placement:
    """The switches of one core's shards (``shards``: every shard it follows)."""

    def __init__(
        self, shards: Sequence[Shard], config: PoolConfig, metrics: Metrics | None
    ) -> None:
        self._shards = tuple(shards)
        self._config = config
        self._metrics = metrics
        self._callbacks: list[SwitchCallback] = []
        self.reset_locks()

    def reset_locks(self) -> None:
        """After a fork: a lock held by a parent thread would never be released in the child."""
        self._lock = threading.Lock()

    def on_switch(self, callback: SwitchCallback) -> Callable[[], None]:
        """Register ``callback(event)`` for every master switch; returns an undo."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    def claimant(self, name: str, address: Address, majority: bool) -> str | None:
        """Why the shard of master ``name`` may not be on ``address``, or None: the one rule
        of "one node, one shard", which discovery applies to every candidate and every switch
        applies again (:meth:`taken`).

        Two shards on one node would mix their keys, and ``ROLE`` only proves that a node is
        *a* master. So a node another shard is on is refused, whoever names it (that shard
        moves first); a node another shard was on before is refused unless most of the
        sentinels asked name it (a stale old master, or one liar, cannot place it; a node
        reused for another master name, as a recycled address can be, is taken on a majority).
        """
        for other in self._shards:
            if other.name == name:
                continue
            if other.address == address:
                return f"the master of shard {other.index} ({other.name!r})"
            if not majority and address in other.former:
                return (
                    f"a former master of shard {other.index} ({other.name!r}), and not named by "
                    "a majority of the sentinels"
                )
        return None

    def taken(self, shard: Shard, address: Address, *, source: str, majority: bool) -> bool:
        """True (with a warning, and the shard's error set) if :meth:`claimant` refuses
        ``address`` for ``shard``: the last check before any switch, against a shard that moved
        while the sentinels or ``ROLE`` were being asked."""
        if shard.address == address:
            return False
        reason = self.claimant(shard.name, address, majority)
        if reason is None:
            return False
        message = (
            f"shard {shard.label}: refusing {source} naming {address}, {reason}: two shards "
            "on one node would mix their keys"
        )
        logger.warning("%s", message)
        shard.failed(ConflictingMasterError(message))
        return True

    def apply_resolution(self, shard: Shard, resolution: Resolution, *, source: str) -> bool:
        """Take a resolution from the sentinels if it is newer than the shard's evidence."""
        if not resolution.verified:  # the sentinels still name the node that just failed
            return False
        named = ", ".join(map(str, resolution.named_by)) or "the sentinels"
        outcome, old = self._place(
            shard,
            resolution.address,
            source=source,
            evidence=Evidence(resolution.epoch, resolution.asked_at),
            named=f"{source} (named by {named})",
            majority=resolution.majority,
        )
        if outcome == "taken":
            return False
        if outcome == "stale":
            logger.info(
                "shard %s: ignoring %s naming %s: a newer switch to %s came first",
                shard.label,
                source,
                resolution.address,
                old,
            )
            return False
        shard.note_agreeing(resolution.agreeing)
        if self._config.read_from_replicas or self._config.outage_reads:
            shard.set_replicas(resolution.replicas)
        if outcome == "same":  # ROLE just said master: an outage without a switch is over
            shard.reachable_again()
            return False
        if old is not None:
            self._announce(shard, old, resolution.address, source, None)
        else:
            logger.info(
                "shard %s master %s (%d sentinels agree)",
                shard.label,
                resolution.address,
                resolution.agreeing,
            )
        return True

    def confirm_and_switch(
        self,
        shard: Shard,
        address: Address,
        *,
        source: str,
        evidence: Evidence,
        majority: bool,
        announced: bool = False,
    ) -> bool:
        """Switch to ``address`` once ``ROLE`` says it is a master (an event is only a hint),
        unless newer evidence moved the shard while ``ROLE`` was being asked.

        ``ROLE`` proves a node claims to be *a* master, not *this shard's*: :meth:`taken`
        refuses a node another shard is on (or was on, unless ``majority``: one sentinel's
        word counts as one only where there is one sentinel).
        """
        if shard.address == address:
            shard.switch(address, source=source, evidence=evidence)  # keep the newer evidence
            return False
        if self.taken(shard, address, source=source, majority=majority):  # not worth a ROLE
            return False
        try:
            role = check_role(address, self._config.connection_options())
        except (redis.RedisError, OSError) as exc:
            logger.warning(
                "shard %s: %s announced %s, unreachable: %s",
                shard.label,
                source,
                address,
                exc,
            )
            return False
        if role != "master":
            logger.info(
                "shard %s: ignoring %s naming %s (ROLE is %s)",
                shard.label,
                source,
                address,
                role,
            )
            return False
        outcome, old = self._place(
            shard, address, source=source, evidence=evidence, named=source, majority=majority
        )
        if outcome != "moved":
            if outcome == "stale":
                logger.info(
                    "shard %s: ignoring %s naming %s: a newer switch to %s came first",
                    shard.label,
                    source,
                    address,
                    old,
                )
            return False
        lag = time.monotonic() - evidence.at if announced else None
        self._announce(shard, old, address, source, lag)
        return True

    def _place(
        self,
        shard: Shard,
        address: Address,
        *,
        source: str,
        evidence: Evidence,
        named: str,
        majority: bool,
    ) -> tuple[Literal["taken", "stale", "same", "moved"], Address | None]:
        """``shard.switch(...)`` unless :meth:`taken` refuses the node (``("taken", current)``):
        the one way a shard's master changes, checked and switched under one lock so that two
        shards moving at once cannot land on one node."""
        with self._lock:
            if self.taken(shard, address, source=named, majority=majority):
                return "taken", shard.address
            return shard.switch(address, source=source, evidence=evidence)

    def _announce(
        self, shard: Shard, old: Address | None, new: Address, source: str, lag: float | None
    ) -> None:
        event = SwitchEvent(shard.index, shard.name, old, new, source, lag)
        if self._metrics is not None:
            self._metrics.switch(shard.name, source_kind(source))
        logger.warning(
            "shard %s switched %s -> %s (via %s%s)",
            shard.label,
            old,
            new,
            source,
            "" if lag is None else f", {lag * 1000:.1f} ms after the sentinels announced it",
        )
        for callback in list(self._callbacks):
            try:
                callback(event)
            except Exception:
                logger.exception("switch callback %r failed", callback)
