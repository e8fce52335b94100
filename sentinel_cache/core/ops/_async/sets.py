"""Set operations (django-redis's ``sadd``, ``scard``, ``smembers``, ``sismember``,
``smismember``, ``spop``, ``srandmember``, ``srem``, ``sscan``, ``sscan_iter``, and the
multi-key ``sdiff``, ``sinter``, ``sunion``, their ``*store`` variants and ``smove``); members
go through the cache's codec as every cached value does.

A multi-key operation whose keys all live on one shard is the one native command there. Keys
on several shards: every source's members are read from their shards at once (one round trip),
combined here on the stored bytes (what Redis compares), and a ``*store`` writes the result on
the destination's shard in one ``MULTI`` (atomic there); across shards nothing is atomic, a
write landing between two shards' reads may be seen on one and not the other. ``smove`` across
shards is ``SREM`` on the source, then ``SADD`` on the destination.

The asyncio source; ``_sync/sets.py`` is generated from it by ``scripts/unasync.py``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from sentinel_cache.core.arguments import check_count, distinct
from sentinel_cache.core.ops._async.client import AsyncCacheOperations
from sentinel_cache.core.ops.plans import (
    MISS,
    READ_MOVED,
    UPDATE,
    Command,
    Plan,
    logger,
    short_key,
)
from sentinel_cache.core.ops.scan import ShardScan
from sentinel_cache.core.topology.shard import Shard
from sentinel_cache.exceptions import ArgumentTypeError, ArgumentValueError


def glob_matcher(pattern: Any) -> re.Pattern[str]:
    """``SSCAN``'s ``MATCH`` glob (``*``, ``?``, ``[abc]``, ``[^a-z]``, ``\\`` escapes), as a
    regular expression over a member's text (``?`` is one character, where Redis's is a byte). Members are stored framed by the codec, so the
    server's ``MATCH`` would see the frame; the pattern is applied here to each decoded member
    instead (:func:`member_text`)."""
    if not isinstance(pattern, str):
        raise ArgumentTypeError("match", pattern, f"must be str, not {type(pattern).__name__}")
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 1
        elif ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[":
            i = bracket(pattern, i + 1, out)
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def bracket(pattern: str, i: int, out: list[str]) -> int:
    """A glob's ``[...]`` from ``pattern[i]`` as a regular expression's class (appended to
    ``out``); the index of its ``]``. As Redis's ``stringmatchlen``: ``^`` negates, ``\\``
    escapes, ``x-y`` is a range wherever a ``-`` follows with a character after it (``z-a`` is
    ``a-z``), ``[]`` matches nothing, and the pattern's end closes an open class."""
    negate = pattern[i : i + 1] == "^"
    i += negate
    parts: list[str] = []
    while i < len(pattern) and pattern[i] != "]":
        if pattern[i] == "\\" and i + 1 < len(pattern):
            i += 1
            parts.append(re.escape(pattern[i]))
        elif i + 2 < len(pattern) and pattern[i + 1] == "-":
            low, high = sorted((pattern[i], pattern[i + 2]))
            parts.append(f"{re.escape(low)}-{re.escape(high)}")
            i += 2
        else:
            parts.append(re.escape(pattern[i]))
        i += 1
    if parts:
        out.append(f"[{'^' if negate else ''}{''.join(parts)}]")
    else:
        out.append("." if negate else "(?!)")
    return i


def member_text(member: Any) -> str:
    """What ``match`` is applied to: a str member itself, bytes as UTF-8 text, any other
    member its ``str()`` (an int ``12`` is ``"12"``, as Redis stores it)."""
    if isinstance(member, str):
        return member
    if isinstance(member, bytes):
        return member.decode("utf-8", "replace")
    return str(member)


def combine(command: str, keys: Sequence[Any], members: Mapping[Any, set[bytes]]) -> set[bytes]:
    """``SDIFF``/``SINTER``/``SUNION`` of the keys' stored members, in the keys' order."""
    first, *rest = (members.get(key, set()) for key in keys)
    if command == "SDIFF":
        return first.difference(*rest)
    if command == "SINTER":
        return first.intersection(*rest)
    return first.union(*rest)


class AsyncSetOperations(AsyncCacheOperations):
    """Sets: one key's members on its shard (``UPDATE`` / ``READ_MOVED``), and the multi-key
    operations across shards."""

    def member_values(self, stored: Any, key: Any) -> set[Any]:
        """Stored members as values (those that cannot be read are left out, logged)."""
        decoded = (self.decode(data, key) for data in stored)
        return {value for value in decoded if value is not MISS}

    async def sadd(self, key: Any, *members: Any) -> int:
        """Add the members; the number added (not counting those already there)."""
        encoded = [self.encode(member) for member in members]
        if not encoded:
            return 0
        (added,), _ = await self.keyed(key, [("SADD", key, *encoded)], [0], UPDATE)
        return int(added)

    async def srem(self, key: Any, *members: Any) -> int:
        """Remove the members; the number removed."""
        encoded = [self.encode(member) for member in members]
        if not encoded:
            return 0
        (removed,), _ = await self.keyed(key, [("SREM", key, *encoded)], [0], UPDATE)
        return int(removed)

    async def scard(self, key: Any) -> int:
        (size,), _ = await self.keyed(key, [("SCARD", key)], [0], READ_MOVED)
        return int(size)

    async def smembers(self, key: Any) -> set[Any]:
        (stored,), _ = await self.keyed(key, [("SMEMBERS", key)], [[]], READ_MOVED)
        return self.member_values(stored, key)

    async def sismember(self, key: Any, member: Any) -> bool:
        command: Command = ("SISMEMBER", key, self.encode(member))
        (found,), _ = await self.keyed(key, [command], [0], READ_MOVED)
        return bool(found)

    async def smismember(self, key: Any, *members: Any) -> list[bool]:
        encoded = [self.encode(member) for member in members]
        if not encoded:
            return []
        command: Command = ("SMISMEMBER", key, *encoded)
        (found,), _ = await self.keyed(key, [command], [[0] * len(encoded)], READ_MOVED)
        return [bool(x) for x in found]

    async def spop(self, key: Any, count: int | None = None) -> Any:
        """Remove and return a random member (None if the set is empty), or a set of up to
        ``count`` of them. Not resent after a failover: a resend would pop others."""
        if count is not None:
            check_count("count", count, 0)
        command: Command = ("SPOP", key) if count is None else ("SPOP", key, count)
        absent: list[Any] | None = None if count is None else []
        (popped,), _ = await self.keyed(key, [command], [absent], UPDATE, idempotent=False)
        if count is not None:
            return self.member_values(popped, key)
        return self.value_of(popped, key, None)

    async def srandmember(self, key: Any, count: int | None = None) -> Any:
        """A random member (None if the set is empty), or a list of ``count`` of them (distinct;
        a negative count allows repeats, as Redis's)."""
        if count is not None:
            check_count("count", count, None)
        command: Command = ("SRANDMEMBER", key) if count is None else ("SRANDMEMBER", key, count)
        absent: list[Any] | None = None if count is None else []
        (found,), _ = await self.keyed(key, [command], [absent], READ_MOVED)
        if count is None:
            return self.value_of(found, key, None)
        decoded = (self.decode(data, key) for data in found)
        return [value for value in decoded if value is not MISS]

    async def sscan(self, key: Any, match: str | None = None, count: int | None = 10) -> set[Any]:
        """One ``SSCAN`` from the start, as django-redis's: the members of its first batch (for
        a small set, all of them; ``sscan_iter`` reads them all), ``match`` applied here to the
        decoded members (:func:`glob_matcher`)."""
        matcher = None if match is None else glob_matcher(match)
        if count is not None:
            check_count("count", count, 1)
        command: Command = ("SSCAN", key, 0) if count is None else ("SSCAN", key, 0, "COUNT", count)
        ((_, stored),), _ = await self.keyed(key, [command], [[0, []]], READ_MOVED)
        found = self.member_values(stored, key)
        if matcher is None:
            return found
        return {member for member in found if matcher.fullmatch(member_text(member))}

    def sscan_iter(
        self, key: Any, match: str | None = None, count: int | None = 10
    ) -> AsyncIterator[Any]:
        """Every member, ``SSCAN`` batch by batch on the master (a cursor is one server's: on a
        new master the scan begins again, :class:`~sentinel_cache.core.ops.scan.ShardScan`), so
        a member may come more than once; ``match`` as in :meth:`sscan`. The arguments are
        checked here, at the call, not at the first member."""
        matcher = None if match is None else glob_matcher(match)
        if count is not None:
            check_count("count", count, 1)
        return self._sscan(key, matcher, count or 10)

    async def _sscan(
        self,
        key: Any,
        matcher: re.Pattern[str] | None,
        count: int,
    ) -> AsyncIterator[Any]:
        scan = ShardScan(self.core.shard_for(key), "*", count, operation="sscan_iter", key=key)
        while not scan.done:
            command = scan.command()
            (reply,), _ = await self.keyed(
                key, [command], [[0, []]], READ_MOVED, replicas=False, outage=False
            )
            for data in scan.take(reply):
                member = self.decode(data, key)
                if member is not MISS and (
                    matcher is None or matcher.fullmatch(member_text(member))
                ):
                    yield member

    # -- several keys, maybe on several shards -----------------------------------------------
    def one_shard(self, keys: Sequence[Any]) -> Shard | None:
        """The shard every key lives on, or None if they live on several."""
        shards = {self.core.shard_for(key) for key in keys}
        return shards.pop() if len(shards) == 1 else None

    async def _native(
        self,
        shard: Shard,
        command: Command,
        keys: Sequence[Any],
        write: bool,
        *,
        idempotent: bool = True,
    ) -> Any:
        """One multi-key command on the shard all its keys live on; None if IGNORE_EXCEPTIONS
        skipped it. Not ``idempotent`` (``SMOVE``): not sent again once it may have run."""
        access = UPDATE if write else READ_MOVED
        plan: Plan = {shard: [command]}
        operation = str(command[0]).lower()
        replies, _ = await self.planned(plan, keys, access, operation, idempotent=idempotent)
        reply = replies.get(shard)
        return None if reply is None else reply[0]

    async def _combined(self, command: str, keys: Sequence[Any]) -> set[bytes]:
        """The stored members of ``SDIFF``/``SINTER``/``SUNION`` over ``keys``: the native
        command where they share a shard, else each key's ``SMEMBERS`` from every shard at
        once, combined here (a shard skipped by IGNORE_EXCEPTIONS: its keys are empty)."""
        if not keys:
            raise ArgumentValueError("keys", keys, f"{command.lower()} needs at least one key")
        shard = self.one_shard(keys)
        if shard is not None:
            return set(await self._native(shard, (command, *keys), keys, False) or ())
        groups = self.core.group_by_shard(distinct(keys))
        plan: Plan = {s: [("SMEMBERS", key) for key in group] for s, group in groups.items()}
        replies, _ = await self.planned(plan, keys, READ_MOVED, command.lower())
        members: dict[Any, set[bytes]] = {}
        for s, group in groups.items():
            shard_replies = replies.get(s)
            if shard_replies is not None:
                members.update(zip(group, map(set, shard_replies), strict=True))
        return combine(command, keys, members)

    async def _store(self, command: str, dest: Any, keys: Sequence[Any]) -> int:
        """``*STORE``: the result's size, the result written on the destination's shard (the
        destination deleted if it is empty), as Redis's."""
        if not keys:
            raise ArgumentValueError("keys", keys, f"{command.lower()}store needs a source key")
        shard = self.one_shard([dest, *keys])
        if shard is not None:
            native: Command = (f"{command}STORE", dest, *keys)
            stored = await self._native(shard, native, [dest, *keys], True)
            return int(stored or 0)
        result = await self._combined(command, keys)
        writes: list[Command] = [("DEL", dest), *([("SADD", dest, *result)] if result else [])]
        absent = ["OK", *["QUEUED"] * len(writes), [0] * len(writes)]
        replies, _ = await self.keyed(dest, [("MULTI",), *writes, ("EXEC",)], absent, UPDATE)
        return int(replies[-1][1]) if result else 0

    async def sdiff(self, *keys: Any) -> set[Any]:
        return self.member_values(await self._combined("SDIFF", keys), keys[0])

    async def sinter(self, *keys: Any) -> set[Any]:
        return self.member_values(await self._combined("SINTER", keys), keys[0])

    async def sunion(self, *keys: Any) -> set[Any]:
        return self.member_values(await self._combined("SUNION", keys), keys[0])

    async def sdiffstore(self, dest: Any, *keys: Any) -> int:
        return await self._store("SDIFF", dest, keys)

    async def sinterstore(self, dest: Any, *keys: Any) -> int:
        return await self._store("SINTER", dest, keys)

    async def sunionstore(self, dest: Any, *keys: Any) -> int:
        return await self._store("SUNION", dest, keys)

    async def smove(self, source: Any, destination: Any, member: Any) -> bool:
        """Move ``member`` from ``source`` to ``destination``; False if it was not in
        ``source``. On one shard ``SMOVE`` (atomic); across shards ``SREM`` on the source, then
        ``SADD`` on the destination, not atomic: a reader may see the member in neither set
        meanwhile. If the ``SADD`` fails (or IGNORE_EXCEPTIONS skips the destination's shard)
        the member is put back in the source, so a failed move loses no member."""
        data = self.encode(member)
        shard = self.one_shard([source, destination])
        if shard is not None:
            command: Command = ("SMOVE", source, destination, data)
            # Not resent either: a second SMOVE of a member moved already answers 0.
            keys = [source, destination]
            return bool(await self._native(shard, command, keys, True, idempotent=False))
        # Not resent: after a failover a resend would answer 0 for a member removed already.
        srem: Command = ("SREM", source, data)
        (removed,), _ = await self.keyed(source, [srem], [0], UPDATE, idempotent=False)
        if not removed:
            return False
        sadd: Command = ("SADD", destination, data)
        try:
            (added,), _ = await self.keyed(destination, [sadd], [None], UPDATE)
        except BaseException:
            await self._put_back(source, destination, data)
            raise
        if added is None:  # the destination's shard skipped: no move
            await self._put_back(source, destination, data)
            return False
        return True

    async def _put_back(self, source: Any, destination: Any, data: Any) -> None:
        """An ``smove``'s member back in its source after its ``SADD`` failed (if that ``SADD``
        timed out after all, the member is in both sets: a copy, never a loss)."""
        try:
            (added,), _ = await self.keyed(source, [("SADD", source, data)], [None], UPDATE)
        except Exception as exc:
            added, reason = None, f"{type(exc).__name__}: {exc}"
        else:
            reason = "its shard is skipped (IGNORE_EXCEPTIONS)"
        if added is None:
            logger.error(
                "smove from %s to %s: the member removed from the source could be neither "
                "added to the destination nor put back (%s): it is lost",
                short_key(source),
                short_key(destination),
                reason,
            )
