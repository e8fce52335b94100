"""Warm adoption (issue 25): the cache a team runs today (django-redis, Django's ``RedisCache``,
Flask-Caching's Redis backend) read through and emptied into this one, framework-free.

The adapters wrap the old backend in a :class:`PreviousCache` (its own key function, serializer,
compressor and sharding read the values) and apply two rules, each declared once there:

* a miss is served from the previous cache and copied (:meth:`Adopter.adopt`); a key the
  previous cache no longer has is read on ours again before it is reported missing (a
  concurrent reader copies before it deletes the previous copy, so the second read finds it);
  a value the previous backend cannot decode is a miss, one our serializer cannot store is
  served from there and not copied: both stay there, skipped and listed by the migration (the
  second is present to a conditional write too: :meth:`Adopter.adopt_to_write`);
* a write moves the previous copy onto ours first, then deletes it there
  (:meth:`Adopter.move_then_forget`: a reader between the two finds the copy on ours), a
  delete only deletes it (:meth:`Adopter.forget`); a previous cache that cannot delete it
  fails the write, whatever its backend's ``IGNORE_EXCEPTIONS``; a ``clear`` or pattern
  delete empties the previous cache first (:meth:`Adopter.cleared`).

The copies pass the resharding's guard (:data:`~sentinel_cache.core.ops.scripts.COPY_MISSING`):
never over a value there, never over a delete since (its tombstone), never after the copy's
deadline. A delete removes the previous copy, then leaves a tombstone before it deletes ours,
so a copy of a deleted value that read the previous cache before the delete either lands before
the delete on ours (which removes it) or is refused (read the protocol in the scripts module).
With ``DURABLE_REPLICAS`` (the option of the cache whose client the :class:`Adopter` has) each
shard's copies are followed by its ``WAIT``, and the previous copies are removed only after it.

:func:`migrate_previous` empties the previous cache (``sentinel_reshard --from-previous-cache``,
``flask sentinel-reshard --from-previous-cache``): its servers ``SCAN``ned for its keys, each
batch adopted as a reader would, reported like a resharding.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sentinel_cache.core.admin.reshard.calls import TokenBucket
from sentinel_cache.core.admin.reshard.rendering import render_report
from sentinel_cache.core.admin.reshard.reports import PairReport, Progress, Report, ShardReport
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ops.plans import MISS, Command
from sentinel_cache.core.ops.scripts import (
    CLEARED,
    COPY_MISSING,
    TOMBSTONE_MS,
    TOMBSTONE_PREFIX,
    copy_deadline,
)
from sentinel_cache.core.topology.shard import MASTER_ERRORS, Shard
from sentinel_cache.exceptions import ConfigurationError, SerializationError, ShardUnavailableError

__all__ = [
    "COPIED",
    "DELETED",
    "EXPIRED",
    "GONE",
    "KEPT",
    "LATE",
    "LISTED",
    "PRESENT",
    "SKIPPED",
    "UNREADABLE",
    "UNREPRESENTABLE",
    "Adopter",
    "PreviousCache",
    "PreviousPlan",
    "migrate_previous",
    "plan_previous",
    "pttls_on",
    "refuse_with_resharding",
    "render_previous_plan",
    "run_previous",
]

logger = logging.getLogger("sentinel_cache")

#: A copy's outcome: copied; refused, a value is on ours (it wins); refused, deleted or cleared
#: on ours since; gone from the previous cache before its TTL was read; refused, too late.
COPIED, PRESENT, DELETED, EXPIRED, LATE = "copied", "present", "deleted", "expired", "late"
#: Not copied, left on the previous cache: its backend raised decoding the value (a "poison"
#: value: a miss to a reader, skipped and listed by the migration); our serializer cannot store
#: the value (served as the previous cache decodes it, on every read, until written here).
UNREADABLE, UNREPRESENTABLE = "unreadable", "unrepresentable"
SKIPPED = (UNREADABLE, UNREPRESENTABLE)
#: The outcomes that leave the previous copy where it is (a write deletes it first).
KEPT = (DELETED, LATE, *SKIPPED)
#: How many skipped keys a migration report lists by name (all are counted).
LISTED = 100
#: What :meth:`PreviousCache.pttls` says of a key that is not there (any more).
GONE = -2


def refuse_with_resharding(previous_masters: Sequence[str], setting: str, value: Any) -> None:
    """A ConfigurationError naming ``setting`` when a resharding is under way too: a copy would
    go to a key's new owner while a newer value may still be on its previous one."""
    if previous_masters:
        raise ConfigurationError(
            option=setting,
            value=value,
            reason="cannot be combined with PREVIOUS_MASTERS: finish the resharding (or the "
            "adoption) first, then start the other",
        )


class PreviousCache(Protocol):
    """The cache being replaced, through its own backend (keys are the caller's)."""

    label: str  # for messages and reports, e.g. "CACHES['old']"

    def read(self, keys: Sequence[Any]) -> dict[Any, Any]:
        """The values it holds of these keys (absent ones left out)."""

    def pttls(self, keys: Sequence[Any]) -> dict[Any, int | None]:
        """Each key's milliseconds left, None for no expiry, :data:`GONE`; or its default when
        the backend cannot tell (the adapter's rule). One round trip per server."""

    def remove(self, keys: Sequence[Any]) -> None:
        """Delete these keys from it, raising if it cannot: through its servers' own clients
        where the backend would hide the error (django-redis's ``IGNORE_EXCEPTIONS``)."""

    def clear(self, pattern: str | None) -> None:
        """Empty it (``pattern``: only the keys of ours matching this glob)."""

    def servers(self) -> Sequence[tuple[str, Any]]:
        """(label, redis-py client) of every server holding its keys, for the migration's SCAN;
        a ConfigurationError naming the option if the backend cannot list its keys."""

    def pattern(self) -> str:
        """The SCAN pattern of its keys (its prefix and version)."""

    def key_of(self, stored: bytes) -> Any:
        """The caller's key for a stored key the SCAN found."""


class Adopter:
    """The two rules over our sync client; ``make_key`` turns a caller's key into ours."""

    def __init__(self, client: CacheClient, make_key: Callable[[Any], str]) -> None:
        self.client = client
        self.make_key = make_key

    def _by_shard(self, keys: Sequence[Any]) -> dict[Shard, dict[str, Any]]:
        shard_for = self.client.core.shard_for
        groups: dict[Shard, dict[str, Any]] = {}
        for key in keys:
            made = self.make_key(key)
            groups.setdefault(shard_for(made), {})[made] = key
        return groups

    def adopt(
        self,
        previous: PreviousCache,
        keys: Sequence[Any],
        *,
        strict: bool = True,
        recheck: bool = False,
        remove: bool = True,
    ) -> tuple[dict[Any, Any], dict[Any, tuple[str, str]]]:
        """Read ``keys`` from the previous cache and copy what it has to their shards with its
        remaining TTL (with DURABLE_REPLICAS, each shard's copies followed by its WAIT), then
        delete the previous copies that are on ours now. Returns the values read and each key's
        (shard name, outcome). A value is served as ours will return it (a tuple our JSON makes
        a list is a list from the first read); one our serializer cannot store is served as the
        previous cache decodes it, not copied (:data:`UNREPRESENTABLE`); one the previous
        backend cannot decode is a miss (:data:`UNREADABLE`); both stay on the previous cache.
        A shard's error is raised, or with ``strict`` False (a reader: the value is served
        anyway) logged, that shard's keys left uncopied (:data:`LATE`) and their previous copies
        kept. ``recheck`` (a reader): keys the previous cache does not have are read on ours
        again: a concurrent reader may have moved them between our miss and this read (its copy
        lands on ours before it deletes the previous copy), so they are not reported missing.
        ``remove`` False (a write, :meth:`move_then_forget`): the previous copies are left for
        the write's own delete. A key the previous cache does not have costs its one read (and
        the recheck)."""
        began = time.monotonic()
        found, outcomes = self._read(previous, list(keys))
        readable = [key for key in keys if key in found]
        if recheck and len(readable) + len(outcomes) < len(keys):
            found.update(
                self._ours([key for key in keys if key not in found and key not in outcomes])
            )
        if not readable:
            return found, outcomes
        ttls = previous.pttls(readable)
        groups = self._by_shard(readable)
        run = self.client.run
        # Each owner's clock, read after the previous cache: its TIME ran at most ``elapsed``
        # after that read, so every deadline is no later than TOMBSTONE_MS after the read.
        deadlines: dict[Shard, int | None] = {}
        for shard in groups:
            try:
                clock = run(shard, lambda r: r.time(), write=True)
                deadlines[shard] = copy_deadline(clock, time.monotonic() - began)
            except MASTER_ERRORS as exc:
                if strict:
                    raise
                self._not_copied(previous, shard, exc)
                deadlines[shard] = None
        for shard, made in groups.items():
            items: list[tuple[str, Any, tuple[Any, int]]] = []
            for final, key in made.items():
                ttl = ttls[key]
                if ttl == GONE or ttl == 0:  # expired between its read and now
                    outcomes[key] = (shard.name, EXPIRED)
                    continue
                data = self._encoded(previous, key, found[key])
                if data is None:
                    outcomes[key] = (shard.name, UNREPRESENTABLE)
                    continue
                found[key] = self._as_stored(data, found[key])
                items.append((final, key, (data, ttl or 0)))  # 0 is "no expiry" to the copy
            deadline = deadlines[shard]
            if not items:
                continue
            try:
                if deadline is None:
                    replies = [LATE] * len(items)
                else:
                    replies = _outcomes(self._written(shard, _copies(items, deadline)))
            except MASTER_ERRORS as exc:
                if strict:
                    raise
                self._not_copied(previous, shard, exc)
                replies = [LATE] * len(items)
            for (_, key, _), outcome in zip(items, replies, strict=True):
                outcomes[key] = (shard.name, outcome)
        # Deleted or cleared on ours: the delete removed the previous copy already, and a
        # clear of other keys (the mark is per database) must not lose this one. With
        # DURABLE_REPLICAS the copies are on our replicas by now (or the shortfall was logged).
        done = [key for key, (_, outcome) in outcomes.items() if outcome in (COPIED, PRESENT)]
        if done and remove:
            previous.remove(done)
        return found, outcomes

    def _read(
        self, previous: PreviousCache, keys: list[Any]
    ) -> tuple[dict[Any, Any], dict[Any, tuple[str, str]]]:
        """The previous cache's values of ``keys``, and :data:`UNREADABLE` for each key whose
        value its backend raised decoding: a batch that raises is read again key by key, so
        one such value costs only itself. Connection errors are the previous cache's own."""
        try:
            return dict(previous.read(keys)), {}
        except MASTER_ERRORS:
            raise
        except Exception as exc:
            if len(keys) == 1:
                return {}, {keys[0]: ("-", self._unreadable(previous, keys[0], exc))}
        found: dict[Any, Any] = {}
        outcomes: dict[Any, tuple[str, str]] = {}
        for key in keys:
            try:
                found.update(previous.read([key]))
            except MASTER_ERRORS:
                raise
            except Exception as exc:
                outcomes[key] = ("-", self._unreadable(previous, key, exc))
        return found, outcomes

    @staticmethod
    def _unreadable(previous: PreviousCache, key: Any, exc: Exception) -> str:
        logger.warning(
            "%s cannot read its value of key %r (a miss here, left there): %s: %s",
            previous.label,
            key,
            type(exc).__name__,
            exc,
        )
        return UNREADABLE

    def _encoded(self, previous: PreviousCache, key: Any, value: Any) -> Any:
        """The value in our format, or None if our serializer cannot store it (logged)."""
        try:
            return self.client.encode(value)
        except SerializationError as exc:
            logger.warning(
                "%s: its value of key %r cannot be stored by this cache's serializer (served "
                "from there, not copied): %s",
                previous.label,
                key,
                exc,
            )
            return None

    def _as_stored(self, data: Any, value: Any) -> Any:
        """What a read of the copy will return (JSON makes a tuple a list): served from the
        first read, so the first and the later reads agree."""
        if type(data) is int:
            return value
        decoded = self.client.decode(data)
        return value if decoded is MISS else decoded

    def _ours(self, keys: Sequence[Any]) -> dict[Any, Any]:
        """The values ours has of ``keys`` (the caller's keys), read on their shards."""
        made = {self.make_key(key): key for key in keys}
        return {made[final]: value for final, value in self.client.get_many(list(made)).items()}

    def _written(self, shard: Shard, commands: Sequence[Command]) -> list[Any]:
        """One shard's batch of writes followed by the WAIT of DURABLE_REPLICAS (the client's
        rule, a shortfall logged): the previous copies are removed only once our replicas have
        theirs. The replies without the WAIT's."""
        client = self.client
        plan = client.durable_plan({shard: commands})
        replies = {shard: client.execute(shard, plan[shard], write=True)}
        client.durable_checked(replies)
        return replies[shard]

    @staticmethod
    def _not_copied(previous: PreviousCache, shard: Shard, exc: BaseException) -> None:
        logger.warning(
            "read through %s: not copied to shard %s (served, its old copy kept): %s: %s",
            previous.label,
            shard.name,
            type(exc).__name__,
            exc,
        )

    def adopt_to_write(
        self, previous: PreviousCache, keys: Sequence[Any], *, keep_held: bool
    ) -> dict[Any, Any]:
        """Before a write on an existing value of ``keys`` (missing on ours): adopted, then the
        previous copies that could not be moved deleted, so none outlives the write. Returns
        the values held there that our serializer cannot store (:data:`UNREPRESENTABLE`): such
        a key is present, as ``get`` just said, so a conditional write answers as for a present
        key (``add`` refuses, ``get_or_set`` returns it; ``keep_held``: their copies are left
        there, nothing being written), and one that replaces it (``set(xx=True)``) stores. A
        value the previous backend cannot decode is absent to all of them, as to ``get``.

        The keys moved here get tombstones too, as a delete leaves: the write may expire the
        key at once (``touch(k, 0)``, ``expire``), and a reader that read the previous copy
        before this adoption deleted it must not copy the old value back after that."""
        found, outcomes = self.adopt(previous, keys, strict=False)
        held = {key: found[key] for key, (_, done) in outcomes.items() if done == UNREPRESENTABLE}
        left = [
            key
            for key, (_, done) in outcomes.items()
            if done in KEPT and not (keep_held and key in held)
        ]
        if left:
            self.forget(previous, left)
        moved = [key for key, (_, done) in outcomes.items() if done in (COPIED, PRESENT)]
        if moved:
            self._tombstones(moved, "tombstones of an adopted key's write")
        return held

    def move_then_forget(self, previous: PreviousCache, keys: Sequence[Any]) -> None:
        """Before a write that replaces the values of ``keys`` (``set``, ``set_many``): each
        previous copy moved onto ours first (the adoption's copy, with its TTL, never over a
        value ours has, a delete or a clear), then :meth:`forget` (the previous copies deleted,
        tombstones), then the caller writes. So from before its delete of the previous copy
        until the write lands, ours holds the old value or the new one: a reader that misses on
        ours and then on the previous cache finds one of them when it reads ours again (a read
        concurrent with an overwrite returns the old or the new value, never a miss). A
        previous cache that cannot be read or cannot delete fails the write
        (ShardUnavailableError naming it); what may stay on ours then is a faithful copy of the
        old value, which the previous cache still holds. Costs the previous cache's read (and,
        for a key it holds, its TTL, our shard's clock and the copy) before :meth:`forget`."""
        if not keys:
            return
        try:
            self.adopt(previous, keys, strict=False, remove=False)
        except MASTER_ERRORS as exc:  # adopt(strict=False) logs ours': these are the previous's
            raise _refused(previous, keys, "read", exc) from exc
        self.forget(previous, keys)

    def forget(self, previous: PreviousCache, keys: Sequence[Any]) -> None:
        """Before a write or delete of ``keys`` on ours: their previous copies deleted, then a
        tombstone for each on its shard (no copy read before the delete lands after it). A
        previous cache that cannot delete them fails the write (ShardUnavailableError naming
        it): the old copy would come back once ours is deleted or expires."""
        if not keys:
            return
        try:
            previous.remove(keys)
        except MASTER_ERRORS as exc:
            raise _refused(previous, keys, "delete", exc) from exc
        self._tombstones(keys, "tombstones of a write")

    def _tombstones(self, keys: Sequence[Any], what: str) -> None:
        """A tombstone for each key on its shard: no copy read before lands after it."""
        for shard, made in self._by_shard(keys).items():
            marks = [(f"{TOMBSTONE_PREFIX}{final}", TOMBSTONE_MS) for final in made]
            self._mark(shard, marks, what)

    def cleared(self, previous: PreviousCache, pattern: str | None) -> None:
        """Before a ``clear`` (``pattern`` None) or a pattern delete on ours: the previous
        cache emptied of those keys, then every shard marked cleared for TOMBSTONE_MS: no
        copy read before lands after (copies of any key are refused meanwhile; the values are
        still served, their previous copies kept). A ``clear`` without a prefix flushes the
        mark too: call :meth:`mark_cleared` again after it."""
        previous.clear(pattern)
        self.mark_cleared()

    def mark_cleared(self) -> None:
        for shard in self.client.core.shards:
            self._mark(shard, [(CLEARED, TOMBSTONE_MS)], "clear mark")

    def _mark(self, shard: Shard, marks: Sequence[tuple[str, int]], what: str) -> None:
        """The marks written on the shard; with IGNORE_EXCEPTIONS an unavailable shard is
        skipped (logged) like the operation that follows, which skips it too."""
        try:
            self.client.run(shard, _marker(marks), write=True)
        except MASTER_ERRORS as exc:
            if not self.client.fail_open.skip(shard, exc, what):
                raise

    def present(self, keys: Sequence[Any]) -> int:
        """How many of ``keys`` ours has (a dry run's "already present")."""
        count = 0
        for shard, made in self._by_shard(keys).items():
            count += int(self.client.run(shard, _exists(list(made)), write=False))
        return count


def _refused(
    previous: PreviousCache, keys: Sequence[Any], what: str, exc: BaseException
) -> ShardUnavailableError:
    """The error of a write refused because the previous cache cannot ``what`` its copies."""
    return ShardUnavailableError(
        f"{previous.label} (PREVIOUS_CACHE) cannot {what} its copies of {len(keys)} key(s) "
        f"(first {keys[0]!r}), so this write is refused (the old value would come back): "
        f"{type(exc).__name__}: {exc}"
    )


def pttls_on(servers: Sequence[tuple[Any, list[tuple[Any, Any]]]]) -> dict[Any, int | None]:
    """``PTTL`` of stored keys, one pipeline per server: ``[(server, [(key, stored key)])]`` ->
    each key's milliseconds left, None for no expiry, :data:`GONE` (the adapters' helper)."""
    found: dict[Any, int | None] = {}
    for server, pairs in servers:
        pipe = server.pipeline(transaction=False)
        for _, stored in pairs:
            pipe.pttl(stored)
        for (key, _), left in zip(pairs, pipe.execute(), strict=True):
            found[key] = None if int(left) == -1 else int(left)
    return found


def _exists(keys: Sequence[str]) -> Callable[[Any], Any]:
    return lambda redis_client: redis_client.exists(*keys)


def _marker(marks: Sequence[tuple[str, int]]) -> Callable[[Any], Any]:
    def send(redis_client: Any) -> Any:
        pipe = redis_client.pipeline(transaction=False)
        for name, ms in marks:
            pipe.set(name, 1, px=ms)
        return pipe.execute()

    return send


def _copies(items: Sequence[tuple[str, Any, tuple[Any, int]]], deadline: int) -> list[Command]:
    """The copies of one shard and, in the same transaction, why each refused one was refused
    (read by :func:`_outcomes`)."""
    finals = [final for final, _, _ in items]
    args = [x for _, _, (data, ttl) in items for x in (data, ttl)]
    checks: list[Command] = []
    for final in finals:
        checks += [("EXISTS", final), ("EXISTS", f"{TOMBSTONE_PREFIX}{final}")]
    return [
        ("MULTI",),
        ("EVAL", COPY_MISSING, len(finals), *finals, deadline, *args),
        *checks,
        ("EXISTS", CLEARED),
        ("EXEC",),
    ]


def _outcomes(replies: Sequence[Any]) -> list[str]:
    """Each copy's outcome from the replies of :func:`_copies` (its transaction's, last)."""
    done = replies[-1]
    for reply in done:
        if isinstance(reply, Exception):  # an error inside EXEC is a reply, not raised
            raise reply
    copied, checks, cleared = done[0], done[1:-1], done[-1]
    outcomes = []
    for i, was_copied in enumerate(copied):
        if was_copied:
            outcomes.append(COPIED)
        elif checks[2 * i]:
            outcomes.append(PRESENT)
        elif checks[2 * i + 1] or cleared:
            outcomes.append(DELETED)
        else:
            outcomes.append(LATE)
    return outcomes


def _scan(server: Any, pattern: str, batch: int) -> Iterator[list[bytes]]:
    """The server's keys matching ``pattern``, a SCAN batch at a time."""
    cursor = 0
    while True:
        cursor, keys = server.scan(cursor, match=pattern, count=batch)
        if keys:
            yield list(keys)
        if int(cursor) == 0:
            return


def migrate_previous(
    adopter: Adopter,
    previous: PreviousCache,
    *,
    rate: float | None = None,
    batch: int = 500,
    progress: Callable[[Progress], None] | None = None,
) -> Report:
    """Every key of the previous cache adopted, as a reader would (the same guard, the same
    TTLs, never over a value ours has), then deleted from it. Resumable: what is adopted is
    gone from the previous cache, so a second run (or a run after a killed one) handles only
    what is left. A server or shard error gives that server up (the report says so; run again).
    A value the previous backend cannot decode, or this cache's serializer cannot store, is
    skipped and left there, counted and listed in the report (``error``, the run still
    complete): it cannot stop the others. A key deleted (or written) on ours while its batch
    copied it counts as gone: that delete removed the previous copy first. ``rate`` caps the
    keys adopted per second."""
    if batch < 1:
        raise ValueError(f"batch must be a positive number of keys, got {batch}")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be a positive number of keys per second, got {rate}")
    servers = previous.servers()  # a ConfigurationError before anything is read
    pattern = previous.pattern()
    chunk = batch if rate is None else max(1, min(batch, int(rate / 10)))
    bucket = None if rate is None else TokenBucket(rate, chunk)
    started = time.monotonic()
    pairs: dict[tuple[str, str], list[int]] = {}
    sizes: list[int | None] = []
    for _, server in servers:
        try:
            sizes.append(int(server.dbsize()))
        except MASTER_ERRORS:
            sizes.append(None)
    shards: list[ShardReport] = []
    totals = [0, 0]  # scanned, handled
    for position, (label, server) in enumerate(servers):
        began = time.monotonic()
        counts = {"scanned": 0, COPIED: 0, PRESENT: 0, "gone": 0, LATE: 0}
        skipped: dict[str, list[Any]] = {UNREADABLE: [], UNREPRESENTABLE: []}
        error: str | None = None
        try:
            for stored in _scan(server, pattern, batch):
                counts["scanned"] += len(stored)
                keys = [previous.key_of(k) for k in stored]
                for i in range(0, len(keys), chunk):
                    part = keys[i : i + chunk]
                    if bucket is not None:
                        bucket.take(len(part))
                    _, outcomes = adopter.adopt(previous, part)
                    outcomes.update(_deleted_since(previous, part, outcomes))
                    for key in part:
                        shard, outcome = outcomes.get(key, ("-", EXPIRED))
                        if outcome in SKIPPED:  # left there, listed: no run can move it
                            skipped[outcome].append(key)
                            continue
                        # Refused as deleted (the old copy still there: see adopt, and
                        # _deleted_since), or too late: run again.
                        kind = {COPIED: COPIED, PRESENT: PRESENT, EXPIRED: "gone"}.get(
                            outcome, LATE
                        )
                        counts[kind] += 1
                        index = {COPIED: 0, PRESENT: 1}.get(outcome, 2)
                        if kind != LATE:
                            pairs.setdefault((label, shard), [0, 0, 0])[index] += 1
                if progress is not None:
                    progress(
                        _progress(label, position, len(servers), counts, sizes, totals, started)
                    )
        except Exception as exc:  # reported: this server is given up, the others still run
            error = f"{type(exc).__name__}: {exc}"
            logger.error("adoption from %s: server %s given up: %s", previous.label, label, error)
        if counts[LATE] and error is None:
            error = (
                f"{counts[LATE]} keys not copied (deleted or cleared on this cache in the last "
                f"{TOMBSTONE_MS // 1000} s, or their copy came after its deadline): run again"
            )
        complete = error is None  # skipped keys do not make it incomplete: no run moves them
        if any(skipped.values()):
            note = _skipped_note(skipped)
            logger.error("adoption from %s: server %s: %s", previous.label, label, note)
            error = note if error is None else f"{error}; {note}"
        if progress is not None:
            last = _progress(label, position, len(servers), counts, sizes, totals, started)
            progress(dataclasses.replace(last, done=True, error=None if complete else error))
        totals[0] += counts["scanned"]
        totals[1] += counts[COPIED] + counts[PRESENT] + counts["gone"]
        shards.append(
            ShardReport(
                name=label,
                position=position,
                leaving=False,
                keys=sizes[position],
                scanned=counts["scanned"],
                moved=counts[COPIED],
                already_present=counts[PRESENT],
                expired=counts["gone"],
                restarts=0,
                seconds=time.monotonic() - began,
                complete=complete,
                error=error,
            )
        )
    return Report(
        match=pattern,
        rate_limit=rate,
        seconds=time.monotonic() - started,
        shards=tuple(shards),
        pairs=tuple(PairReport(a, b, *c) for (a, b), c in sorted(pairs.items())),
    )


def _deleted_since(
    previous: PreviousCache, keys: Sequence[Any], outcomes: dict[Any, tuple[str, str]]
) -> dict[Any, tuple[str, str]]:
    """The keys of a batch whose copy was refused as deleted on ours and whose previous copy
    is gone too, as :data:`EXPIRED` (nothing left to move): a delete or write on ours removes
    the previous copy before it leaves its tombstone (:meth:`Adopter.forget`), so a key deleted
    while the batch copied it is done, not a reason to run again. One round trip, only for a
    batch with such keys; a previous copy still there (a clear of other keys, the mark being
    per database) stays :data:`DELETED`, a run again moves it."""
    refused = [key for key in keys if outcomes.get(key, ("-", EXPIRED))[1] == DELETED]
    if not refused:
        return {}
    left = previous.pttls(refused)
    return {key: (outcomes[key][0], EXPIRED) for key in refused if left[key] == GONE}


def _skipped_note(skipped: dict[str, list[Any]]) -> str:
    """The report's words on the keys a migration skipped: counted, the first LISTED named."""
    unreadable, unrepresentable = skipped[UNREADABLE], skipped[UNREPRESENTABLE]
    keys = [*unreadable, *unrepresentable]
    shown = ", ".join(repr(key) for key in keys[:LISTED])
    more = f" and {len(keys) - LISTED} more" if len(keys) > LISTED else ""
    return (
        f"{len(keys)} keys skipped, left on the previous cache ({len(unreadable)} its backend "
        f"cannot decode: delete them there or let them expire; {len(unrepresentable)} this "
        f"cache's serializer cannot store: read through until written here): {shown}{more}"
    )


def _progress(
    label: str,
    position: int,
    servers: int,
    counts: dict[str, int],
    sizes: Sequence[int | None],
    totals: Sequence[int],
    started: float,
) -> Progress:
    elapsed = max(time.monotonic() - started, 1e-9)
    handled = counts[COPIED] + counts[PRESENT] + counts["gone"]
    total_scanned = totals[0] + counts["scanned"]
    total_keys = sum(size or 0 for size in sizes)
    scan_rate = total_scanned / elapsed
    left = max(total_keys - total_scanned, 0)
    return Progress(
        shard=label,
        position=position,
        shards=servers,
        scanned=counts["scanned"],
        moved=handled,
        keys=sizes[position] or 0,
        total_scanned=total_scanned,
        total_moved=totals[1] + handled,
        total_keys=total_keys,
        elapsed=elapsed,
        rate=(totals[1] + handled) / elapsed,
        scan_rate=scan_rate,
        eta=left / scan_rate if scan_rate > 0 else None,
    )


@dataclass(frozen=True)
class PreviousPlan:
    """A dry run: per server of the previous cache, the keys found and how many ours has
    already (those stay ours; the others would be copied)."""

    label: str
    pattern: str
    servers: tuple[tuple[str, int, int], ...]  # (server, keys scanned, already on ours)
    complete: bool = True

    @property
    def scanned(self) -> int:
        return sum(s[1] for s in self.servers)

    @property
    def present(self) -> int:
        return sum(s[2] for s in self.servers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "previous_cache": self.label,
            "match": self.pattern,
            "scanned": self.scanned,
            "would_copy": self.scanned - self.present,
            "already_present": self.present,
            "complete": self.complete,
            "servers": [
                {"server": name, "scanned": scanned, "already_present": present}
                for name, scanned, present in self.servers
            ],
        }


def plan_previous(
    adopter: Adopter, previous: PreviousCache, *, batch: int = 500, sample: int | None = None
) -> PreviousPlan:
    """Count what :func:`migrate_previous` would copy; nothing is written (``sample``: at most
    that many keys per server)."""
    found = []
    for label, server in previous.servers():
        scanned = present = 0
        for stored in _scan(server, previous.pattern(), batch):
            if sample is not None:
                stored = stored[: sample - scanned]
            scanned += len(stored)
            present += adopter.present([previous.key_of(k) for k in stored])
            if sample is not None and scanned >= sample:
                break
        found.append((label, scanned, present))
    return PreviousPlan(previous.label, previous.pattern(), tuple(found), sample is None)


def render_previous_plan(plan: PreviousPlan, *, title: str | None = None) -> str:
    """A dry run for a terminal."""
    lines = [title] if title else []
    sampled = "" if plan.complete else " (a sample)"
    lines.append(
        f"Dry run{sampled}: {plan.scanned:,} keys in {plan.label} matching {plan.pattern!r}; "
        f"{plan.scanned - plan.present:,} would be copied, {plan.present:,} are on ours already "
        "(ours win; their old copies would be deleted). Nothing was written."
    )
    for name, scanned, present in plan.servers:
        lines.append(f"  {name}: {scanned:,} keys, {present:,} on ours already")
    return "\n".join(lines) + "\n"


def run_previous(
    caches: Sequence[tuple[str, Adopter, PreviousCache]],
    *,
    dry_run: bool,
    rate: float | None,
    batch: int,
    sample: int | None,
    progress: Callable[[str], Callable[[Progress], None] | None],
) -> tuple[dict[str, dict[str, Any]], list[str], bool]:
    """What both ``--from-previous-cache`` commands do for their caches, given as (name,
    adopter, previous): each dry-run or migrated (``progress(title)`` gives the callback, or
    None); returns each one's JSON document by name, the texts and whether all completed."""
    documents: dict[str, dict[str, Any]] = {}
    texts: list[str] = []
    complete = True
    for name, adopter, previous in caches:
        title = f"cache {name!r} from {previous.label}"
        if dry_run:
            found = plan_previous(adopter, previous, batch=batch, sample=sample)
            documents[name] = found.to_dict()
            texts.append(render_previous_plan(found, title=title))
            continue
        report = migrate_previous(
            adopter, previous, rate=rate, batch=batch, progress=progress(title)
        )
        complete = complete and report.complete
        documents[name] = report.to_dict()
        texts.append(render_report(report, title=title))
    return documents, texts, complete
