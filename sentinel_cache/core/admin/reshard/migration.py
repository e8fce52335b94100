"""The migration: every key whose owner changed, moved from its previous owner (see the
package's docstring for the steps)."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.exceptions import ResponseError

from sentinel_cache.core.admin.reshard.calls import (
    DEFAULT_RETRY_FOR,
    Calls,
    TokenBucket,
    owner_lookup,
    sources,
)
from sentinel_cache.core.admin.reshard.reports import PairReport, Progress, Report, ShardReport
from sentinel_cache.core.admin.reshard.rings import require_previous
from sentinel_cache.core.config import CacheOptions
from sentinel_cache.core.ops.plans import (
    DUMP_WITH_TTL,
    RESTORE_MISSING,
    Command,
    copy_deadline,
    is_reserved,
)
from sentinel_cache.core.ops.scan import ShardScan
from sentinel_cache.core.topology.shard import MASTER_ERRORS, Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_DELETE_DELAY",
    "Migration",
    "ProgressCallback",
    "Tally",
    "durability",
    "migrate",
]

logger = logging.getLogger("sentinel_cache")

DEFAULT_BATCH = 500
# A moved key's old copy is deleted this long after its restore: a reader that found the owner
# empty just before the restore still finds the old copy when it asks the previous owner.
DEFAULT_DELETE_DELAY = 0.2

ProgressCallback = Callable[[Progress], None]


class Tally:
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


class Migration:
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
        durable_replicas: int = 0,
        durable_timeout_ms: int = 100,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = core
        self.owner_of = owner_lookup(core)
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
        self.calls = Calls(
            core,
            retry_for,
            durable_replicas=durable_replicas,
            durable_timeout_ms=durable_timeout_ms,
            clock=clock,
            sleep=sleep,
        )
        self.pairs: dict[tuple[str, str], list[int]] = {}
        # (due, tally, keys): old copies to delete once their restore is old enough.
        self.pending: deque[tuple[float, Tally, list[Any]]] = deque()
        self.tallies: list[Tally] = []
        self.started = clock()
        # The owners' side runs in a helper thread, so the source reads the next chunk while
        # the owners restore this one: (tally, restores, gone, deadlines) per chunk, None to stop.
        self.work: queue.Queue[tuple[Tally, _Restores, _Gone, _Deadlines] | None] = queue.Queue(
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
        for position, shard in enumerate(sources(self.core)):
            keys: int | None
            try:
                keys = int(self.calls.one(shard, ("DBSIZE",), retry=False))
            except MASTER_ERRORS:
                keys = None  # the shard's own pass retries, and says why if it cannot
            self.tallies.append(Tally(shard, position, shard.name not in current, keys))
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

    def _give_up(self, tally: Tally, exc: BaseException) -> None:
        tally.error = str(exc) if isinstance(exc, _Abandon) else f"{type(exc).__name__}: {exc}"
        logger.error("reshard: shard %s given up: %s", tally.shard.label, tally.error)

    # -- one source shard -----------------------------------------------------------------
    def _shard(self, tally: Tally) -> None:
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

    def _move(self, tally: Tally, chunk: Sequence[tuple[Any, Shard]]) -> None:
        """One chunk moved, both halves in this thread."""
        self._restore(tally, *self._dump(tally, chunk))

    def _dump(
        self, tally: Tally, chunk: Sequence[tuple[Any, Shard]]
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
        self, tally: Tally, restores: _Restores, gone: _Gone, deadlines: _Deadlines
    ) -> None:
        """The owners' half: per owner one ``RESTORE_MISSING`` (and an ``EXISTS`` per key that
        was gone: moved by a reader, or expired), the owners' batches sent together, each
        followed by the WAIT of DURABLE_REPLICAS; the source's copies of the keys now on their
        owners (or deleted there) deleted a moment later. A key whose restore came after its deadline stays on the source, for the next
        run (the shard is reported incomplete)."""
        plan: dict[Shard, list[Command]] = {}
        for owner, items in restores.items():
            args = [x for _, ttl, dump in items for x in (ttl, dump)]
            keys = [k for k, _, _ in items]
            plan[owner] = [("EVAL", RESTORE_MISSING, len(items), *keys, deadlines[owner], *args)]
        for owner, lost in gone.items():
            plan.setdefault(owner, []).extend(("EXISTS", key) for key in lost)
        answers = self.calls.written(plan)  # on the owners' replicas before the source's DEL
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

    def _count(self, tally: Tally, owner: Shard, outcome: int) -> None:
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
                self.calls.written({tally.shard: [("DEL", *keys)]})
            except MASTER_ERRORS as exc:
                # The moved keys are on their owners; the old copies stay until the next run
                # (reads and writes go to the owner first, so they are never served).
                if tally.error is None:
                    tally.error = (
                        f"old copies of {len(keys)} moved keys not deleted: "
                        f"{type(exc).__name__}: {exc}"
                    )

    def _report(self, tally: Tally, *, done: bool = False) -> None:
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
    durable_replicas: int = 0,
    durable_timeout_ms: int = 100,
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
    killed one) moves only what is left. ``durable_replicas``, ``durable_timeout_ms``: the
    caches' ``DURABLE_REPLICAS`` (:func:`durability` of their options): each owner's restores
    are followed by the same ``WAIT`` as every write, before the source's copies are deleted,
    and so are those deletes (a shortfall logged). Raises :class:`ConfigurationError` without
    ``PREVIOUS_MASTERS``.
    """
    require_previous(core)
    if batch < 1:
        raise ValueError(f"batch must be a positive number of keys, got {batch}")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be a positive number of keys per second, got {rate}")
    if retry_for < 0 or delete_delay < 0:
        raise ValueError("retry_for and delete_delay must not be negative")
    if durable_replicas < 0 or durable_timeout_ms < 0:
        raise ValueError(
            f"durable_replicas and durable_timeout_ms must not be negative, got "
            f"{durable_replicas} and {durable_timeout_ms}"
        )
    return Migration(
        core,
        match=match,
        rate=rate,
        batch=batch,
        progress=progress,
        retry_for=retry_for,
        delete_delay=delete_delay,
        durable_replicas=durable_replicas,
        durable_timeout_ms=durable_timeout_ms,
    ).run()


def durability(options: Iterable[CacheOptions]) -> dict[str, int]:
    """:func:`migrate`'s ``durable_replicas`` and ``durable_timeout_ms`` for the caches sharing
    one core (their keys live on the same servers, and one migration moves them all): the most
    replicas any of them waits for, and the longest timeout among those that wait."""
    waiting = [o for o in options if o.durable_replicas > 0]
    if not waiting:
        return {"durable_replicas": 0, "durable_timeout_ms": 100}
    return {
        "durable_replicas": max(o.durable_replicas for o in waiting),
        "durable_timeout_ms": max(o.durable_timeout_ms for o in waiting),
    }
