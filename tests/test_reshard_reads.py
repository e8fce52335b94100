"""Resharding (issue 14): while PREVIOUS_MASTERS is set, a key not moved yet is read from its
previous owner (and moved), and writes remove the previous owner's copy. Real servers."""

from __future__ import annotations

import asyncio

import pytest
from threads import Workers
from waiting import wait_until

from sentinel_cache import ConfigurationError
from sentinel_cache.core.config import PoolConfig
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient, execute
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

KEYS = [f"rs:{n}" for n in range(600)]


def core_for(
    cluster: LocalSentinelCluster, masters: list[str], **options: object
) -> ShardedSentinelPool:
    return ShardedSentinelPool(masters, cluster.sentinel_addresses, listeners=False, **options)


def placed(
    cluster: LocalSentinelCluster, masters: list[str], **options: object
) -> ShardedSentinelPool:
    """Every key written under ``masters`` (then closed), on a flushed topology."""
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            node.flushdb()
    core = core_for(cluster, masters, **options)
    CacheClient(core, Codec()).set_many({key: f"v{key}" for key in KEYS}, 600)
    return core


def where(cluster: LocalSentinelCluster, key: str) -> list[str]:
    names = []
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            if node.exists(key):
                names.append(name)
    return names


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (["shard0", "shard1"], ["shard0", "shard1", "shard2"]),  # append a master
        (["shard0", "shard1", "shard2"], ["shard0", "shard1"]),  # remove the last one
        (["shard0", "shard1", "shard2"], ["shard0", "shard2"]),  # remove one in the middle
    ],
    ids=["append", "remove-last", "remove-middle"],
)
def test_no_read_misses_while_keys_move(
    three: LocalSentinelCluster, before: list[str], after: list[str]
) -> None:
    placed(three, before).close()
    core = core_for(three, after, previous_masters=before)
    try:
        client = CacheClient(core, Codec())
        moved = [key for key in KEYS if core.previous_shard_for(key) is not None]
        assert moved, "the change moves some keys"
        half = len(KEYS) // 2
        for key in KEYS[:half]:
            assert client.get(key) == f"v{key}"
        assert client.get_many(KEYS[half:]) == {key: f"v{key}" for key in KEYS[half:]}
        for key in moved[:50]:  # each now on its owner, with its TTL kept (the previous owner
            # keeps its copy until the migration or a write removes it)
            assert where(three, key) == sorted(
                {core.shard_for(key).name, core.previous_shard_for(key).name}  # type: ignore[union-attr]
            )
            ttl = client.ttl(key)
            assert ttl is not None and 595 < ttl <= 600
    finally:
        core.close()


def _reply_skips(cluster: LocalSentinelCluster) -> int:
    """``CLIENT REPLY`` calls served by every master so far."""
    total = 0
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            total += node.info("commandstats").get("cmdstat_client|reply", {}).get("calls", 0)
    return total


@pytest.mark.parametrize("allowed", [True, False], ids=["posted", "acl-refuses-client-reply"])
def test_a_read_moves_the_key_without_waiting_where_the_owner_allows_it(
    three: LocalSentinelCluster, allowed: bool
) -> None:
    """The copy a read writes on the owner goes out with ``CLIENT REPLY SKIP`` (the read does not
    wait for it) on masters that allow it; a master whose ACL forbids ``CLIENT REPLY`` gets an
    acknowledged ``SET NX`` instead. Either way the key lands on its owner and the connections
    stay in step."""
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    placed(three, before).close()
    user: dict[str, object] = {}
    if not allowed:
        for name in three.master_names:
            with three.node_client(three.master_address(name)) as node:
                node.execute_command(
                    "ACL", "SETUSER", "noskip", "on", ">noskip-pw", "~*", "+@all", "-client|reply"
                )
        user = {"username": "noskip", "password": "noskip-pw"}
    core = core_for(three, after, previous_masters=before, **user)
    try:
        client = CacheClient(core, Codec())
        moved = [key for key in KEYS if core.previous_shard_for(key) is not None][:40]
        calls = _reply_skips(three)
        for key in moved:
            assert client.get(key) == f"v{key}"
        assert all(shard.allows("CLIENT REPLY") is allowed for shard in core.shards[2:])
        skipped = _reply_skips(three) - calls  # the probe (CLIENT REPLY ON) counts too
        assert skipped > len(moved) if allowed else skipped == 0
        wait_until(
            lambda: all(core.shard_for(key).name in where(three, key) for key in moved),
            5,
            "every read key on its owner",
        )
        assert client.get_many(moved) == {key: f"v{key}" for key in moved}  # still in step
    finally:
        core.close()
        if not allowed:
            for name in three.master_names:
                with three.node_client(three.master_address(name)) as node:
                    node.execute_command("ACL", "DELUSER", "noskip")


def test_reweighting_keeps_every_key_readable(three: LocalSentinelCluster) -> None:
    placed(three, ["shard0", "shard1"]).close()
    core = core_for(
        three, ["shard0", "shard1"], weights=[1, 3], previous_masters=["shard0", "shard1"]
    )
    try:
        client = CacheClient(core, Codec())
        assert any(core.previous_shard_for(key) for key in KEYS)
        assert client.get_many(KEYS) == {key: f"v{key}" for key in KEYS}
    finally:
        core.close()


def test_writes_and_deletes_leave_no_old_copy(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    placed(three, before).close()
    core = core_for(three, after, previous_masters=before)
    try:
        client = CacheClient(core, Codec())
        moved = [key for key in KEYS if core.previous_shard_for(key) is not None][:6]
        a, b, c, d, e, f = moved
        client.set(a, "new", 600)  # an overwrite: the old copy goes
        assert where(three, a) == [core.shard_for(a).name] and client.get(a) == "new"
        assert client.delete(b) is True and where(three, b) == [] and client.get(b) is None
        assert client.add(c, "other", 600) is False  # it exists (on its previous owner)
        assert client.get(c) == f"v{c}"
        client.set_many({d: 1}, 600)
        assert where(three, d) == [core.shard_for(d).name]
        assert client.delete_many([e]) == 1 and where(three, e) == []
        assert client.has_key(f) and core.shard_for(f).name in where(three, f)
    finally:
        core.close()


def test_async_reads_fall_back_too(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    placed(three, before).close()
    core = core_for(three, after, previous_masters=before)

    async def go() -> None:
        client = AsyncCacheClient(core, Codec())
        moved = [key for key in KEYS if core.previous_shard_for(key) is not None][:20]
        assert await client.get(moved[0]) == f"v{moved[0]}"
        assert await client.get_many(moved[1:]) == {key: f"v{key}" for key in moved[1:]}
        await client.aclose()

    try:
        asyncio.run(go())
    finally:
        core.close()


def test_without_previous_masters_nothing_changes(three: LocalSentinelCluster) -> None:
    core = core_for(three, ["shard0", "shard1"])
    try:
        assert core.previous_ring is None and core.departed == ()
        assert core.previous_shard_for("any") is None
    finally:
        core.close()


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"previous_weights": [1, 1]}, "previous_weights"),
        ({"previous_masters": ["a", "a"]}, "previous_masters"),
        ({"previous_masters": ["a"], "previous_weights": [0]}, "previous_weights"),
    ],
)
def test_bad_previous_options_are_named(options: dict[str, object], option: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PoolConfig.create(["a", "b"], ["127.0.0.1:26379"], **options)
    assert caught.value.option == option


def test_concurrent_readers_of_a_moving_key_never_miss(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    placed(three, before).close()
    core = core_for(three, after, previous_masters=before)
    moved = [key for key in KEYS if core.previous_shard_for(key) is not None]
    misses: list[str] = []

    def read() -> None:
        client = CacheClient(core, Codec())
        misses.extend(key for key in moved if client.get(key) is None)

    try:
        with Workers(timeout=60) as workers:
            for n in range(4):
                workers.spawn(read, name=f"reader-{n}")
        assert misses == []
    finally:
        core.close()


def test_a_moving_key_holding_a_list_reads_as_a_miss(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    placed(three, before).close()
    core = core_for(three, after, previous_masters=before)
    try:
        key = next(k for k in (f"rs:list:{n}" for n in range(1000)) if core.previous_shard_for(k))
        previous = core.previous_shard_for(key)
        assert previous is not None
        execute(core, previous, lambda client: client.rpush(key, "x"))
        assert CacheClient(core, Codec()).get(key, "default") == "default"
    finally:
        core.close()
