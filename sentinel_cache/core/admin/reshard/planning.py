"""The dry run: what the servers hold, and what of it a migration would move."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sentinel_cache.core.admin.reshard.calls import DEFAULT_RETRY_FOR, Calls, owner_lookup, sources
from sentinel_cache.core.admin.reshard.rings import Movement, movement_of, require_previous
from sentinel_cache.core.ops.plans import is_reserved
from sentinel_cache.core.ops.scan import ShardScan
from sentinel_cache.core.topology.shard import MASTER_ERRORS
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

__all__ = ["PLAN_BATCH", "Flow", "Plan", "ShardPlan", "plan"]

PLAN_BATCH = 1000


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
    require_previous(core)
    if sample is not None and sample < 1:
        raise ValueError(f"sample must be a positive number of keys per shard, got {sample}")
    started = time.monotonic()
    moves = movement_of(core)
    calls = Calls(core, retry_for)
    owner_of = owner_lookup(core)
    current = set(core.config.masters)
    shards: list[ShardPlan] = []
    counted: dict[tuple[str, str], int] = {}
    estimated: dict[tuple[str, str], int] = {}
    for position, shard in enumerate(sources(core)):
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
