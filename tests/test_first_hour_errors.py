"""Mistakes caught where they are made (issue 25): sentinels nobody answers on fail the first call
within DISCOVERY_TIMEOUT, naming LOCATION and the timeout; a master name no sentinel monitors says
which was meant, as the system check does; an unknown option names the closest ones only."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator

import pytest
from waiting import key_on

from sentinel_cache.core.config import parse_cache_config
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.options import OPTION_NAMES
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ConfigurationError, ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

DISCOVERY_TIMEOUT = 1.5
#: The sentinels' default socket timeouts (0.5 s each): a round already under way may end
#: that late, and the process needs some slack on a loaded machine.
SLACK = 1.0


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def mute_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a wrong service, a stuck process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("client", ["sync", "asyncio"])
@pytest.mark.parametrize("kind", ["closed", "mute"])
def test_unreachable_sentinels_fail_the_first_call_within_discovery_timeout(
    kind: str, client: str, closed_port: int, mute_port: int
) -> None:
    port = closed_port if kind == "closed" else mute_port
    config, _ = parse_cache_config(
        [f"127.0.0.1:{port}"], {"MASTERS": ["shard_a"], "DISCOVERY_TIMEOUT": DISCOVERY_TIMEOUT}
    )
    pool = ShardedSentinelPool.from_config(config)
    try:
        started = time.monotonic()
        with pytest.raises(ShardUnavailableError) as raised:
            if client == "sync":
                CacheClient(pool, Codec()).get("k")
            else:
                asyncio.run(AsyncCacheClient(pool, Codec()).get("k"))
        elapsed = time.monotonic() - started
    finally:
        pool.close()
    assert elapsed < DISCOVERY_TIMEOUT + SLACK, elapsed
    message = str(raised.value)
    assert f"no sentinel of LOCATION (127.0.0.1:{port}) answered" in message
    assert f"within DISCOVERY_TIMEOUT ({DISCOVERY_TIMEOUT:g} s)" in message


def test_a_master_no_sentinel_monitors_says_which_was_meant(cluster: LocalSentinelCluster) -> None:
    first, second = cluster.master_names
    wrong = second.upper()
    pool = ShardedSentinelPool([first, wrong], cluster.config()["sentinels"])
    try:
        with pytest.raises(ShardUnavailableError) as raised:
            pool.client_for(key_on(pool, 1)).get("k")
    finally:
        pool.close()
    message = str(raised.value)
    assert f"master {wrong!r}: no sentinel monitors this name" in message
    # The words of the system check (E003) and sentinel_status: one helper.
    assert f"; they monitor: {first!r}, {second!r}; did you mean {second!r}?" in message


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("WIEGHTS", "; did you mean 'WEIGHTS'?"),
        ("MASTER", "; did you mean 'MASTERS'?"),
        ("SOCKET_TIMEOT", "; did you mean 'SOCKET_TIMEOUT'?"),
        ("XYZ", " (docs/configuration.md lists every option)"),
    ],
)
def test_an_unknown_option_names_the_closest_not_every_option(name: str, hint: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_cache_config(["127.0.0.1:26379"], {"MASTERS": ["a"], name: 1})
    assert raised.value.reason == f"unknown option {name!r}{hint}"
    shown = [option for option in OPTION_NAMES if repr(option) in str(raised.value)]
    assert len(shown) <= 1, shown


def test_a_string_masters_is_refused_unless_it_lists_several() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_cache_config(["127.0.0.1:26379"], {"MASTERS": "shard_a"})
    assert raised.value.option == "MASTERS" and raised.value.value == "shard_a"
    assert '"MASTERS": ["shard_a"] for one shard' in str(raised.value)
    # A comma-separated string (an environment variable, the URL) names the list itself.
    config, _ = parse_cache_config(["127.0.0.1:26379"], {"MASTERS": "shard_a,shard_b"})
    assert config.masters == ("shard_a", "shard_b")
    config, _ = parse_cache_config("sentinel://127.0.0.1:26379?masters=shard_a", {})
    assert config.masters == ("shard_a",)


def test_data_nodes_in_location_say_so_per_shard_without_acl_advice(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """LOCATION listing the data nodes (issue 38): each shard's error quotes its own command
    (shard 1 quoted shard 0's), says the addresses are data nodes, not sentinels, and nothing
    advises an ACL change (a data node refuses SENTINEL MASTER too, without NOPERM)."""
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    nodes = ["{}:{}".format(*cluster.master_address(name)) for name in cluster.master_names]
    config, _ = parse_cache_config(
        nodes, {"MASTERS": cluster.master_names, "DISCOVERY_TIMEOUT": DISCOVERY_TIMEOUT}
    )
    pool = ShardedSentinelPool.from_config(config)
    messages = []
    try:
        for index, name in enumerate(cluster.master_names):
            with pytest.raises(ShardUnavailableError) as raised:
                pool.client_for(key_on(pool, index)).get("k")
            message = str(raised.value)
            messages.append(message)
            assert f"'GET-MASTER-ADDR-BY-NAME' '{name}'" in message, message
            other = cluster.master_names[1 - index]
            assert f"'{other}'" not in message, message
            assert (
                f"{nodes[0]}: not a sentinel: " in message
                and f"{nodes[1]}: not a sentinel" in message
            )
            assert (
                "answers as a Redis data node, not as a sentinel: LOCATION (Flask: CACHE_REDIS_SENTINELS) must list the "
                "sentinels' host:port" in message
            )
    finally:
        pool.close()
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "+sentinel|master" not in logged + "".join(messages)


def test_a_master_name_no_sentinel_monitors_gets_no_acl_advice(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    pool = ShardedSentinelPool([cluster.master_names[0], "nosuch"], cluster.config()["sentinels"])
    try:
        with pytest.raises(ShardUnavailableError, match="no sentinel monitors this name"):
            pool.client_for(key_on(pool, 1)).get("k")
    finally:
        pool.close()
    assert "+sentinel|master" not in "\n".join(r.getMessage() for r in caplog.records)
