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

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from time import perf_counter
from typing import Any, TypeVar

from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

from sentinel_cache.core.arguments import (
    INT64_MAX,
    INT64_MIN,
    MAX_TIMEOUT,
    distinct,
    valid_delta,
    valid_int,
    valid_timeout,
)
from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.async_io import AsyncShardIO, run_blocking, wait_fence
from sentinel_cache.core.ops.observe import Observed, note, observed
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
    REPLY_SKIP,
    SWAP_IF_SAME,
    TOMBSTONE_MS,
    UPDATE,
    WRITE,
    Access,
    ClientBase,
    Command,
    Groups,
    command_name,
    copy_deadline,
    expiry_args,
    incr_refused,
    is_ok,
    is_reserved,
    logger,
    outcome,
    pack,
    past_64_bits,
    short_key,
    wrong_type,
)
from sentinel_cache.core.ops.scan import ShardScan
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.shard import FEATURES, MASTER_ERRORS, Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import (
    ArgumentValueError,
    IncrementError,
    InvalidValueError,
    PoolExhaustedError,
)

T = TypeVar("T")

SCAN_COUNT = 1000
# The reply of a shard IGNORE_EXCEPTIONS skipped, where None means "absent".
_SKIPPED: Any = object()
# An incr past 64 bits writes only if the value is still what it read: tries before giving up.
INCR_SWAP_TRIES = 10


class AsyncCacheOperations(ClientBase):
    """The cache operations over the sharded core (the adapters' client)."""

    def __init__(self, core: ShardedSentinelPool, codec: Codec, **options: Any) -> None:
        """``options``: see :class:`~sentinel_cache.core.ops.plans.ClientBase` (durability, fail-open)."""
        super().__init__(core, codec, **options)
        self.io = AsyncShardIO(core)

    async def aclose(self) -> None:
        """Release this flavour's connections (asyncio: the running loop's); the core stays."""
        await self.io.aclose()

    # -- the one place that talks to a shard ---------------------------------------------------
    async def ready(self, shard: Shard, write: bool) -> None:
        """The core started, the shard's master known, and (for a write) its fence open."""
        core = self.core
        if not core.started or shard.address is None:
            await run_blocking(core.ready, shard, False)
        if write and shard.fenced:
            began = perf_counter()
            await wait_fence(shard, core.config.failover_hold)
            note(core, shard, fence_wait=perf_counter() - began)

    async def execute(
        self,
        shard: Shard,
        commands: Sequence[Command],
        *,
        write: bool,
        idempotent: bool = True,
        replicas: bool = True,
        client: Any = None,
    ) -> list[Any]:
        """Send ``commands`` to the shard in one round trip and return their replies, with the
        safety net of :meth:`run` (``client``: see there)."""
        core = self.core
        if core.tracer is None:
            metrics = core.metrics
            if metrics is None:
                return await self.run(
                    shard,
                    lambda client: send(client, commands),
                    write=write,
                    idempotent=idempotent,
                    replicas=replicas,
                    client=client,
                )
            started = perf_counter()  # metrics alone: no span, no context object
            try:
                replies = await self.run(
                    shard,
                    lambda client: send(client, commands),
                    write=write,
                    idempotent=idempotent,
                    replicas=replicas,
                    client=client,
                )
            except BaseException:
                metrics.call(shard.name, command_name(commands), "error", perf_counter() - started)
                raise
            metrics.call(
                shard.name,
                command_name(commands),
                outcome(commands, replies),
                perf_counter() - started,
            )
            return replies
        with observed(core, shard, commands) as call:
            call.replies = await self.run(
                shard,
                lambda client: send(client, commands),
                write=write,
                idempotent=idempotent,
                replicas=replicas,
                client=client,
            )
        return list(call.replies)

    async def run(
        self,
        shard: Shard,
        operation: Callable[[Any], Awaitable[T]],
        *,
        write: bool,
        idempotent: bool = True,
        replicas: bool = True,
        client: Any = None,
    ) -> T:
        """``operation(client)`` on the shard's master (or, for a read, a replica in rotation;
        or first on ``client``, a connection to the master given by the caller) with the
        pull-path safety net; the one definition of it.

        A connection error, timeout or READONLY reply makes the shard re-resolve its master
        (rate-limited, never waiting on the node that just failed); an idempotent operation is
        retried once if the shard moved. A reply that arrived after the shard moved (or began
        a failover) is no acknowledgement: idempotent operations are retried, others raise
        :class:`~sentinel_cache.StaleReplyError`. A replica that fails a read leaves the read
        rotation and the master answers.
        """
        core = self.core
        await self.ready(shard, write)
        reader = client is None and not write and replicas  # a replica in rotation may serve
        replica, chosen = await self.io.reader(shard) if reader else (None, client)
        client = chosen if chosen is not None else await self.io.master(shard)
        address, generation = shard.current()
        try:
            return await operation(client)
        except PoolExhaustedError:
            raise
        except MASTER_ERRORS as exc:
            if replica is not None:  # a replica failed: the master still serves reads
                shard.set_replica_health(replica, False, f"{type(exc).__name__}: {exc}")
                return await operation(await self.io.master(shard))
            if core.should_reresolve(shard, exc, generation):
                reason = f"{type(exc).__name__}: {exc}"
                await run_blocking(core.reresolve, shard, reason=reason, suspect=address)
            core.retry_or_raise(shard, exc, generation, idempotent=idempotent)
        note(core, shard, retried=True)
        if write and shard.fenced:
            began = perf_counter()
            await wait_fence(shard, core.config.failover_hold)
            note(core, shard, fence_wait=perf_counter() - began)
        return await operation(await self.io.master(shard))

    async def scatter(
        self, plan: Mapping[Shard, Sequence[Command]], *, write: bool, operation: str
    ) -> dict[Shard, list[Any] | None]:
        """Every shard's batch sent before any reply is read (one round trip for all shards).

        A shard whose batch failed goes through the safety net once: re-resolve, then one
        resend only if the shard moved, so a hung master costs one socket timeout, not a second
        one for the resend. An error reply takes the single-shard path, which raises it. With
        IGNORE_EXCEPTIONS an unavailable shard's replies are None and the others' are kept.
        """
        if self.core.tracer is None:
            return await self._scatter(plan, write, operation)
        with Observed(self.core, None, None, operation, shards=list(plan)):
            return await self._scatter(plan, write, operation)

    async def _scatter(
        self, plan: Mapping[Shard, Sequence[Command]], write: bool, operation: str
    ) -> dict[Shard, list[Any] | None]:
        core = self.core
        if len(plan) == 1:
            ((shard, commands),) = plan.items()
            return {shard: await self._shard_or_none(shard, commands, write, operation)}
        started = perf_counter()
        for shard in plan:
            try:
                await self.ready(shard, write)
            except MASTER_ERRORS as exc:
                if not self.fail_open.skip(shard, exc, operation):
                    raise
        replies: dict[Shard, list[Any] | None] = {}
        failed: dict[Shard, tuple[BaseException, Address | None, int]] = {}
        resend: list[Shard] = []
        in_flight: list[tuple[Shard, Any, Any, Sequence[Command], Address | None, int]] = []
        try:
            for shard, commands in plan.items():
                address, generation = shard.current()
                connections = (await self.io.master(shard)).connection_pool
                try:
                    connection = await connections.get_connection()
                except PoolExhaustedError:
                    raise
                except MASTER_ERRORS as exc:  # a refused connect
                    failed[shard] = (exc, address, generation)
                    continue
                in_flight.append((shard, connections, connection, commands, address, generation))
                try:
                    await connection.send_packed_command(pack(connection, commands))
                except MASTER_ERRORS as exc:
                    failed[shard] = (exc, address, generation)
            for shard, _, connection, commands, address, generation in in_flight:
                if shard in failed:
                    continue
                try:
                    replies[shard] = [await connection.read_response() for _ in commands]
                except MASTER_ERRORS as exc:
                    failed[shard] = (exc, address, generation)
                except ResponseError:
                    resend.append(shard)
                if core.metrics is not None:
                    result = "ok" if shard in replies else "error"
                    elapsed = perf_counter() - started
                    core.metrics.call(shard.name, command_name(commands), result, elapsed)
        finally:
            for shard, connections, connection, *_ in in_flight:
                if shard not in replies:  # replies left unread: the socket is out of step
                    await connection.disconnect()
                await connections.release(connection)
        for shard, (error, address, generation) in failed.items():
            try:
                if core.should_reresolve(shard, error, generation):
                    reason = f"{type(error).__name__}: {error}"
                    await run_blocking(core.reresolve, shard, reason=reason, suspect=address)
                core.retry_or_raise(shard, error, generation, idempotent=True)
            except MASTER_ERRORS as exc:
                if not self.fail_open.skip(shard, exc, operation):
                    raise
                replies[shard] = None
            else:
                resend.append(shard)
        for shard in resend:
            replies[shard] = await self._shard_or_none(shard, plan[shard], write, operation)
        return replies

    async def _shard_or_none(
        self, shard: Shard, commands: Sequence[Command], write: bool, operation: str
    ) -> list[Any] | None:
        """One shard's part of a scatter: its replies, or None if IGNORE_EXCEPTIONS skips it."""
        try:
            return await self.execute(shard, commands, write=write)
        except MASTER_ERRORS as exc:
            if not self.fail_open.skip(shard, exc, operation):
                raise
            return None

    async def post(self, plan: Mapping[Shard, Sequence[Command]]) -> None:
        """Send each shard's commands and read nothing: writes nobody waits for, each command
        preceded by ``CLIENT REPLY SKIP`` so the server sends nothing back either (only to
        masters that allow it: see :meth:`learn`). Best effort: a shard fenced for a failover is
        left out, and one whose connection fails is logged, for the caller loses nothing."""
        for shard, commands in plan.items():
            if shard.fenced or shard.allows("CLIENT REPLY") is not True:
                continue
            quiet = [x for command in commands for x in (REPLY_SKIP, command)]
            connections = (await self.io.master(shard)).connection_pool
            try:
                connection = await connections.get_connection()
                try:
                    await connection.send_packed_command(pack(connection, quiet))
                except BaseException:
                    await connection.disconnect()
                    raise
                finally:
                    await connections.release(connection)
            except MASTER_ERRORS as exc:
                self.unposted.warn(
                    logger,
                    "shard %s: writes sent without waiting were not sent: %s: %s",
                    shard.label,
                    type(exc).__name__,
                    exc,
                )

    async def keyed(
        self,
        key: Any,
        commands: list[Command],
        absent: list[Any],
        access: Access,
        *,
        idempotent: bool = True,
        replicas: bool = True,
        keep: tuple[bytes, float | None] | None = None,
    ) -> tuple[list[Any], int]:
        """The one way a single-key operation runs: ``commands`` on the key's shard, with the
        rules its ``access`` calls for (:class:`~sentinel_cache.core.ops.plans.Access`). The
        replies, and how many copies its previous owner deleted (a ``delete`` while resharding).
        With IGNORE_EXCEPTIONS an unavailable shard answers ``absent``: the replies as if the
        key did not exist (the one fail-open rule)."""
        dropped = 0
        if self.core.previous_ring is not None:
            if access.move:
                await self._move([key])
            if access.delete:  # first: see plans.DELETE_MARKED
                dropped = await self._drop_previous([key])
        try:
            replies = await self._on(
                key,
                commands,
                absent,
                write=access.write,
                idempotent=idempotent,
                replicas=replicas,
                keep=keep,
            )
        finally:
            if access.replace:
                await self._drop_previous([key])
        return replies, dropped

    async def planned(
        self,
        plan: Mapping[Shard, Sequence[Command]],
        keys: Iterable[Any],
        access: Access,
        operation: str,
    ) -> tuple[dict[Shard, list[Any] | None], int]:
        """The one way a multi-key operation runs: its plan on every shard at once
        (:meth:`scatter`) with the rules its ``access`` calls for on ``keys``, as
        :meth:`keyed`."""
        keys = list(keys)
        dropped = 0
        if self.core.previous_ring is not None:
            if access.move:
                await self._move(keys)
            if access.delete:  # first: see plans.DELETE_MARKED
                dropped = await self._drop_previous(keys)
        try:
            replies = await self.scatter(plan, write=access.write, operation=operation)
        finally:
            if access.write:
                self.forget(keys)
            if access.replace:
                await self._drop_previous(keys)
        return replies, dropped

    async def _on(
        self,
        key: Any,
        commands: list[Command],
        absent: list[Any],
        *,
        write: bool,
        idempotent: bool,
        replicas: bool,
        keep: tuple[bytes, float | None] | None,
    ) -> list[Any]:
        """:meth:`keyed`'s round trip, and the near cache's part of it.

        ``keep``: the stored data and timeout of a write the near cache may keep. It goes on
        the shard's writer connection when that is free (the server does not echo it to us),
        and is kept if nothing read or wrote the key meanwhile
        (:meth:`~sentinel_cache.core.topology.near.NearCache.own`); any other write evicts the key."""
        shard = self.core.shard_for(key)
        near = self.core.near
        writer = ticket = None
        if keep is not None and near is not None and self.core.previous_ring is None:
            writer = self.io.writer(shard, key)
            if writer is not None:
                ticket = near.ticket(shard, key)
        kept = False
        try:
            replies = await self.execute(
                shard,
                commands,
                write=write,
                idempotent=idempotent,
                replicas=replicas,
                client=writer,
            )
            kept = ticket is not None and is_ok(replies[0])
            return replies
        except MASTER_ERRORS as exc:
            if not self.fail_open.skip(shard, exc, commands[0][0]):
                raise
            return absent
        finally:
            if writer is not None:
                writer.done()
            if kept:
                near.own(shard, key, ticket, *keep)  # type: ignore[union-attr, misc]
            elif write:
                self.forget([key])

    # -- single key --------------------------------------------------------------------------
    async def get(self, key: Any, default: Any = None) -> Any:
        core = self.core
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
                (data, pttl), _ = await self.keyed(
                    key, [("GET", key), ("PTTL", key)], [None, -2], READ, replicas=False
                )
                near.fill(shard, key, ticket, data, pttl)  # type: ignore[union-attr]
        except BaseException as exc:
            if ticket is not None:  # a failed read leaves no ticket behind
                near.release(key, ticket)  # type: ignore[union-attr]
            if not isinstance(exc, ResponseError) or not wrong_type(exc):
                raise
            logger.warning("key %s holds a non-string value: treated as a miss", short_key(key))
            return default
        return self.value_of(data, key, default)

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
        data = self.encode(value)
        command: Command = ("SET", key, data, *expiry_args(timeout))
        keep = None
        if nx or xx:  # a key not moved yet is on its previous owner: NX/XX must see it
            command += ("NX",) if nx else ("XX",)
        elif type(data) is bytes:
            keep = (data, timeout)
        replies, _ = await self.keyed(
            key,
            self.durable([command]),
            [None],
            UPDATE if nx or xx else REPLACE,
            idempotent=not nx,
            keep=keep,
        )
        self.check_durable(key, replies)
        return is_ok(replies[0])

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
        near = self.core.near
        if near is not None and near.get(key) is not None:
            return True
        (reply,), _ = await self.keyed(key, [("EXISTS", key)], [0], READ)
        if not reply and self.core.previous_ring is not None:  # maybe not moved yet
            (reply,), _ = await self.keyed(key, [("EXISTS", key)], [0], READ_MOVED)
        return bool(reply)

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
                (value,), _ = await self.keyed(key, [command], [_SKIPPED], UPDATE, idempotent=False)
            except NoScriptError:  # nothing ran: safe to send the body, which caches it
                command = ("EVAL", INCR_IF_EXISTS, 1, key, delta)
                (value,), _ = await self.keyed(key, [command], [_SKIPPED], UPDATE, idempotent=False)
        except ResponseError as exc:
            if not past_64_bits(exc):
                raise incr_refused(key, exc) from None
            value = await self._incr_past_64_bits(key, delta, exc)
        if value is _SKIPPED:
            raise ValueError(f"Key {key!r} not found (its shard is unavailable)")
        if value is None:
            raise ValueError(f"Key {key!r} not found")
        return int(value)

    async def _incr_past_64_bits(self, key: Any, delta: int, refusal: ResponseError) -> Any:
        """django-redis's fallback when the value or the result does not fit the server's 64
        bits: the integer is read, added to in Python and written back (a big integer is stored
        encoded), keeping the TTL, atomically: the write lands only if the key still holds what
        was read (:data:`~sentinel_cache.core.ops.plans.SWAP_IF_SAME`), else it is read again.
        The new value, None for a missing key, ``_SKIPPED`` for a skipped shard."""
        for _ in range(INCR_SWAP_TRIES):
            (data,), _ = await self.keyed(key, [("GET", key)], [_SKIPPED], READ, replicas=False)
            if data is None or data is _SKIPPED:
                return data
            value = self.decode(data, key)
            if type(value) is not int:  # a str, a float, unreadable: what INCRBY refused
                raise incr_refused(key, refusal) from None
            swap: Command = ("EVAL", SWAP_IF_SAME, 1, key, data, self.encode(value + delta))
            (swapped,), _ = await self.keyed(key, [swap], [_SKIPPED], UPDATE, idempotent=False)
            if swapped is _SKIPPED:
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
        replies, _ = await self.planned(plan, mapping, REPLACE, "set_many")
        return self.not_set(groups, replies)

    async def learn(self, shards: Iterable[Shard], feature: str) -> None:
        """Ask the masters not asked yet whether they allow ``feature`` (see
        :data:`~sentinel_cache.core.topology.shard.FEATURES`): once per master, so not batched."""
        command, allowed = FEATURES[feature]
        for shard in shards:
            if shard.allows(feature) is not None:
                continue
            try:
                (reply,) = await self.execute(shard, [command], write=False, replicas=False)
            except ResponseError:  # refused (ACL) or renamed away
                reply = None
            except MASTER_ERRORS:  # unknown still: the operation that follows meets the error
                continue
            # A reply is read only from the shard's master of the moment (a replaced one's is
            # refused), so it is about the generation current now.
            shard.learned(feature, shard.generation, allowed(reply))

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
        return dropped + sum(int(x) for r in replies.values() if r is not None for x in r)

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
            (reply,) = await self.execute(shard, [command], write=write, replicas=False)
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
            # After every shard was flushed: no copy read before the flush lands (plans._GUARD).
            marks = {s: [("SET", CLEARED, 1, "PX", TOMBSTONE_MS)] for s in self.core.every_shard}
            await self.scatter(marks, write=True, operation="clear")
        return complete

    # -- resharding (PREVIOUS_MASTERS): a key not moved yet is still on its previous owner -----
    async def _with_adopted(self, found: dict[Any, Any], groups: Groups) -> dict[Any, Any]:
        """``get_many``'s misses read from their previous owners (and moved), batched."""
        if self.core.previous_ring is None:
            return found
        missing: dict[Shard, list[Any]] = {}
        for group in groups.values():
            for key in group:
                previous = None if key in found else self.core.previous_shard_for(key)
                if previous is not None:
                    missing.setdefault(previous, []).append(key)
        for key, data in (await self.adopt_many(missing)).items():
            value = self.decode(data, key)
            if value is not MISS:
                found[key] = value
        return found

    async def _get_moving(self, key: Any, previous: Shard) -> Any:
        """A key whose owner changed: its owner's value (and clock) and its previous owner's
        copy read in one round trip; the copy is restored on the owner if the owner had none."""
        owner = self.core.shard_for(key)
        plan = {owner: [("GET", key), ("TIME",)], previous: self.copy_plan([key])}
        began = perf_counter()
        replies = await self.scatter(plan, write=False, operation="get")
        elapsed = perf_counter() - began
        own = replies.get(owner)
        if own is not None and own[0] is not None:
            return own[0]
        copies = self.copies({previous: [key]}, {previous: replies.get(previous)})
        if own is None:  # the owner skipped (IGNORE_EXCEPTIONS): nothing to copy onto
            return copies[key][0] if key in copies else None
        deadlines = {owner: copy_deadline(own[1], elapsed)}
        return (await self._restore(copies, deadlines)).get(key)

    async def adopt_many(self, groups: Mapping[Shard, Sequence[Any]]) -> dict[Any, Any]:
        """Move keys from their previous owners (``groups``: previous shard -> keys) to their
        owners, batched per shard: read value and TTL, then write them where the owner has no
        newer value (:meth:`_restore`). Key -> the stored data now on its owner. The previous
        owner keeps its copy until the migration (or a write through the new placement) deletes
        it, so concurrent readers of the same key never find it gone from both."""
        if not groups:
            return {}
        plan = {shard: self.copy_plan(keys) for shard, keys in groups.items()}
        owners = self.core.group_by_shard(key for keys in groups.values() for key in keys)
        for owner in owners:  # each owner's clock, for its copies' deadline
            plan.setdefault(owner, []).append(("TIME",))
        began = perf_counter()
        replies = await self.scatter(plan, write=False, operation="reshard")
        elapsed = perf_counter() - began
        deadlines = {
            owner: copy_deadline(reply[-1], elapsed)
            for owner in owners
            if (reply := replies.get(owner)) is not None
        }
        return await self._restore(self.copies(groups, replies), deadlines)

    async def _restore(
        self,
        copies: Mapping[Any, tuple[bytes, int]],
        deadlines: Mapping[Shard, int],
    ) -> dict[Any, Any]:
        """Write the copies on their owners unless a newer value, a tombstone or the deadline
        stops them (:data:`~sentinel_cache.core.ops.plans.COPY_MISSING`). Key -> the stored data on
        its owner now.

        A read moves what it found: the writes are posted where the owner allows it, so the read
        returns the value it found without a second round trip, and a copy that fails to land
        stays on its previous owner, to be read and moved again. Elsewhere each write is
        acknowledged and a newer value found on the owner is read and returned. (An operation
        that acts on the key where it lives now moves it with :meth:`_move` instead.)"""
        if not copies:
            return {}
        owners, plan = self.adopt_plan(copies, deadlines)
        await self.learn(owners, "CLIENT REPLY")
        posted = {shard: plan.pop(shard) for shard in owners if shard.allows("CLIENT REPLY")}
        await self.post(posted)
        moved = {key: copies[key][0] for shard in posted for key in owners[shard]}
        newer: list[Any] = []
        written = await self.scatter(plan, write=True, operation="reshard") if plan else {}
        for shard, replies in written.items():
            if replies is not None:
                for key, reply in zip(owners[shard], replies[0], strict=True):
                    if reply == 1:
                        moved[key] = copies[key][0]
                    else:
                        newer.append(key)
        if newer:  # written (or deleted) through the new placement meanwhile: that wins
            current, reread = self.mget_plan(newer)
            moved.update(
                self.raw_found(
                    current, await self.scatter(reread, write=False, operation="reshard")
                )
            )
        return moved

    async def _move(self, keys: Sequence[Any]) -> None:
        """Move keys not moved yet to their owners (``DUMP``, then ``RESTORE`` where
        the owner has none, acknowledged), then delete the previous owners' copies: the
        operation that follows finds each key where it lives now, and no old copy is left to
        come back (see :class:`~sentinel_cache.core.ops.plans.Access`)."""
        groups, plan = self.dump_plan(keys)
        if not groups:
            return
        began = perf_counter()  # on the masters: their copies are deleted next
        replies = await self.scatter(plan, write=True, operation="reshard")
        restores = self.restore_plan(groups, replies, perf_counter() - began)
        if restores:
            await self.scatter(restores, write=True, operation="reshard")
        await self._drop_previous([key for group in groups.values() for key in group])

    async def _drop_previous(self, keys: Iterable[Any]) -> int:
        """Delete ``keys`` from their previous owners: after a write on the owner (whose value
        then wins over any copy), before a delete on the owner (whose tombstone must come after:
        see :data:`~sentinel_cache.core.ops.plans.DELETE_MARKED`)."""
        if self.core.previous_ring is None:
            return 0
        plan = self.previous_del_plan(keys)
        if not plan:
            return 0
        replies = await self.scatter(plan, write=True, operation="reshard")
        return sum(int(r[0]) for r in replies.values() if r is not None)


async def send(client: Any, commands: Sequence[Command]) -> list[Any]:
    """One round trip on a connection borrowed from ``client``'s pool: every command sent,
    every reply read.

    An error reply is raised after the replies that follow it were read (the connection stays
    in step); a connection failure (or a cancelled task) drops the socket before it goes back.
    ``READONLY`` counts as a connection failure: the node is no master.
    """
    connections = client.connection_pool
    connection = await connections.get_connection()
    try:
        await connection.send_packed_command(pack(connection, commands))
        replies: list[Any] = []
        error: ResponseError | None = None
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ReadOnlyError:
                raise
            except ResponseError as exc:
                error = error or exc
                replies.append(exc)
    except BaseException:
        await connection.disconnect()
        raise
    finally:
        await connections.release(connection)
    if error is not None:
        raise error
    return replies
