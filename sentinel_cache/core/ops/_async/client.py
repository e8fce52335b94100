"""Every cache operation, written once: the asyncio source of both clients.

``sentinel_cache/core/ops/_sync/client.py`` is generated from this file by ``scripts/unasync.py`` (as
httpcore generates its ``_sync`` package): ``async``/``await`` are erased and ``Async`` names
lose their prefix. Do not edit the generated file; ``make test`` fails when it is stale.

What differs between the two flavours is only how a shard's connections are reached and how to
wait: each flavour's ``*_io.py`` module beside this package, hand-written and small.
Everything else is here once: the safety net (re-resolve without waiting on the node that
failed, one retry of idempotent commands when the shard moved, no acknowledgement from a
replaced master), the write fence, the scatter of multi-key batches, and each operation's
commands and replies (with the plans of :mod:`sentinel_cache.core.ops.plans`).

``timeout`` is seconds, None means never expire, zero or less means the value expires at once
(as in Django). Every entry point that takes a timeout, a delta or keys applies the rules of
:mod:`sentinel_cache.core.arguments` before it sends anything (an int timeout costs a type check
and a comparison; keys are checked where they are placed on the ring).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from sentinel_cache.core.arguments import (
    INT64_MAX,
    INT64_MIN,
    MAX_TIMEOUT,
    distinct,
    valid_delta,
    valid_int,
    valid_timeout,
)
from sentinel_cache.core.ops._async.runner import SKIPPED, AsyncRunner
from sentinel_cache.core.ops.plans import (
    CLEARED,
    DELETE,
    DELETE_MARKED,
    INCR_IF_EXISTS,
    INCR_IF_EXISTS_SHA,
    MISS,
    READ,
    READ_MOVED,
    REPLACE,
    SWAP_IF_SAME,
    TOMBSTONE_MS,
    UPDATE,
    WRITE,
    Command,
    counter_value,
    expiry_args,
    incr_refused,
    is_ok,
    is_reserved,
    logger,
    past_64_bits,
    short_key,
    wrong_type,
)
from sentinel_cache.core.ops.scan import ShardScan
from sentinel_cache.core.topology.shard import MASTER_ERRORS, Shard
from sentinel_cache.exceptions import (
    ArgumentValueError,
    IncrementError,
    InvalidValueError,
)

SCAN_COUNT = 1000
# An incr past 64 bits writes only if the value is still what it read: tries before giving up.
INCR_SWAP_TRIES = 10


def non_string_miss(exc: BaseException, key: Any) -> bool:
    """Whether a read's ``exc`` says the key holds no string (a list, a hash, ... that this
    cache did not write): a read that treats it as a miss says so in the log, once, here."""
    if not isinstance(exc, ResponseError) or not wrong_type(exc):
        return False
    logger.warning("key %s holds a non-string value: treated as a miss", short_key(key))
    return True


class AsyncCacheOperations(AsyncRunner):
    """The cache operations over the sharded core (the adapters' client)."""

    # -- single key --------------------------------------------------------------------------
    async def get(self, key: Any, default: Any = None) -> Any:
        core = self.core
        if self.mux_link is not None:  # keyed's direct round trip, in this one coroutine
            commands: list[Command] = [("GET", key)]
            call = self.started(key, commands, False)
            if call is not None:
                link = call.link
                try:
                    try:
                        if link.paused:
                            await link.drained()
                        (data,) = link.finish(await call.waiter)
                    except MASTER_ERRORS as exc:
                        (data,) = await self.resumed(
                            link, commands, [None], exc, write=False, idempotent=True, outage=True
                        )
                except ResponseError as exc:
                    if not non_string_miss(exc, key):
                        raise
                    return default
                if data is None:
                    return default
                try:  # decode's, a call less
                    return self.codec.loads(data)
                except InvalidValueError as exc:
                    self.unreadable(key, exc)  # logged, and the default
                    return default
        near = core.near
        previous = None if core.previous_ring is None else core.previous_shard_for(key)
        ticket = None
        if previous is None and near is not None:
            local = near.get(key)
            if local is not None:  # a near-cache hit: no ring lookup, one decode
                try:
                    return self.codec.loads(local)
                except InvalidValueError:
                    return self.value_of(local, key, default)  # logged, and the default
            shard = core.shard_for(key)
            ticket = near.ticket(shard, key)
        try:
            if previous is not None:  # its owner changed: ask both at once
                data = await self._get_moving(key, previous)
            elif ticket is None:
                (data,), _ = await self.keyed(key, [("GET", key)], [None], READ)
            else:  # read on the master (the node tracked), with the time the copy may live
                # (in an outage a replica in step may answer: the near cache keeps none of that)
                (data, pttl), _ = await self.keyed(
                    key, [("GET", key), ("PTTL", key)], [None, -2], READ, replicas=False
                )
                near.fill(shard, key, ticket, data, pttl)  # type: ignore[union-attr]
        except BaseException as exc:
            if ticket is not None:  # a failed read leaves no ticket behind
                near.release(key, ticket)  # type: ignore[union-attr]
            if not non_string_miss(exc, key):
                raise
            return default
        if data is None:  # value_of's, inlined: every get's last step
            return default
        value = self.decode(data, key)
        return default if value is MISS else value

    async def set(
        self, key: Any, value: Any, timeout: float | None, *, nx: bool = False, xx: bool = False
    ) -> bool:
        """Store the value; ``nx``: only where the key is absent (``add``), ``xx``: only where
        it exists. True if stored."""
        if type(timeout) is not int or timeout > MAX_TIMEOUT:
            timeout = valid_timeout(timeout)
        if nx and xx:
            raise ArgumentValueError("xx", xx, "cannot be combined with nx")
        if timeout is not None and timeout <= 0:
            if nx:  # "added" and expired at once: it succeeds only where the key was absent
                return not await self.has_key(key)
            deleted = await self.delete(key)
            return deleted if xx else True  # xx: "stored" only where it existed
        data = self.codec.dumps(value)  # encode's, a call less
        command: Command = ("SET", key, data, *expiry_args(timeout))
        if nx or xx:  # a key not moved yet is on its previous owner: NX/XX must see it
            command += ("NX",) if nx else ("XX",)
        call = None
        if self.mux_link is not None:  # keyed's direct round trip, in this one coroutine
            commands = [command]
            call = self.started(key, commands, True)
        if call is not None:
            link = call.link
            try:
                if link.paused:
                    await link.drained()
                replies = link.finish(await call.waiter)
            except MASTER_ERRORS as exc:
                replies = await self.resumed(
                    link, commands, [SKIPPED], exc, write=True, idempotent=not nx, outage=True
                )
        else:
            keep = None if nx or xx or type(data) is not bytes else (data, timeout)
            replies, _ = await self.keyed(
                key,
                [command],
                [SKIPPED],
                UPDATE if nx or xx else REPLACE,
                idempotent=not nx,
                keep=keep,
            )
        if nx and replies[0] is None:  # taken: by a value it can read?
            return await self._add_over_unreadable(key, data, timeout)
        return is_ok(replies[0])

    async def _add_over_unreadable(
        self, key: Any, data: bytes | int, timeout: float | None
    ) -> bool:
        """An ``add`` that found the key taken: a value this cache cannot read counts as absent,
        as ``get`` and ``has_key`` say, so it is replaced, and only if it is still the same
        (:data:`~sentinel_cache.core.ops.plans.SWAP_IF_SAME`). False for a readable value."""
        (found,), _ = await self.keyed(
            key, [("GET", key)], [SKIPPED], READ, replicas=False, outage=False
        )
        if type(found) is not bytes or self.decode(found, key) is not MISS:
            return False  # readable (the add lost fairly), skipped, or gone since
        ms = 0 if timeout is None else expiry_args(timeout)[1]
        swap: Command = ("EVAL", SWAP_IF_SAME, 1, key, found, data, ms)
        (swapped,), _ = await self.keyed(key, [swap], [0], UPDATE, idempotent=False)
        return swapped == 1

    async def add(self, key: Any, value: Any, timeout: float | None) -> bool:
        return await self.set(key, value, timeout, nx=True)

    async def touch(self, key: Any, timeout: float | None) -> bool:
        """True if the key exists (PERSIST alone answers 0 for a key that had no expiry)."""
        if type(timeout) is not int or timeout > MAX_TIMEOUT:
            timeout = valid_timeout(timeout)
        if timeout is None:
            (exists, _), _ = await self.keyed(
                key, [("EXISTS", key), ("PERSIST", key)], [0, 0], UPDATE
            )
            return bool(exists)
        if timeout <= 0:
            return await self.delete(key)
        ms = max(1, int(timeout * 1000))
        (reply,), _ = await self.keyed(key, [("PEXPIRE", key, ms)], [0], UPDATE)
        return bool(reply)

    async def delete(self, key: Any) -> bool:
        commands = self.del_commands([key])
        replies, dropped = await self.keyed(key, commands, [0] * len(commands), DELETE)
        return sum(replies) > 0 or dropped > 0

    async def has_key(self, key: Any) -> bool:
        """True if ``get`` would find a value: one this cache cannot read is absent, as ``get``,
        ``add`` and ``get_or_set`` treat it (so the value is read, not only ``EXISTS``); a key
        holding a hash, set or sorted set is present."""
        near = self.core.near
        local = None if near is None else near.get(key)
        if local is not None:
            return self.decode(local, key) is not MISS
        try:
            (data,), _ = await self.keyed(key, [("GET", key)], [None], READ)
            if data is None and self.core.previous_ring is not None:  # maybe not moved yet
                (data,), _ = await self.keyed(key, [("GET", key)], [None], READ_MOVED)
        except ResponseError as exc:
            if not wrong_type(exc):
                raise
            return True
        return data is not None and self.decode(data, key) is not MISS

    async def incr(self, key: Any, delta: int = 1, *, create: bool = False) -> int | None:
        """Atomic and TTL-preserving; ValueError if the key is missing (Django semantics), or,
        with ``create``, a missing key counts from 0 without expiry (cachelib semantics), and
        None when IGNORE_EXCEPTIONS skipped the shard. A value the server cannot increment
        raises :class:`~sentinel_cache.IncrementError` naming the key."""
        if type(delta) is not int or not INT64_MIN <= delta <= INT64_MAX:
            delta = valid_delta(delta)
        try:
            if create:
                (value,), _ = await self.keyed(
                    key, [("INCRBY", key, delta)], [None], UPDATE, idempotent=False
                )
                return None if value is None else int(value)
            command: Command = ("EVALSHA", INCR_IF_EXISTS_SHA, 1, key, delta)
            try:
                (value,), _ = await self.keyed(key, [command], [SKIPPED], UPDATE, idempotent=False)
            except NoScriptError:  # nothing ran: safe to send the body, which caches it
                command = ("EVAL", INCR_IF_EXISTS, 1, key, delta)
                (value,), _ = await self.keyed(key, [command], [SKIPPED], UPDATE, idempotent=False)
        except ResponseError as exc:
            if not past_64_bits(exc):
                raise incr_refused(key, exc) from None
            value = await self._incr_past_64_bits(key, delta, exc)
        if value is SKIPPED:
            raise ValueError(f"Key {key!r} not found (its shard is unavailable)")
        if value is None:
            raise ValueError(f"Key {key!r} not found")
        return int(value)

    async def _incr_past_64_bits(self, key: Any, delta: int, refusal: ResponseError) -> Any:
        """django-redis's fallback when the value or the result does not fit the server's 64
        bits: the integer is read, added to in Python and written back (a big integer is stored
        encoded), keeping the TTL, atomically: the write lands only if the key still holds what
        was read (:data:`~sentinel_cache.core.ops.plans.SWAP_IF_SAME`), else it is read again.
        The new value, None for a missing key, ``SKIPPED`` for a skipped shard."""
        for _ in range(INCR_SWAP_TRIES):
            (data,), _ = await self.keyed(
                key, [("GET", key)], [SKIPPED], READ, replicas=False, outage=False
            )
            if data is None or data is SKIPPED:
                return data
            value = counter_value(self.codec, data)
            if value is None:  # not what INCR takes for an integer, nor ours for a big one
                raise incr_refused(key, refusal) from None
            swap: Command = ("EVAL", SWAP_IF_SAME, 1, key, data, self.encode(value + delta))
            (swapped,), _ = await self.keyed(key, [swap], [SKIPPED], UPDATE, idempotent=False)
            if swapped is SKIPPED:
                return swapped
            if swapped == 1:
                return value + delta
        raise IncrementError(key, f"its value changed under each of {INCR_SWAP_TRIES} tries")

    async def pttl(self, key: Any) -> int | None:
        """Milliseconds left; None for no expiry; 0 for a missing key (django-redis's rules)."""
        (ms,), _ = await self.keyed(key, [("PTTL", key)], [-2], READ_MOVED)
        if ms == -1:
            return None
        return max(0, int(ms))

    async def pexpire(self, key: Any, ms: int) -> bool:
        """Expire the key in ``ms`` milliseconds (0 or less deletes it); False if missing."""
        ms = valid_int("ms", ms)
        (reply,), _ = await self.keyed(key, [("PEXPIRE", key, ms)], [0], UPDATE)
        return bool(reply)

    async def pexpire_at(self, key: Any, when_ms: int) -> bool:
        """Expire the key at ``when_ms`` (milliseconds since 1970; a moment past deletes it);
        False if missing."""
        when_ms = valid_int("when", when_ms)
        (reply,), _ = await self.keyed(key, [("PEXPIREAT", key, when_ms)], [0], UPDATE)
        return bool(reply)

    async def ttl(self, key: Any) -> float | None:
        """Seconds left; None for no expiry; 0 for a missing key."""
        (ms,), _ = await self.keyed(key, [("PTTL", key)], [-2], READ_MOVED)
        if ms == -1:
            return None
        return 0 if ms < 0 else ms / 1000

    async def expire(self, key: Any, timeout: float) -> bool:
        return await self.touch(key, timeout)

    async def persist(self, key: Any) -> bool:
        return await self.touch(key, None)

    # -- many keys ---------------------------------------------------------------------------
    async def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        near = self.core.near
        if near is None:
            groups, plan = self.mget_plan(keys)
            if not plan:
                return {}
            found = self.found(groups, await self.scatter(plan, write=False, operation="get_many"))
            if self.core.previous_ring is None:  # nothing to adopt: no call for it
                return found
            return await self._with_adopted(found, groups)
        local, missing = self.near_hits(near, keys)
        groups, plan = self.mget_plan(missing)
        if not plan:
            return local
        tickets = {key: near.ticket(shard, key) for shard, group in groups.items() for key in group}
        for shard, group in groups.items():
            if any(tickets[key] is not None for key in group):  # the time each copy may live
                plan[shard].extend(("PTTL", key) for key in group)
        try:
            replies = await self.scatter(plan, write=False, operation="get_many")
            for shard, shard_replies in replies.items():
                if shard_replies is not None and len(shard_replies) > 1:
                    data = zip(groups[shard], shard_replies[0], shard_replies[1:], strict=True)
                    for key, value, pttl in data:
                        near.fill(shard, key, tickets.pop(key), value, pttl)
        finally:
            for key, ticket in tickets.items():  # failed, or a shard skipped: no ticket left
                near.release(key, ticket)
        return await self._with_adopted({**local, **self.found(groups, replies)}, groups)

    async def set_many(self, mapping: Mapping[Any, Any], timeout: float | None) -> list[Any]:
        """Returns the keys that failed (Django's contract)."""
        if type(timeout) is not int or timeout > MAX_TIMEOUT:
            timeout = valid_timeout(timeout)
        if not mapping:
            return []
        if timeout is not None and timeout <= 0:
            await self.delete_many(list(mapping))
            return []
        groups = self.core.group_by_shard(mapping)
        if timeout is not None:
            await self.learn(groups, "MSETEX")
        plan = self.set_plan(groups, mapping, timeout)
        try:
            replies, _ = await self.planned(plan, mapping, REPLACE, "set_many")
        except ResponseError as exc:
            # MSETEX taken away within a generation (an ACL change, a restart as an older
            # server): relearned, and the whole plan sent once more with what each master allows
            # now. Which shards' batches failed is not known here; set_many is idempotent.
            used = [shard for shard, commands in plan.items() if commands[0][0] == "MSETEX"]
            if not used or not await self.relearn(used, "MSETEX", exc):
                raise
            plan = self.set_plan(groups, mapping, timeout)
            replies, _ = await self.planned(plan, mapping, REPLACE, "set_many")
        return self.not_set(groups, replies) if None in replies.values() else []

    async def get_or_set_many(
        self, defaults: Mapping[Any, Any], timeout: float | None
    ) -> dict[Any, Any]:
        """The value of every key of ``defaults``; a missing key gets its default, added with
        ``SET NX`` so a concurrent writer's value wins (and is returned). Two round trips, each
        one batch per shard."""
        if type(timeout) is not int or timeout > MAX_TIMEOUT:
            timeout = valid_timeout(timeout)
        found = await self.get_many(defaults)
        missing = {key: value for key, value in defaults.items() if key not in found}
        if not missing:
            return found
        if timeout is not None and timeout <= 0:  # stored and expired at once
            return {**missing, **found}
        groups, plan = self.add_plan(missing, timeout)
        replies, _ = await self.planned(plan, missing, WRITE, "get_or_set_many")
        found.update(self.stored(groups, replies))
        return found

    async def delete_many(self, keys: Iterable[Any]) -> int:
        keys = list(keys)
        plan = self.del_plan(keys)
        if not plan:
            return 0
        replies, dropped = await self.planned(plan, keys, DELETE, "delete_many")
        for shard_replies in replies.values():
            if shard_replies is not None:
                for deleted in shard_replies:
                    dropped += int(deleted)
        return dropped

    async def remove_many(self, keys: Iterable[Any], *, unlink: bool = False) -> dict[Any, bool]:
        """Delete (or ``UNLINK``) the keys, then check none is still there, in one batch per
        shard (cachelib's contract): key -> gone. Keys of a shard skipped by IGNORE_EXCEPTIONS
        are left out."""
        groups = self.core.group_by_shard(distinct(keys))
        command = "UNLINK" if unlink else "DEL"
        plan = {
            shard: [*self.del_commands(group, command), *(("EXISTS", key) for key in group)]
            for shard, group in groups.items()
        }
        gone: dict[Any, bool] = {}
        if not plan:
            return gone
        every = [key for group in groups.values() for key in group]
        removed, _ = await self.planned(plan, every, DELETE, "delete_many")
        for shard, replies in removed.items():
            if replies is not None:
                checks = replies[len(replies) - len(groups[shard]) :]
                gone.update(zip(groups[shard], (not r for r in checks), strict=True))
        return gone

    # -- whole cache (per shard, so an adapter can skip a shard that is down) ----------------
    async def iter_keys_on(
        self,
        shard: Shard,
        pattern: str,
        *,
        count: int = SCAN_COUNT,
        write: bool = False,
        operation: str = "iter_keys",
    ) -> AsyncIterator[bytes]:
        """Every key of one shard matching ``pattern`` (``SCAN`` on its master, never ``KEYS``),
        begun again on a new master (:mod:`sentinel_cache.core.ops.scan`: none missed, some maybe
        repeated); each batch goes through the safety net."""
        await self.ready(shard, write)
        scan = ShardScan(shard, pattern, count, operation=operation)
        while not scan.done:
            command = scan.command()
            (reply,) = await self.execute(
                shard, [command], write=write, replicas=False, outage=False
            )
            for key in scan.take(reply):
                yield key

    async def iter_keys(self, pattern: str, *, count: int = SCAN_COUNT) -> AsyncIterator[bytes]:
        """Every key matching ``pattern`` on every shard, some maybe more than once (a skipped
        shard yields nothing more)."""
        for shard in self.core.every_shard:
            try:
                async for key in self.iter_keys_on(shard, pattern, count=count):
                    yield key
            except MASTER_ERRORS as exc:
                if not self.fail_open.skip(shard, exc, "iter_keys", incomplete=True):
                    raise

    async def delete_pattern_on(
        self, shard: Shard, pattern: str, count: int = SCAN_COUNT, operation: str = "delete_pattern"
    ) -> int:
        """``SCAN MATCH`` + ``UNLINK`` of one shard's matching keys (on its master). After a
        master change the scan begins again: a key whose delete had not reached the new master
        is deleted, and counted, again."""
        deleted = 0
        batch: list[bytes] = []
        async for key in self.iter_keys_on(
            shard, pattern, count=count, write=True, operation=operation
        ):
            batch.append(key)
            if len(batch) >= count:
                deleted += await self._unlink(shard, batch)
                batch = []
        if batch:
            deleted += await self._unlink(shard, batch)
        return deleted

    async def _unlink(self, shard: Shard, keys: list[bytes]) -> int:
        """``UNLINK`` of keys found on ``shard``; while resharding, those owned by another shard
        (``shard`` held them under the previous placement) are then deleted on their owners with
        tombstones, so no copy of them comes back (see plans.DELETE_MARKED)."""
        try:
            (reply,) = await self.execute(shard, [("UNLINK", *keys)], write=True)
        finally:
            self.forget(keys)
        if self.core.previous_ring is not None:
            elsewhere = [k for k in keys if not is_reserved(k) and self.core.shard_for(k) != shard]
            if elsewhere:
                groups = self.core.group_by_shard(elsewhere)
                plan = {
                    owner: [("EVAL", DELETE_MARKED, len(group), *group, TOMBSTONE_MS, "UNLINK")]
                    for owner, group in groups.items()
                }
                await self.scatter(plan, write=True, operation="delete_pattern")
        return int(reply)

    async def delete_pattern(self, pattern: str, *, count: int = SCAN_COUNT) -> int:
        """How many keys matching ``pattern`` were deleted (on the shards not skipped)."""
        deleted = 0
        for shard in self.core.every_shard:
            try:
                deleted += await self.delete_pattern_on(shard, pattern, count)
            except MASTER_ERRORS as exc:
                if not self.fail_open.skip(shard, exc, "delete_pattern", incomplete=True):
                    raise
        return deleted

    async def clear(self, pattern: str | None) -> bool:
        """With a pattern (this cache's keys, see :func:`~sentinel_cache.core.ops.plans.escape_pattern`):
        SCAN + UNLINK of the matching keys on every shard. Without one: the whole database of
        every shard is flushed, as Django's RedisCache does. False if IGNORE_EXCEPTIONS skipped
        a shard."""
        complete = True
        for shard in self.core.every_shard:
            try:
                if pattern:
                    await self.delete_pattern_on(shard, pattern, operation="clear")
                else:
                    try:
                        await self.execute(shard, [("FLUSHDB", "ASYNC")], write=True)
                    finally:
                        self.forget_shard(shard, "clear")
            except MASTER_ERRORS as exc:
                if not self.fail_open.skip(shard, exc, "clear", incomplete=True):
                    raise
                complete = False
        if not pattern and self.core.previous_ring is not None:
            # After every shard was flushed: no copy read before the flush lands (scripts._GUARD).
            marks = {s: [("SET", CLEARED, 1, "PX", TOMBSTONE_MS)] for s in self.core.every_shard}
            await self.scatter(marks, write=True, operation="clear")
        return complete
