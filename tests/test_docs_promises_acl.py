"""The minimal ACLs of docs/security.md are enough: the cache runs as users allowed exactly the
commands the page lists, read from the page itself, on real servers.

The data-node users get the page's first row ("every cache operation") and, for each feature,
that feature's row too, on the keys ``~web:*`` and ``~sentinel_cache:*`` and no channel but the
page's; the sentinel user gets the page's sentence. Every operation must then succeed, and no
refused command may be logged. A command the page forgets makes a test fail with the server's
``NOPERM`` (or with a missing config epoch, for ``SENTINEL MASTER``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from waiting import wait_until

from sentinel_cache.core.addresses import Address
from sentinel_cache.core.admin import reshard, status
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.listener import CHANNELS
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

PAGE = Path(__file__).resolve().parent.parent / "docs" / "security.md"
SECRET = "docs-acl-S3cret-5d1e"
KEYS = ("~web:*", "~sentinel_cache:*")


def _rules(tokens: list[str]) -> list[str]:
    """ACL rules for the page's backticked tokens: ``CLIENT ID`` -> ``+client|id``; a channel
    name -> ``&name``."""
    rules = []
    for token in tokens:
        if ":" in token:
            rules.append(f"&{token}")
        elif re.fullmatch(r"[A-Z-]+( [A-Z-]+)?", token):
            rules.append("+" + token.lower().replace(" ", "|"))
    return rules


def data_rows() -> dict[str, list[str]]:
    """The page's table: what a row is needed for -> its ACL rules."""
    text = PAGE.read_text(encoding="utf-8")
    table = text[text.index("| Needed for | Data-node commands |") :].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        needed, commands = line.strip("| ").split(" | ")
        rows[needed] = _rules(re.findall(r"`([^`]+)`", commands))
    return rows


def sentinel_rules() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    sentence = text[text.index("The sentinel user needs") :].split("\n\n", 1)[0]
    tokens = re.findall(r"`([A-Z][A-Z -]+)`", sentence)
    return [*_rules(tokens), *(f"&{channel}" for channel in CHANNELS)]


ROWS = data_rows()
EVERY = "every cache operation"


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """2 shards with a replica each and one sentinel, with the page's sentinel user."""
    with LocalSentinelCluster(shards=2, replicas=1, sentinels=1) as cluster:
        with cluster.sentinel_client(0) as sentinel:
            sentinel.execute_command(
                "ACL", "SETUSER", "docs-watcher", "on", f">{SECRET}", "resetchannels", "-@all",
                *sentinel_rules(),
            )  # fmt: skip
        yield cluster


def data_user(cluster: LocalSentinelCluster, name: str, *rows: str) -> str:
    """An ACL user on every data node allowed the first row and ``rows``, nothing else."""
    rules = [rule for row in (EVERY, *rows) for rule in ROWS[row]]
    for address in cluster.node_addresses():
        with cluster.node_client(address) as node:
            known = [rule for rule in rules if _server_has(node, rule)]
            node.execute_command(
                "ACL", "SETUSER", name, "reset", "on", f">{SECRET}", *KEYS, "resetchannels",
                "-@all", *known,
            )  # fmt: skip
    return name


def _server_has(node: redis.Redis, rule: str) -> bool:
    """Whether the server knows the rule's command (MSETEX: Valkey 9.1+, Redis 8.4+ only)."""
    try:
        node.execute_command("ACL", "SETUSER", "docs-probe", "off", rule)
    except redis.ResponseError:
        return False
    return True


def pool_as(cluster: LocalSentinelCluster, user: str, **options: Any) -> ShardedSentinelPool:
    return ShardedSentinelPool(
        options.pop("masters", cluster.master_names),
        cluster.sentinel_addresses,
        username=user,
        password=SECRET,
        sentinel_kwargs={"username": "docs-watcher", "password": SECRET},
        **options,
    )


@pytest.fixture
def refusals(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The log lines about a refused command, for refusals the cache survives silently."""
    caplog.set_level(logging.DEBUG, logger="sentinel_cache")
    return lambda: [r.getMessage() for r in caplog.records if "permission" in r.getMessage()]


def test_the_first_row_runs_every_cache_operation(
    topology: LocalSentinelCluster, refusals: Callable[[], list[str]]
) -> None:
    pool = pool_as(topology, data_user(topology, "docs-base"))
    try:
        cache = CacheClient(pool, Codec())
        keys = [f"web:base:{i}" for i in range(6)]
        assert cache.set(keys[0], "v", 60) and cache.set(keys[1], "w", None)
        assert cache.get(keys[0]) == "v" and cache.add(keys[2], "x", 60)
        assert not cache.add(keys[2], "y", 60)
        assert cache.set_many({keys[3]: 3, keys[4]: 4}, 60) == []
        assert cache.set_many({keys[3]: 3, keys[4]: 4}, None) == []
        assert cache.get_many(keys) == {
            keys[0]: "v",
            keys[1]: "w",
            keys[2]: "x",
            keys[3]: 3,
            keys[4]: 4,
        }
        assert cache.incr(keys[3], 2) == 5 and cache.incr(keys[5], create=True) == 1
        assert cache.set(keys[5], 2**63 - 2, 60) and cache.incr(keys[5], 10) == 2**63 + 8
        assert cache.touch(keys[0], 120) and cache.has_key(keys[0])
        assert cache.expire(keys[1], 50) and 0 < (cache.ttl(keys[1]) or 0) <= 50
        assert cache.persist(keys[1]) and cache.ttl(keys[1]) is None
        assert cache.pexpire_at(keys[1], int(time.time() * 1000) + 50_000)
        assert sorted(cache.iter_keys("web:base:*")) == sorted(k.encode() for k in keys)
        assert cache.delete(keys[0]) and cache.delete_many(keys[1:3]) == 2
        assert cache.delete_pattern("web:base:3*") == 1
        assert cache.clear("web:base:*") and cache.get_many(keys) == {}
    finally:
        pool.close()
    assert refusals() == []


def test_clear_without_a_prefix_with_its_row(topology: LocalSentinelCluster) -> None:
    pool = pool_as(topology, data_user(topology, "docs-flush", "`clear()` without a `KEY_PREFIX`"))
    try:
        cache = CacheClient(pool, Codec())
        assert cache.set("web:flush", 1, 60) and cache.clear(None)
        assert cache.get("web:flush") is None
    finally:
        pool.close()


def test_a_stampede_waiter_with_its_row(
    topology: LocalSentinelCluster, refusals: Callable[[], list[str]]
) -> None:
    user = data_user(topology, "docs-stampede", "`get_or_set` with `STAMPEDE_PROTECTION`")
    holder, waiter = pool_as(topology, user), pool_as(topology, user, listeners=False)
    computing, outcomes = threading.Event(), []

    def slow() -> str:
        computing.set()
        time.sleep(1.0)  # the other process's caller blocks on the wake stream meanwhile
        return "computed once"

    def hold() -> None:
        try:
            outcomes.append(CacheClient(holder, Codec()).get_or_set("web:cold", slow, 60))
        except Exception as exc:  # noqa: BLE001 - judged below
            outcomes.append(exc)

    thread = threading.Thread(target=hold)
    try:
        CacheClient(holder, Codec()).delete("web:cold")
        thread.start()
        assert computing.wait(10)
        got = CacheClient(waiter, Codec()).get_or_set("web:cold", lambda: "twice", 60)
        thread.join(10)
        assert not thread.is_alive()
    finally:
        holder.close()
        waiter.close()
    assert outcomes == ["computed once"] and got == "computed once"
    assert refusals() == []


@pytest.mark.parametrize(("push", "mode"), [(False, "redirect"), ("auto", "push")])
def test_the_near_cache_with_its_row(
    topology: LocalSentinelCluster, refusals: Callable[[], list[str]], push: Any, mode: str
) -> None:
    user = data_user(topology, f"docs-near-{mode}", "`NEAR_CACHE`")
    pool = pool_as(topology, user, near_cache=True, near_cache_push=push)
    try:
        pool.discover()
        near = pool.near
        assert near is not None
        wait_until(lambda: all(near.status(i)["tracked"] for i in range(2)), 10, "tracking")
        # With "auto", RESP3 push (HELLO needs no ACL rule), not the fallback for servers
        # refusing it.
        assert [near.status(i)["mode"] for i in range(2)] == [mode, mode]
        cache = CacheClient(pool, Codec())
        index = pool.shard_index("web:near")
        assert cache.set("web:near", "v", 60) and cache.get("web:near") == "v"
        assert cache.get("web:near") == "v"
        assert near.status(index)["hits"] >= 1
    finally:
        pool.close()
    assert refusals() == []


def test_resharding_and_the_status_command_with_their_rows(
    topology: LocalSentinelCluster, refusals: Callable[[], list[str]]
) -> None:
    rows = ("resharding (`PREVIOUS_MASTERS`, `sentinel_reshard`)", "the status command")
    user = data_user(topology, "docs-reshard", *rows)
    first, both = topology.master_names[:1], topology.master_names
    old = pool_as(topology, user, masters=first, listeners=False)
    new = pool_as(topology, user, masters=both, previous_masters=first, listeners=False)
    try:
        keys = [f"web:moving:{i}" for i in range(40)]
        assert CacheClient(old, Codec()).set_many(dict.fromkeys(keys, "v"), 600) == []
        moving = [k for k in keys if new.shard_index(k) == 1]
        assert len(moving) >= 2
        cache = CacheClient(new, Codec())
        assert cache.get(moving[0]) == "v"  # served from the previous owner, and copied
        assert cache.delete(moving[1])  # removes the old copy, leaves a tombstone
        report = reshard.migrate(new, match="web:moving:*", delete_delay=0.0)
        assert report.complete and report.errors == ()
        assert cache.get_many(keys) == {k: "v" for k in keys if k != moving[1]}
        health = status.collect(new)
        assert health["state"] == "healthy", health.get("problems")
    finally:
        old.close()
        new.close()
    assert refusals() == []


@pytest.mark.failover
def test_the_sentinel_user_follows_a_failover_with_its_config_epoch(
    topology: LocalSentinelCluster,
) -> None:
    pool = pool_as(topology, data_user(topology, "docs-failover"))
    name = topology.master_names[0]
    try:
        cache = CacheClient(pool, Codec())
        assert cache.set("web:before", 1, 60)
        wait_until(lambda: all(pool.listener_states().values()), 10, "the listener")
        old = pool.shards[0].address
        topology.failover(name)
        wait_until(lambda: pool.shards[0].address not in (None, old), 30, "the switch")
        # SENTINEL MASTER answered: the switch carries the sentinels' config epoch.
        assert pool.sentinels.config_epoch(Address(*topology.sentinel_addresses[0]), name) >= 1
        assert cache.set("web:after", 2, 60) and cache.get("web:before") == 1
    finally:
        pool.close()
