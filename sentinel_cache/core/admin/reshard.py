"""Resharding (issue 14): plan a change of the shard list, then move the keys whose owner changes.

While ``PREVIOUS_MASTERS`` is set, the transitional ring keeps every key readable (a miss on the
owner is served from the previous owner, and moved). This module empties the previous owners:

* :func:`movement` says what a change of ``MASTERS``/``WEIGHTS`` moves from the rings alone
  (no server is asked): the fraction of the hash space per (from, to) master pair, the least any
  placement could move for the new shares, which masters changed position, and what to do
  instead when the change moves far more than needed.
* :func:`plan` adds what the servers hold: it scans every previous shard (or a sample of each)
  and counts the keys that would move, per pair. Nothing is written.
* :func:`migrate` scans every shard of the previous placement (masters leaving the ring
  included, still followed through the sentinels) and moves each key whose owner is now another
  shard: ``PTTL`` + ``DUMP`` on the source, the ``RESTORE_MISSING`` script on the owner (never
  over a value written meanwhile through the new ring, nor over a delete since: see
  :data:`~sentinel_cache.core.ops.plans.DELETE_MARKED`), then ``DEL`` on the source. Batched
  (one round trip per step and batch, the owners' restores sent together), rate-limited,
  resumable (a second run moves nothing; a killed one is simply run again), and it follows a
  failover of any shard in the middle.

Framework-free: the ``sentinel_reshard`` management command and ``flask sentinel-reshard`` call
these, and render with :func:`render_plan`, :func:`render_report` and :class:`ProgressPrinter`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import AuthenticationError, ResponseError

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ops.plans import RESTORE_MISSING, Command, copy_deadline, is_reserved
from sentinel_cache.core.ops.scan import ShardScan
from sentinel_cache.core.ring import NODES_PER_WEIGHT, murmur64a
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.shard import MASTER_ERRORS, Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ConfigurationError

__all__ = [
    "Flow",
    "Movement",
    "PairReport",
    "Plan",
    "Progress",
    "ProgressPrinter",
    "Report",
    "ShardPlan",
    "ShardReport",
    "Shift",
    "TokenBucket",
    "migrate",
    "movement",
    "plan",
    "render_plan",
    "render_report",
]

logger = logging.getLogger("sentinel_cache")

DEFAULT_BATCH = 500
PLAN_BATCH = 1000
DEFAULT_RETRY_FOR = 30.0
# A moved key's old copy is deleted this long after its restore: a reader that found the owner
# empty just before the restore still finds the old copy when it asks the previous owner.
DEFAULT_DELETE_DELAY = 0.2
EXCESS = 0.01  # a change moving more than the least possible + this fraction is warned about
_SPACE = float(1 << 64)
_LOWEST = -(1 << 63)
_HIGHEST = (1 << 63) - 1

ProgressCallback = Callable[["Progress"], None]

# Each key's remaining TTL in ms and its DUMP, read at once (one command, one consistent view).
DUMP_WITH_TTL = """
local out = {}
for i, key in ipairs(KEYS) do
    out[2 * i - 1] = redis.call('PTTL', key)
    out[2 * i] = redis.call('DUMP', key)
end
return out
"""


def _require_previous(core: ShardedSentinelPool) -> None:
    if core.previous_ring is None:
        raise ConfigurationError(
            option="PREVIOUS_MASTERS",
            value=None,
            reason="not set: nothing to migrate. Deploy the new MASTERS with PREVIOUS_MASTERS "
            "(and PREVIOUS_WEIGHTS if the weights changed) naming the placement before the "
            "change, then run the migration (see docs/resharding.md)",
        )


# -- what the rings say ------------------------------------------------------------------------
@dataclass(frozen=True)
class Shift:
    """A master kept in the list at another position (Jedis places keys by position)."""

    name: str
    previous: int
    current: int


@dataclass(frozen=True)
class Movement:
    """What a change of the shard list moves, from the two rings alone (no key is read).

    Fractions are of the hash space, so of the keys when keys hash evenly (they do: MurmurHash).
    ``pairs`` maps (from master, to master) to the fraction moving between them; ``minimal`` is
    the least any placement could move for the new shares (half the sum of the share changes per
    master: an append or a removal of the last master moves exactly that).
    """

    previous: tuple[str, ...]
    previous_weights: tuple[int, ...]
    masters: tuple[str, ...]
    weights: tuple[int, ...]
    pairs: tuple[tuple[str, str, float], ...]
    fraction: float
    minimal: float
    shifted: tuple[Shift, ...]
    warnings: tuple[str, ...]
    suggestion: tuple[tuple[str, ...], tuple[int, ...], float] | None = None

    @property
    def excessive(self) -> bool:
        return self.fraction > self.minimal + EXCESS

    def to_dict(self) -> dict[str, Any]:
        suggestion = None
        if self.suggestion is not None:
            names, weights, fraction = self.suggestion
            suggestion = {"masters": list(names), "weights": list(weights), "fraction": fraction}
        return {
            "previous_masters": list(self.previous),
            "previous_weights": list(self.previous_weights),
            "masters": list(self.masters),
            "weights": list(self.weights),
            "fraction": self.fraction,
            "minimal_fraction": self.minimal,
            "pairs": [{"from": a, "to": b, "fraction": f} for a, b, f in self.pairs],
            "shifted": [
                {"master": s.name, "previous_position": s.previous, "position": s.current}
                for s in self.shifted
            ],
            "warnings": list(self.warnings),
            "suggestion": suggestion,
        }


def _ring_nodes(weights: Sequence[int]) -> list[tuple[int, int]]:
    """(hash, position) of every virtual node, sorted, exactly as :class:`HashRing` builds them
    (a later node wins a hash collision, like Jedis's ``TreeMap.put``)."""
    nodes: dict[int, int] = {}
    for i, weight in enumerate(weights):
        for n in range(NODES_PER_WEIGHT * weight):
            nodes[murmur64a(f"SHARD-{i}-NODE-{n}".encode("ascii"))] = i
    return sorted(nodes.items())


def _flows(
    previous: Sequence[str],
    previous_weights: Sequence[int],
    masters: Sequence[str],
    weights: Sequence[int],
) -> tuple[dict[tuple[str, str], float], dict[str, float], dict[str, float]]:
    """Fraction of the hash space per (previous owner, owner) name pair (equal names included),
    and each master's share before and after."""
    old, new = _ring_nodes(previous_weights), _ring_nodes(weights)
    points = sorted({h for h, _ in old} | {h for h, _ in new})
    flows: dict[tuple[str, str], float] = {}
    i = j = 0
    last = None
    for point in points:
        # A key hashing into (last, point] belongs to the first node >= point of each ring;
        # the first interval also takes the wrap-around (above the last point, below the first).
        while i < len(old) and old[i][0] < point:
            i += 1
        while j < len(new) and new[j][0] < point:
            j += 1
        a = previous[old[i][1] if i < len(old) else old[0][1]]
        b = masters[new[j][1] if j < len(new) else new[0][1]]
        wrap = (point - _LOWEST + 1) + (_HIGHEST - points[-1])
        length = wrap if last is None else point - last
        last = point
        flows[(a, b)] = flows.get((a, b), 0.0) + length / _SPACE
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for (a, b), share in flows.items():
        before[a] = before.get(a, 0.0) + share
        after[b] = after.get(b, 0.0) + share
    return flows, before, after


def _moved_fraction(flows: Mapping[tuple[str, str], float]) -> float:
    return sum(share for (a, b), share in flows.items() if a != b)


def _suggest(
    previous: Sequence[str], masters: Sequence[str], weights: Sequence[int]
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The same masters and weights placed to move less: every kept master at its previous
    position, a new master in a removed one's position (the position kept, the master behind
    it swapped), other new masters appended, and a hole left by a removal filled by the last
    master rather than by shifting every later one."""
    weight_of = dict(zip(masters, weights, strict=True))
    added = [name for name in masters if name not in previous]
    slots: list[str | None] = []
    for name in previous:
        if name in weight_of:
            slots.append(name)
        else:
            slots.append(added.pop(0) if added else None)
    slots.extend(added)
    while None in slots:
        while slots and slots[-1] is None:
            slots.pop()
        if None in slots:
            slots[slots.index(None)] = slots.pop()
    names = tuple(name for name in slots if name is not None)
    return names, tuple(weight_of[name] for name in names)


def movement(
    previous: Sequence[str],
    previous_weights: Sequence[int] | None,
    masters: Sequence[str],
    weights: Sequence[int] | None = None,
) -> Movement:
    """What changing the shard list from ``previous`` to ``masters`` moves (weights default to
    1 each), with warnings when it moves far more than needed and what to do instead."""
    previous = tuple(previous)
    masters = tuple(masters)
    previous_weights = tuple(previous_weights or (1,) * len(previous))
    weights = tuple(weights or (1,) * len(masters))
    flows, before, after = _flows(previous, previous_weights, masters, weights)
    fraction = _moved_fraction(flows)
    names = set(before) | set(after)
    minimal = sum(abs(after.get(n, 0.0) - before.get(n, 0.0)) for n in names) / 2
    shifted = tuple(
        Shift(name, i, masters.index(name))
        for i, name in enumerate(previous)
        if name in masters and masters.index(name) != i
    )
    warnings: list[str] = []
    suggestion = None
    if previous == masters and previous_weights == weights:
        warnings.append("PREVIOUS_MASTERS and MASTERS (and their weights) are equal: nothing moves")
    for shift in shifted:
        warnings.append(
            f"master {shift.name} moves from position {shift.previous} to {shift.current}: "
            "Jedis places keys by position, not by name, so the keys of both positions move"
        )
    if fraction > minimal + EXCESS:
        warnings.append(
            f"this change moves {fraction:.1%} of the keys; the least any placement could move "
            f"for the new shares is {minimal:.1%}"
        )
        removed_inside = [
            name
            for i, name in enumerate(previous)
            if name not in masters and any(n in masters for n in previous[i + 1 :])
        ]
        inserted = [
            name
            for j, name in enumerate(masters)
            if name not in previous and any(n in previous for n in masters[j + 1 :])
        ]
        for name in removed_inside:
            warnings.append(
                f"{name} is removed from the middle of the list, which shifts every later "
                "master: to retire the machine behind it, keep the name at its position and "
                "move it to other hardware with a Sentinel failover (nothing moves); to have "
                "fewer shards, remove the last master instead (only its keys move)"
            )
        for name in inserted:
            warnings.append(
                f"{name} is inserted before existing masters: append new masters at the end "
                f"instead (only their share, about 1/{len(masters)} each, moves)"
            )
        if not removed_inside and not inserted and shifted:
            warnings.append("masters are reordered: keep the previous order")
        names_s, weights_s = _suggest(previous, masters, weights)
        if names_s != masters:
            flows_s, _, _ = _flows(previous, previous_weights, names_s, weights_s)
            fraction_s = _moved_fraction(flows_s)
            if fraction_s < fraction - EXCESS:
                suggestion = (names_s, weights_s, fraction_s)
                text = f"MASTERS = {list(names_s)!r}"
                if weights_s != (1,) * len(names_s):
                    text += f", WEIGHTS = {list(weights_s)!r}"
                warnings.append(
                    f"{text} (the same masters) would move {fraction_s:.1%} instead of "
                    f"{fraction:.1%} (Java services using Jedis need the same order)"
                )
    pairs = tuple(
        sorted(((a, b, share) for (a, b), share in flows.items() if a != b), key=lambda p: p[:2])
    )
    return Movement(
        previous=previous,
        previous_weights=previous_weights,
        masters=masters,
        weights=weights,
        pairs=pairs,
        fraction=fraction,
        minimal=minimal,
        shifted=shifted,
        warnings=tuple(warnings),
        suggestion=suggestion,
    )


def movement_of(core: ShardedSentinelPool) -> Movement:
    """:func:`movement` for a core's ``PREVIOUS_MASTERS`` -> ``MASTERS``."""
    _require_previous(core)
    config = core.config
    return movement(
        config.previous_masters, config.previous_weights, config.masters, config.weights
    )


# -- planning: what the servers hold -----------------------------------------------------------
@dataclass(frozen=True)
class ShardPlan:
    """One shard of the previous placement, as scanned by :func:`plan`."""

    name: str
    position: int  # in PREVIOUS_MASTERS
    leaving: bool  # not in MASTERS any more
    keys: int | None  # DBSIZE (every key of the database, whatever ``match``)
    scanned: int
    moving: int
    complete: bool  # every key scanned (False: a sample, or an error)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "position": self.position,
            "leaving": self.leaving,
            "keys": self.keys,
            "scanned": self.scanned,
            "moving": self.moving,
            "complete": self.complete,
            "error": self.error,
        }


@dataclass(frozen=True)
class Flow:
    """Keys that would move from one master to another: counted, estimated for the whole shard
    (scaled by ``DBSIZE`` when only a sample was scanned) and expected from the rings."""

    source: str
    target: str
    keys: int
    estimated: int
    expected: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "to": self.target,
            "keys": self.keys,
            "estimated": self.estimated,
            "expected_fraction": self.expected,
        }


@dataclass(frozen=True)
class Plan:
    """What :func:`migrate` would do, from a scan (or a sample) of every previous shard."""

    match: str
    sample: int | None
    movement: Movement
    shards: tuple[ShardPlan, ...]
    flows: tuple[Flow, ...]
    seconds: float

    @property
    def scanned(self) -> int:
        return sum(s.scanned for s in self.shards)

    @property
    def moving(self) -> int:
        return sum(s.moving for s in self.shards)

    @property
    def estimated(self) -> int:
        return sum(f.estimated for f in self.flows)

    @property
    def fraction(self) -> float:
        """Of the keys scanned, the fraction that would move."""
        return self.moving / self.scanned if self.scanned else 0.0

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(f"{s.name}: {s.error}" for s in self.shards if s.error)

    @property
    def complete(self) -> bool:
        """Every shard could be scanned (a sample counts)."""
        return not self.errors

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.movement.warnings + tuple(f"shard {e} (not scanned)" for e in self.errors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "match": self.match,
            "sample": self.sample,
            "seconds": self.seconds,
            "scanned": self.scanned,
            "moving": self.moving,
            "estimated_moving": self.estimated,
            "fraction": self.fraction,
            "expected_fraction": self.movement.fraction,
            "minimal_fraction": self.movement.minimal,
            "complete": self.complete,
            "shards": [s.to_dict() for s in self.shards],
            "flows": [f.to_dict() for f in self.flows],
            "movement": self.movement.to_dict(),
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }


def _owner_lookup(core: ShardedSentinelPool) -> Callable[[Any], Shard]:
    """``core.shard_for`` for keys scanned once each: the same ring, without its LRU cache (a
    scan would only fill it with keys never asked for again, and evict the hot ones)."""
    nodes = _ring_nodes(core.config.weights)
    hashes = [h for h, _ in nodes]
    owners = [core.shards[i] for _, i in nodes]
    count = len(hashes)
    first = owners[0]
    shard_for = core.shard_for

    def owner(key: Any) -> Shard:
        if type(key) is not bytes:
            return shard_for(key)
        i = bisect_left(hashes, murmur64a(key))
        return owners[i] if i < count else first

    return owner


def _sources(core: ShardedSentinelPool) -> list[Shard]:
    """The shards of the previous placement, in its order (masters leaving the ring included)."""
    return [core.shard(name) for name in core.config.previous_masters]


def plan(
    core: ShardedSentinelPool,
    *,
    match: str = "*",
    sample: int | None = None,
    batch: int = PLAN_BATCH,
    retry_for: float = DEFAULT_RETRY_FOR,
) -> Plan:
    """Scan every shard of the previous placement (only its first ``sample`` keys if given: SCAN
    order follows the server's hash table, unrelated to the ring, so it is a fair sample) and
    count, per (from, to) master pair, the keys matching ``match`` that would move. Nothing is
    written. Raises :class:`ConfigurationError` without ``PREVIOUS_MASTERS``."""
    _require_previous(core)
    if sample is not None and sample < 1:
        raise ValueError(f"sample must be a positive number of keys per shard, got {sample}")
    started = time.monotonic()
    moves = movement_of(core)
    calls = _Calls(core, retry_for)
    owner_of = _owner_lookup(core)
    current = set(core.config.masters)
    shards: list[ShardPlan] = []
    counted: dict[tuple[str, str], int] = {}
    estimated: dict[tuple[str, str], int] = {}
    for position, shard in enumerate(_sources(core)):
        keys: int | None = None
        scanned = 0
        targets: dict[str, int] = {}
        error = None
        complete = False
        try:
            keys = int(calls.one(shard, ("DBSIZE",)))
            scan = ShardScan(shard, match, batch, operation="reshard plan")
            while True:
                command = scan.command()
                if scan.cursor == 0:  # a pass begins (again, on a new master): count afresh
                    scanned = 0
                    targets.clear()
                found = scan.take(calls.one(shard, command))
                room = len(found) if sample is None else sample - scanned
                dropped = len(found) > room
                found = found[:room]
                scanned += len(found)
                for key in found:
                    owner = owner_of(key)
                    if owner is not shard and not is_reserved(key):
                        targets[owner.name] = targets.get(owner.name, 0) + 1
                if scan.done or scanned == sample:
                    complete = scan.done and not dropped
                    break
        except MASTER_ERRORS as exc:
            error = f"{type(exc).__name__}: {exc}"
        scale = 1.0
        if not complete and error is None and scanned and keys:
            scale = keys / scanned
        for target, count in targets.items():
            pair = (shard.name, target)
            counted[pair] = counted.get(pair, 0) + count
            estimated[pair] = estimated.get(pair, 0) + round(count * scale)
        shards.append(
            ShardPlan(
                name=shard.name,
                position=position,
                leaving=shard.name not in current,
                keys=keys,
                scanned=scanned,
                moving=sum(targets.values()),
                complete=complete,
                error=error,
            )
        )
    expected = {(a, b): f for a, b, f in moves.pairs}
    flows = tuple(
        Flow(a, b, counted.get((a, b), 0), estimated.get((a, b), 0), expected.get((a, b), 0.0))
        for a, b in sorted(set(counted) | set(expected))
    )
    return Plan(
        match=match,
        sample=sample,
        movement=moves,
        shards=tuple(shards),
        flows=flows,
        seconds=time.monotonic() - started,
    )


# -- the migration -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Progress:
    """Where a migration stands, given to the ``progress`` callback after every batch and when
    a shard is done (or given up)."""

    shard: str
    position: int  # of this shard among the sources (0-based)
    shards: int  # sources in all
    scanned: int  # keys scanned on this shard
    moved: int  # keys moved from this shard (restored, or already on their owner)
    keys: int  # DBSIZE of this shard when the migration began
    total_scanned: int
    total_moved: int
    total_keys: int
    elapsed: float
    rate: float  # keys moved per second so far
    scan_rate: float  # keys scanned per second so far
    eta: float | None  # seconds left, from the DBSIZE estimates (None: unknown yet)
    done: bool = False  # this shard is finished (or given up, with ``error``)
    error: str | None = None

    @property
    def fraction(self) -> float:
        """Of the keys estimated, the fraction scanned (capped below 1 until the end)."""
        if not self.total_keys:
            return 0.0
        return min(self.total_scanned / self.total_keys, 1.0)


@dataclass(frozen=True)
class PairReport:
    """The keys of one (from, to) master pair: moved, found already on the owner (a newer value
    written through the new ring, or moved by a reader), or gone before the move (expired, or
    deleted)."""

    source: str
    target: str
    moved: int
    already_present: int
    expired: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "to": self.target,
            "moved": self.moved,
            "already_present": self.already_present,
            "expired": self.expired,
        }


@dataclass(frozen=True)
class ShardReport:
    """One source shard's part of a migration."""

    name: str
    position: int  # in PREVIOUS_MASTERS
    leaving: bool
    keys: int | None  # DBSIZE when the migration began
    scanned: int
    moved: int
    already_present: int
    expired: int
    restarts: int  # scans begun again after the shard's master changed
    seconds: float
    complete: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "position": self.position,
            "leaving": self.leaving,
            "keys": self.keys,
            "scanned": self.scanned,
            "moved": self.moved,
            "already_present": self.already_present,
            "expired": self.expired,
            "restarts": self.restarts,
            "seconds": self.seconds,
            "complete": self.complete,
            "error": self.error,
        }


@dataclass(frozen=True)
class Report:
    """What :func:`migrate` did. ``complete`` is False when a shard was given up (its keys stay
    readable through the transitional ring; run the migration again)."""

    match: str
    rate_limit: float | None
    seconds: float
    shards: tuple[ShardReport, ...]
    pairs: tuple[PairReport, ...]

    @property
    def scanned(self) -> int:
        return sum(s.scanned for s in self.shards)

    @property
    def moved(self) -> int:
        return sum(s.moved for s in self.shards)

    @property
    def already_present(self) -> int:
        return sum(s.already_present for s in self.shards)

    @property
    def expired(self) -> int:
        return sum(s.expired for s in self.shards)

    @property
    def rate(self) -> float:
        """Keys moved per second."""
        return self.moved / self.seconds if self.seconds > 0 else 0.0

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(f"{s.name}: {s.error}" for s in self.shards if s.error)

    @property
    def complete(self) -> bool:
        return all(s.complete for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": False,
            "match": self.match,
            "rate_limit": self.rate_limit,
            "seconds": self.seconds,
            "scanned": self.scanned,
            "moved": self.moved,
            "already_present": self.already_present,
            "expired": self.expired,
            "rate": self.rate,
            "complete": self.complete,
            "errors": list(self.errors),
            "pairs": [p.to_dict() for p in self.pairs],
            "shards": [s.to_dict() for s in self.shards],
        }


class TokenBucket:
    """At most ``rate`` tokens a second on average, ``burst`` at once: :meth:`take` sleeps off
    any debt."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = float(rate)
        self.capacity = float(burst if burst is not None else max(1.0, rate / 10))
        self.tokens = self.capacity
        self._clock = clock
        self._sleep = sleep
        self._last = clock()

    def take(self, n: float) -> None:
        now = self._clock()
        self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.rate)
        self._last = now
        self.tokens -= n
        if self.tokens < 0:
            self._sleep(-self.tokens / self.rate)


class _Calls:
    """Commands on one shard's master through the core's safety net (re-resolve, one retry after
    a switch), retried with a backoff while the shard is unavailable (a failover in progress),
    for at most ``retry_for`` seconds. Credentials refused are raised at once."""

    def __init__(
        self,
        core: ShardedSentinelPool,
        retry_for: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ops = CacheClient(core, Codec())
        self.retry_for = retry_for
        self.clock = clock
        self.sleep = sleep

    def _retrying(self, shard: Shard, attempt: Callable[[], Any]) -> Any:
        deadline: float | None = None
        delay = 0.05
        while True:
            try:
                return attempt()
            except AuthenticationError:
                raise
            except MASTER_ERRORS as exc:
                now = self.clock()
                if deadline is None:
                    deadline = now + self.retry_for
                    logger.warning(
                        "reshard: shard %s unavailable (%s: %s); retrying for up to %gs",
                        shard.label,
                        type(exc).__name__,
                        exc,
                        self.retry_for,
                    )
                if now >= deadline:
                    raise
                self.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 1.0)

    def run(self, shard: Shard, commands: Sequence[Command], *, retry: bool = True) -> list[Any]:
        attempt = lambda: self.ops.execute(shard, commands, write=True)  # noqa: E731
        return self._retrying(shard, attempt) if retry else attempt()

    def one(self, shard: Shard, command: Command, *, retry: bool = True) -> Any:
        return self.run(shard, [command], retry=retry)[0]

    def scatter(self, plan: Mapping[Shard, Sequence[Command]]) -> dict[Shard, list[Any]]:
        """Every shard's batch sent before any reply is read. After a failure, each shard's
        batch is sent again on its own, with the retries of :meth:`run`: every command sent here
        is idempotent (a restore that had been applied then counts as already present)."""
        try:
            replies = self.ops.scatter(plan, write=True, operation="reshard")
        except AuthenticationError:
            raise
        except MASTER_ERRORS:
            replies = {}
        return {
            shard: replies.get(shard) or self.run(shard, commands)
            for shard, commands in plan.items()
        }


class _Tally:
    """A source shard's running counts."""

    def __init__(self, shard: Shard, position: int, leaving: bool, keys: int | None) -> None:
        self.shard = shard
        self.position = position
        self.leaving = leaving
        self.keys = keys
        self.scanned = 0
        self.moved = 0
        self.already_present = 0
        self.expired = 0
        self.restarts = 0
        self.seconds = 0.0
        self.complete = False
        self.finished = False
        self.error: str | None = None

    def freeze(self) -> ShardReport:
        return ShardReport(
            name=self.shard.name,
            position=self.position,
            leaving=self.leaving,
            keys=self.keys,
            scanned=self.scanned,
            moved=self.moved,
            already_present=self.already_present,
            expired=self.expired,
            restarts=self.restarts,
            seconds=self.seconds,
            complete=self.complete and self.error is None,
            error=self.error,
        )


_Restores = dict[Shard, list[tuple[Any, int, bytes]]]  # per owner: (key, ttl ms, DUMP)
_Gone = dict[Shard, list[Any]]  # per owner: keys gone from the source before their DUMP
_Deadlines = dict[Shard, int]  # per owner: its restores' deadline, on its clock


class _Abandon(Exception):
    """A shard is given up (its keys stay where they are, readable through the transitional
    ring)."""


class _Migration:
    def __init__(
        self,
        core: ShardedSentinelPool,
        *,
        match: str,
        rate: float | None,
        batch: int,
        progress: ProgressCallback | None,
        retry_for: float,
        delete_delay: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = core
        self.owner_of = _owner_lookup(core)
        self.match = match
        self.rate = rate
        self.batch = batch
        self.chunk = batch if rate is None else max(1, min(batch, int(rate / 10)))
        self.bucket = (
            None if rate is None else TokenBucket(rate, self.chunk, clock=clock, sleep=sleep)
        )
        self.progress = progress
        self.delete_delay = delete_delay
        self.clock = clock
        self.sleep = sleep
        self.calls = _Calls(core, retry_for, clock=clock, sleep=sleep)
        self.pairs: dict[tuple[str, str], list[int]] = {}
        # (due, tally, keys): old copies to delete once their restore is old enough.
        self.pending: deque[tuple[float, _Tally, list[Any]]] = deque()
        self.tallies: list[_Tally] = []
        self.started = clock()
        # The owners' side runs in a helper thread, so the source reads the next chunk while
        # the owners restore this one: (tally, restores, gone, deadlines) per chunk, None to stop.
        self.work: queue.Queue[tuple[_Tally, _Restores, _Gone, _Deadlines] | None] = queue.Queue(
            maxsize=2
        )
        self.failure: BaseException | None = None

    # -- the whole run --------------------------------------------------------------------
    def run(self) -> Report:
        worker = threading.Thread(target=self._restorer, name="sentinel-reshard", daemon=True)
        worker.start()
        try:
            report = self._run()
        except BaseException:  # Ctrl-C: what is queued is dropped, and the helper told to end
            self.failure = self.failure or _Abandon("the migration was interrupted")
            while True:
                try:
                    self.work.put_nowait(None)
                    break
                except queue.Full:
                    with contextlib.suppress(queue.Empty):
                        self.work.get_nowait()
                        self.work.task_done()
            raise
        self.work.put(None)
        worker.join()
        return report

    def _run(self) -> Report:
        current = set(self.core.config.masters)
        for position, shard in enumerate(_sources(self.core)):
            keys: int | None
            try:
                keys = int(self.calls.one(shard, ("DBSIZE",), retry=False))
            except MASTER_ERRORS:
                keys = None  # the shard's own pass retries, and says why if it cannot
            self.tallies.append(_Tally(shard, position, shard.name not in current, keys))
        for tally in self.tallies:
            began = self.clock()
            try:
                self._shard(tally)
                self._drain()
                tally.complete = True
            except (_Abandon, ResponseError, *MASTER_ERRORS) as exc:
                self._drain(quiet=True)
                self._give_up(tally, exc)
            tally.seconds = self.clock() - began
            tally.finished = True
            self._report(tally, done=True)
        self._flush(final=True)
        pairs = tuple(PairReport(a, b, *counts) for (a, b), counts in sorted(self.pairs.items()))
        return Report(
            match=self.match,
            rate_limit=self.rate,
            seconds=self.clock() - self.started,
            shards=tuple(t.freeze() for t in self.tallies),
            pairs=pairs,
        )

    def _give_up(self, tally: _Tally, exc: BaseException) -> None:
        tally.error = str(exc) if isinstance(exc, _Abandon) else f"{type(exc).__name__}: {exc}"
        logger.error("reshard: shard %s given up: %s", tally.shard.label, tally.error)

    # -- one source shard -----------------------------------------------------------------
    def _shard(self, tally: _Tally) -> None:
        """Every key of the shard that belongs elsewhere now, moved. After the shard's master
        changed the scan begins again (:class:`~sentinel_cache.core.ops.scan.ShardScan`; a rescan is
        cheap: what moved is gone)."""
        shard = tally.shard
        owner_of = self.owner_of
        movers: list[tuple[Any, Shard]] = []  # keys to move, gathered until a chunk is full
        scan = ShardScan(shard, self.match, self.batch, operation="reshard")
        while not scan.done:
            keys = scan.take(self.calls.one(shard, scan.command()))
            tally.restarts = scan.restarts
            tally.scanned += len(keys)
            for key in keys:
                owner = owner_of(key)
                if owner is not shard and not is_reserved(key):  # a tombstone stays put
                    movers.append((key, owner))
            while len(movers) >= self.chunk or (movers and scan.cursor == 0):
                chunk, movers = movers[: self.chunk], movers[self.chunk :]
                if self.bucket is not None:
                    self.bucket.take(len(chunk))
                if self.failure is not None:
                    raise self.failure
                self.work.put((tally, *self._dump(tally, chunk)))
            self._flush()
            if not scan.done:
                self._report(tally)

    def _move(self, tally: _Tally, chunk: Sequence[tuple[Any, Shard]]) -> None:
        """One chunk moved, both halves in this thread."""
        self._restore(tally, *self._dump(tally, chunk))

    def _dump(
        self, tally: _Tally, chunk: Sequence[tuple[Any, Shard]]
    ) -> tuple[_Restores, _Gone, _Deadlines]:
        """The source's half of a chunk: each key's TTL and ``DUMP`` read in one script, with
        every owner's clock in the same round trip (the restores' deadlines, see
        :func:`~sentinel_cache.core.ops.plans.copy_deadline`); per owner, what to restore there and
        the keys that were gone."""
        keys = [key for key, _ in chunk]
        plan: dict[Shard, list[Command]] = {
            tally.shard: [("EVAL", DUMP_WITH_TTL, len(keys), *keys)]
        }
        for _, owner in chunk:
            plan.setdefault(owner, [("TIME",)])
        began = time.monotonic()
        answers = self.calls.scatter(plan)
        elapsed = time.monotonic() - began
        replies = answers[tally.shard][0]
        deadlines = {
            owner: copy_deadline(answers[owner][0], elapsed)
            for owner in plan
            if owner is not tally.shard
        }
        restores: _Restores = {}
        gone: _Gone = {}
        for i, (key, owner) in enumerate(chunk):
            ttl, dump = replies[2 * i], replies[2 * i + 1]
            # PTTL 0: expiring within the millisecond (RESTORE would read 0 as "no expiry").
            if dump is None or ttl == -2 or ttl == 0:
                gone.setdefault(owner, []).append(key)
            else:
                restores.setdefault(owner, []).append((key, max(int(ttl), 0), dump))
        return restores, gone, deadlines

    def _restore(
        self, tally: _Tally, restores: _Restores, gone: _Gone, deadlines: _Deadlines
    ) -> None:
        """The owners' half: per owner one ``RESTORE_MISSING`` (and an ``EXISTS`` per key that
        was gone: moved by a reader, or expired), the owners' batches sent together; the
        source's copies of the keys now on their owners (or deleted there) deleted a moment
        later. A key whose restore came after its deadline stays on the source, for the next
        run (the shard is reported incomplete)."""
        plan: dict[Shard, list[Command]] = {}
        for owner, items in restores.items():
            args = [x for _, ttl, dump in items for x in (ttl, dump)]
            keys = [k for k, _, _ in items]
            plan[owner] = [("EVAL", RESTORE_MISSING, len(items), *keys, deadlines[owner], *args)]
        for owner, lost in gone.items():
            plan.setdefault(owner, []).extend(("EXISTS", key) for key in lost)
        answers = self.calls.scatter(plan)
        delete: list[Any] = []
        late = 0
        for owner, owner_replies in answers.items():
            items = restores.get(owner, [])
            if items:
                done, owner_replies = owner_replies[0], owner_replies[1:]
                for (key, _, _), outcome in zip(items, done, strict=True):
                    if outcome == 3:
                        late += 1
                        continue
                    # 1 restored, 0 a newer value there, 2 deleted there since (a tombstone).
                    self._count(tally, owner, {1: 0, 0: 1, 2: 2}[outcome])
                    delete.append(key)
            for _key, exists in zip(gone.get(owner, []), owner_replies, strict=True):
                self._count(tally, owner, 1 if exists else 2)
        if late and tally.error is None:
            tally.error = (
                f"{late} keys not moved (their restore came after its deadline): run again"
            )
        if delete:
            self.pending.append((self.clock() + self.delete_delay, tally, delete))

    def _restorer(self) -> None:
        """The helper thread: the owners' half of every chunk, in order; the first failure is
        kept for the main thread (the chunks after it are skipped until it is collected)."""
        while True:
            item = self.work.get()
            try:
                if item is None:
                    return
                if self.failure is None:
                    self._restore(*item)
            except BaseException as exc:  # handed to the main thread
                self.failure = exc
            finally:
                self.work.task_done()

    def _drain(self, *, quiet: bool = False) -> None:
        """Wait for the chunks handed to the helper thread; raise its failure (unless
        ``quiet``: the shard is being given up for another reason already)."""
        self.work.join()
        failure, self.failure = self.failure, None
        if failure is not None and not quiet:
            raise failure

    def _count(self, tally: _Tally, owner: Shard, outcome: int) -> None:
        counts = self.pairs.setdefault((tally.shard.name, owner.name), [0, 0, 0])
        counts[outcome] += 1
        if outcome == 0:
            tally.moved += 1
        elif outcome == 1:
            tally.already_present += 1
        else:
            tally.expired += 1

    def _flush(self, *, final: bool = False) -> None:
        """Delete the old copies whose restore is old enough (every one at the end, after the
        last delay)."""
        while self.pending:
            due, tally, keys = self.pending[0]
            wait = due - self.clock()
            if wait > 0:
                if not final:
                    return
                self.sleep(wait)
            self.pending.popleft()
            try:
                self.calls.one(tally.shard, ("DEL", *keys))
            except MASTER_ERRORS as exc:
                # The moved keys are on their owners; the old copies stay until the next run
                # (reads and writes go to the owner first, so they are never served).
                if tally.error is None:
                    tally.error = (
                        f"old copies of {len(keys)} moved keys not deleted: "
                        f"{type(exc).__name__}: {exc}"
                    )

    def _report(self, tally: _Tally, *, done: bool = False) -> None:
        if self.progress is None:
            return
        elapsed = max(self.clock() - self.started, 1e-9)
        total_scanned = sum(t.scanned for t in self.tallies)
        total_moved = sum(t.moved + t.already_present for t in self.tallies)
        # A finished shard counts what it scanned; the others their DBSIZE at the start.
        total_keys = 0
        left = 0
        for t in self.tallies:
            if t.finished:
                total_keys += t.scanned
            else:
                estimate = max(t.keys or 0, t.scanned)
                total_keys += estimate
                left += estimate - t.scanned
        scan_rate = total_scanned / elapsed
        eta = left / scan_rate if scan_rate > 0 else None
        self.progress(
            Progress(
                shard=tally.shard.name,
                position=tally.position,
                shards=len(self.tallies),
                scanned=tally.scanned,
                moved=tally.moved + tally.already_present,
                keys=tally.keys or 0,
                total_scanned=total_scanned,
                total_moved=total_moved,
                total_keys=total_keys,
                elapsed=elapsed,
                rate=total_moved / elapsed,
                scan_rate=scan_rate,
                eta=eta,
                done=done,
                error=tally.error if done else None,
            )
        )


def migrate(
    core: ShardedSentinelPool,
    *,
    match: str = "*",
    rate: float | None = None,
    batch: int = DEFAULT_BATCH,
    progress: ProgressCallback | None = None,
    retry_for: float = DEFAULT_RETRY_FOR,
    delete_delay: float = DEFAULT_DELETE_DELAY,
) -> Report:
    """Move every key matching ``match`` whose owner changed from its previous owner to its
    owner now, with its remaining TTL; never over a value written meanwhile through the new
    ring (that one wins, and the old copy is deleted).

    ``rate`` caps the keys moved per second (token bucket); ``batch`` is the ``SCAN COUNT`` and
    the keys moved per round trip. ``progress(Progress)`` is called after every batch and when a
    shard is done. A shard unavailable for longer than ``retry_for`` seconds is given up (the
    report says which; its keys stay readable; run again). Each old copy is deleted
    ``delete_delay`` seconds after its restore, so a reader that missed on the owner just before
    the restore still finds it on the previous owner. Idempotent: a second run (or a run after a
    killed one) moves only what is left. Raises :class:`ConfigurationError` without
    ``PREVIOUS_MASTERS``.
    """
    _require_previous(core)
    if batch < 1:
        raise ValueError(f"batch must be a positive number of keys, got {batch}")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be a positive number of keys per second, got {rate}")
    if retry_for < 0 or delete_delay < 0:
        raise ValueError("retry_for and delete_delay must not be negative")
    return _Migration(
        core,
        match=match,
        rate=rate,
        batch=batch,
        progress=progress,
        retry_for=retry_for,
        delete_delay=delete_delay,
    ).run()


# -- rendering, for the commands ---------------------------------------------------------------
def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "  ") -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines


def _placement(names: Sequence[str], weights: Sequence[int]) -> str:
    text = "[" + ", ".join(names) + "]"
    if any(w != 1 for w in weights):
        text += " weights [" + ", ".join(map(str, weights)) + "]"
    return text


def render_plan(plan: Plan, *, title: str | None = None) -> str:
    """A dry run's plan for a terminal."""
    moves = plan.movement
    lines = []
    if title:
        lines.append(title)
    lines.append(
        f"Dry run: PREVIOUS_MASTERS {_placement(moves.previous, moves.previous_weights)} -> "
        f"MASTERS {_placement(moves.masters, moves.weights)}; nothing was moved."
    )
    how = (
        "a full scan" if plan.sample is None else f"a sample of up to {plan.sample:,} keys a shard"
    )
    lines.append(f"Keys matching {plan.match!r}, from {how} ({plan.seconds:.1f} s):")
    rows = []
    for s in plan.shards:
        share = f" ({s.moving / s.scanned:.1%})" if s.scanned else ""
        state = "error: " + s.error if s.error else ("scanned" if s.complete else "sampled")
        rows.append(
            [
                s.name + (" (leaving)" if s.leaving else ""),
                s.position,
                "?" if s.keys is None else f"{s.keys:,}",
                f"{s.scanned:,}",
                f"{s.moving:,}{share}",
                state,
            ]
        )
    lines += _table(["shard", "position", "keys", "scanned", "moving", ""], rows)
    if plan.flows:
        lines.append("Moves:")
        rows = []
        for f in plan.flows:
            share = f"{f.keys / plan.scanned:.1%}" if plan.scanned else "-"
            rows.append(
                [
                    f"{f.source} -> {f.target}",
                    f"{f.keys:,}",
                    f"{f.estimated:,}",
                    share,
                    f"{f.expected:.1%}",
                ]
            )
        lines += _table(["from -> to", "keys", "estimated", "of scanned", "expected"], rows)
    lines.append(
        f"Total: {plan.moving:,} of {plan.scanned:,} keys scanned would move ({plan.fraction:.1%}; "
        f"about {plan.estimated:,} in all). The rings say {moves.fraction:.1%}; the least any "
        f"placement could move is {moves.minimal:.1%}."
    )
    if plan.warnings:
        lines.append("Warnings:")
        lines += [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"


def render_report(report: Report, *, title: str | None = None) -> str:
    """A migration's report for a terminal."""
    lines = []
    if title:
        lines.append(title)
    state = "done" if report.complete else "INCOMPLETE (run it again once the shards are back)"
    lines.append(
        f"Migration {state} in {report.seconds:.1f} s: {report.moved:,} keys moved "
        f"({report.rate:,.0f} keys/s), {report.already_present:,} already on their owner, "
        f"{report.expired:,} expired before the move; {report.scanned:,} keys scanned "
        f"matching {report.match!r}."
    )
    if report.pairs:
        rows = [
            [
                f"{p.source} -> {p.target}",
                f"{p.moved:,}",
                f"{p.already_present:,}",
                f"{p.expired:,}",
            ]
            for p in report.pairs
        ]
        lines += _table(["from -> to", "moved", "already present", "expired"], rows)
    rows = []
    for s in report.shards:
        state = "done" if s.complete else "error: " + (s.error or "incomplete")
        if s.complete and s.error:
            state = "done; " + s.error
        rows.append(
            [
                s.name + (" (leaving)" if s.leaving else ""),
                f"{s.scanned:,}",
                f"{s.moved + s.already_present + s.expired:,}",
                str(s.restarts),
                f"{s.seconds:.1f} s",
                state,
            ]
        )
    lines.append("Shards:")
    lines += _table(["shard", "scanned", "handled", "rescans", "time", ""], rows)
    return "\n".join(lines) + "\n"


def render_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


class ProgressPrinter:
    """The commands' progress display: on a terminal one bar redrawn in place; otherwise a
    plain line when a shard is done and at most every ``interval`` seconds between."""

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        tty: bool,
        interval: float = 5.0,
        width: int = 24,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write = write
        self.tty = tty
        self.interval = interval
        self.width = width
        self.clock = clock
        self._last: float | None = None
        self._drawn = 0

    @staticmethod
    def line(p: Progress) -> str:
        return (
            f"shard {p.position + 1}/{p.shards} {p.shard}: scanned {p.scanned:,}/~{p.keys:,}, "
            f"moved {p.moved:,}; total moved {p.total_moved:,} at {p.rate:,.0f} keys/s, "
            f"ETA {_duration(p.eta)}"
        )

    def __call__(self, p: Progress) -> None:
        if self.tty:
            filled = int(round(p.fraction * self.width))
            bar = "#" * filled + "-" * (self.width - filled)
            text = f"[{bar}] {p.fraction:4.0%} {self.line(p)}"
            self.write("\r" + text + " " * max(0, self._drawn - len(text)))
            self._drawn = len(text)
            if p.done and p.error:
                self.write(f"\nshard {p.shard} given up: {p.error}\n")
                self._drawn = 0
            return
        now = self.clock()
        if p.done or self._last is None or now - self._last >= self.interval:
            self._last = now
            suffix = ""
            if p.done:
                suffix = f" (given up: {p.error})" if p.error else " (done)"
            self.write(self.line(p) + suffix + "\n")

    def close(self) -> None:
        """End the bar's line."""
        if self.tty and self._drawn:
            self.write("\n")
            self._drawn = 0
