"""How an operation reaches the shards, written once: the asyncio source of both runners.

``_sync/runner.py`` is generated from this file by ``scripts/unasync.py``. Every operation
(``client.py``, ``hashes.py``, ``sorted_sets.py``) runs through the two entry points here:
``keyed`` (one key) and ``planned`` (several keys, one batch per shard, all shards at once),
which apply the rules each operation's :class:`~sentinel_cache.core.ops.plans.Access` calls for
(near-cache eviction, moving a key from its previous owner, the previous owner's cleanup: the
moves themselves are in ``moves.py``, which this class builds on), and through ``run``, the
safety net: re-resolve without waiting on the node that failed, one retry of idempotent
commands when the shard moved, no acknowledgement from a replaced master, the write fence.
What differs between the flavours is only how a shard's connections are reached and how
to wait: each flavour's ``*_io.py`` module beside this package.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from time import perf_counter
from typing import Any, TypeVar

from redis.exceptions import MasterDownError, NoPermissionError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sentinel_cache.core.config import Address
from sentinel_cache.core.metrics import command_name
from sentinel_cache.core.ops._async.moves import AsyncMoves
from sentinel_cache.core.ops.async_io import AsyncShardIO, run_blocking, wait_fence, wait_switch
from sentinel_cache.core.ops.observe import Observed, note, observed
from sentinel_cache.core.ops.plans import (
    REPLY_SKIP,
    Access,
    Command,
    is_ok,
    logger,
    pack,
    short_key,
    unknown_command,
)
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.following import MasterState
from sentinel_cache.core.topology.lean_rules import closed_by_node, mark_unsent, may_resend
from sentinel_cache.core.topology.shard import FEATURES, MASTER_ERRORS, Shard
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import PoolExhaustedError, ShardUnavailableError

T = TypeVar("T")

#: An ``absent`` reply (see :meth:`AsyncRunner.keyed`) for operations where None means
#: "absent" too: what a shard IGNORE_EXCEPTIONS skipped answers, told apart.
SKIPPED: Any = object()


class AsyncRunner(AsyncMoves):
    """The shards' side of every operation: the safety net, the batches, the rules."""

    def __init__(self, core: ShardedSentinelPool, codec: Codec, **options: Any) -> None:
        """``options``: see :class:`~sentinel_cache.core.ops.plans.ClientBase` (durability, fail-open)."""
        super().__init__(core, codec, **options)
        self.io = AsyncShardIO(core)
        # Read once: the options that put work on the hot path, off (the common case) or on.
        self.replica_reads = core.config.read_from_replicas
        self.outage_hold = core.config.outage_hold
        #: The multiplexed connection's round trip on a client (falling back to :func:`send`
        #: itself), or None: :func:`send`, looked up at each call.
        self.roundtrip = self.io.sender(send)
        #: The shared connection a call may go on at once (see :meth:`execute`), or None.
        self.mux_link = self.io.mux_link
        # What :meth:`direct` and :meth:`started` ask of the core that is set when it is built
        # (tracing, metrics, the near cache, a resharding, DURABLE_REPLICAS), asked once.
        self.may_go_direct = (
            self.mux_link is not None and core.tracer is None and core.metrics is None
        )
        self.may_start_read = (
            self.may_go_direct and core.near is None and core.previous_ring is None
        )
        self.may_start_write = self.may_start_read and self.durable_wait is None

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

    def direct(
        self, shard: Shard, write: bool, replicas: bool = True, state: MasterState | None = None
    ) -> Any:
        """The shard's shared connection (``ASYNC_MULTIPLEX``) where a call needs nothing of
        :meth:`run` before it is sent there, else None: no tracer or metrics, the core started
        and the master known, no known outage, no raised write fence for a write, no
        ``READ_FROM_REPLICAS`` rotation for a read (``replicas``), and the connection open,
        current and this process's. The one check behind every direct round trip. ``state``:
        the caller's look at the shard (else one taken here), the one every part of it reads."""
        if not self.may_go_direct:
            return None
        if state is None:
            state = shard.state
        if (
            state.address is not None
            and state.unreachable_since is None
            and not (state.fenced if write else replicas and self.replica_reads)
            and self.core.started
        ):
            return self.mux_link(shard, state)  # type: ignore[misc]
        return None

    async def execute(
        self,
        shard: Shard,
        commands: Sequence[Command],
        *,
        write: bool,
        idempotent: bool = True,
        replicas: bool = True,
        outage: bool = True,
        client: Any = None,
    ) -> list[Any]:
        """Send ``commands`` to the shard in one round trip and return their replies, with the
        safety net of :meth:`run` (``client``: see there)."""
        core = self.core
        roundtrip = self.roundtrip or send
        if core.tracer is None:
            metrics = core.metrics
            if metrics is None:
                if client is None and self.mux_link is not None:
                    # The shared connection's round trip, without run's and the checkout's
                    # coroutines: only where run would send to that connection at once.
                    link = self.direct(shard, write, replicas)
                    if link is not None:
                        try:
                            return await link.roundtrip(commands)
                        except MASTER_ERRORS as exc:  # run's safety net, as if it had sent
                            return await self.rerun(
                                link,
                                commands,
                                exc,
                                write=write,
                                idempotent=idempotent,
                                outage=outage,
                            )
                return await self.run(
                    shard,
                    lambda client: roundtrip(client, commands),
                    write=write,
                    idempotent=idempotent,
                    replicas=replicas,
                    outage=outage,
                    client=client,
                )
            started = perf_counter()  # metrics alone: no span, no context object
            try:
                replies = await self.run(
                    shard,
                    lambda client: roundtrip(client, commands),
                    write=write,
                    idempotent=idempotent,
                    replicas=replicas,
                    outage=outage,
                    client=client,
                )
            except BaseException:
                metrics.call(shard.name, command_name(commands), "error", perf_counter() - started)
                raise
            metrics.sent(shard.name, commands, replies, perf_counter() - started)
            return replies
        with observed(core, shard, commands) as call:
            call.replies = await self.run(
                shard,
                lambda client: roundtrip(client, commands),
                write=write,
                idempotent=idempotent,
                replicas=replicas,
                outage=outage,
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
        outage: bool = True,
        client: Any = None,
        failed: tuple[BaseException, Address | None, int] | None = None,
    ) -> T:
        """``operation(client)`` on the shard's master (or, for a read, a replica in rotation;
        or first on ``client``, a connection to the master given by the caller) with the
        pull-path safety net; the one definition of it.

        Which replicas a read (``write`` false, no ``client``) may be sent to, two questions:
        ``replicas``, one in the read rotation (``READ_FROM_REPLICAS``), false for a reply the
        master alone gives in normal times (a near copy's, which its tracking session covers);
        ``outage``, one in step while the master is unreachable (``OUTAGE_READS``), false for
        what only the node that runs the operation can answer even then: a cursor (``SCAN``),
        a lock read, the read of a read-modify-write.

        A connection error, timeout or READONLY reply makes the shard re-resolve its master
        (rate-limited, never waiting on the node that just failed); an idempotent operation is
        retried once if the shard moved. A reply that arrived after the shard moved (or began
        a failover) is no acknowledgement: idempotent operations are retried, others raise
        :class:`~sentinel_cache.StaleReplyError`. A replica that fails a read leaves the read
        rotation and the master answers.

        While the master is unreachable and not replaced (an outage, see
        :mod:`~sentinel_cache.core.topology.safety`): a read may be answered by a replica in
        step with it (:meth:`outage_read`), and with ``OUTAGE_HOLD`` an operation that may be
        sent again waits for the switch (:meth:`hold`). Once the outage is known, a read goes to
        such a replica first and a write (with ``OUTAGE_HOLD``) waits *before* it is sent.

        ``failed``: the first attempt was already made on the shard's master (:meth:`execute`'s
        direct round trip on the shared connection) and raised this error, while the master
        was that address of that generation: the rules below start from it.
        """
        core = self.core
        reader = client is None and not write
        outage_readable = reader and outage  # a replica in step may answer it in an outage
        read = operation if outage_readable else None  # what a replica in step may answer
        if failed is not None:
            return await self._retried(
                shard, operation, failed, read, write=write, idempotent=idempotent
            )
        state = shard.state  # one look at the shard: the fast path reads nothing else of it
        if not core.started or state.address is None or (write and state.fenced):
            await self.ready(shard, write)
            state = shard.state
        # A known outage (shard.in_outage, in the same look): the master not asked first.
        if state.unreachable_since is not None and self.skips_master(outage_readable, write):
            if outage_readable:
                served, reply = await self.outage_read(shard, operation, state.generation)
                if served:
                    return reply
            else:
                await self.hold(shard, state.generation, None)
                state = shard.state
        if reader and replicas and self.replica_reads:  # a replica in rotation may serve
            replica, chosen = await self.io.reader(shard)
        else:
            replica, chosen = None, client
        client = chosen if chosen is not None else await self.io.master(shard)
        address, generation = state.address, state.generation
        try:
            return await operation(client)
        except PoolExhaustedError:
            raise
        except MASTER_ERRORS as exc:
            if replica is not None:  # a replica failed: the master still serves reads
                shard.set_replica_health(replica, False, f"{type(exc).__name__}: {exc}")
                return await operation(await self.io.master(shard))
            first = (exc, address, generation)
        return await self._retried(
            shard, operation, first, read, write=write, idempotent=idempotent
        )

    async def _retried(
        self,
        shard: Shard,
        operation: Callable[[Any], Awaitable[T]],
        failed: tuple[BaseException, Address | None, int],
        read: Callable[[Any], Awaitable[Any]] | None,
        *,
        write: bool,
        idempotent: bool,
    ) -> T:
        """:meth:`run`'s safety net once its first attempt on the master raised ``failed``: the
        error, and the address and generation of the master it was sent to."""
        core = self.core
        error, address, generation = failed
        for retry in (False, True):
            if retry:
                try:
                    return await operation(await self.io.master(shard))
                except PoolExhaustedError:
                    raise
                except MASTER_ERRORS as exc:
                    error = exc
            elif may_resend(error, idempotent) and closed_by_node(error):
                try:
                    return await self.reconnected(shard, operation)
                except PoolExhaustedError:
                    raise
                except MASTER_ERRORS as again:  # the node is gone: the rules below
                    error = again
            # The same rules when the one retry failed too (the shard moved to a node that
            # is down as well, or the move was a re-resolve naming the same dead master), so
            # an outage holds it, then the shard's error, never the connection's bare one.
            # What was never sent is held and resent as an idempotent call is (may_resend).
            served, reply = await self._recover(
                shard, error, address, generation, read, idempotent=may_resend(error, idempotent)
            )
            if served:
                return reply
            if not retry:
                note(core, shard, retried=True)
                if write and shard.fenced:
                    began = perf_counter()
                    await wait_fence(shard, core.config.failover_hold)
                    note(core, shard, fence_wait=perf_counter() - began)
                address, generation = shard.current()
        try:  # the last try, after a hold that saw the switch
            return await operation(await self.io.master(shard))
        except MASTER_ERRORS as exc:
            raise ShardUnavailableError(
                f"shard {shard.label} at {shard.address}: {type(exc).__name__}: {exc}"
            ) from exc

    async def reconnected(self, shard: Shard, operation: Callable[[Any], Awaitable[T]]) -> T:
        """``operation`` once more after the master closed the connection it was sent on
        (:func:`~sentinel_cache.core.topology.lean_rules.closed_by_node`): on a new connection,
        the pool's idle ones closed first, since whatever closed one (a ``CLIENT KILL``, a
        restart) closed them too. Only for what may be sent again
        (:func:`~sentinel_cache.core.topology.lean_rules.may_resend`): idempotent, or never
        sent. What this attempt raises takes the safety net's path. Always on the master's
        pool, whatever the call was sent on: the near cache's writer connection has no pool, and
        its loss ends its session (a resend there raised ``AttributeError``)."""
        note(self.core, shard, retried=True)
        master = await self.io.master(shard)
        await master.connection_pool.disconnect(inuse_connections=False)
        return await operation(master)

    async def answers(self, shard: Shard) -> bool:
        """Whether the shard's master answers a ``PING`` on a new connection (the pool's idle
        ones closed first, as in :meth:`reconnected`): asked before a closed connection is
        taken for an outage."""
        master = await self.io.master(shard)
        try:
            await master.connection_pool.disconnect(inuse_connections=False)
            await master.ping()
        except MASTER_ERRORS:
            return False
        return True

    def skips_master(self, outage_readable: bool, write: bool) -> bool:
        """Whether a call on a shard in a known outage (a call's re-resolve found its master
        unreachable and no other) is not sent to that master first, so a hung master's
        SOCKET_TIMEOUT is paid once, not per call: a read a replica in step may answer asks one
        first (``OUTAGE_READS``), a write waits for the switch (``OUTAGE_HOLD``). :meth:`run`
        does it; :meth:`scatter` leaves such a shard's batch to it."""
        if outage_readable:
            return self.core.config.outage_reads
        return write and self.outage_hold > 0

    async def _recover(
        self,
        shard: Shard,
        exc: BaseException,
        address: Address | None,
        generation: int,
        read: Callable[[Any], Awaitable[Any]] | None,
        *,
        idempotent: bool,
    ) -> tuple[bool, Any]:
        """The safety net after ``exc`` on the shard's master of ``generation``: ``(True,
        reply)`` if a replica answered the read (``read``: the operation, if a replica may
        answer it), ``(False, None)`` if the operation may be sent again to the shard's master;
        else it raises."""
        core = self.core
        if core.should_reresolve(shard, exc, generation):
            reason = f"{type(exc).__name__}: {exc}"
            await run_blocking(core.reresolve, shard, reason=reason, suspect=address)
        if shard.generation == generation and closed_by_node(exc) and await self.answers(shard):
            # The node closed the connection (a CLIENT KILL, its idle timeout) and answers on a
            # new one: no outage, which would hold every write on the shard until the
            # housekeeper saw the master again (issue 36's kill storm: 0.4-0.7 s stalls).
            core.retry_or_raise(shard, exc, generation, idempotent=idempotent)
            return False, None
        if core.unreachable(shard, exc, generation):
            if read is not None and core.config.outage_reads:
                served, reply = await self.outage_read(shard, read, generation)
                if served:
                    return True, reply
            if idempotent and core.config.outage_hold:
                await self.hold(shard, generation, exc)
                return False, None
        core.retry_or_raise(shard, exc, generation, idempotent=idempotent)
        return False, None

    async def outage_read(
        self, shard: Shard, read: Callable[[Any], Awaitable[T]], generation: int
    ) -> tuple[bool, Any]:
        """``read`` on a replica in step with the unreachable master of ``generation``
        (``OUTAGE_READS``): ``(True, reply)``, or ``(False, None)`` if none answered. Such a
        replica holds what that master gave it, up to its replication lag. A connection it
        closed is made again once (the sentinels close every client's connection to the replica
        they promote); whether a replica stays a candidate is the housekeeper's ``ROLE`` check's
        to say."""
        for address in shard.outage_replicas(generation):
            client = await self.io.replica(shard, address)
            if client is None:  # no longer listed
                continue
            for _ in range(2):
                try:
                    reply = await read(client)
                except (PoolExhaustedError, MasterDownError, RedisTimeoutError):
                    break  # busy, refusing stale reads (replica-serve-stale-data no), or hung
                except MASTER_ERRORS:
                    continue
                note(self.core, shard, outage_read=True)
                return True, reply
        return False, None

    async def hold(self, shard: Shard, generation: int, exc: BaseException | None) -> None:
        """Wait (``OUTAGE_HOLD`` at most) for the shard to leave its unreachable master of
        ``generation``, or for that master to answer again; else the shard's error, naming the
        hold. Waits on the shard's switch signal, sending nothing: the housekeeper and the
        listeners ask the sentinels meanwhile."""
        hold = self.core.config.outage_hold
        if not await wait_switch(shard, generation, hold):
            raise self.core.held_too_long(shard, exc, hold) from exc

    async def scatter(
        self,
        plan: Mapping[Shard, Sequence[Command]],
        *,
        write: bool,
        operation: str,
        idempotent: bool = True,
    ) -> dict[Shard, list[Any] | None]:
        """Every shard's batch sent before any reply is read (one round trip for all shards).

        A shard whose batch failed goes through the safety net once: re-resolve, then one
        resend only if the shard moved, so a hung master costs one socket timeout, not a second
        one for the resend. A shard in a known outage is not sent its batch first when a single
        call would not be (:meth:`skips_master`): the single-shard path answers it after the
        others, from a replica in step or after the hold. An error reply takes the single-shard
        path, which raises it. With IGNORE_EXCEPTIONS an unavailable shard's replies are None
        and the others' are kept. A batch that is not ``idempotent`` is sent again only where
        it never left (:func:`~sentinel_cache.core.topology.lean_rules.may_resend`), as in
        :meth:`run`.
        """
        if self.core.tracer is None:
            return await self._scatter(plan, write, operation, idempotent)
        with Observed(self.core, None, None, operation, shards=list(plan)):
            return await self._scatter(plan, write, operation, idempotent)

    async def _scatter(
        self,
        plan: Mapping[Shard, Sequence[Command]],
        write: bool,
        operation: str,
        idempotent: bool,
    ) -> dict[Shard, list[Any] | None]:
        core = self.core
        if len(plan) == 1:
            ((shard, commands),) = plan.items()
            reply = await self._shard_or_none(shard, commands, write, operation, idempotent)
            return {shard: reply}
        started = perf_counter()
        running = core.started
        # Each shard's master and generation, read before its checkout (a switch after that is
        # the connection's to notice, as in run): in the look that finds it ready, or after
        # every shard is ready when one had to wait.
        sent_to: list[tuple[Shard, Sequence[Command], Address | None, int]] = []
        waited = False
        # A shard in a known outage whose master is not asked first (a replica in step reads,
        # a write is held: see skips_master) is sent nothing here: run answers it once the
        # other shards' replies are read, so the batches in flight wait for no hold.
        aside: list[Shard] = []
        for shard, commands in plan.items():
            state = shard.state
            if state.unreachable_since is not None and self.skips_master(not write, write):
                aside.append(shard)
                continue
            if not running or state.address is None or (write and state.fenced):
                waited = True
                try:
                    await self.ready(shard, write)
                except MASTER_ERRORS as exc:
                    if not self.fail_open.skip(shard, exc, operation):
                        raise
            sent_to.append((shard, commands, state.address, state.generation))
        if waited:
            sent_to = [(shard, commands, *shard.current()) for shard, commands, *_ in sent_to]
        replies: dict[Shard, list[Any] | None] = {}
        failed: dict[Shard, tuple[BaseException, Address | None, int]] = {}
        resend = aside
        in_flight: list[tuple[Shard, Any, Any, Sequence[Command], Address | None, int]] = []
        metrics = core.metrics
        # With metrics: each batch read (or not), and when; recorded once, for the whole call.
        batches: list[tuple[str, Sequence[Command], bool, float]] | None = None
        master = self.io.master
        try:
            for shard, commands, address, generation in sent_to:
                connections = (await master(shard)).connection_pool
                try:
                    connection = await connections.get_connection()
                except PoolExhaustedError:
                    raise
                except MASTER_ERRORS as exc:  # a refused connect: nothing sent
                    failed[shard] = (mark_unsent(exc), address, generation)
                    continue
                in_flight.append((shard, connections, connection, commands, address, generation))
            # Every batch packed before any is sent: one with a value over its master's limit
            # (pack raises ValueTooLargeError) leaves every shard unwritten.
            packed = [pack(connection, commands) for _, _, connection, commands, *_ in in_flight]
            for (shard, _, connection, _, address, generation), data in zip(
                in_flight, packed, strict=True
            ):
                try:
                    await connection.send_packed_command(data)
                except MASTER_ERRORS as exc:
                    failed[shard] = (exc, address, generation)
            if metrics is not None:
                batches = []
            for shard, _, connection, commands, address, generation in in_flight:
                if failed and shard in failed:
                    continue
                try:
                    if len(commands) == 1:  # the usual batch: one command per shard
                        replies[shard] = [await connection.read_response()]
                    else:
                        replies[shard] = [await connection.read_response() for _ in commands]
                except MASTER_ERRORS as exc:
                    failed[shard] = (exc, address, generation)
                except ResponseError:
                    resend.append(shard)
                if batches is not None:
                    ok = shard in replies
                    batches.append((shard.name, commands, ok, perf_counter() - started))
        finally:
            for shard, connections, connection, *_ in in_flight:
                if shard not in replies:  # replies left unread: the socket is out of step
                    await connection.disconnect()
                await connections.release(connection)
            if batches:
                metrics.batches(batches)  # type: ignore[union-attr]
        for shard, (error, address, generation) in failed.items():
            again = may_resend(error, idempotent)
            if again and closed_by_node(error):  # the single-shard path: on a new connection
                resend.append(shard)
                continue
            read = None if write else functools.partial(send, commands=plan[shard])
            try:
                served, reply = await self._recover(
                    shard, error, address, generation, read, idempotent=again
                )
            except MASTER_ERRORS as exc:
                if not self.fail_open.skip(shard, exc, operation):
                    raise
                replies[shard] = None
            else:
                if served:
                    replies[shard] = reply
                else:
                    resend.append(shard)
        for shard in resend:
            replies[shard] = await self._shard_or_none(
                shard, plan[shard], write, operation, idempotent
            )
        return replies

    async def _shard_or_none(
        self,
        shard: Shard,
        commands: Sequence[Command],
        write: bool,
        operation: str,
        idempotent: bool = True,
    ) -> list[Any] | None:
        """One shard's part of a scatter: its replies, or None if IGNORE_EXCEPTIONS skips it.
        With a near cache, on the master: the copies a read makes must be the master's (the node
        tracked), never a replica's in the read rotation."""
        try:
            replicas = self.core.near is None
            return await self.execute(
                shard, commands, write=write, idempotent=idempotent, replicas=replicas
            )
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
        outage: bool = True,
        keep: tuple[bytes, float | None] | None = None,
    ) -> tuple[list[Any], int]:
        """The one way a single-key operation runs: ``commands`` on the key's shard, with the
        rules its ``access`` calls for (:class:`~sentinel_cache.core.ops.plans.Access`). The
        replies, and how many copies its previous owner deleted (a ``delete`` while resharding).
        With IGNORE_EXCEPTIONS an unavailable shard answers ``absent``: the replies as if the
        key did not exist (the one fail-open rule). ``replicas``, ``outage``: which replicas
        may answer a read (see :meth:`run`).

        ``keep``: the stored data and timeout of a write the near cache may keep. It goes on
        the shard's writer connection when that is free (the server does not echo it to us),
        and is kept if nothing read or wrote the key meanwhile
        (:meth:`~sentinel_cache.core.topology.near.NearCache.own`); any other write evicts the
        key. (One method, not two: every operation's hot path.)

        With ``ASYNC_MULTIPLEX`` and nothing of the above to do, the call goes on the shard's
        shared connection from here (:meth:`started`), one coroutine for the whole round trip
        (``get`` and ``set`` do the same themselves); :meth:`resumed` takes over if it fails."""
        call = None
        if self.mux_link is not None:
            call = self.started(key, commands, access.write, replicas)
        if call is not None:
            link = call.link
            try:
                if link.paused:
                    await link.drained()
                return link.finish(await call.waiter), 0
            except MASTER_ERRORS as exc:
                failed = exc
            replies = await self.resumed(
                link,
                commands,
                absent,
                failed,
                write=access.write,
                idempotent=idempotent,
                outage=outage,
            )
            return replies, 0
        core = self.core
        write = access.write
        resharding = core.previous_ring is not None
        dropped = 0
        if resharding:
            if access.move:
                await self._move([key])
            if access.delete:  # first: see plans.DELETE_MARKED
                dropped = await self._drop_previous([key])
        shard = core.shard_for(key)
        near = core.near
        wait = self.durable_wait if write else None
        if wait is not None:  # DURABLE_REPLICAS: every write waits for its replicas
            commands = [*commands, wait]
            absent = [*absent, self.durable_replicas]
        writer = ticket = None
        if keep is not None and near is not None and not resharding:
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
                outage=outage,
                client=writer,
            )
            kept = ticket is not None and is_ok(replies[0])
        except MASTER_ERRORS as exc:
            if not self.fail_open.skip(shard, exc, commands[0][0]):
                raise
            replies = absent
        finally:
            if writer is not None:
                writer.done()
            if kept:
                near.own(shard, key, ticket, *keep)  # type: ignore[union-attr, misc]
            elif write and near is not None:
                self.forget([key])
            if resharding and access.replace:
                await self._drop_previous([key])
        if wait is not None:
            self.check_durable(shard, short_key(key), replies.pop())
        return replies, dropped

    def started(self, key: Any, commands: list[Command], write: bool, replicas: bool = True) -> Any:
        """A single-key call begun on its shard's shared connection (``ASYNC_MULTIPLEX``) when
        :meth:`keyed` has nothing to do around it (no near cache, no resharding, no
        ``DURABLE_REPLICAS`` wait for a write) and :meth:`run` nothing before it
        (:meth:`direct`): the queued :class:`~sentinel_cache.core.ops.async_mux.MuxCall`, whose
        caller awaits its ``waiter``, then ``link.finish`` (or :meth:`resumed` on a failure).
        None otherwise, or if the connection is closing (nothing queued): keyed's own path."""
        if not (self.may_start_write if write else self.may_start_read):
            return None
        shard = self.core.shard_for(key)
        state = shard.state
        link = self.direct(shard, write, replicas, state)
        if link is None:
            return None
        try:
            return link.start(commands, state.promotions)
        except MASTER_ERRORS:  # closing: nothing queued, keyed's path meets it again
            return None

    async def resumed(
        self,
        link: Any,
        commands: list[Command],
        absent: list[Any],
        error: BaseException,
        *,
        write: bool,
        idempotent: bool,
        outage: bool,
    ) -> list[Any]:
        """:meth:`keyed`'s direct round trip on ``link`` raised ``error``: :meth:`run`'s safety
        net from that failure on the master it was sent to (not from the start: the call is not
        sent a third time), then keyed's fail-open rule (``absent`` for a shard skipped)."""
        try:
            return await self.rerun(
                link, commands, error, write=write, idempotent=idempotent, outage=outage
            )
        except MASTER_ERRORS as exc:
            if not self.fail_open.skip(link.shard, exc, commands[0][0]):
                raise
            return absent

    async def rerun(
        self,
        link: Any,
        commands: Sequence[Command],
        error: BaseException,
        *,
        write: bool,
        idempotent: bool,
        outage: bool,
    ) -> list[Any]:
        """A direct round trip on ``link`` raised ``error``: :meth:`run`'s safety net from that
        failure on the master it was sent to, not from the start (the call is not sent a third
        time). What :meth:`execute` and :meth:`resumed` both do after a failed direct call."""
        roundtrip = self.roundtrip or send
        return await self.run(
            link.shard,
            lambda client: roundtrip(client, commands),
            write=write,
            idempotent=idempotent,
            outage=outage,
            failed=(error, link.address, link.generation),
        )

    async def planned(
        self,
        plan: Mapping[Shard, Sequence[Command]],
        keys: Iterable[Any],
        access: Access,
        operation: str,
        *,
        idempotent: bool = True,
    ) -> tuple[dict[Shard, list[Any] | None], int]:
        """The one way a multi-key operation runs: its plan on every shard at once
        (:meth:`scatter`) with the rules its ``access`` calls for on ``keys``, as
        :meth:`keyed`."""
        core = self.core
        resharding = core.previous_ring is not None
        dropped = 0
        if resharding:
            keys = list(keys)
            if access.move:
                await self._move(keys)
            if access.delete:  # first: see plans.DELETE_MARKED
                dropped = await self._drop_previous(keys)
        durable = access.write and self.durable_wait is not None  # DURABLE_REPLICAS: as in keyed
        if durable:
            plan = self.durable_plan(plan)
        try:
            replies = await self.scatter(
                plan, write=access.write, operation=operation, idempotent=idempotent
            )
            if durable:
                self.durable_checked(replies)
        finally:
            if access.write and core.near is not None:
                self.forget(keys)
            if resharding and access.replace:
                await self._drop_previous(keys)
        return replies, dropped

    async def learn(self, shards: Iterable[Shard], feature: str) -> None:
        """Ask the masters not asked yet whether they allow ``feature`` (see
        :data:`~sentinel_cache.core.topology.shard.FEATURES`): once per master, so not batched.
        A master that has it but refuses it to our user (``NOPERM``) is logged, once per master:
        a server without it is no misconfiguration, an ACL that forbids it may be."""
        for shard in shards:
            if shard.allows(feature) is None:
                await self._ask(shard, feature, quiet=False)

    async def relearn(self, shards: Iterable[Shard], feature: str, error: ResponseError) -> bool:
        """After ``error`` from a batch that used ``feature`` on ``shards``: ask their masters
        again, since an ACL change (``-msetex``) or a restart as an older server takes it away
        within a generation, and what was learned would otherwise fail every call until the next
        switch. True if one of them no longer allows it (each logged), so the caller may resend
        with what they allow now; False if all still do (the error was about something else)."""
        if not (isinstance(error, NoPermissionError) or unknown_command(error)):
            return False
        changed = False
        for shard in shards:
            was = shard.allows(feature)  # None: a new master since, asked as any new one
            if not await self._ask(shard, feature, quiet=was is True):
                changed = True  # denied now, or unknown (its error raised by the resend)
                if was is True and shard.allows(feature) is False:
                    logger.warning(
                        "shard %s: the master at %s no longer allows %s (%s: %s): %s",
                        shard.label,
                        shard.address,
                        feature,
                        type(error).__name__,
                        error,
                        FEATURES[feature].without,
                    )
        return changed

    async def _ask(self, shard: Shard, feature: str, *, quiet: bool) -> bool:
        """Probe ``shard``'s master for ``feature`` and record the answer; True if allowed.
        A ``NOPERM`` is logged unless ``quiet``; a master unreachable records nothing."""
        probe, allowed, without = FEATURES[feature]
        try:
            (reply,) = await self.execute(shard, [probe], write=False, replicas=False, outage=False)
        except NoPermissionError:
            if not quiet:
                logger.info(
                    "shard %s: the master at %s refuses %s to this user (NOPERM): %s",
                    shard.label,
                    shard.address,
                    feature,
                    without,
                )
            reply = None
        except ResponseError:  # absent, renamed away, or refused for another reason
            reply = None
        except MASTER_ERRORS:  # unknown still: the operation that follows meets the error
            return False
        # A reply is read only from the shard's master of the moment (a replaced one's is
        # refused), so it is about the generation current now.
        found = allowed(reply)
        shard.learned(feature, shard.generation, found)
        return found


async def send(client: Any, commands: Sequence[Command]) -> list[Any]:
    """One round trip on a connection borrowed from ``client``'s pool: every command sent,
    every reply read.

    An error reply is raised after the replies that follow it were read (the connection stays
    in step); a connection failure (or a cancelled task) drops the socket before it goes back.
    A failure to get a connection is noted as sent nothing
    (:func:`~sentinel_cache.core.topology.lean_rules.mark_unsent`).
    ``READONLY`` counts as a connection failure: the node is no master.
    """
    connections = client.connection_pool
    try:
        connection = await connections.get_connection()
    except PoolExhaustedError:
        raise
    except MASTER_ERRORS as exc:  # the connect or the checkout's check: nothing sent
        mark_unsent(exc)
        raise
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
