"""A feature taken away while the process runs (docs/security.md): ``MSETEX`` revoked from our ACL
user (``ACL SETUSER ... -msetex``) on one master after ``set_many`` learned it was allowed.

What was learned holds for the master's generation, so without a relearn every ``set_many`` with
a timeout on that shard would fail with ``NOPERM`` until the next switch. The call that meets the
refusal asks again, logs it once, and is sent again with the script; the next call does not try
``MSETEX`` there at all, and the other master keeps it. The same for a master restarted at its
address without the command (renamed away, as an older server lacks it): "unknown command". A
refusal about something else is raised as before. On a server without ``MSETEX`` (Redis 7) there
is nothing to take away: the script is used throughout and nothing is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.exceptions import NoPermissionError
from test_feature_denied import TIMEOUT, has_msetex, pool_as, user

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

REVOKED = "no longer allows MSETEX"


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(shards=2, replicas=0, sentinels=1) as cluster:
        yield cluster


def msetex_stats(cluster: LocalSentinelCluster, name: str) -> tuple[int, int]:
    """``MSETEX`` calls run and refused (the ACL) on ``name``'s master, from INFO commandstats."""
    with cluster.node_client(cluster.master_address(name)) as node:
        stats = node.info("commandstats").get("cmdstat_msetex", {})
    return int(stats.get("calls", 0)), int(stats.get("rejected_calls", 0))


def calling(
    flavour: str, pool: ShardedSentinelPool
) -> tuple[Callable[..., Any], Callable[[], None]]:
    """``call(name, *args)`` on a cache client of ``flavour``, and how to close it. The asyncio
    client's calls all run in one event loop, its connections' (a loop of our own, not
    ``asyncio.Runner``: Python 3.10 is supported)."""
    if flavour == "sync":
        cache = CacheClient(pool, Codec())
        return (lambda name, *args: getattr(cache, name)(*args)), lambda: None
    loop = asyncio.new_event_loop()
    clients: list[AsyncCacheClient] = []

    async def call(name: str, *args: Any) -> Any:
        if not clients:
            clients.append(AsyncCacheClient(pool, Codec()))
        return await getattr(clients[0], name)(*args)

    def close() -> None:
        try:
            if clients:
                loop.run_until_complete(clients[0].aclose())
            loop.run_until_complete(loop.shutdown_asyncgens())  # as asyncio.Runner closes
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    return (lambda name, *args: loop.run_until_complete(call(name, *args))), close


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_set_many_recovers_when_msetex_is_revoked(
    topology: LocalSentinelCluster, caplog: pytest.LogCaptureFixture, flavour: str
) -> None:
    caplog.set_level(logging.INFO, logger="sentinel_cache")
    present = has_msetex(topology)
    name = user(topology, f"revoked-{flavour}", msetex=True)
    revoked, kept = topology.master_names
    pool = pool_as(topology, name)
    call, close = calling(flavour, pool)
    keys = [f"web:revoked:{flavour}:{i}" for i in range(20)]
    try:
        assert len(pool.group_by_shard(keys)) == 2, "the keys span both masters"
        shards = {shard.name: shard for shard in pool.shards}
        before = {n: msetex_stats(topology, n) for n in (revoked, kept)}
        assert call("set_many", dict.fromkeys(keys, 0), TIMEOUT) == []
        for n in (revoked, kept):  # MSETEX used where the server has it (probe and batch)
            assert (msetex_stats(topology, n)[0] > before[n][0]) is present
            assert shards[n].allows("MSETEX") is present

        if present:
            with topology.node_client(topology.master_address(revoked)) as node:
                node.execute_command("ACL", "SETUSER", name, "-msetex")
        second = {key: i for i, key in enumerate(keys)}
        assert call("set_many", second, TIMEOUT) == []  # no NoPermissionError
        assert call("get_many", keys) == second
        ttls = [call("ttl", key) for key in keys]
        assert all(TIMEOUT - 5 < (ttl or 0) <= TIMEOUT for ttl in ttls), ttls
        assert shards[revoked].allows("MSETEX") is False
        assert shards[kept].allows("MSETEX") is present

        # Learned: the next call sends the script to the revoked master, MSETEX to the other.
        stats = {n: msetex_stats(topology, n) for n in (revoked, kept)}
        third = {key: -i for i, key in enumerate(keys)}
        assert call("set_many", third, TIMEOUT) == []
        assert call("get_many", keys) == third
        assert msetex_stats(topology, revoked) == stats[revoked]  # neither run nor refused
        assert msetex_stats(topology, kept)[0] == stats[kept][0] + int(present)
        label = shards[revoked].label
    finally:
        close()
        pool.close()
    lines = [r.getMessage() for r in caplog.records if REVOKED in r.getMessage()]
    if present:  # once, naming the shard, the refusal and what is used instead
        (line,) = lines
        assert f"shard {label}:" in line and "NoPermissionError" in line and "script" in line
    else:
        assert lines == []


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_another_refusal_is_raised_and_msetex_kept(
    topology: LocalSentinelCluster, caplog: pytest.LogCaptureFixture, flavour: str
) -> None:
    """A ``NOPERM`` about the keys, not the command: the relearn finds MSETEX still allowed, so
    the refusal reaches the caller as before and nothing is resent or logged as revoked."""
    caplog.set_level(logging.INFO, logger="sentinel_cache")
    present = has_msetex(topology)
    name = user(topology, f"keys-denied-{flavour}", msetex=True)
    denied, _ = topology.master_names
    pool = pool_as(topology, name)
    call, close = calling(flavour, pool)
    keys = [f"web:keys-denied:{flavour}:{i}" for i in range(20)]
    try:
        shards = {shard.name: shard for shard in pool.shards}
        assert call("set_many", dict.fromkeys(keys, 0), TIMEOUT) == []
        with topology.node_client(topology.master_address(denied)) as node:
            node.execute_command("ACL", "SETUSER", name, "resetkeys", "~sentinel_cache:*")
        with pytest.raises(NoPermissionError, match="key"):
            call("set_many", dict.fromkeys(keys, 1), TIMEOUT)
        assert shards[denied].allows("MSETEX") is present
    finally:
        close()
        pool.close()
    assert [r for r in caplog.records if REVOKED in r.getMessage()] == []


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_set_many_recovers_when_a_master_comes_back_without_msetex(
    server_kind: str, caplog: pytest.LogCaptureFixture, flavour: str
) -> None:
    """A master restarted at its address without ``MSETEX`` (here renamed away, as an older
    server lacks it) and no switch: the same generation, so only the refusal can tell."""
    caplog.set_level(logging.INFO, logger="sentinel_cache")
    with LocalSentinelCluster(shards=2, replicas=0, sentinels=1) as cluster:
        present = has_msetex(cluster)
        gone, kept = cluster.master_names
        pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses)
        call, close = calling(flavour, pool)
        keys = [f"web:restarted:{flavour}:{i}" for i in range(20)]
        try:
            shards = {shard.name: shard for shard in pool.shards}
            assert call("set_many", dict.fromkeys(keys, 0), TIMEOUT) == []
            assert shards[gone].allows("MSETEX") is present
            generation = shards[gone].generation
            lost = pool.group_by_shard(keys)[shards[gone]]
            address = cluster.master_address(gone)
            cluster.kill_node(address)
            rename = ["--rename-command", "MSETEX", ""] if present else []
            cluster.restart_node(address, extra_args=rename)
            for attempt in range(3):  # the pooled sockets to the killed process fail once
                try:
                    found = call("get_many", keys)
                    assert not found.keys() & set(lost), "restarted empty"
                    break
                except ShardUnavailableError:
                    assert attempt < 2
            second = {key: i for i, key in enumerate(keys)}
            assert call("set_many", second, TIMEOUT) == []
            assert call("get_many", keys) == second
            ttls = [call("ttl", key) for key in keys]
            assert all(TIMEOUT - 5 < (ttl or 0) <= TIMEOUT for ttl in ttls), ttls
            assert shards[gone].generation == generation, "no switch: the same master"
            assert shards[gone].allows("MSETEX") is False
            assert shards[kept].allows("MSETEX") is present
            with cluster.node_client(address) as node:  # the next call sends no MSETEX there
                errors = node.info("errorstats")
                assert call("set_many", second, TIMEOUT) == []
                assert node.info("errorstats") == errors
            label = shards[gone].label
        finally:
            close()
            pool.close()
    lines = [r.getMessage() for r in caplog.records if REVOKED in r.getMessage()]
    if present:
        (line,) = lines
        assert f"shard {label}:" in line and "unknown command" in line, line
    else:
        assert lines == []
