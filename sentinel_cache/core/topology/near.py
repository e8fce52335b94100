"""The near cache (``NEAR_CACHE = True``): a process-local copy of hot values, kept correct by
the servers' invalidations and by failovers.

Per shard, one tracker thread keeps the shard's master tracked (Redis 6.0+, Valkey 7.2+) in one
of two modes (``NEAR_CACHE_PUSH``: False, the default, takes redirect; "auto" takes push
wherever the server accepts ``HELLO 3``; redirect is faster when many threads write kept keys,
push saves a connection per shard):

* **push** (RESP3): ONE connection, the *writer*, sends ``CLIENT TRACKING ON BCAST NOLOOP
  [PREFIX p ...]``; the server's invalidations arrive on it as push frames (``>``, an
  ``invalidate`` with the keys, or a null for a flush), between the replies to our writes.
  Whoever reads that socket applies every push it reads, in order, before anything read after
  it: the tracker (holding the writer, when no write does) and a write's caller reading its
  own reply (a push may come before it). redis-py's pure-Python RESP3 parser calls our push
  handler from inside ``read_response`` (every supported redis-py does), and the holder drains
  what the parser buffered before giving the writer back.
* **redirect** (RESP2: ``NEAR_CACHE_PUSH: False``, or where ``HELLO 3`` is refused): TWO
  connections, an invalidation connection subscribed to ``__redis__:invalidate``, and the
  writer, whose ``CLIENT TRACKING ON REDIRECT <the invalidation connection> BCAST NOLOOP``
  sends its invalidations there.

Either way the server names every key written, deleted or expired by anyone (another process,
a Java service, ``redis-cli``) except by the writer connection itself, and sends a null when it
flushes (``FLUSHDB``, ``FLUSHALL``, a full resync). BCAST mode needs no tracking state per data
connection, so the pools are untouched. The tracker pings each of its connections every second
whatever the traffic, so a lost, silently cut or stalled connection ends the session within
``PING_EVERY + PONG_WITHIN``; no read of the tracker, and no drain by a write's caller, waits
longer than ``PONG_WITHIN`` for bytes it was told are there.

A hit is refused while invalidations of its shard may be in this process unapplied
(:class:`~sentinel_cache.core.topology.near_tracking.Arrivals`): bytes on the socket they come
on, or a reader's ``draining`` flag, raised before it reads and lowered only once the parser
holds nothing more (a parser may take several frames in one ``recv``). In push mode a write's
reply shares the socket: a hit peeks at a readable socket and is served when only whole
simple replies wait there (no push can hide in them); over TLS it cannot peek, and any byte
waiting refuses it (a conservative miss: the server answers), as does the short while a
write's caller reads its reply holding bytes it has not applied.

What keeps a copy correct:

1. **Sessions.** A shard's copies carry the *session* they were stored in; a session starts
   when its connections (one or two) are set up and ends when one is lost or errs, when the shard's
   master switches, and when the core stops. A session records the master generation it tracks:
   a copy of another session, or of another master generation than the shard's current one, is
   never served (so a switch hides the shard's copies at once, before the tracker has even
   noticed it), and no read or write made after a switch is kept under the old master's session
   (its tracking hears nothing of the new master's writes). Nor is a copy served while a
   failover is announced (the write fence is up), or once a replica was promoted since its read
   was sent: another process may notice the switch before this one (its listener thread
   scheduled sooner) and write on the new master, while this one still follows the old.
2. **Tickets** (the in-flight race). A read that misses takes a ticket for the key before it
   sends; an invalidation of that key, a local write of it or the end of the session tears the
   ticket; the reply is stored only if its ticket is intact. An invalidation that arrives before
   the read's reply therefore never leaves the old value behind.
3. **Own writes.** A sync ``set`` of a kept key goes on the writer connection (leased to one
   write at a time): the server sends no echo of it, so the value written is kept once
   acknowledged, if its ticket (taken before sending) is intact. If another read or write took
   the key's ticket meanwhile, a read's reply may predate the write and no invalidation will tear
   it, so the write tears it and keeps nothing. When BCAST merges one key's changes made in one
   server event-loop turn, it names the last writer: a write by someone else after ours is always
   announced. Every other write (deletes, ``incr``, multi-key writes, asyncio writes, and a
   ``set`` that found the writer busy for ``WRITER_WAIT``) goes through the pool, evicts the key
   after the server acknowledged it (or failed), and is echoed like anyone's.
4. **Bounds**: a copy lives at most ``NEAR_CACHE_TTL`` seconds, and never beyond the key's
   expiry on the server (a read asks ``PTTL`` with its ``GET``; a write keeps its own timeout),
   counted from before the request was sent: a server that expires keys lazily sends their
   invalidation only when it gets to them. The least recently used copies go first beyond
   ``NEAR_CACHE_MAX_ENTRIES`` or ``NEAR_CACHE_MAX_BYTES`` (stored bytes).

Reads that ``READ_FROM_REPLICAS`` would send to a replica bypass the near cache (replicas are
not tracked; a replica may apply a write after the master announced it).

The tracker threads and their connections are in
:mod:`~sentinel_cache.core.topology.near_tracking`; this module keeps the copies and the tickets.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, NamedTuple

from sentinel_cache.core.arguments import check_key
from sentinel_cache.core.topology.near_tracking import CHANNEL as CHANNEL
from sentinel_cache.core.topology.near_tracking import PING_EVERY as PING_EVERY
from sentinel_cache.core.topology.near_tracking import PONG_WITHIN as PONG_WITHIN
from sentinel_cache.core.topology.near_tracking import RETRY_EVERY as RETRY_EVERY
from sentinel_cache.core.topology.near_tracking import Tracker, Writer

if TYPE_CHECKING:
    from sentinel_cache.core.config import PoolConfig
    from sentinel_cache.core.topology.shard import Shard

WRITER_WAIT = 0.01  # the longest a write waits for the writer connection before the pool


class _Entry(NamedTuple):
    data: bytes
    shard: int
    session: int
    generation: int
    promotions: int  # the shard's replica promotions announced when its read was sent
    expires: float
    size: int


class _ShardState:
    """One shard's tracking session and counters (guarded by the near cache's lock)."""

    __slots__ = (
        "session",
        "generation",
        "live",
        "writer",
        "keys",
        "bytes",
        "hits",
        "misses",
        "invalidations",
        "flushes",
    )

    def __init__(self) -> None:
        self.session = 0
        self.generation = -1  # the shard's master generation ``session`` tracks
        self.live = False  # a tracker is subscribed for ``session``
        self.writer: Writer | None = None  # the session's writer connection
        self.keys: set[Any] = set()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.invalidations = 0
        self.flushes: dict[str, int] = {}


class NearCache:
    """The local copies of one core, all shards together (one LRU, one lock)."""

    def __init__(
        self, config: PoolConfig, shards: Sequence[Shard], shard_index: Callable[[Any], int]
    ) -> None:
        self.max_entries = config.near_cache_max_entries
        self.max_bytes = config.near_cache_max_bytes
        self.ttl = config.near_cache_ttl
        self.prefixes = tuple(config.near_cache_prefixes)
        self._prefix_bytes = tuple(p.encode() for p in self.prefixes)
        self._shard_list = tuple(shards)
        self._shard_count = len(shards)
        self._shard_index = shard_index  # the ring's placement, to count a miss on its shard
        self._trackers: list[Tracker] = []
        self.reset()

    def reset(self) -> None:
        """Empty, untracked state (a new process after a fork starts from here)."""
        self._lock = threading.Lock()
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        # key -> (ticket, shard index, session, generation, when taken: before the request,
        # the shard's count of reads a replica answered in an outage, promotions announced)
        self._tickets: dict[Any, tuple[object, int, int, int, float, int, int]] = {}
        self._shards = [_ShardState() for _ in range(self._shard_count)]
        self._bytes = 0
        self._trackers = []

    def __repr__(self) -> str:
        live = sum(state.live for state in self._shards)
        return (
            f"<NearCache {len(self._entries)} entries {self._bytes} bytes, "
            f"{live}/{len(self._shards)} shards tracked>"
        )

    # -- reads -------------------------------------------------------------------------------
    def wanted(self, key: Any) -> bool:
        if not self.prefixes:
            return True
        if isinstance(key, bytes):
            return key.startswith(self._prefix_bytes)
        return str(key).startswith(self.prefixes)

    def get(self, key: Any) -> bytes | None:
        """The local copy of ``key`` if one may be served, else None (counted as a miss).

        The hot path of a hit takes no lock (a lock costs as much as the rest of it): each step
        is one atomic operation under the GIL. A copy is not served while invalidations of its
        shard have arrived and are not applied
        (:class:`~sentinel_cache.core.topology.near_tracking.Arrivals`), and it is looked up
        again once none is: then every invalidation that arrived before the read began has been
        applied, and a copy dropped after that was still current when the read began, as it
        would be had the read taken the lock first. The entry knows its shard, so the key is
        not placed on the ring.
        """
        entries = self._entries
        try:
            entry = entries.get(key)
        except TypeError:  # unhashable (a list): the key error, as without the near cache
            check_key(key)
            raise
        if entry is not None:
            data, index, session, generation, promotions, expires, _ = entry
            state = self._shards[index]
            master = self._shard_list[index].state
            # A session's number is only ever held by copies while it is live (ending or
            # beginning one moves it on), so a matching session means live. Not while a
            # failover is announced (fenced), nor once a replica was promoted since the copy's
            # read: a process that noticed the switch before this one may have written on the
            # new master, which this session hears nothing of.
            if (
                session == state.session
                and generation == master.generation
                and promotions == master.promotions
                and not master.fenced
                and expires > monotonic()
            ):
                writer = state.writer
                if (
                    writer is None
                    or writer.arrivals is None
                    or writer.arrivals.pending()
                    # Looked up again once nothing is pending: the tracker may have applied an
                    # invalidation that arrived before this read began between the first look
                    # and the check (this thread waiting for the GIL in between).
                    or entries.get(key) is not entry
                ):
                    # Invalidations arrived and not applied yet (or the session is ending):
                    # the server answers, the copy stays unless one of them is about it.
                    state.misses += 1
                    return None
                try:  # noqa: SIM105 - contextlib.suppress costs a context manager per hit
                    entries.move_to_end(key)
                except KeyError:  # dropped since, by what arrived after the check: served
                    pass
                state.hits += 1  # a statistic: an increment lost to a race is no harm
                return data
        with self._lock:
            if entry is not None and entries.get(key) is entry:
                self._drop_locked(key)  # stale
            index = self._shard_index(key) if entry is None else entry.shard
            self._shards[index].misses += 1
        return None

    def ticket(self, shard: Shard, key: Any) -> object | None:
        """A ticket for a read of ``key`` about to be sent, or None if its reply must not be
        stored (not tracked now, or a key outside ``NEAR_CACHE_PREFIXES``)."""
        state = self._shards[shard.index]
        # A session tracks one master: right after a switch (before its tracker noticed) the
        # new master's replies must not be kept under it, for it hears nothing of their keys.
        # Nor while that master is unreachable: a replica answers such reads (OUTAGE_READS).
        master = shard.state
        generation = master.generation
        if (
            not state.live
            or state.generation != generation
            or not self.wanted(key)
            or shard.in_outage(generation)
        ):
            return None
        ticket = object()
        with self._lock:
            self._tickets[key] = (
                ticket,
                shard.index,
                state.session,
                generation,
                monotonic(),
                shard.outage_reads,
                master.promotions,
            )
        return ticket

    def release(self, key: Any, ticket: object | None) -> None:
        """The read that took ``ticket`` failed (an error reply, a timeout, an exhausted pool):
        its ticket goes, so tickets stay as many as the reads in flight."""
        if ticket is not None:
            with self._lock:
                held = self._tickets.get(key)
                if held is not None and held[0] is ticket:
                    del self._tickets[key]

    def fill(self, shard: Shard, key: Any, ticket: object | None, data: Any, pttl: Any) -> None:
        """Store the reply of a ticketed read if nothing tore the ticket meanwhile; ``pttl`` is
        the key's ``PTTL``, asked in the same round trip (-1: no expiry)."""
        if ticket is not None:
            ttl = self.ttl if pttl == -1 else min(self.ttl, max(int(pttl), 0) / 1000)
            with self._lock:
                self._store_locked(shard, key, ticket, data, ttl)

    def own(
        self, shard: Shard, key: Any, ticket: object | None, data: Any, timeout: float | None
    ) -> None:
        """Our write of ``data`` at ``key`` on the shard's writer connection (whose writes the
        server does not echo) was acknowledged: keep it if the ticket taken before it was sent
        is intact. Otherwise someone read or wrote the key meanwhile, and a read whose reply
        predates this write must not be kept either (no invalidation will come to tear its
        ticket): the key and its tickets go."""
        ttl = self.ttl if timeout is None else min(self.ttl, timeout)
        with self._lock:
            if not self._store_locked(shard, key, ticket, data, ttl):
                self._tickets.pop(key, None)
                if key in self._entries:
                    self._drop_locked(key)

    def _store_locked(
        self, shard: Shard, key: Any, ticket: object | None, data: Any, ttl: float
    ) -> bool:
        """Keep ``data`` if ``ticket`` is intact and its session and master current; True
        unless the ticket was torn or something changed (then nothing was kept)."""
        held = self._tickets.get(key)
        if ticket is None or held is None or held[0] is not ticket:
            return False  # torn: invalidated or written meanwhile (or a newer read's ticket)
        del self._tickets[key]
        state = self._shards[shard.index]
        if (
            not isinstance(data, bytes)
            or not state.live
            or held[2] != state.session
            or held[3] != shard.generation
            or held[3] != state.generation
            or held[6] != shard.promotions  # a reply across a promotion: moot
            # The master was found unreachable since the ticket was taken: a replica may have
            # answered (OUTAGE_READS), which the master's session hears nothing about. Or one
            # did, and the outage ended before this reply came here (the master answered again).
            or shard.in_outage(held[3])
            or shard.outage_reads != held[5]
        ):
            return False
        if key in self._entries:
            self._drop_locked(key)
        size = len(data)
        if size > self.max_bytes:
            return True  # nothing kept, and nothing stale left
        # From when the ticket was taken, before the request was sent: the server counted the
        # key's time left (or set its expiry) later, so the copy never outlives the key.
        expires = held[4] + ttl
        if expires <= time.monotonic():
            return True  # expired already: nothing kept
        self._entries[key] = _Entry(data, shard.index, held[2], held[3], held[6], expires, size)
        state.keys.add(key)
        state.bytes += size
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop_locked(oldest)
        return True

    # -- writes and invalidations ------------------------------------------------------------
    def evict(self, keys: Iterable[Any]) -> None:
        """Our own write (or delete) of ``keys`` was acknowledged or failed: forget them."""
        with self._lock:
            for key in keys:
                self._tickets.pop(key, None)
                if key in self._entries:
                    self._drop_locked(key)

    def invalidate(self, index: int, keys: Sequence[bytes] | None) -> None:
        """The server says ``keys`` changed (None: everything on this shard)."""
        with self._lock:
            state = self._shards[index]
            if keys is None:
                self._flush_locked(index, "server flush")
                return
            state.invalidations += len(keys)
            for raw in keys:
                for key in (raw, raw.decode("utf-8", "surrogateescape")):
                    self._tickets.pop(key, None)
                    if key in self._entries:
                        self._drop_locked(key)

    def flush_shard(self, index: int, cause: str) -> None:
        """Drop every copy of one shard, and its tickets (``clear`` flushed its database)."""
        with self._lock:
            self._flush_locked(index, cause)

    # -- sessions ----------------------------------------------------------------------------
    def begin(self, index: int, writer: Writer, generation: int) -> int:
        """The tracker of shard ``index`` is subscribed and its writer tracked, on the master of
        ``generation``: a new session starts, empty."""
        with self._lock:
            self._flush_locked(index, None)
            state = self._shards[index]
            state.session += 1
            state.generation = generation
            state.live = True
            state.writer = writer
            writer.session = state.session
            return state.session

    def lease(self, shard: Shard, key: Any) -> Writer | None:
        """The shard's writer connection for a write of ``key`` whose value may be kept, held
        for the caller until :meth:`Writer.done`; None if the key is not kept, tracking is off,
        or other writes held the writer for ``WRITER_WAIT`` (the write then goes through the
        pool, and the server's echo of it evicts the key as any outside write would)."""
        state = self._shards[shard.index]
        writer = state.writer
        if (
            writer is None
            or writer.ping_due
            or not self.wanted(key)
            or not writer.lock.acquire(timeout=WRITER_WAIT)
        ):
            return None
        if (
            writer.session != state.session
            or state.generation != shard.generation  # on the old master: the pool's is current
            or writer.connection.lost
        ):
            writer.lock.release()
            return None
        return writer

    def end(self, index: int, session: int | None, cause: str) -> None:
        """Tracking of shard ``index`` stopped (``session`` None: whatever session is on)."""
        with self._lock:
            state = self._shards[index]
            if session is not None and session != state.session:
                return
            self._flush_locked(index, cause)  # while still live: the end of a session counts
            state.session += 1
            state.live = False
            state.writer = None

    def _flush_locked(self, index: int, cause: str | None) -> None:
        state = self._shards[index]
        if cause is not None and (state.keys or state.live):
            state.flushes[cause] = state.flushes.get(cause, 0) + 1
        for key in list(state.keys):
            self._drop_locked(key)
        for key in [k for k, held in self._tickets.items() if held[1] == index]:
            del self._tickets[key]

    def _drop_locked(self, key: Any) -> None:
        entry = self._entries.pop(key)
        state = self._shards[entry.shard]
        state.keys.discard(key)
        state.bytes -= entry.size
        self._bytes -= entry.size

    # -- trackers ----------------------------------------------------------------------------
    def start(self, shards: Sequence[Shard], config: PoolConfig) -> None:
        """One tracker thread per shard (the core starts them with its listeners)."""
        self._trackers = [Tracker(self, shard, config) for shard in shards]
        for tracker in self._trackers:
            tracker.start()

    @property
    def running(self) -> bool:
        """Trackers were started in this process and not stopped."""
        return bool(self._trackers)

    def stop(self, *, wait: bool) -> None:
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.stop()
        for index in range(len(self._shards)):
            self.end(index, None, "stopped")
        if wait:
            for tracker in trackers:
                tracker.join(timeout=5)

    def status(self, index: int) -> dict[str, Any]:
        """One shard's counters for ``status()`` (entries, bytes, hit ratio, flushes by cause)."""
        with self._lock:
            state = self._shards[index]
            lookups = state.hits + state.misses
            return {
                "tracked": state.live,
                # How the session hears invalidations: "push" (RESP3, 1 connection) or
                # "redirect" (RESP2, 2 connections); None while untracked.
                "mode": state.writer.mode if state.live and state.writer is not None else None,
                "entries": len(state.keys),
                "bytes": state.bytes,
                "hits": state.hits,
                "misses": state.misses,
                "hit_ratio": round(state.hits / lookups, 4) if lookups else None,
                "invalidations": state.invalidations,
                "flushes": dict(state.flushes),
                "in_flight": sum(held[1] == index for held in self._tickets.values()),
            }
