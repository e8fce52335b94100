"""Resharding (issue 22): a delete is final while PREVIOUS_MASTERS is set. A read (or the
migration) that found the previous owner's copy before a delete removed it must not copy it back
onto the owner after the delete: forced at each step, and under contention. Real servers."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from waiting import wait_until

from sentinel_cache.core.admin import reshard
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

BEFORE, AFTER = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]  # a master appended
KEYS = [f"tomb:{n}" for n in range(3000)]


def core_for(
    cluster: LocalSentinelCluster, masters: list[str], **options: Any
) -> ShardedSentinelPool:
    return ShardedSentinelPool(masters, cluster.sentinel_addresses, listeners=False, **options)


def resharding(cluster: LocalSentinelCluster) -> ShardedSentinelPool:
    """Every key written under BEFORE on a flushed topology; a core with AFTER and BEFORE as its
    previous placement."""
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            node.flushall()
    with core_for(cluster, BEFORE) as before:
        CacheClient(before, Codec()).set_many({key: f"v{key}" for key in KEYS}, 600)
    return core_for(cluster, AFTER, previous_masters=BEFORE)


def moving(core: ShardedSentinelPool) -> list[str]:
    return [key for key in KEYS if core.previous_shard_for(key) is not None]


def on_any_node(cluster: LocalSentinelCluster, keys: list[str]) -> list[str]:
    """The keys some master still holds."""
    found = []
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            found += [key for key, there in zip(keys, node.mget(keys), strict=True) if there]
    return found


def copies_run(cluster: LocalSentinelCluster, name: str) -> int:
    """Scripts and SETs the master ``name`` ran so far (a read's copy is one or the other)."""
    with cluster.node_client(cluster.master_address(name)) as node:
        stats = node.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("eval", "set"))


DELETES: dict[str, Callable[[Any, str], Any]] = {
    "delete": lambda client, key: client.delete(key),
    "delete_many": lambda client, key: client.delete_many([key]),
}
# Every other operation that removes a key, for the forced races.
FORCED: dict[str, Callable[[Any, str], Any]] = {
    **DELETES,
    "remove_many": lambda client, key: client.remove_many([key], unlink=True)[key],
    "set-timeout-0": lambda client, key: client.set(key, "gone", 0),
    "touch-timeout-0": lambda client, key: client.touch(key, -1),
    "delete_pattern": lambda client, key: client.delete_pattern(key),
    "clear-pattern": lambda client, key: client.clear("tomb:*"),
    "clear": lambda client, key: client.clear(None),
}


# -- forced: the delete lands between the read's steps ------------------------------------------


@pytest.mark.parametrize("how", list(FORCED))
def test_a_delete_between_a_read_and_its_copy_is_final(
    three: LocalSentinelCluster, how: str
) -> None:
    """The read has found the old copy on the previous owner and the owner empty; the whole
    delete runs before the read's copy goes out: the key stays deleted."""
    core = resharding(three)
    try:
        reader, deleter = CacheClient(core, Codec()), CacheClient(core, Codec())
        key = moving(core)[0]
        owner = core.shard_for(key).name
        real_post = reader.post
        ran: dict[str, int] = {}

        def delete_then_post(plan: Any) -> None:
            ran["deleted"] = int(bool(FORCED[how](deleter, key)))
            ran["before"] = copies_run(three, owner)
            real_post(plan)

        reader.post = delete_then_post  # type: ignore[method-assign]
        assert reader.get(key) == f"v{key}"  # what it found: the delete had not happened yet
        assert ran["deleted"] == 1
        wait_until(lambda: copies_run(three, owner) > ran["before"], 5, "the copy ran")
        assert on_any_node(three, [key]) == []
        assert CacheClient(core, Codec()).get(key) is None
    finally:
        core.close()


@pytest.mark.parametrize("how", list(FORCED))
def test_a_delete_between_the_reads_of_both_owners_is_final(
    three: LocalSentinelCluster, how: str
) -> None:
    """The read's two halves pulled apart: the previous owner read first, then the whole
    delete, then the owner read (empty now): the copy the read then sends is refused."""
    core = resharding(three)
    try:
        reader, deleter = CacheClient(core, Codec()), CacheClient(core, Codec())
        key = moving(core)[1]
        owner = core.shard_for(key)
        real_scatter = reader.scatter
        ran: dict[str, int] = {}

        def previous_first(plan: Any, **kwargs: Any) -> Any:
            if owner not in plan or len(plan) == 1:
                return real_scatter(plan, **kwargs)
            rest = {shard: commands for shard, commands in plan.items() if shard is not owner}
            replies = real_scatter(rest, **kwargs)
            ran["deleted"] = int(bool(FORCED[how](deleter, key)))
            ran["before"] = copies_run(three, owner.name)
            replies.update(real_scatter({owner: plan[owner]}, **kwargs))
            return replies

        reader.scatter = previous_first  # type: ignore[method-assign]
        assert reader.get(key) == f"v{key}"
        assert ran["deleted"] == 1
        wait_until(lambda: copies_run(three, owner.name) > ran["before"], 5, "the copy ran")
        assert on_any_node(three, [key]) == []
        assert CacheClient(core, Codec()).get(key) is None
    finally:
        core.close()


@pytest.mark.parametrize("how", ["delete", "delete_many"])
def test_async_a_delete_between_a_read_and_its_copy_is_final(
    three: LocalSentinelCluster, how: str
) -> None:
    core = resharding(three)
    key = moving(core)[2]
    owner = core.shard_for(key).name
    ran: dict[str, int] = {}

    async def go() -> Any:
        reader, deleter = AsyncCacheClient(core, Codec()), AsyncCacheClient(core, Codec())
        real_post = reader.post

        async def delete_then_post(plan: Any) -> None:
            ran["deleted"] = int(
                bool(await getattr(deleter, how)(key if how == "delete" else [key]))
            )
            ran["before"] = copies_run(three, owner)
            await real_post(plan)

        reader.post = delete_then_post  # type: ignore[method-assign]
        try:
            return await reader.get(key)
        finally:
            await reader.aclose()
            await deleter.aclose()

    try:
        assert asyncio.run(go()) == f"v{key}"
        assert ran["deleted"] == 1
        wait_until(lambda: copies_run(three, owner) > ran["before"], 5, "the copy ran")
        assert on_any_node(three, [key]) == []
        assert CacheClient(core, Codec()).get(key) is None
    finally:
        core.close()


def test_get_many_and_ttl_copies_refused_after_a_delete(three: LocalSentinelCluster) -> None:
    """The multi-key read (posted copies) and an acknowledged move (ttl moves the key, DUMP and
    RESTORE, before answering) with the delete forced between their read and their copy."""
    core = resharding(three)
    try:
        reader, deleter = CacheClient(core, Codec()), CacheClient(core, Codec())
        keys = moving(core)[3:8]
        real_restore = reader._restore

        def delete_then_restore(copies: Any, *args: Any, **kwargs: Any) -> Any:
            assert deleter.delete_many(list(copies)) == len(copies)
            return real_restore(copies, *args, **kwargs)

        reader._restore = delete_then_restore  # type: ignore[method-assign]
        assert reader.get_many(keys[:4]) == {key: f"v{key}" for key in keys[:4]}
        real_plan = reader.restore_plan

        def delete_then_plan(groups: Any, *args: Any) -> Any:  # after the DUMP, before RESTORE
            moved = [key for group in groups.values() for key in group]
            assert deleter.delete_many(moved) == len(moved)
            return real_plan(groups, *args)

        reader.restore_plan = delete_then_plan  # type: ignore[method-assign]
        assert reader.ttl(keys[4]) == 0  # acknowledged: refused, so absent where it lives
        fresh = CacheClient(core, Codec())
        wait_until(lambda: on_any_node(three, keys) == [], 5, "no copy anywhere")
        assert fresh.get_many(keys) == {}
    finally:
        core.close()


def test_the_migration_does_not_restore_a_key_deleted_after_its_dump(
    three: LocalSentinelCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = resharding(three)
    deleter = CacheClient(core, Codec())
    real_restore = reshard.Migration._restore
    deleted: list[str] = []

    def delete_then_restore(self: Any, tally: Any, restores: Any, *rest: Any) -> None:
        for items in restores.values():
            keys = [key.decode() for key, _, _ in items][:5]
            if keys:
                assert deleter.delete_many(keys) == len(keys)
                deleted.extend(keys)
        real_restore(self, tally, restores, *rest)

    monkeypatch.setattr(reshard.Migration, "_restore", delete_then_restore)
    try:
        report = reshard.migrate(core, batch=100)
        assert report.complete and deleted
        assert report.expired == len(deleted)  # counted as gone before the move
        assert on_any_node(three, deleted) == []
        assert CacheClient(core, Codec()).get_many(deleted) == {}
    finally:
        core.close()


def test_writes_after_a_delete_win_and_tombstones_are_no_values(
    three: LocalSentinelCluster,
) -> None:
    core = resharding(three)
    try:
        client = CacheClient(core, Codec())
        a, b, c, d = moving(core)[8:12]
        assert client.delete_many([a, b, c, d]) == 4
        assert client.add(a, "added", 600) is True
        assert client.set(b, "set", 600) is True
        assert client.get_many([a, b, c]) == {a: "added", b: "set"}
        assert client.has_key(c) is False and client.ttl(c) == 0
        with pytest.raises(ValueError):
            client.incr(d)
        assert client.delete(a) is True and client.get(a) is None
    finally:
        core.close()


# -- under contention ----------------------------------------------------------------------------


@pytest.mark.parametrize("how", list(DELETES))
def test_deletes_racing_readers_and_the_migration_stay_deleted(
    three: LocalSentinelCluster, how: str
) -> None:
    """1,000 moving keys deleted one by one while two readers read the keys being deleted
    and the migration runs: afterwards none of them is readable, or on any node."""
    core = resharding(three)
    victims = moving(core)[:1000]
    assert len(victims) == 1000
    at = [0]  # the deleter's position
    done = threading.Event()
    outcomes: dict[str, Any] = {}

    def read(name: str, seed: int) -> None:
        client, rng, reads = CacheClient(core, Codec()), random.Random(seed), 0
        try:
            while not done.is_set():
                i = at[0] + rng.randrange(0, 3)
                client.get(victims[min(i, len(victims) - 1)])
                reads += 1
            outcomes[name] = reads
        except BaseException as exc:
            outcomes[name] = exc

    def migrate() -> None:
        try:
            runs = 0
            while not done.is_set():
                reshard.migrate(core, batch=50, delete_delay=0.0)
                runs += 1
            outcomes["migrate"] = runs
        except BaseException as exc:
            outcomes["migrate"] = exc

    workers = [threading.Thread(target=read, args=(f"reader{n}", n)) for n in range(2)]
    workers.append(threading.Thread(target=migrate))
    try:
        for worker in workers:
            worker.start()
        deleter = CacheClient(core, Codec())
        for i, key in enumerate(victims):
            at[0] = i
            DELETES[how](deleter, key)
        done.set()
        for worker in workers:
            worker.join(120)
        assert not any(worker.is_alive() for worker in workers)
        assert all(isinstance(outcomes[name], int) and outcomes[name] > 0 for name in outcomes), (
            outcomes
        )
        fresh = CacheClient(core, Codec())
        back = fresh.get_many(victims)
        print(f"{how}: {len(back)} of {len(victims)} deleted keys readable; {outcomes}")
        assert back == {}
        assert on_any_node(three, victims) == []
    finally:
        done.set()
        core.close()
