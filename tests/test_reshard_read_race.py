"""Resharding (issue 35): a read never misses a key that was present throughout while
PREVIOUS_MASTERS is set. A read of a key not moved yet asks its owner and its previous owner
(``get``: in one round trip; ``get_many``: the owners first, then the previous owners); an
operation that moves the key (``touch``, ``incr``, ``expire``, ``add``, ``ttl``: ``DUMP``,
``RESTORE`` on the owner, then the previous copy deleted) can land between the two reads, so
the read finds the key on neither. It then reads the owner again before it reports a miss.

Forced: the move (or a delete, which must stay a miss) run between the read's two halves.
Under contention: processes of reading threads and moving threads on keys not moved yet, rounds
signalled through a list on one master; every read of a key present before and after counted.
Real servers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

BEFORE, AFTER = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]  # a master appended
KEYS = [f"race:{n}" for n in range(2000)]
VALUE = 1000  # every key a counter: incr works on it, and every value is present (not None)


def core_for(masters: list[str], sentinels: list[str], **options: Any) -> ShardedSentinelPool:
    return ShardedSentinelPool(masters, sentinels, listeners=False, **options)


def place(cluster: LocalSentinelCluster) -> None:
    """Every key written under BEFORE only (database 0 of every master flushed first)."""
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            node.flushdb()
    with core_for(BEFORE, cluster.sentinel_addresses) as before:
        CacheClient(before, Codec()).set_many(dict.fromkeys(KEYS, VALUE), 600)


def resharding(cluster: LocalSentinelCluster) -> ShardedSentinelPool:
    place(cluster)
    return core_for(AFTER, cluster.sentinel_addresses, previous_masters=BEFORE)


def moving(core: ShardedSentinelPool) -> list[str]:
    return [key for key in KEYS if core.previous_shard_for(key) is not None]


def on_any_node(cluster: LocalSentinelCluster, keys: list[str]) -> list[str]:
    found = []
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            found += [key for key, there in zip(keys, node.mget(keys), strict=True) if there]
    return found


#: The operations that move a key first (plans.Access ``move``); each keeps the key present.
MOVES: dict[str, Callable[[Any, str], Any]] = {
    "touch": lambda client, key: client.touch(key, 600),
    "incr": lambda client, key: client.incr(key, 1),
    "expire": lambda client, key: client.expire(key, 600),
    "add": lambda client, key: client.add(key, -1, 600),  # refused (present), moved first
    "ttl": lambda client, key: client.ttl(key),
}


def owner_first(reader: Any, key: str, between: Callable[[], Any]) -> dict[str, int]:
    """``reader.scatter`` split for the read of ``key``: its owner's part sent alone, then
    ``between()``, then the rest (its previous owner's part). Returns a dict counting the
    splits."""
    owner = reader.core.shard_for(key)
    real = reader.scatter
    ran = {"split": 0}

    def split(plan: Any, **kwargs: Any) -> Any:
        if owner not in plan or len(plan) == 1 or ran["split"]:
            return real(plan, **kwargs)
        ran["split"] += 1
        replies = real({owner: plan[owner]}, **kwargs)
        between()
        replies.update(real({s: c for s, c in plan.items() if s is not owner}, **kwargs))
        return replies

    reader.scatter = split
    return ran


@pytest.mark.parametrize("how", list(MOVES))
def test_a_move_between_the_reads_of_both_owners_is_no_miss(
    three: LocalSentinelCluster, how: str
) -> None:
    """``get``: the owner read (empty), then the whole move, then the previous owner read
    (gone): the key is still found, on the owner."""
    core = resharding(three)
    try:
        reader, mover = CacheClient(core, Codec()), CacheClient(core, Codec())
        key = moving(core)[0]
        ran = owner_first(reader, key, lambda: MOVES[how](mover, key))
        got = reader.get(key)
        assert ran["split"] == 1
        assert got in (VALUE, VALUE + 1), f"{how}: the read returned {got!r}"
        assert on_any_node(three, [key]) == [key]  # on the owner only
    finally:
        core.close()


def test_a_delete_between_the_reads_of_both_owners_stays_a_miss(
    three: LocalSentinelCluster,
) -> None:
    """The same split with a delete instead of a move: the read's second look at the owner
    finds nothing, and the key is gone everywhere."""
    core = resharding(three)
    try:
        reader, deleter = CacheClient(core, Codec()), CacheClient(core, Codec())
        key = moving(core)[1]
        ran = owner_first(reader, key, lambda: deleter.delete(key))
        assert reader.get(key, "missed") == "missed"
        assert ran["split"] == 1
        assert on_any_node(three, [key]) == []
    finally:
        core.close()


@pytest.mark.parametrize("how", ["touch", "incr"])
def test_get_many_a_move_between_the_owners_and_previous_owners_reads_is_no_miss(
    three: LocalSentinelCluster, how: str
) -> None:
    """``get_many``: its owners read (the keys missing), then the keys moved, then its previous
    owners read (gone): every key is still found; deleted ones instead stay misses."""
    core = resharding(three)
    try:
        reader, other = CacheClient(core, Codec()), CacheClient(core, Codec())
        keys = moving(core)[2:12]
        moved, deleted = keys[:6], keys[6:]
        real = reader.adopt_many

        def move_then_adopt(groups: Any) -> Any:
            for key in moved:
                MOVES[how](other, key)
            assert other.delete_many(deleted) == len(deleted)
            return real(groups)

        reader.adopt_many = move_then_adopt  # type: ignore[method-assign]
        got = reader.get_many(keys)
        assert sorted(got) == sorted(moved), f"found {sorted(got)}"
        assert on_any_node(three, deleted) == []
    finally:
        core.close()


def test_async_a_move_between_the_reads_of_both_owners_is_no_miss(
    three: LocalSentinelCluster,
) -> None:
    core = resharding(three)
    key = moving(core)[12]
    owner = core.shard_for(key)
    mover = CacheClient(core, Codec())
    ran = {"split": 0}

    async def go() -> Any:
        reader = AsyncCacheClient(core, Codec())
        real = reader.scatter

        async def split(plan: Any, **kwargs: Any) -> Any:
            if owner not in plan or len(plan) == 1 or ran["split"]:
                return await real(plan, **kwargs)
            ran["split"] += 1
            replies = await real({owner: plan[owner]}, **kwargs)
            mover.touch(key, 600)
            replies.update(await real({s: c for s, c in plan.items() if s is not owner}, **kwargs))
            return replies

        reader.scatter = split  # type: ignore[method-assign]
        try:
            return await reader.get(key)
        finally:
            await reader.aclose()

    try:
        assert asyncio.run(go()) == VALUE
        assert ran["split"] == 1
    finally:
        core.close()


def counted(client: Any) -> dict[str, int]:
    """Round trips ``client`` makes from now on: its top-level ``scatter`` and ``execute``
    calls (one round trip each; those a scatter makes inside are its own)."""
    calls = {"trips": 0, "depth": 0}
    for name in ("scatter", "execute"):
        real = getattr(client, name)

        def wrapped(*args: Any, real: Any = real, **kwargs: Any) -> Any:
            calls["trips"] += calls["depth"] == 0
            calls["depth"] += 1
            try:
                return real(*args, **kwargs)
            finally:
                calls["depth"] -= 1

        setattr(client, name, wrapped)
    return calls


def test_the_second_look_costs_one_round_trip_only_for_a_miss_on_both(
    three: LocalSentinelCluster,
) -> None:
    """A read of a key on neither owner costs one round trip more (per owner); a read that
    finds the key (on its owner, or on its previous owner) and a miss of a key that does not
    move cost what they did."""
    core = resharding(three)
    try:
        reader = CacheClient(core, Codec())
        reader.get(moving(core)[21])  # the owner asked once whether it takes CLIENT REPLY
        calls = counted(reader)
        absent = [
            key for key in (f"absent:{n}" for n in range(200)) if core.previous_shard_for(key)
        ]
        still = [
            key for key in (f"absent:{n}" for n in range(200)) if not core.previous_shard_for(key)
        ]
        owners = {core.shard_for(key).name for key in absent[:10]}
        trips: dict[str, int] = {}
        for what, read in {
            "get, on neither": lambda: reader.get(absent[0]),
            "get_many of 10, on neither": lambda: reader.get_many(absent[:10]),
            "get, not moved yet": lambda: reader.get(moving(core)[20]),
            "get, moved": lambda: reader.get(moving(core)[20]),
            "get, a key that does not move, absent": lambda: reader.get(still[0]),
        }.items():
            calls["trips"] = 0
            read()
            trips[what] = calls["trips"]
        print(f"\nround trips: {trips} (owners of the 10: {sorted(owners)})")
        assert trips == {
            "get, on neither": 2,  # owner + previous owner at once, then the owner again
            "get_many of 10, on neither": 2 + len(owners),  # owners, previous owners, owners
            "get, not moved yet": 1,  # its copy posted: no round trip
            "get, moved": 1,
            "get, a key that does not move, absent": 1,
        }
    finally:
        core.close()


# -- under contention: no split forced -------------------------------------------------------

ROUNDS = 4
PROCESSES, READERS, MOVERS = 2, 4, 2  # reading processes; reading and moving threads in each
JOIN_S = 180  # a round takes a few seconds on an idle machine
GO, DONE = "readrace:go", "readrace:done"  # lists in database 1 of shard0's master


def _round(sentinels: list[str], keys: list[str], many: bool) -> dict[str, int]:
    """One round in this process: READERS threads read every key (``get``, or ``get_many`` in
    batches of 10), MOVERS threads ``touch`` their share of them (moving each), all started
    at once. Reads that returned no value, and reads done."""
    core = core_for(AFTER, sentinels, previous_masters=BEFORE)
    counts = {"misses": 0, "reads": 0}
    lock = threading.Lock()
    start = threading.Barrier(READERS + MOVERS)
    errors: list[BaseException] = []

    def read() -> None:
        client = CacheClient(core, Codec())
        start.wait(timeout=JOIN_S)
        missed = 0
        if many:
            for i in range(0, len(keys), 10):
                got = client.get_many(keys[i : i + 10])
                missed += sum(1 for key in keys[i : i + 10] if key not in got)
        else:
            missed = sum(1 for key in keys if client.get(key) is None)
        with lock:
            counts["misses"] += missed
            counts["reads"] += len(keys)

    def move(share: list[str]) -> None:
        client = CacheClient(core, Codec())
        start.wait(timeout=JOIN_S)
        for key in share:
            client.touch(key, 600)

    def recorded(target: Callable[..., None], *args: Any) -> Callable[[], None]:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # raised below, after every thread is joined
                with lock:
                    errors.append(exc)
                start.abort()

        return run

    threads = [threading.Thread(target=recorded(read)) for _ in range(READERS)]
    threads += [threading.Thread(target=recorded(move, keys[m::MOVERS])) for m in range(MOVERS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_S)
        if any(thread.is_alive() for thread in threads):
            raise AssertionError("a thread of the round did not finish")
        if errors:
            raise errors[0]
    finally:
        core.close()
    return counts


def _process(params: dict[str, Any]) -> None:
    """A process of the contention test (``python tests/test_reshard_read_race.py <json>``):
    one :func:`_round` per ``GO`` message, its counts pushed to ``DONE``, until ``stop``."""
    signals = redis.Redis(*params["signals"], db=1)
    while True:
        popped = signals.blpop([GO], timeout=JOIN_S)
        if popped is None or popped[1] == b"stop":
            return
        try:
            outcome: dict[str, Any] = _round(
                params["sentinels"], params["keys"], popped[1] == b"get_many"
            )
        except Exception as exc:  # reported to the test, which fails naming it
            outcome = {"error": f"{type(exc).__name__}: {exc}"}
        signals.rpush(DONE, json.dumps(outcome))


@pytest.mark.parametrize("many", [False, True], ids=["get", "get_many"])
def test_reads_racing_moves_never_miss_a_present_key(
    three: LocalSentinelCluster, many: bool
) -> None:
    """PROCESSES processes of READERS reading and MOVERS touching threads, ROUNDS rounds, on
    keys not moved yet: every key is present before and after each round (checked), and no
    read misses one."""
    address = three.master_address("shard0")
    core = resharding(three)
    keys = moving(core)
    core.close()
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    params = {"signals": list(address), "sentinels": three.sentinel_addresses, "keys": keys}
    signals = redis.Redis(*address, db=1)
    signals.delete(GO, DONE)
    processes = [
        subprocess.Popen([sys.executable, __file__, json.dumps(params)], env=env)
        for _ in range(PROCESSES)
    ]
    misses = reads = 0
    try:
        for round_ in range(ROUNDS):
            place(three)
            signals.rpush(GO, *["get_many" if many else "get"] * PROCESSES)
            for _ in range(PROCESSES):
                popped = signals.blpop([DONE], timeout=JOIN_S)
                assert popped is not None, f"round {round_}: a process did not report"
                outcome = json.loads(popped[1])
                assert "error" not in outcome, outcome["error"]
                misses += outcome["misses"]
                reads += outcome["reads"]
            with core_for(AFTER, three.sentinel_addresses, previous_masters=BEFORE) as after:
                got = CacheClient(after, Codec()).get_many(keys)
            assert len(got) == len(keys), f"round {round_}: keys gone after the round"
        signals.rpush(GO, *["stop"] * PROCESSES)
        for process in processes:
            assert process.wait(timeout=JOIN_S) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        signals.close()
    print(f"\n{misses} misses of {reads} reads of present keys ({'get_many' if many else 'get'})")
    assert misses == 0


if __name__ == "__main__":  # a process of test_reads_racing_moves_never_miss_a_present_key
    _process(json.loads(sys.argv[1]))
