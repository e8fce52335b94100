"""What a migration reports: its progress as it goes, and per shard and master pair at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PairReport", "Progress", "Report", "ShardReport"]


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
