"""Resharding's moves, written once: the asyncio source of both runners' part that moves keys.

``_sync/moves.py`` is generated from this file by ``scripts/unasync.py``. While
``PREVIOUS_MASTERS`` is set, a key not moved yet is still on its previous owner: a read adopts
what it finds there (:meth:`AsyncMoves.adopt_many`, posted copies), an operation that acts on
the key where it lives now moves it first (``_move``: ``DUMP``/``RESTORE``, acknowledged), and
the previous owner's copy is deleted after a write or before a delete (``_drop_previous``).
A read that finds a key on neither its owner nor its previous owner reads the owner again
before it reports a miss (:meth:`AsyncMoves._on_owners` states the rule).
Which operation needs which is its :class:`~sentinel_cache.core.ops.plans.Access`, applied by the
runner's ``keyed`` and ``planned`` (:mod:`~sentinel_cache.core.ops._async.runner`, which builds
on this class and sends the moves' batches).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from time import perf_counter
from typing import Any

from sentinel_cache.core.ops.plans import MISS, ClientBase, Command, Groups, copy_deadline
from sentinel_cache.core.topology.shard import MASTER_ERRORS, Shard

#: What a scatter returns: each shard's replies, or None where IGNORE_EXCEPTIONS skipped it.
Replies = dict[Shard, list[Any] | None]


class AsyncMoves(ClientBase):
    """Moving keys from their previous owners to their owners, in batches per shard."""

    # The runner's (the subclass): every batch goes through its safety net.
    scatter: Callable[..., Awaitable[Replies]]
    learn: Callable[[Iterable[Shard], str], Awaitable[None]]
    post: Callable[[Mapping[Shard, Sequence[Command]]], Awaitable[None]]
    execute: Callable[..., Awaitable[Any]]

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
        adopted = await self.adopt_many(missing)
        gone = [key for keys in missing.values() for key in keys if key not in adopted]
        if gone:  # on neither: moved meanwhile? (see _on_owners)
            adopted.update(await self._on_owners(gone))
        for key, data in adopted.items():
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
        if key not in copies:  # on neither: moved meanwhile? (see _on_owners)
            return (await self._on_owners([key])).get(key)
        deadlines = {owner: copy_deadline(own[1], elapsed)}
        return (await self._restore(copies, deadlines)).get(key)

    async def _on_owners(self, keys: Sequence[Any]) -> dict[Any, Any]:
        """The rule of a read that missed keys on their owners and then on their previous
        owners: it reads the owners again, on their masters, before it reports a miss. An
        operation that moved a key between the two reads (``_move``: ``incr``, ``add``,
        ``touch``, ``ttl``, ...) restored it on the owner's master, acknowledged, before it
        deleted the previous copy, so that key is on the owner now. A miss stays a miss: a
        delete drops the previous copy first, then deletes on the owner (its tombstone after),
        an expired key is gone from both, and the migration deletes a previous copy only
        ``delete_delay`` after its restore. One more round trip per owner, only for keys
        missing on both while resharding. Key -> the stored data found."""
        groups, plan = self.mget_plan(keys)
        found: dict[Any, Any] = {}
        for shard, commands in plan.items():
            try:
                replies = await self.execute(shard, commands, write=False, replicas=False)
            except MASTER_ERRORS as exc:
                if not self.fail_open.skip(shard, exc, "get"):
                    raise
                continue
            found.update(self.raw_found({shard: groups[shard]}, {shard: replies}))
        return found

    async def adopt_many(self, groups: Mapping[Shard, Sequence[Any]]) -> dict[Any, Any]:
        """Move keys from their previous owners (``groups``: previous shard -> keys) to their
        owners, batched per shard: read value and TTL, then write them where the owner has no
        newer value (:meth:`_restore`). Key -> the stored data now on its owner. The previous
        owner keeps its copy until the migration (or a write through the new placement) deletes
        it, so concurrent readers of the same key never find it gone from both (an operation
        that moves the key deletes it: :meth:`_on_owners`)."""
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
        written = await self._written(plan) if plan else {}
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
            await self._written(restores)
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
        replies = await self._written(plan)
        return sum(int(r[0]) for r in replies.values() if r is not None)

    async def _written(self, plan: Mapping[Shard, Sequence[Command]]) -> Replies:
        """A batch of resharding's writes on the masters, each shard's followed by the WAIT of
        DURABLE_REPLICAS (a shortfall logged, as the runner's): a copy restored on its owner is
        on the owner's replicas before the previous owner's copy is deleted, and that delete is
        on the previous owner's replicas before the operation goes on."""
        replies = await self.scatter(self.durable_plan(plan), write=True, operation="reshard")
        self.durable_checked(replies)
        return replies
