"""A near-cache copy never outlives what it copies (issue 22, finding 5), on real servers: failed
reads leave no ticket, prefixes the server refuses are refused first, copies live at most the
key's remaining TTL, a switch never lets a read be kept under the old master's session, a
stalled or cut tracker connection ends the session in time, and what it does is counted.
Each scenario counts stale reads against a plain GET on the master."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from waiting import wait_until

from sentinel_cache import ConfigurationError, PoolExhaustedError, ShardUnavailableError
from sentinel_cache.core.config import PoolConfig, parse_cache_config
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.faults import CLIENT


def near_status(core: ShardedSentinelPool, key: str) -> dict[str, Any]:
    return core.status()["shards"][core.shard_index(key)]["near_cache"]


def tracked(core: ShardedSentinelPool) -> bool:
    return all(shard["near_cache"]["tracked"] for shard in core.status()["shards"])


def in_flight(core: ShardedSentinelPool) -> int:
    return sum(shard["near_cache"]["in_flight"] for shard in core.status()["shards"])


def outsider(core: ShardedSentinelPool, key: str) -> redis.Redis:
    """Another writer (a Java service, redis-cli): a plain client on the key's master."""
    address = core.shard_for(key).address
    assert address is not None
    db = core.config.connection_options().get("db", 0)
    return redis.Redis(host=address.host, port=address.port, db=db)


@pytest.fixture(scope="module")
def faulty(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """One shard (and a replica to fail over to) behind the fault proxy, for this module's
    tests that stall or cut connections or switch the master."""
    with LocalSentinelCluster(shards=1, replicas=1, sentinels=3, faults=True) as made:
        yield made


def started(cluster: LocalSentinelCluster, **options: Any) -> ShardedSentinelPool:
    """A core with the near cache on, started and tracking."""
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, near_cache=True, **options
    )
    CacheClient(core, Codec()).get("truth:start")  # starts the core (nothing connects before)
    wait_until(lambda: tracked(core), 5, "tracking")
    return core


@pytest.fixture
def core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    made = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, near_cache=True, db=9
    )
    CacheClient(made, Codec()).clear(None)
    wait_until(lambda: tracked(made), 5, "tracking")
    yield made
    made.close()


# -- 1. a failed read drops its ticket --------------------------------------------------------
def test_reads_of_non_string_keys_leave_no_ticket(core: ShardedSentinelPool) -> None:
    """WRONGTYPE on 1,000 distinct keys, and 1,000 more read by get_many: every ticket goes with
    its failed read (before, each stayed: one per key, bounded by nothing)."""
    client = CacheClient(core, Codec())
    keys = [f"truth:hash:{n}" for n in range(2000)]
    for shard in core.shards:
        with redis.Redis(host=shard.address.host, port=shard.address.port, db=9) as other:
            pipe = other.pipeline(transaction=False)
            for key in keys:
                if core.shard_for(key) is shard:
                    pipe.hset(key, "f", "v")
            pipe.execute()
    for key in keys[:1000]:
        assert client.get(key, "default") == "default"
    assert client.get_many(keys[1000:]) == {}  # MGET answers nil for them
    assert in_flight(core) == 0


def test_a_read_refused_a_connection_or_timed_out_leaves_no_ticket(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    cluster = make_cluster(shards=1, replicas=0, sentinels=1)
    core = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        max_connections=1,
        pool_timeout=0.1,
        socket_timeout=0.2,
        outage_hold=0,  # each failure is under test: raised at once, not held for a switch
    )
    try:
        client = CacheClient(core, Codec())
        client.set("truth:started", 1, None)
        wait_until(lambda: tracked(core), 5, "tracking")
        shard = core.shards[0]
        held = shard.pool.get_connection()
        try:
            with pytest.raises(PoolExhaustedError):
                client.get("truth:exhausted")
            with pytest.raises(PoolExhaustedError):
                client.get_many(["truth:exhausted:1", "truth:exhausted:2"])
        finally:
            shard.pool.release(held)
        assert in_flight(core) == 0
        with outsider(core, "truth:slow") as other:
            other.execute_command("CLIENT", "PAUSE", 600, "ALL")  # the read times out
            with pytest.raises(ShardUnavailableError, match="TimeoutError"):
                client.get("truth:slow")
            assert in_flight(core) == 0
    finally:
        core.close()


# -- 2. prefixes the server would refuse are refused by the configuration ---------------------
@pytest.mark.parametrize(
    ("prefixes", "named"),
    [
        (["app:", "app:user:"], ("'app:'", "'app:user:'")),
        (["app:user:", "b:", "app:"], ("'app:user:'", "'app:'")),
        ("x:,x:", ("'x:'", "'x:'")),
    ],
)
def test_overlapping_prefixes_are_refused_naming_both(
    prefixes: Any, named: tuple[str, str]
) -> None:
    with pytest.raises(ConfigurationError, match="near_cache_prefixes") as caught:
        PoolConfig.create(["a"], ["127.0.0.1:26379"], near_cache_prefixes=prefixes)
    assert caught.value.option == "near_cache_prefixes"
    assert all(name in str(caught.value) for name in named)
    assert "overlap" in str(caught.value)


def test_the_django_option_is_named_and_the_server_agrees(cluster: LocalSentinelCluster) -> None:
    """NEAR_CACHE_PREFIXES is refused with the adapters' name for it; the server itself refuses
    the same prefixes for BCAST tracking (what the check stands for), and takes the shorter
    one alone."""
    options = {"MASTERS": cluster.master_names, "NEAR_CACHE": True}
    with pytest.raises(ConfigurationError, match="NEAR_CACHE_PREFIXES") as caught:
        parse_cache_config(
            cluster.sentinel_addresses, {**options, "NEAR_CACHE_PREFIXES": ["app:", "app:user:"]}
        )
    assert caught.value.option == "NEAR_CACHE_PREFIXES"
    host, port = cluster.master_address(cluster.master_names[0])
    with redis.Redis(host=host, port=port) as raw:
        own_id = raw.client_id()
        with pytest.raises(redis.ResponseError, match="(?i)overlap"):
            raw.execute_command(
                "CLIENT",
                "TRACKING",
                "ON",
                "REDIRECT",
                own_id,
                "BCAST",
                "PREFIX",
                "app:",
                "PREFIX",
                "app:user:",
            )
        assert raw.execute_command(
            "CLIENT", "TRACKING", "ON", "REDIRECT", own_id, "BCAST", "PREFIX", "app:"
        ) in (b"OK", "OK")


# -- 3. a copy lives at most the key's remaining TTL --------------------------------------------
def test_no_copy_outlives_its_key_when_no_invalidation_comes(
    faulty: LocalSentinelCluster, near_push: bool
) -> None:
    """Copies filled by get and get_many of keys another writer set with a TTL, our own set
    (kept by the write) and reads after our touch, add and set_many: once the invalidation
    connection is stalled (as a server that expires a key lazily sends nothing until it gets
    to it), none is served past the key's expiry, while a key without TTL stays kept (under
    NEAR_CACHE_TTL) and the session is still live. Before, read copies lived NEAR_CACHE_TTL."""
    core = started(faulty, near_cache_push=near_push)
    client = CacheClient(core, Codec())
    near = core.near
    assert near is not None
    ttl = 0.5
    try:
        with outsider(core, "ttl:read") as other:
            other.set("ttl:forever", Codec().dumps("f"))
            for key in ("ttl:read", "ttl:many"):
                other.set(key, Codec().dumps(key), px=int(ttl * 1000))
            first = time.monotonic()  # every key below expires at or after first + ttl
            client.set("ttl:set", "s", ttl)
            client.set("ttl:touch", "t", None)
            client.touch("ttl:touch", ttl)
            client.add("ttl:add", "a", ttl)
            client.set_many({"ttl:set_many": "m"}, ttl)
        expiring = ["ttl:read", "ttl:many", "ttl:set", "ttl:touch", "ttl:add", "ttl:set_many"]
        for key in ["ttl:forever", *expiring]:
            reader: Callable[[], Any] = (
                (lambda k=key: client.get_many([k]).get(k))
                if key == "ttl:many"
                else (lambda k=key: client.get(k))
            )
            wait_until(
                lambda r=reader, k=key: r() is not None and near.get(k) is not None,
                2,
                f"a copy of {key} (the echo of our own write evicts it first)",
            )
        assert time.monotonic() < first + ttl, "too slow to fill the copies before expiry"
        faulty.partition(faulty.master_names[0], peers=[CLIENT], direction="outbound")
        try:
            time.sleep(max(0.0, first + ttl + 0.05 - time.monotonic()))
            served = [key for key in expiring if near.get(key) is not None]
            assert tracked(core), "the session ended: this proves nothing about the TTL bound"
            assert near.get("ttl:forever") is not None  # no TTL: kept
        finally:
            faulty.heal(faulty.master_names[0])
        assert served == []
    finally:
        core.close()


# -- 4. no read after a switch is kept under the old master's session --------------------------
@pytest.mark.failover
def test_a_read_right_after_a_switch_is_not_kept_under_the_old_session(
    make_cluster: Callable[..., LocalSentinelCluster], near_push: bool
) -> None:
    """The switch is applied (the safety net's re-resolve, as after a READONLY reply) and the
    key read from the new master at once, before the tracker, still subscribed on the old
    master, has noticed: that reply must not be kept, for the old session hears nothing of the
    new master's writes. Then another writer changes the key on the new master: every read
    returns what a plain GET on the master returns (before, the copy kept under the old session
    was served until the tracker caught up)."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    # The switch is applied when the test says.
    core = started(cluster, listeners=False, near_cache_push=near_push)
    client = CacheClient(core, Codec())
    near = core.near
    assert near is not None
    shard = core.shards[0]
    try:
        client.set("switch:k", "before", None)
        old = shard.address
        cluster.failover(shard.name)
        wait_until(lambda: cluster.master_address(shard.name) != old, 30, "the failover")
        new = cluster.master_address(shard.name)
        cluster.wait_for_replication(shard.name)
        # The sentinels' CLIENT KILL of the demoted master's normal clients may have ended the
        # session; the tracker then tracks it again, as the master this core still knows.
        wait_until(lambda: tracked(core), 5, "a session on the old master")
        assert shard.address == old
        assert core.reresolve(shard, reason="test: the master moved", force=True)
        assert client.get("switch:k") == "before"  # read from the new master
        assert near.get("switch:k") is None, "a new master's reply kept under the old session"
        stale = 0
        with redis.Redis(host=new[0], port=new[1]) as other:
            for n in range(20):
                other.set("switch:k", Codec().dumps(n))
                got = client.get("switch:k")
                stale += got != Codec().loads(other.get("switch:k"))
        assert stale == 0
        wait_until(lambda: tracked(core), 5, "tracking the new master")
        with redis.Redis(host=new[0], port=new[1]) as other:
            other.set("switch:k", Codec().dumps("later"))
        wait_until(lambda: client.get("switch:k") == "later", 1, "the new session's invalidation")
    finally:
        core.close()


# -- 5. both tracker connections are checked on schedule, whatever the traffic -----------------
def test_both_tracker_connections_are_pinged_under_traffic(
    faulty: LocalSentinelCluster, near_push: bool
) -> None:
    """Another writer keeps the invalidation connection busy for three seconds: the server
    still sees a PING from each of our two tracking connections (one in push mode) at least
    every two seconds (before, neither was pinged while invalidations flowed, so a silent cut
    of the writer went unnoticed for as long as the traffic lasted)."""
    core = started(faulty, near_cache_push=near_push)
    try:
        with outsider(core, "busy:k") as other:
            own = {other.client_id()}
            before = near_status(core, "busy:k")["invalidations"]
            until = time.monotonic() + 3.0
            n = 0
            while time.monotonic() < until:
                other.set(f"busy:{n % 50}", n)
                n += 1
            assert near_status(core, "busy:k")["invalidations"] > before + 100
            clients = {c["id"]: c for c in other.client_list() if int(c["id"]) not in own}
            if near_push:  # one connection, tracked, its invalidations pushed on it
                tracking = [c for c in clients.values() if "t" in c["flags"]]
                assert len(tracking) == 1 and tracking[0]["resp"] == "3", tracking
            else:  # the writer holds the tracking, redirected to the invalidation connection
                writers = [c for c in clients.values() if c.get("redir", "-1") not in ("-1", "0")]
                assert len(writers) == 1, writers
                tracking = [writers[0], clients[writers[0]["redir"]]]
            for client in tracking:
                assert client["cmd"] == "ping" and int(client["idle"]) <= 2, client
    finally:
        core.close()


@pytest.mark.failover
def test_a_stalled_tracker_ends_the_session_without_a_socket_timeout(
    faulty: LocalSentinelCluster, near_push: bool
) -> None:
    """SOCKET_TIMEOUT=None (accepted) must not make the tracker wait forever: with every byte
    from the master held (an invalidation among them), the shard's copies go within two
    seconds."""
    core = started(faulty, socket_timeout=None, near_cache_push=near_push)
    client = CacheClient(core, Codec())
    near = core.near
    assert near is not None
    name = faulty.master_names[0]
    try:
        client.set("stall:k", "old", None)
        # kept by the write (a hit waits while a PONG is on the tracked socket: Arrivals)
        wait_until(lambda: near.get("stall:k") is not None, 5, "the write's copy")
        address = core.shards[0].address
        assert address is not None
        with socket.create_connection(address, timeout=2) as other:  # connected before the cut
            faulty.partition(name, peers=[CLIENT], direction="outbound")
            cut = time.monotonic()
            # Applied on the master; its reply held, with the invalidation and every pong.
            other.sendall(b"SELECT 0\r\nSET stall:k new\r\n")
        wait_until(lambda: near.get("stall:k") is None, 4, "the stall noticed")
        assert time.monotonic() - cut < 3.0
    finally:
        faulty.heal(name)
        core.close()


# -- 6. what the near cache does is visible: metrics and health --------------------------------
def test_hits_misses_invalidations_flushes_and_tracking_are_metrics(
    cluster: LocalSentinelCluster,
) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import REGISTRY

    core = started(cluster, metrics=True, db=10)
    client = CacheClient(core, Codec())
    key = "metrics:near"
    name = core.shard_for(key).name

    def sample(metric: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(metric, {"shard": name, **labels}) or 0.0

    try:
        names = [
            ("sentinel_cache_near_cache_lookups_total", {"result": "hit"}),
            ("sentinel_cache_near_cache_lookups_total", {"result": "miss"}),
            ("sentinel_cache_near_cache_invalidations_total", {}),
            ("sentinel_cache_near_cache_flushes_total", {"cause": "server flush"}),
        ]
        before = [sample(metric, **labels) for metric, labels in names]
        assert sample("sentinel_cache_near_cache_tracked") == 1
        client.get(key)  # a miss
        client.set(key, "v", None)  # kept by the write
        # a hit, once nothing waits on the tracked socket (a PONG: near_tracking.Arrivals)
        hits = before[0]
        wait_until(
            lambda: client.get(key) == "v" and sample(names[0][0], **names[0][1]) > hits,
            5,
            "a near-cache hit",
        )
        assert sample("sentinel_cache_near_cache_entries") >= 1
        seen = near_status(core, key)["invalidations"]
        with outsider(core, key) as other:
            other.set(key, Codec().dumps("w"))
            wait_until(lambda: near_status(core, key)["invalidations"] > seen, 2, "invalidation")
            other.flushdb()
            wait_until(
                lambda: near_status(core, key)["flushes"].get("server flush", 0) > 0, 2, "flush"
            )
        after = [sample(metric, **labels) for metric, labels in names]
        assert [b - a >= 1 for a, b in zip(before, after, strict=True)] == [True] * 4
    finally:
        core.close()


def test_health_reports_a_near_cache_that_is_on_but_not_tracking(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    """A user whose ACL forbids CLIENT TRACKING: the cache serves (from the servers), and the
    health report says the near cache does not track (before, it said nothing)."""
    from sentinel_cache.core.admin import health

    cluster = make_cluster(shards=1, replicas=0, sentinels=1)
    host, port = cluster.master_address(cluster.master_names[0])
    with redis.Redis(host=host, port=port) as admin:
        admin.execute_command(
            "ACL", "SETUSER", "nearless", "on", ">pw", "~*", "&*", "+@all", "-client|tracking"
        )
    core = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        username="nearless",
        password="pw",
    )
    try:
        client = CacheClient(core, Codec())
        client.set("health:near", "v", None)
        assert client.get("health:near") == "v"
        report = health.check(core)
        assert report.ready
        assert any("near cache is on but not tracking" in w for w in report.warnings), report
        assert not tracked(core)
    finally:
        core.close()


# -- 7. a fork leaves the parent's near cache as it was ---------------------------------------
def test_a_fork_leaves_the_parents_copies_session_and_trackers(core: ShardedSentinelPool) -> None:
    """The parent's copies, tracking session and tracker threads are the same after a fork
    (before, every fork emptied them and restarted the trackers); the child starts empty and
    tracks on its own; the parent still sees another writer's change."""
    import os
    import threading

    client = CacheClient(core, Codec())
    client.set("fork:k", "parent", None)
    before = near_status(core, "fork:k")
    trackers = {t.ident for t in threading.enumerate() if t.name.startswith("sentinel_cache-near")}
    assert before["entries"] >= 1 and trackers
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 0
        try:
            if near_status(core, "fork:k")["entries"] != 0:
                code = 3
            elif client.get("fork:k") != "parent":
                code = 4
            else:
                wait_until(lambda: tracked(core), 5, "tracking in the child")
        except BaseException:
            code = 6
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after = near_status(core, "fork:k")
    # Still a local copy: read from the near cache alone (nothing fills it), until served (a
    # hit waits while a PONG is on the tracked socket: near_tracking.Arrivals).
    near = core.near
    assert near is not None
    wait_until(lambda: near.get("fork:k") == Codec().dumps("parent"), 5, "the parent's copy")
    assert client.get("fork:k") == "parent"
    assert after["flushes"] == before["flushes"] and after["tracked"]
    now = {t.ident for t in threading.enumerate() if t.name.startswith("sentinel_cache-near")}
    assert now == trackers
    seen = after["invalidations"]
    with outsider(core, "fork:k") as other:
        other.set("fork:k", Codec().dumps("outside"))
    wait_until(lambda: near_status(core, "fork:k")["invalidations"] > seen, 2, "invalidation")
    assert client.get("fork:k") == "outside"
