"""The near cache (issue 13) on real servers: invalidations from any writer, read-your-writes,
the in-flight race, failovers (planned and SIGKILL), a lost tracker, server flushes, bounds,
fork and asyncio."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from threads import Workers
from waiting import key_on, wait_until

from sentinel_cache import ConfigurationError
from sentinel_cache.core.config import PoolConfig
from sentinel_cache.core.ops._sync import runner
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.faults import CLIENT


def near_status(core: ShardedSentinelPool, key: str) -> dict[str, Any]:
    return core.status()["shards"][core.shard_index(key)]["near_cache"]


def tracked(core: ShardedSentinelPool) -> bool:
    return all(shard["near_cache"]["tracked"] for shard in core.status()["shards"])


def near_mode(core: ShardedSentinelPool) -> str:
    """The one mode every shard's session runs in ("push" or "redirect")."""
    (mode,) = {shard["near_cache"]["mode"] for shard in core.status()["shards"]}
    return str(mode)


def store(client: CacheClient, core: ShardedSentinelPool, key: str, value: Any) -> None:
    """Write ``key``, then read it until a copy is kept. An integer is stored as a number, not
    bytes, and such a write is not kept: it goes through the pool, and its echo could evict a
    copy read right after it, so that echo is waited for first."""
    before = near_status(core, key)["invalidations"]
    client.set(key, value, None)
    if not isinstance(Codec().dumps(value), bytes):
        echoed(core, key, before)
    cached(client, core, key)


def cached(client: CacheClient, core: ShardedSentinelPool, key: str) -> None:
    """Read ``key`` until its copy is kept (a sync write is kept at once; one that went
    through the pool, as asyncio writes do, is evicted by the server's echo of it first)."""
    wait_until(
        lambda: client.get(key) is not None and near_status(core, key)["entries"] >= 1,
        2,
        f"a local copy of {key}",
    )


def echoed(core: ShardedSentinelPool, key: str, before: int) -> None:
    """Wait for the server's invalidation of a write of ``key`` made outside the writer
    connection: until it has arrived, it may evict a copy read after the write."""
    wait_until(lambda: near_status(core, key)["invalidations"] > before, 2, f"the echo of {key}")


def fence(client: CacheClient, core: ShardedSentinelPool, index: int) -> None:
    """Wait until every invalidation shard ``index`` has sent so far has arrived: keep a copy of
    a fence key there, write it from outside and wait for its copy to go. The server sends the
    invalidations of one session in order, so the earlier ones came first. Adds exactly one
    invalidation to the shard's count."""
    key = key_on(core, index, "near:fence")
    store(client, core, key, "fence")
    before = near_status(core, key)["invalidations"]
    with outsider(core, key) as other:
        other.set(key, Codec().dumps("fenced"))
    # Applied, not only arrived: a hit is refused as soon as the invalidation is on the socket
    # (near_tracking.Arrivals), before the tracker counts it.
    echoed(core, key, before)


def outsider(core: ShardedSentinelPool, key: str) -> redis.Redis:
    """Another writer (a Java service, redis-cli): a plain client on the key's master."""
    address = core.shard_for(key).address
    assert address is not None
    db = core.config.connection_options().get("db", 0)
    return redis.Redis(host=address.host, port=address.port, db=db)


@pytest.fixture
def core(cluster: LocalSentinelCluster, near_push: bool) -> Iterator[ShardedSentinelPool]:
    made = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        near_cache_push=near_push,
        db=5,
    )
    CacheClient(made, Codec()).clear(None)
    wait_until(lambda: tracked(made), 5, "tracking")
    yield made
    made.close()


def served_locally(client: CacheClient, core: ShardedSentinelPool, key: str, value: Any) -> None:
    """Wait (5 s at most) until a read of ``key`` gives ``value`` from the near cache (its hit
    counted). A hit may be refused while anything is on the tracker's socket (a PONG, another
    key's invalidation: near_tracking.Arrivals), so a given read is not bound to be one; each
    read must give ``value`` all the same."""

    def hit() -> bool:
        before = near_status(core, key)["hits"]
        assert client.get(key) == value
        return bool(near_status(core, key)["hits"] == before + 1)

    wait_until(hit, 5, f"a near-cache hit of {key}")


def test_a_hit_is_served_locally_and_an_outside_write_evicts_it(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    store(client, core, "near:a", {"v": 1})

    served_locally(client, core, "near:a", {"v": 1})
    with outsider(core, "near:a") as other:
        other.set("near:a", Codec().dumps({"v": 2}))
    # The invalidation is on the socket before the outsider's reply: the next read asks the
    # server (near_tracking.Arrivals), however late the tracker applies it.
    assert client.get("near:a") == {"v": 2}
    # ... and the tracker counts the invalidation once it reads it, not necessarily by now.
    wait_until(lambda: near_status(core, "near:a")["invalidations"] >= 1, 5, "the invalidation")


def test_own_writes_are_read_back_at_once(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    for n in range(20):  # no waiting for the server's invalidation between write and read
        client.set("near:own", n, None)
        assert client.get("near:own") == n
        assert client.get("near:own") == n
    client.delete("near:own")
    assert client.get("near:own") is None
    client.set_many({"near:m1": 1, "near:m2": 2}, None)
    assert client.get_many(["near:m1", "near:m2"]) == {"near:m1": 1, "near:m2": 2}
    client.set_many({"near:m1": 10, "near:m2": 20}, None)
    assert client.get_many(["near:m1", "near:m2"]) == {"near:m1": 10, "near:m2": 20}
    assert client.incr("near:m1", 5) == 15
    assert client.get("near:m1") == 15
    client.delete_many(["near:m1"])
    assert client.get("near:m1") is None and client.has_key("near:m2")


def test_own_sync_writes_are_kept_without_an_echo(core: ShardedSentinelPool) -> None:
    """A sync write goes on the shard's writer connection, whose tracking has NOLOOP: the
    value is kept at once and the server sends no invalidation of it; another writer's write
    still evicts it. An asyncio write goes through the pool, and its echo evicts the key."""
    client = CacheClient(core, Codec())
    near = core.near
    assert near is not None
    shard = core.shard_for("near:kept")
    index = core.shard_index("near:kept")
    fence(client, core, index)  # nothing sent before the writes is counted below
    before = near_status(core, "near:kept")
    for n in range(5):
        client.set("near:kept", {"n": n}, None)
        data = Codec().dumps({"n": n})  # kept by the write itself (a hit may wait: see above)
        wait_until(lambda data=data: near.get("near:kept") == data, 5, f"write {n} kept")
    fence(client, core, index)  # an echo of the writes, were one sent, has arrived by now
    after = near_status(core, "near:kept")
    assert after["invalidations"] == before["invalidations"] + 1, "only the fence's"
    served_locally(client, core, "near:kept", {"n": 4})
    with outsider(core, "near:kept") as other:
        other.set("near:kept", Codec().dumps("outside"))
    wait_until(lambda: near.get("near:kept") is None, 1, "the outside write's invalidation")
    assert client.get("near:kept") == "outside"

    async def write_async() -> None:
        aclient = AsyncCacheClient(core, Codec())
        await aclient.set("near:kept", "async", None)
        await aclient.aclose()

    before = near_status(core, "near:kept")
    asyncio.run(write_async())
    echoed(core, "near:kept", before["invalidations"])  # written through the pool: echoed
    assert client.get("near:kept") == "async"
    assert shard.allows("CLIENT REPLY") is None  # (the writer path asks no feature)


def test_a_read_that_raced_our_write_is_not_kept(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced: a read takes its ticket while our write is in flight, so its reply may predate
    the write, and the write makes no invalidation to tear that ticket: the write must tear it
    (and keep nothing), and the read's old reply must not be kept."""
    client = CacheClient(core, Codec())
    near = core.near
    assert near is not None
    store(client, core, "near:raced", "old")
    shard = core.shard_for("near:raced")
    real_send = runner.send
    raced: dict[str, Any] = {}

    def send_while_a_read_starts(target: Any, commands: Any) -> list[Any]:
        if commands[0][:2] == ("SET", "near:raced") and not raced:
            raced["ticket"] = near.ticket(shard, "near:raced")  # the read's, before the SET
        return real_send(target, commands)

    monkeypatch.setattr(runner, "send", send_while_a_read_starts)
    client.set("near:raced", "new", None)
    assert raced["ticket"] is not None
    assert near.get("near:raced") is None  # the write kept nothing: someone raced it
    near.fill(shard, "near:raced", raced["ticket"], Codec().dumps("old"), -1)  # the read's reply
    assert near.get("near:raced") is None  # not kept
    assert client.get("near:raced") == "new"


def test_no_copy_outlives_a_storm_of_own_and_outside_writes(core: ShardedSentinelPool) -> None:
    """Threads of this process write and read a few keys while another process writes the
    same keys: once everyone stopped and the last invalidations arrived, every copy kept
    equals what the server holds (a write kept locally never hides a later outside one)."""
    import random

    client = CacheClient(core, Codec())
    near = core.near
    assert near is not None
    keys = [f"near:storm:{n}" for n in range(8)]
    workers = Workers(timeout=10)

    def ours(seed: int) -> None:
        rng = random.Random(seed)
        while not workers.stop.is_set():
            key = rng.choice(keys)
            if rng.random() < 0.5:
                client.set(key, {"by": "us", "n": rng.random()}, None)
            else:
                client.get(key)

    def theirs() -> None:
        rng = random.Random(99)
        clients = {key: outsider(core, key) for key in keys}
        try:
            while not workers.stop.is_set():
                key = rng.choice(keys)
                clients[key].set(key, Codec().dumps({"by": "them", "n": rng.random()}))
        finally:
            for other in clients.values():
                other.close()

    with workers:
        for n in range(4):
            workers.spawn(ours, n, name=f"ours-{n}")
        workers.spawn(theirs, name="theirs")
        time.sleep(1.5)  # the storm's length
    for index in sorted({core.shard_index(key) for key in keys}):
        fence(client, core, index)  # the last invalidations have arrived
    kept = 0
    for key in keys:
        local = near.get(key)
        with outsider(core, key) as other:
            stored = other.get(key)
        if local is not None:
            kept += 1
            assert local == stored, f"{key}: kept {local!r}, the server has {stored!r}"
    assert kept > 0, "no copy left to check: the storm proved nothing"


def test_a_lost_writer_connection_ends_the_session(core: ShardedSentinelPool) -> None:
    """The writer connection holds the session's tracking: when the server closes it (here
    ``CLIENT KILL TYPE normal``, which spares the subscribed invalidation connection) the
    copies go, and tracking resumes with a new writer."""
    client = CacheClient(core, Codec())
    store(client, core, "near:w", "one")

    def losses() -> int:
        return int(near_status(core, "near:w")["flushes"].get("tracker connection lost", 0))

    lost = losses()
    with outsider(core, "near:w") as other:
        other.client_kill_filter(_type="normal", skipme=True)
    wait_until(lambda: losses() > lost, 2, "the lost writer")
    assert near_status(core, "near:w")["entries"] == 0
    wait_until(lambda: tracked(core), 5, "tracking again")
    store(client, core, "near:w", "two")
    with outsider(core, "near:w") as other:
        other.set("near:w", Codec().dumps("three"))
    wait_until(lambda: client.get("near:w") == "three", 1, "invalidations through the new writer")


def test_an_invalidation_during_the_read_never_leaves_the_old_value(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced: the GET's reply (the old value) is held back until an outside write has been
    applied and its invalidation received; the reply must not be kept."""
    client = CacheClient(core, Codec())
    before = near_status(core, "near:race")["invalidations"]
    with outsider(core, "near:race") as other:  # not kept here: the read below must miss
        other.set("near:race", Codec().dumps("old"))
    echoed(core, "near:race", before)
    real_send = runner.send
    state = {"raced": False}

    def send_then_race(target: Any, commands: Any) -> list[Any]:
        replies = real_send(target, commands)
        if commands[0] == ("GET", "near:race") and not state["raced"]:
            state["raced"] = True
            seen = near_status(core, "near:race")["invalidations"]
            with outsider(core, "near:race") as other:
                other.set("near:race", Codec().dumps("new"))
            wait_until(
                lambda: near_status(core, "near:race")["invalidations"] > seen, 2, "invalidation"
            )
        return replies

    monkeypatch.setattr(runner, "send", send_then_race)
    assert client.get("near:race") == "old"  # the value the server had when it was read
    assert state["raced"]
    assert client.get("near:race") == "new"  # not the old reply, kept after its invalidation
    assert near_status(core, "near:race")["entries"] >= 1  # and the new one is kept


def test_bounded_by_entries_and_bytes(cluster: LocalSentinelCluster) -> None:
    core = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        near_cache_max_entries=50,
        near_cache_max_bytes=20_000,
        db=6,
    )
    try:
        client = CacheClient(core, Codec())
        client.set_many({f"near:bound:{n}": "x" * 300 for n in range(400)}, None)
        wait_until(lambda: tracked(core), 5, "tracking")
        for n in range(400):
            assert client.get(f"near:bound:{n}") == "x" * 300
        shards = [s["near_cache"] for s in core.status()["shards"]]
        assert sum(s["entries"] for s in shards) <= 50
        assert sum(s["bytes"] for s in shards) <= 20_000
        assert sum(s["entries"] for s in shards) > 0
    finally:
        core.close()


def test_a_server_flush_and_a_lost_tracker_drop_the_copies(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    store(client, core, "near:f", 1)
    flushes = near_status(core, "near:f")["flushes"].get("server flush", 0)
    with outsider(core, "near:f") as other:
        other.flushdb()
    wait_until(lambda: near_status(core, "near:f")["entries"] == 0, 2, "the flush")
    assert near_status(core, "near:f")["flushes"].get("server flush", 0) > flushes
    assert client.get("near:f") is None
    store(client, core, "near:f", 2)
    with outsider(core, "near:f") as other:
        # The connection the invalidations come on goes: the subscriber (redirect), or the one
        # tracked connection (push, where no subscriber is ours).
        other.client_kill_filter(_type="pubsub" if near_mode(core) == "redirect" else "normal")
    wait_until(lambda: near_status(core, "near:f")["entries"] == 0, 2, "the lost tracker")
    assert near_status(core, "near:f")["flushes"].get("tracker connection lost", 0) >= 1
    wait_until(lambda: tracked(core), 5, "tracking again")
    assert client.get("near:f") == 2


def _failover_then_outside_write(cluster: LocalSentinelCluster, kill: bool, push: bool) -> None:
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, near_cache=True, near_cache_push=push
    )
    try:
        client = CacheClient(core, Codec())
        client.set("near:fo", "started", None)  # the core starts (nothing connects before)
        wait_until(lambda: tracked(core), 5, "tracking")
        store(client, core, "near:fo", "before")
        shard = core.shard_for("near:fo")
        old = shard.address
        if kill:
            cluster.kill_master(shard.name)
        else:
            cluster.failover(shard.name)
        wait_until(lambda: shard.address != old, 30, "the switch")
        # Right after the switch is applied: another writer changes the key on the new master.
        with outsider(core, "near:fo") as other:
            other.set("near:fo", Codec().dumps("after"))
        assert client.get("near:fo") == "after"  # never the copy from before the switch
        wait_until(lambda: tracked(core), 5, "tracking the new master")
        assert client.get("near:fo") == "after"
        with outsider(core, "near:fo") as other:
            other.set("near:fo", Codec().dumps("later"))
        wait_until(lambda: client.get("near:fo") == "later", 1, "invalidations from the new master")

        def ended() -> bool:  # why: the switch, or the dead master
            flushes = near_status(core, "near:fo")["flushes"]
            return flushes.get("master switched", 0) + flushes.get("tracker connection lost", 0) > 0

        # Reads since the switch were kept under no session, so they could be right before the
        # tracker even noticed the switch: wait for it.
        wait_until(ended, 2, "the old session's end")
    finally:
        core.close()


@pytest.mark.failover
def test_a_planned_failover_never_serves_a_stale_copy(
    make_cluster: Callable[..., LocalSentinelCluster], near_push: bool
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    _failover_then_outside_write(cluster, kill=False, push=near_push)


@pytest.mark.failover
def test_a_killed_master_never_leaves_a_stale_copy(
    make_cluster: Callable[..., LocalSentinelCluster], near_push: bool
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    _failover_then_outside_write(cluster, kill=True, push=near_push)


@pytest.mark.failover
def test_a_silently_cut_master_ends_the_session(
    make_cluster: Callable[..., LocalSentinelCluster], near_push: bool
) -> None:
    """A partition between this process and a master (nothing delivered, no reset) is found by
    the pings of both tracker connections: the shard's copies go within about two seconds,
    well before SOCKET_TIMEOUT would have ended a blocked read."""
    cluster = make_cluster(shards=1, replicas=0, sentinels=1, faults=True)
    core = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        near_cache_push=near_push,
        socket_timeout=5,
    )
    try:
        client = CacheClient(core, Codec())
        client.set("near:cut", "started", None)  # the core starts (nothing connects before)
        wait_until(lambda: tracked(core), 5, "tracking")
        store(client, core, "near:cut", "kept")
        cluster.partition(cluster.master_names[0], peers=[CLIENT])
        cut = time.monotonic()
        wait_until(lambda: near_status(core, "near:cut")["entries"] == 0, 4, "the cut noticed")
        assert time.monotonic() - cut < 3.0
        assert near_status(core, "near:cut")["flushes"].get("tracker ping unanswered", 0) >= 1
    finally:
        cluster.heal(cluster.master_names[0])
        core.close()


def test_a_forked_child_starts_empty_and_tracks_on_its_own(core: ShardedSentinelPool) -> None:
    client = CacheClient(core, Codec())
    store(client, core, "near:fork", "parent")
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 0
        try:
            if near_status(core, "near:fork")["entries"] != 0:
                code = 3
            elif client.get("near:fork") != "parent":
                code = 4
            else:
                wait_until(lambda: tracked(core), 5, "tracking in the child")
                client.get("near:fork")
                if (
                    client.get("near:fork") != "parent"
                    or near_status(core, "near:fork")["hits"] < 1
                ):
                    code = 5
        except BaseException:
            code = 6
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.get("near:fork") == "parent"  # the parent's copy and tracking are untouched


def test_async_reads_share_the_near_cache(core: ShardedSentinelPool) -> None:
    async def go() -> tuple[Any, Any]:
        client = AsyncCacheClient(core, Codec())
        before = near_status(core, "near:async")["invalidations"]
        await client.set("near:async", 7, None)
        echoed(core, "near:async", before)
        first = await client.get("near:async")
        # A hit may be refused while the tracker reads its socket (a PONG, another key's
        # invalidation: near_tracking.Arrivals), so the one after a refused read is retried.
        for _ in range(200):
            hits = near_status(core, "near:async")["hits"]
            second = await client.get("near:async")
            if near_status(core, "near:async")["hits"] == hits + 1:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("no near-cache hit for an async read in 200 tries")
        many = await client.get_many(["near:async"])
        await client.aclose()
        return (first, second), many

    assert asyncio.run(go()) == ((7, 7), {"near:async": 7})


def test_prefixes_limit_what_is_kept(cluster: LocalSentinelCluster) -> None:
    core = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        near_cache_prefixes="hot:",
        db=7,
    )
    try:
        client = CacheClient(core, Codec())
        client.set("hot:1", 1, None)
        client.set("cold:1", 1, None)
        wait_until(lambda: tracked(core), 5, "tracking")
        for _ in range(2):
            client.get("hot:1")
            client.get("cold:1")
        assert near_status(core, "hot:1")["entries"] + near_status(core, "cold:1")["entries"] >= 1
        assert core.near is not None and core.near.get("cold:1") is None
    finally:
        core.close()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("near_cache", "yes"),
        ("near_cache_max_entries", 0),
        ("near_cache_max_bytes", -1),
        ("near_cache_ttl", 0),
        ("near_cache_prefixes", [""]),
        ("near_cache_prefixes", 5),
    ],
)
def test_bad_options_are_named(option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=option) as caught:
        PoolConfig.create(["a"], ["127.0.0.1:26379"], **{option: value})
    assert caught.value.option == option


def test_the_status_report_shows_the_near_cache(core: ShardedSentinelPool, near_push: bool) -> None:
    from sentinel_cache.core.admin import status

    client = CacheClient(core, Codec())
    store(client, core, "near:st", 1)
    hits = near_status(core, "near:st")["hits"]
    # served by the copy (once no invalidation is on its way: near_tracking.Arrivals)
    wait_until(
        lambda: client.get("near:st") == 1 and near_status(core, "near:st")["hits"] > hits,
        2,
        "a hit",
    )
    served = near_status(core, "near:st")["hits"]
    report = status.collect(core, timeout=1.0)
    row = report["shards"][core.shard_index("near:st")]["near_cache"]
    assert row["tracked"] is True and row["entries"] >= 1 and row["hits"] == served
    assert row["mode"] == ("push" if near_push else "redirect")
    text = status.render_text(report)
    assert "near cache (this process)" in text and "hit ratio" in text
    assert f"yes ({row['mode']})" in text


def test_the_django_and_flask_backends_take_the_options(cluster: LocalSentinelCluster) -> None:
    """Both adapters pass NEAR_CACHE through to the core: their reads hit the local copy."""
    from sentinel_cache.django import ShardedSentinelCache as DjangoCache

    options = {"MASTERS": cluster.master_names, "NEAR_CACHE": True, "DB": 8}
    django_cache = DjangoCache(cluster.sentinel_addresses, {"OPTIONS": options})
    from flask import Flask
    from flask_caching import Cache

    app = Flask("near")
    app.config.update(
        CACHE_TYPE="sentinel_cache.flask.ShardedSentinelCache",
        CACHE_REDIS_SENTINELS=[f"{h}:{p}" for h, p in cluster.sentinel_addresses],
        CACHE_REDIS_SENTINEL_MASTERS=cluster.master_names,
        CACHE_OPTIONS={"NEAR_CACHE": True, "DB": 8},
    )
    flask_ext = Cache(app)
    flask_cache = app.extensions["cache"][flask_ext]
    core = django_cache.core
    assert core.near is not None and flask_cache.core.near is not None
    try:
        django_cache.set("adapters", {"a": 1}, None)  # starts the core (nothing connects before)
        wait_until(lambda: tracked(core), 5, "tracking")
        wait_until(
            lambda: (
                django_cache.get("adapters") == {"a": 1}
                and core.near is not None
                and near_status(core, django_cache.make_key("adapters"))["entries"] >= 1
            ),
            2,
            "a local copy",
        )
        key = django_cache.make_key("adapters")

        def three_local_reads() -> bool:
            """get, aget and get_many all served by the local copy (a late echo of the first
            write may evict it once: then the copy is read again and the three retried)."""
            hits = near_status(core, key)["hits"]
            assert django_cache.get("adapters") == {"a": 1}
            assert asyncio.run(django_cache.aget("adapters")) == {"a": 1}
            assert django_cache.get_many(["adapters"]) == {"adapters": {"a": 1}}
            return bool(near_status(core, key)["hits"] == hits + 3)

        wait_until(three_local_reads, 3, "three reads served locally")
        flask_cache.set("f", "flask", 0)
        wait_until(lambda: tracked(flask_cache.core), 5, "tracking (Flask)")
        wait_until(
            lambda: (
                flask_cache.get("f") == "flask"
                and near_status(flask_cache.core, flask_cache._get_prefix() + "f")["entries"] >= 1
            ),
            2,
            "a local copy (Flask)",
        )
        assert flask_cache.has("f")
    finally:
        core.close()
        flask_cache.core.close()
