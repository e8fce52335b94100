"""A feature the server has but our ACL user may not run (docs/security.md): ``set_many`` with a
timeout on masters whose user is allowed the page's first row except ``MSETEX``.

The probe must tell "the server has it" from "we may run it": a master that has ``MSETEX`` (Valkey
9.1+, Redis 8.4+) and refuses it to the user gets the script, with no ``NOPERM`` reaching the
caller, and the log says so once per master. On a server without ``MSETEX`` (Redis 7) the same
user gets the script too, and nothing is logged as refused: the command is absent, not denied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import redis
from test_docs_promises_acl import EVERY, KEYS, ROWS, SECRET

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

TIMEOUT = 60


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(shards=2, replicas=0, sentinels=1) as cluster:
        yield cluster


def has_msetex(cluster: LocalSentinelCluster) -> bool:
    """Whether the servers have MSETEX at all: an ACL rule naming a command they lack is refused."""
    answers = set()
    for address in cluster.node_addresses():
        with cluster.node_client(address) as node:
            try:
                node.execute_command("ACL", "SETUSER", "msetex-probe", "off", "+msetex")
                answers.add(True)
            except redis.ResponseError:
                answers.add(False)
    assert len(answers) == 1, "the test servers are all of one version"
    return answers.pop()


def user(cluster: LocalSentinelCluster, name: str, *, msetex: bool) -> str:
    """A data-node user allowed the page's first row, with or without ``MSETEX``."""
    assert "+msetex" in ROWS[EVERY], "the first row lists MSETEX"
    # Left out where the server lacks it too: a rule naming an unknown command is refused.
    keep = msetex and has_msetex(cluster)
    rules = [rule for rule in ROWS[EVERY] if keep or rule != "+msetex"]
    for address in cluster.node_addresses():
        with cluster.node_client(address) as node:
            node.execute_command(
                "ACL", "SETUSER", name, "reset", "on", f">{SECRET}", *KEYS, "resetchannels",
                "-@all", *rules,
            )  # fmt: skip
    return name


def pool_as(cluster: LocalSentinelCluster, name: str) -> ShardedSentinelPool:
    return ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, username=name, password=SECRET
    )


def set_many_twice(pool: ShardedSentinelPool, flavour: str, mapping: dict[str, int]) -> None:
    """``set_many`` with a timeout twice (the second on what the first learned), then read back."""
    if flavour == "sync":
        cache = CacheClient(pool, Codec())
        assert cache.set_many(mapping, TIMEOUT) == []
        assert cache.set_many(mapping, TIMEOUT) == []
        assert cache.get_many(mapping) == mapping
        ttls = [cache.ttl(key) for key in mapping]
    else:

        async def run() -> list[float | None]:
            cache = AsyncCacheClient(pool, Codec())
            try:
                assert await cache.set_many(mapping, TIMEOUT) == []
                assert await cache.set_many(mapping, TIMEOUT) == []
                assert await cache.get_many(mapping) == mapping
                return [await cache.ttl(key) for key in mapping]
            finally:
                await cache.aclose()

        ttls = asyncio.run(run())
    assert all(TIMEOUT - 5 < (ttl or 0) <= TIMEOUT for ttl in ttls), ttls


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refuses MSETEX" in r.getMessage()]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_set_many_with_a_timeout_where_msetex_is_denied(
    topology: LocalSentinelCluster, caplog: pytest.LogCaptureFixture, flavour: str
) -> None:
    caplog.set_level(logging.INFO, logger="sentinel_cache")
    present = has_msetex(topology)
    pool = pool_as(topology, user(topology, f"no-msetex-{flavour}", msetex=False))
    mapping = {f"web:denied:{flavour}:{i}": i for i in range(20)}
    try:
        assert len(pool.group_by_shard(mapping)) == 2, "the keys span both masters"
        set_many_twice(pool, flavour, mapping)  # no NoPermissionError raised
        assert [shard.allows("MSETEX") for shard in pool.shards] == [False, False]
        labels = [shard.label for shard in pool.shards]
    finally:
        pool.close()
    lines = refusals(caplog)
    if present:  # denied: once per master, naming it and what is used instead
        assert len(lines) == 2, lines
        for label in labels:
            (line,) = [line for line in lines if f"shard {label}:" in line]
            assert "script" in line
    else:  # absent (Redis 7): not a refusal
        assert lines == []


def test_a_user_allowed_msetex_gets_it(
    topology: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe refuses nothing the page's first row allows (its key is in ``KEYS``)."""
    caplog.set_level(logging.INFO, logger="sentinel_cache")
    present = has_msetex(topology)
    pool = pool_as(topology, user(topology, "with-msetex", msetex=True))
    try:
        set_many_twice(pool, "sync", {f"web:allowed:{i}": i for i in range(20)})
        assert [shard.allows("MSETEX") for shard in pool.shards] == [present, present]
    finally:
        pool.close()
    assert refusals(caplog) == []
