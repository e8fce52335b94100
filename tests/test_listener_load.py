"""What many processes on few cores ask of the sentinels (issue 27, item 4): a listener kept
busy longer than its silence limit keeps its subscription, one resync covers the listeners that subscribed before it, and a switch already applied asks the
sentinels nothing more."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import redis
from waiting import wait_until

from sentinel_cache.core.config import Address
from sentinel_cache.core.topology import sentinels
from sentinel_cache.core.topology.listener import SWITCH, SharedResync
from sentinel_cache.core.topology.shard import SwitchEvent
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

pytestmark = pytest.mark.failover

ClusterFactory = Any

#: Longer than a listener's silence limit (3 s from the last message read, before).
BUSY = 4.5


def listeners_connected(pool: ShardedSentinelPool) -> bool:
    listeners = pool.listeners.listeners() if pool.listeners is not None else []
    return bool(listeners) and all(listener.connected for listener in listeners)


def test_a_listener_busy_longer_than_its_silence_limit_keeps_its_subscription(
    make_cluster: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applying a switch takes a listener's thread away from its socket (a SENTINEL MASTER and
    a ROLE, seconds on a saturated machine: here 4.5 s of it). Back, it reads the answers to
    its PINGs waiting there instead of taking the silence for a dead sentinel, resubscribing
    and asking every sentinel again."""
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    name = cluster.master_names[0]
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses)
    switches: list[SwitchEvent] = []
    pool.on_switch(switches.append)
    announce = pool.on_switch_announced
    busy: list[float] = []

    def slow(*args: Any, **kwargs: Any) -> None:
        time.sleep(BUSY)  # the machine's load, on the thread that reads the socket
        busy.append(BUSY)
        announce(*args, **kwargs)

    monkeypatch.setattr(pool, "on_switch_announced", slow)
    try:
        pool.discover()
        wait_until(lambda: listeners_connected(pool), 10, "listeners")
        assert pool.listeners is not None
        listeners = pool.listeners.listeners()
        old = cluster.master_address(name)
        cluster.failover(name)
        new = Address(*cluster.wait_for_master_change(name, old, timeout=30))
        wait_until(lambda: pool.shards[0].address == new, BUSY + 10, "the switch")
        wait_until(lambda: bool(busy), BUSY + 10, "a listener back from its busy switch")
        # (the shard may have moved first through another path: the stale-fence check or the
        # replica events' question, while the announcing listeners were busy)
        assert switches and switches[-1].new == new, switches
        # The busy listener's verdict on its silence comes at its next read (at once) or its
        # next PING (within a ping interval, 1 s): watch a little longer than that.
        time.sleep(1.5)
        assert [listener.connects for listener in listeners] == [1, 1, 1], listeners
    finally:
        pool.close()


def test_one_resync_covers_the_listeners_that_subscribed_before_it_began(
    cluster: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        pool.discover()
        asked: list[str] = []
        recheck = pool.recheck

        def counted(*, source: str) -> None:
            asked.append(source)
            recheck(source=source)

        monkeypatch.setattr(pool, "recheck", counted)
        resync = SharedResync(pool)
        subscribed = time.monotonic()
        resync(subscribed, "first")
        resync(subscribed, "subscribed before the first began")
        assert asked == ["first"]
        resync(time.monotonic(), "subscribed after it began")
        assert asked == ["first", "subscribed after it began"]
    finally:
        pool.close()


def test_a_switch_already_applied_asks_nothing_unless_writes_are_held(
    cluster: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses)
    try:
        pool.discover()
        wait_until(lambda: listeners_connected(pool), 10, "listeners")
        assert pool.listeners is not None
        listener = pool.listeners.listeners()[0]
        shard = pool.shards[0]
        announced: list[Address] = []
        monkeypatch.setattr(
            pool, "on_switch_announced", lambda shard, address, **_: announced.append(address)
        )
        here = shard.address
        assert here is not None
        elsewhere = Address(here.host, 1)
        payload = f"{shard.name} {elsewhere.host} {elsewhere.port} {here.host} {here.port}"
        listener.handle(SWITCH, payload)
        assert announced == []  # already there: no SENTINEL MASTER, no ROLE
        shard.raise_fence("+promoted-slave")
        try:
            listener.handle(SWITCH, payload)
            assert announced == [here]  # held writes are released through the announcement
        finally:
            shard.lower_fence()
        moved = f"{shard.name} {here.host} {here.port} {elsewhere.host} {elsewhere.port}"
        listener.handle(SWITCH, moved)
        assert announced == [here, elsewhere]
    finally:
        pool.close()


def discovery_sockets(cluster: ClusterFactory, name: str) -> int:
    """Connections named ``name`` on every sentinel that are not subscribed (the listeners')."""
    count = 0
    for host, port in cluster.sentinel_addresses:
        with redis.Redis(host, port, socket_timeout=5) as client:
            for row in client.client_list():
                if (
                    row.get("name") == name
                    and row.get("sub", "0") == "0"
                    and "P" not in row.get("flags", "")
                ):
                    count += 1
    return count


def test_an_idle_process_keeps_no_discovery_socket_open(
    cluster: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the sentinels have been asked nothing for IDLE_SOCKET_SECONDS, the housekeeper
    closes the discovery sockets: an idle process holds its listeners' connections only, and
    the next question reconnects."""
    monkeypatch.setattr(sentinels, "IDLE_SOCKET_SECONDS", 0.5)
    name = f"idle-{os.getpid()}"
    pool = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, sentinel_kwargs={"client_name": name}
    )
    try:
        pool.discover()
        wait_until(lambda: listeners_connected(pool), 10, "listeners")
        assert discovery_sockets(cluster, name) > 0  # the discovery just asked every sentinel
        wait_until(lambda: discovery_sockets(cluster, name) == 0, 10, "idle sockets closed")
        assert pool.discover() == {
            n: Address(*cluster.master_address(n)) for n in cluster.master_names
        }
    finally:
        pool.close()
