"""What each cache operation sends and how its replies are read: no I/O here.

The operations themselves (:mod:`sentinel_cache.core.ops._async.client`, and the sync client generated
from it) turn a call into commands per shard with these helpers, hand them to one executor
with the safety net, and read the replies back with them. Keys arrive final, exactly as stored,
so placement matches Jedis. Multi-key calls are grouped per shard and scattered: every shard's
batch is sent before any reply is read, so four shards cost about one round trip, not four.

The Lua scripts and their constants are in :mod:`~sentinel_cache.core.ops.scripts` (also
importable from here).
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sentinel_cache.core.arguments import distinct
from sentinel_cache.core.ops.scripts import CLEARED as CLEARED
from sentinel_cache.core.ops.scripts import CLOCK_MARGIN_MS as CLOCK_MARGIN_MS
from sentinel_cache.core.ops.scripts import COPY_MISSING as COPY_MISSING
from sentinel_cache.core.ops.scripts import DELETE_MARKED as DELETE_MARKED
from sentinel_cache.core.ops.scripts import DUMP_WITH_TTL as DUMP_WITH_TTL
from sentinel_cache.core.ops.scripts import INCR_IF_EXISTS as INCR_IF_EXISTS
from sentinel_cache.core.ops.scripts import INCR_IF_EXISTS_SHA as INCR_IF_EXISTS_SHA
from sentinel_cache.core.ops.scripts import RESERVED_PREFIX as RESERVED_PREFIX
from sentinel_cache.core.ops.scripts import RESTORE_MISSING as RESTORE_MISSING
from sentinel_cache.core.ops.scripts import SET_EACH as SET_EACH
from sentinel_cache.core.ops.scripts import SWAP_IF_SAME as SWAP_IF_SAME
from sentinel_cache.core.ops.scripts import TOMBSTONE_MS as TOMBSTONE_MS
from sentinel_cache.core.ops.scripts import TOMBSTONE_PREFIX as TOMBSTONE_PREFIX
from sentinel_cache.core.ops.scripts import copy_deadline as copy_deadline
from sentinel_cache.core.ops.scripts import is_reserved as is_reserved
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.throttle import Throttle
from sentinel_cache.core.topology.lean_rules import DEFAULT_BULK_LIMIT, MIN_BULK_LIMIT, too_large
from sentinel_cache.core.topology.near import NearCache
from sentinel_cache.core.topology.registry import on_fork_in_child
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import (
    IncrementError,
    InvalidValueError,
    SerializationError,
    ValueTooLargeError,
)

logger = logging.getLogger("sentinel_cache")

Command = tuple[Any, ...]
Plan = dict[Shard, list[Command]]
Groups = dict[Shard, list[Any]]
MISS: Any = object()  # a stored value that is absent or unreadable
REPLY_SKIP: Command = ("CLIENT", "REPLY", "SKIP")  # the server sends no reply to what follows

_hiredis_pack: Callable[[Command], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is optional
    _hiredis_pack = None


def pack(connection: Any, commands: Sequence[Command]) -> list[bytes]:
    """Our commands as the bytes to send, in one buffer.

    With hiredis this is one C call per command, as redis-py's hiredis packer does, without its
    generic steps our commands never need (splitting a multi-word name, chunking the buffer):
    a 100-key batch packs in a third of the time. Anything hiredis refuses (None, a bool) goes
    to redis-py's packer, which raises its usual ``DataError``. An argument over the master's
    ``proto-max-bulk-len`` (the connection's ``bulk_limit``, learned when it connected) raises
    :class:`~sentinel_cache.ValueTooLargeError` before anything is sent: the master would read
    it whole, then refuse it and drop the connection. A single command of a few arguments (a
    single-key write) is sized before it is packed; any other batch only if, packed, it is
    larger than any master's smallest limit: one length per batch otherwise.
    """
    if len(commands) == 1 and _hiredis_pack is not None:  # the usual batch: one command
        command = commands[0]
        if len(command) <= _LOOKED_AT:  # a single-key write: sized first
            for arg in command:
                if type(arg) is bytes and len(arg) > MIN_BULK_LIMIT:
                    _refuse_too_large(connection, commands)
                    break
        try:
            one = _hiredis_pack(command)
        except TypeError:
            return _packed(connection, commands)
        if len(one) > MIN_BULK_LIMIT:  # else no argument can be too large
            _refuse_too_large(connection, commands)
        return [one]
    return _packed(connection, commands)


def _packed(connection: Any, commands: Sequence[Command]) -> list[bytes]:
    """:func:`pack` past its one-command path: any batch, or what hiredis refused."""
    if len(commands) == 1 and len(commands[0]) <= _LOOKED_AT:  # a single-key write: sized first
        for arg in commands[0]:
            if type(arg) is bytes and len(arg) > MIN_BULK_LIMIT:
                _refuse_too_large(connection, commands)
                break
    packed: list[bytes] | None = None
    if _hiredis_pack is not None:
        try:
            if len(commands) == 1:  # the usual batch: one command per shard
                packed = [_hiredis_pack(commands[0])]
            else:
                packed = [b"".join([_hiredis_pack(command) for command in commands])]
        except TypeError:
            pass
    if packed is None:
        packed = connection.pack_commands(commands)
    if len(packed) != 1 or len(packed[0]) > MIN_BULK_LIMIT:  # else no argument can be too large
        _refuse_too_large(connection, commands)
    return packed


#: A command of at most this many arguments has them sized before it is packed: packing a
#: 512 MiB value took 3.7 s and 1.5 GiB more here, for a master that would refuse it.
_LOOKED_AT = 8


def _refuse_too_large(connection: Any, commands: Sequence[Command]) -> None:
    """Raise :class:`~sentinel_cache.ValueTooLargeError` if an argument of ``commands`` is over
    the master's ``proto-max-bulk-len`` (the connection's ``bulk_limit``)."""
    limit = getattr(connection, "bulk_limit", DEFAULT_BULK_LIMIT)
    found = too_large(commands, limit)
    if found is not None:
        raise ValueTooLargeError(found[0], found[1], limit)


def is_ok(reply: Any) -> bool:
    return reply is True or reply == b"OK" or reply == "OK"


def expiry_args(timeout: float | None) -> tuple[Any, ...]:
    """``SET`` arguments for a timeout in seconds (None: no expiry)."""
    if timeout is None:
        return ()
    return ("PX", max(1, int(timeout * 1000)))


def wrong_type(exc: BaseException) -> bool:
    """A ``WRONGTYPE`` error: the key holds a list, hash, ... that this cache did not write."""
    return str(exc).startswith("WRONGTYPE")


def unknown_command(exc: BaseException) -> bool:
    """The server does not know the command (absent from its version, or renamed away)."""
    return str(exc).lower().startswith(("unknown command", "err unknown command"))


def past_64_bits(exc: BaseException) -> bool:
    """The server refused an ``INCRBY`` for the size of a number (the value stored, or the
    result), not for what the key holds: the value may be an integer Python can add to."""
    text = str(exc)
    return not wrong_type(exc) and ("not an integer" in text or "overflow" in text)


def incr_refused(key: Any, exc: BaseException) -> BaseException:
    """The server's refusal of an ``incr`` as the :class:`~sentinel_cache.IncrementError` naming
    the key and the reason (not our script's name and line); another error as it is. The delta
    was checked before sending, so "not an integer or out of range" is about the value."""
    text = str(exc)
    if wrong_type(exc):
        return IncrementError(key, "it holds another type than a string (WRONGTYPE)")
    if "not an integer" in text:  # and not one past 64 bits either (see past_64_bits)
        return IncrementError(key, "its value is not an integer")
    return exc


#: What the server's ``INCR`` takes for an integer (and this cache writes one as): a canonical
#: signed decimal, no ``+``, no sign on zero, no leading zero, no space.
CANONICAL_INTEGER = re.compile(rb"-?[1-9][0-9]*|0")


def counter_value(codec: Codec, data: bytes) -> int | None:
    """The integer ``incr``'s fallback past 64 bits may add to, read from the bytes a key holds
    by ``INCR``'s rule, whatever the format: a canonical decimal (of any size), or an integer
    this cache encoded itself (one past 64 bits: framed or signed in the framed format, exactly
    the serializer's output for it in plain). None for what ``INCR`` refuses and no codec of
    ours writes for an integer, though a codec reads it as one: ``b"-0"``, ``b"007"`` (read by
    the framed format's decimal rule), ``b" 12"``, ``b"\t7\n"`` (read by json in plain), a
    msgpack integer; and for anything that is not an integer at all."""
    if CANONICAL_INTEGER.fullmatch(data):
        return int(data)
    try:
        value = codec.loads(data)
    except InvalidValueError:
        return None
    if type(value) is not int:  # a str, a float, a bool
        return None
    if codec.value_format == "plain":  # no header: only the serializer's own bytes for it
        try:
            return value if codec.dumps(value) == data else None
        except SerializationError:  # a custom serializer that reads what it cannot write
            return None
    # framed: a decimal the codec reads leniently is a foreign value, not one of our frames
    return None if data[:1].isdigit() or data[:1] == b"-" else value


# One log throttle per shard and kind of message (an ignored failure, a WAIT shortfall), shared
# by every cache object on the core (Django builds one per request under ASGI: a per-object
# throttle would log every request).
_throttles: weakref.WeakKeyDictionary[Shard, Throttle] = weakref.WeakKeyDictionary()
_shortfalls: weakref.WeakKeyDictionary[Shard, Throttle] = weakref.WeakKeyDictionary()
_throttles_lock = threading.Lock()
SHORTFALL_LOG_INTERVAL = 10.0  # seconds between two WAIT shortfall lines of one shard


def _shard_throttle(
    throttles: weakref.WeakKeyDictionary[Shard, Throttle], shard: Shard, interval: float
) -> Throttle:
    """``shard``'s throttle in ``throttles``, made on first use."""
    with _throttles_lock:
        throttle = throttles.get(shard)
        if throttle is None:
            throttle = throttles[shard] = Throttle(interval)
    return throttle


def _throttles_after_fork() -> None:
    """A forked child's throttles: new locks (one held by a parent's thread stays held)."""
    global _throttles_lock
    _throttles_lock = threading.Lock()
    for throttles in (_throttles, _shortfalls):
        for throttle in list(throttles.values()):
            throttle.reset_after_fork()


on_fork_in_child(_throttles_after_fork)


class FailOpen:
    """``IGNORE_EXCEPTIONS``: an unavailable shard answers as if its keys were absent, for
    every operation and both adapters; each shard's failures logged at most once per
    ``interval`` seconds, with a count of those suppressed."""

    __slots__ = ("ignore", "interval", "logger")

    def __init__(
        self, ignore: bool = False, interval: float = 10.0, log: logging.Logger = logger
    ) -> None:
        self.ignore = ignore
        self.interval = interval
        self.logger = log  # each adapter reports on its own logger

    def __repr__(self) -> str:
        return f"FailOpen(ignore={self.ignore}, interval={self.interval:g})"

    def skip(
        self, shard: Shard, exc: BaseException, operation: str, *, incomplete: bool = False
    ) -> bool:
        """True (logged, and counted in the metrics) if ``exc`` on ``shard`` is to be ignored,
        False to raise it. ``incomplete``: an operation over every shard's keys (``iter_keys``,
        ``delete_pattern``, ``clear``) whose result now leaves this shard out, logged every
        time since nothing else says so."""
        if not self.ignore:
            return False
        if shard.metrics is not None:
            shard.metrics.skipped(shard.name, operation)
        if incomplete:
            self.logger.warning(
                "cache shard %s unavailable (%s): %s skipped it (IGNORE_EXCEPTIONS), its keys "
                "are left out of the result: %s: %s",
                shard.label,
                f"master {shard.address}" if shard.address else "no master known",
                operation,
                type(exc).__name__,
                exc,
            )
            return True
        throttle = _shard_throttle(_throttles, shard, self.interval)
        throttle.interval = self.interval
        throttle.warn(
            self.logger,
            "cache shard %s unavailable (%s): %s ignored (IGNORE_EXCEPTIONS): %s: %s",
            shard.label,
            f"master {shard.address}" if shard.address else "no master known",
            operation,
            type(exc).__name__,
            exc,
        )
        return True


@dataclass(frozen=True)
class Access:
    """What an operation does to its keys; the rules every operation must follow are derived from
    it in one place (the clients' ``keyed`` and ``planned``), never written out per operation.

    - ``write``: it goes to the master, waits for a raised write fence, and evicts the near-cache
      copy of its keys once sent, whatever the outcome (an unknown outcome is no copy either);
      with DURABLE_REPLICAS it is followed by ``WAIT`` (a shortfall logged).
    - ``move`` (while resharding): it acts on the key where it lives now, whatever its type
      (``add``, ``incr``, ``touch``, ``ttl``, hashes, sets, sorted sets), so a key not moved yet
      is moved first: ``DUMP`` on its previous owner, ``RESTORE`` on its owner where the owner has
      none (under the guard of every copy, :data:`RESTORE_MISSING`), acknowledged, and then the
      previous owner's copy deleted, all before the operation runs: a field, member or expiry it
      changes (or a key it empties) cannot come back from an old copy.
    - ``replace`` (while resharding): its value wins, so the previous owner's copy is deleted
      after it, whatever the outcome (``set``, ``set_many``).
    - ``delete`` (while resharding): the previous owner's copy is deleted first, and the owner's
      delete leaves a tombstone (:data:`DELETE_MARKED`: build it with ``del_commands``), so no
      copy read meanwhile comes back; the previous owner's deletes count as deleted.

    A read's misses are looked up on the previous owner by the reads themselves (``get``,
    ``get_many``, ``has_key``), each merging that into its own round trip.
    """

    write: bool
    move: bool = False
    replace: bool = False
    delete: bool = False


READ = Access(write=False)
READ_MOVED = Access(write=False, move=True)  # ttl, hlen, smembers, zrange, ...
WRITE = Access(write=True)  # e.g. get_or_set_many's SET NX of keys just read
UPDATE = Access(write=True, move=True)  # add, incr, touch, hset, sadd, zadd, ...
REPLACE = Access(write=True, replace=True)  # set, set_many
DELETE = Access(write=True, delete=True)  # delete, delete_many, remove_many


class ClientBase:
    """What the sync and async clients share: the core, the codec, the durability setting, and
    the plans and reply readers of the operations."""

    def __init__(
        self,
        core: ShardedSentinelPool,
        codec: Codec,
        *,
        durable_replicas: int = 0,
        durable_timeout_ms: int = 100,
        fail_open: FailOpen | None = None,
    ) -> None:
        self.core = core
        self.codec = codec
        self.durable_replicas = durable_replicas
        self.durable_timeout_ms = durable_timeout_ms
        # Sent after every write when writes must reach replicas (DURABLE_REPLICAS), by the
        # runner's keyed and planned: the one place the rule is applied.
        self.durable_wait: Command | None = (
            ("WAIT", durable_replicas, durable_timeout_ms) if durable_replicas else None
        )
        self.fail_open = fail_open or FailOpen()
        self.unposted = Throttle(30.0)  # posted writes that failed to go out, logged

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.core!r} codec={self.codec!r}>"

    def encode(self, value: Any) -> bytes | int:
        return self.codec.dumps(value)

    def decode(self, data: Any, key: Any = None) -> Any:
        """Stored bytes to a value; data that fails to decode or verify is ``MISS``, logged."""
        try:
            return self.codec.loads(data)
        except InvalidValueError as exc:
            return self.unreadable(key, exc)

    @staticmethod
    def unreadable(key: Any, exc: InvalidValueError) -> Any:
        """A value that failed to decode or verify: logged, and a miss (``MISS``)."""
        logger.warning("unreadable value at key %s treated as a miss: %s", short_key(key), exc)
        return MISS

    def value_of(self, data: Any, key: Any, default: Any) -> Any:
        value = MISS if data is None else self.decode(data, key)
        return default if value is MISS else value

    # -- resharding (PREVIOUS_MASTERS): moving keys from their previous owners ---------------
    @staticmethod
    def copy_plan(keys: Sequence[Any]) -> list[Command]:
        """What a previous owner is asked per key: its value and remaining TTL."""
        return [cmd for key in keys for cmd in (("GET", key), ("PTTL", key))]

    @staticmethod
    def copies(
        groups: Mapping[Shard, Sequence[Any]], replies: Mapping[Shard, list[Any] | None]
    ) -> dict[Any, tuple[bytes, int]]:
        """Key -> (stored data, TTL in ms or 0 for none) of the keys found on their previous
        owners (an absent or expiring key has nothing to move)."""
        found: dict[Any, tuple[bytes, int]] = {}
        for shard, keys in groups.items():
            shard_replies = replies.get(shard)
            if shard_replies is None:
                continue
            for i, key in enumerate(keys):
                data, ttl = shard_replies[2 * i : 2 * i + 2]
                if data is None or ttl == -2 or ttl == 0:
                    continue
                found[key] = (data, max(int(ttl), 0))
        return found

    def adopt_plan(
        self, copies: Mapping[Any, tuple[bytes, int]], deadlines: Mapping[Shard, int]
    ) -> tuple[Groups, Plan]:
        """Per owner one :data:`COPY_MISSING` of its copies, with the owner's deadline: a value
        written through the new placement meanwhile is newer, and stays; a deleted key stays
        deleted. An owner without a deadline (its ``TIME`` unread: skipped) gets nothing. A
        cache value is a string, so the copy needs no ``DUMP``/``RESTORE`` (the migration uses
        them, for every type)."""
        owners = {
            shard: keys
            for shard, keys in self.core.group_by_shard(copies).items()
            if shard in deadlines
        }
        plan: Plan = {}
        for shard, keys in owners.items():
            args = [x for key in keys for x in copies[key]]
            plan[shard] = [("EVAL", COPY_MISSING, len(keys), *keys, deadlines[shard], *args)]
        return owners, plan

    def dump_plan(self, keys: Iterable[Any]) -> tuple[Groups, Plan]:
        """Keys not moved yet, by previous owner, and what each previous owner is asked
        (:data:`DUMP_WITH_TTL`); each owner's clock is read in the same round trip."""
        groups: Groups = {}
        owners: set[Shard] = set()
        previous_shard_for = self.core.previous_shard_for
        for key in dict.fromkeys(keys):
            previous = previous_shard_for(key)
            if previous is not None:
                groups.setdefault(previous, []).append(key)
                owners.add(self.core.shard_for(key))
        plan: Plan = {
            shard: [("EVAL", DUMP_WITH_TTL, len(group), *group)] for shard, group in groups.items()
        }
        for owner in owners:
            plan.setdefault(owner, []).append(("TIME",))
        return groups, plan

    def restore_plan(
        self, groups: Groups, replies: Mapping[Shard, list[Any] | None], elapsed: float
    ) -> Plan:
        """Per owner one :data:`RESTORE_MISSING` of the dumps found (a key gone meanwhile has
        nothing to move; an owner whose clock was not read gets nothing)."""
        owners = {self.core.shard_for(key) for keys in groups.values() for key in keys}
        deadlines = {  # each owner's TIME is the last command of its part (see dump_plan)
            owner: copy_deadline(owned[-1], elapsed)
            for owner in owners
            if (owned := replies.get(owner)) is not None
        }
        restores: dict[Shard, list[Any]] = {}
        for shard, keys in groups.items():
            shard_replies = replies.get(shard)
            if shard_replies is None:
                continue
            dumped = shard_replies[0]
            for i, key in enumerate(keys):
                ttl, dump = dumped[2 * i], dumped[2 * i + 1]
                if dump is None or ttl == -2:
                    continue
                owner = self.core.shard_for(key)
                if owner in deadlines:
                    restores.setdefault(owner, []).append((key, max(0, int(ttl)), dump))
        plan: Plan = {}
        for owner, found in restores.items():
            keys = [key for key, _, _ in found]
            args = [x for _, ttl, dump in found for x in (ttl, dump)]
            plan[owner] = [("EVAL", RESTORE_MISSING, len(keys), *keys, deadlines[owner], *args)]
        return plan

    def del_commands(self, keys: Sequence[Any], command: str = "DEL") -> list[Command]:
        """The delete of one owner's ``keys`` (their replies add up to the keys deleted): the
        keys whose previous owner is another shard get :data:`DELETE_MARKED`, which leaves
        their tombstones (their previous owner's copy must be gone first)."""
        if self.core.previous_ring is None:
            return [(command, *keys)]
        previous_shard_for = self.core.previous_shard_for
        moving: list[Any] = []
        staying: list[Any] = []
        for key in keys:  # each key placed once on the previous ring
            (staying if previous_shard_for(key) is None else moving).append(key)
        commands: list[Command] = [(command, *staying)] if staying else []
        if moving:
            commands.append(("EVAL", DELETE_MARKED, len(moving), *moving, TOMBSTONE_MS, command))
        return commands

    def previous_del_plan(self, keys: Iterable[Any]) -> Plan:
        """``DEL`` of each key on its previous owner, where that is another shard."""
        groups: dict[Shard, list[Any]] = {}
        previous_shard_for = self.core.previous_shard_for
        for key in dict.fromkeys(keys):
            previous = previous_shard_for(key)
            if previous is not None:
                groups.setdefault(previous, []).append(key)
        return {shard: [("DEL", *group)] for shard, group in groups.items()}

    @staticmethod
    def raw_found(groups: Groups, replies: Mapping[Shard, list[Any] | None]) -> dict[Any, Any]:
        """Key -> stored data of an ``MGET`` plan's replies (absent keys left out)."""
        found: dict[Any, Any] = {}
        for shard, shard_replies in replies.items():
            if shard_replies is not None:
                for key, data in zip(groups[shard], shard_replies[0], strict=True):
                    if data is not None:
                        found[key] = data
        return found

    # -- the near cache (NEAR_CACHE): local hits, and what our own writes make stale ----------
    def near_hits(self, near: NearCache, keys: Iterable[Any]) -> tuple[dict[Any, Any], list[Any]]:
        """The values of ``keys`` the near cache may serve, and the keys to ask the shards."""
        local: dict[Any, Any] = {}
        missing: list[Any] = []
        for key in distinct(keys):
            data = near.get(key)
            value = MISS if data is None else self.decode(data, key)
            if value is MISS:
                missing.append(key)
            else:
                local[key] = value
        return local, missing

    def forget(self, keys: Iterable[Any]) -> None:
        """Our write of ``keys`` was acknowledged (or its outcome is unknown): no local copy of
        them may be served any more."""
        near = self.core.near
        if near is not None:
            near.evict(keys)

    def forget_shard(self, shard: Shard, cause: str) -> None:
        near = self.core.near
        if near is not None:
            near.flush_shard(shard.index, cause)

    # -- writes that wait for replicas (DURABLE_REPLICAS) ------------------------------------
    def check_durable(self, shard: Shard, what: str, acknowledged: Any) -> None:
        """Log a write to ``shard`` that fewer replicas than DURABLE_REPLICAS acknowledged in
        time (the write itself succeeded: WAIT cannot undo it): once per
        :data:`SHORTFALL_LOG_INTERVAL` per shard, with how many were held back, since with a
        replica down every write falls short."""
        if type(acknowledged) is int and acknowledged < self.durable_replicas:
            _shard_throttle(_shortfalls, shard, SHORTFALL_LOG_INTERVAL).warn(
                logger,
                "write to %s acknowledged by %d of %d replicas within %d ms",
                what,
                acknowledged,
                self.durable_replicas,
                self.durable_timeout_ms,
            )

    def durable_plan(
        self, plan: Mapping[Shard, Sequence[Command]]
    ) -> Mapping[Shard, Sequence[Command]]:
        """A batch of writes per shard, each followed by the WAIT of DURABLE_REPLICAS (without
        the option, ``plan`` as it is): the rule for every batch of writes, the runner's and
        resharding's; its replies go through :meth:`durable_checked`."""
        wait = self.durable_wait
        if wait is None:
            return plan
        return {shard: [*commands, wait] for shard, commands in plan.items()}

    def durable_checked(self, replies: Mapping[Shard, list[Any] | None]) -> None:
        """The replies of a :meth:`durable_plan`: each shard's WAIT reply taken off (in place)
        and a shortfall logged (a shard skipped by IGNORE_EXCEPTIONS has none)."""
        if self.durable_wait is not None:
            for shard, shard_replies in replies.items():
                if shard_replies is not None:
                    self.check_durable(shard, f"shard {shard.name}", shard_replies.pop())

    # -- multi-key plans and their replies ---------------------------------------------------
    def mget_plan(self, keys: Iterable[Any]) -> tuple[Groups, Plan]:
        groups = self.core.group_by_shard(distinct(keys))
        plan: Plan = {}
        for shard, group in groups.items():  # a loop, not a comprehension: no call more
            plan[shard] = [("MGET", *group)]
        return groups, plan

    def found(self, groups: Groups, replies: Mapping[Shard, list[Any] | None]) -> dict[Any, Any]:
        """The values found (a shard skipped by IGNORE_EXCEPTIONS found nothing). Every value
        is decoded in one call; if one is unreadable they are decoded again one by one, so
        only that one is a miss (logged)."""
        found: dict[Any, Any] = {}
        keys: list[Any] = []
        datas: list[Any] = []
        for shard, shard_replies in replies.items():
            if shard_replies is not None:
                keys += groups[shard]
                datas += shard_replies[0]
        decoded = True  # every value at once
        try:
            values = self.codec.loads_each(datas)
        except InvalidValueError:
            decoded = False
            for key, data in zip(keys, datas, strict=True):
                if data is not None:
                    value = self.decode(data, key)
                    if value is not MISS:
                        found[key] = value
        else:
            for key, data, value in zip(keys, datas, values, strict=True):
                if data is not None:
                    found[key] = value
        metrics = self.core.metrics
        if metrics is not None:  # recorded once for the call
            counts = []
            for shard, shard_replies in replies.items():
                if shard_replies is not None:
                    group = groups[shard]
                    # Found: every key with data when all decoded, else those kept (in C).
                    misses = (
                        shard_replies[0].count(None)
                        if decoded
                        else len(group) - len(found.keys() & group)
                    )
                    counts.append((shard.name, len(group) - misses, misses))
            metrics.lookups(counts)
        return found

    def set_plan(self, groups: Groups, mapping: Mapping[Any, Any], timeout: float | None) -> Plan:
        """One command per shard, whatever the number of keys: ``MSET`` without a timeout;
        with one, ``MSETEX`` where the master has it, else the ``SET_EACH`` script (``MSET``
        takes no expiry). Atomic per shard. Every value is encoded in one call."""
        # Encoded in the groups' order, then sliced per shard: no key -> value map built.
        encoded = self.codec.dumps_each(
            [mapping[key] for group in groups.values() for key in group]
        )
        ms = 0 if timeout is None else max(1, int(timeout * 1000))
        plan: Plan = {}
        end = 0
        for shard, group in groups.items():
            start, end = end, end + len(group)
            values = encoded[start:end]
            if timeout is None:
                command: Command = ("MSET", *_pairs(group, values))
            elif shard.allows("MSETEX"):
                command = ("MSETEX", len(group), *_pairs(group, values), "PX", ms)
            else:
                command = ("EVAL", SET_EACH, len(group), *group, ms, *values)
            plan[shard] = [command]
        return plan

    @staticmethod
    def not_set(groups: Groups, replies: Mapping[Shard, list[Any] | None]) -> list[Any]:
        """The keys not stored: those of a shard skipped by IGNORE_EXCEPTIONS (a shard's batch
        is one atomic command: an error would have been raised)."""
        return [key for shard, reply in replies.items() if reply is None for key in groups[shard]]

    def add_plan(self, mapping: Mapping[Any, Any], timeout: float | None) -> tuple[Groups, Plan]:
        """Per key ``SET NX`` then ``GET``: the value now stored, ours or a concurrent winner's."""
        groups = self.core.group_by_shard(mapping)
        expiry = expiry_args(timeout)
        plan: Plan = {
            shard: [
                command
                for key in group
                for command in (
                    ("SET", key, self.encode(mapping[key]), *expiry, "NX"),
                    ("GET", key),
                )
            ]
            for shard, group in groups.items()
        }
        return groups, plan

    def stored(self, groups: Groups, replies: Mapping[Shard, list[Any] | None]) -> dict[Any, Any]:
        """The values an :meth:`add_plan` read back (every second reply)."""
        return self.found(groups, {s: None if r is None else [r[1::2]] for s, r in replies.items()})

    def del_plan(self, keys: Iterable[Any]) -> Plan:
        groups = self.core.group_by_shard(distinct(keys))
        plan: Plan = {}
        if self.core.previous_ring is None:  # del_commands's plain case, without a call per shard
            for shard, group in groups.items():
                plan[shard] = [("DEL", *group)]
            return plan
        return {shard: self.del_commands(group) for shard, group in groups.items()}


def _pairs(keys: Sequence[Any], values: Sequence[Any]) -> list[Any]:
    """``key1, value1, key2, value2, ...``: the arguments of ``MSET`` and ``MSETEX``."""
    pairs: list[Any] = [None] * (2 * len(keys))
    pairs[::2] = keys
    pairs[1::2] = values
    return pairs


def short_key(key: Any, limit: int = 200) -> str:
    """A key for a log line: a 1 MB key must not make a 1 MB log line."""
    text = repr(key)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def escape_pattern(text: str) -> str:
    """Escape glob characters so a key prefix matches only itself in ``SCAN MATCH``."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
