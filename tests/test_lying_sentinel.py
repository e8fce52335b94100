"""One lying sentinel must never put two shards on one node (issue 22, finding 3).

The liar is a fake sentinel (:class:`~sentinel_cache.testing.fake_sentinel.FakeSentinel`: a real
sentinel adds nothing to a wrong answer) that names shard 1's master for shard 0. Of the two
honest sentinels one is down and the other answers 50 ms late (a fresh cache makes four round
trips to each sentinel before its answer, and the fake takes tens of milliseconds over its own),
so the liar's answer comes first and the votes are tied one to one: the case where the first
reply used to win.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from waiting import key_on, wait_until

from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.client import execute
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ConflictingMasterError
from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.fake_sentinel import FakeSentinel

ClusterFactory = Callable[..., LocalSentinelCluster]
SHORT = {"socket_timeout": 0.3, "socket_connect_timeout": 0.3}
TRIES = 20


class Liar:
    """A fake sentinel naming ``answers[name]`` for each master name (changeable meanwhile)."""

    def __init__(self, answers: dict[str, Address]) -> None:
        self.answers = answers
        self.fake = FakeSentinel(
            {
                ("SENTINEL", "GET-MASTER-ADDR-BY-NAME"): self._master,
                ("SENTINEL", "SENTINELS"): [],
                ("SENTINEL", "REPLICAS"): [],
            }
        )
        self.address = self.fake.address

    def _master(self, args: list[bytes]) -> Any:
        address = self.answers.get(args[2].decode())
        return None if address is None else [address.host, str(address.port)]


@pytest.fixture
def lying_topology(
    make_cluster: ClusterFactory,
) -> Iterator[tuple[LocalSentinelCluster, Liar, list[Address]]]:
    """Two shards; sentinels: the liar (naming shard 1's master for both shards) in place of
    sentinel 0 (stopped: the honest sentinels would otherwise introduce it as a peer, a third
    vote), sentinel 1 stopped, and sentinel 2 answering each reply 50 ms after the liar."""
    cluster = make_cluster(shards=2, replicas=1, sentinels=3, faults=True)
    names = cluster.master_names
    b = Address(*cluster.master_address(names[1]))
    liar = Liar({names[0]: b, names[1]: b})
    cluster.stop_sentinel(0)
    cluster.stop_sentinel(1)
    cluster.delay("sentinel:2", 50)
    sentinels = [liar.address, *map(Address._make, cluster.sentinel_addresses[1:])]
    try:
        yield cluster, liar, sentinels
    finally:
        liar.fake.close()


def conflict_warnings(caplog: pytest.LogCaptureFixture, liar: Liar, names: list[str]) -> list[str]:
    """The warnings that name the liar and both shards."""
    return [
        message
        for record in caplog.records
        if record.levelno >= logging.WARNING
        and str(liar.address) in (message := record.getMessage())
        and all(name in message for name in names)
    ]


def test_fresh_caches_never_put_two_shards_on_one_node(
    lying_topology: tuple[LocalSentinelCluster, Liar, list[Address]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster, liar, sentinels = lying_topology
    names = cluster.master_names
    a, b = (Address(*cluster.master_address(name)) for name in names)
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    merged = []
    written = []
    for attempt in range(TRIES):
        pool = ShardedSentinelPool(names, sentinels, sentinel_kwargs=SHORT, listeners=False)
        try:
            found = pool.discover()
            key = key_on(pool, 0, f"try{attempt}")
            execute(pool, pool.shards[0], lambda c, k=key: c.set(k, "x"))
            written.append(key)
        finally:
            pool.close()
        assert found[names[1]] == b, found
        if found[names[0]] != a:
            merged.append(attempt)
    print(
        f"\nlying sentinel: {len(merged)} of {TRIES} fresh caches put shard 0 on shard 1's master"
    )
    with cluster.node_client(b) as shard1_master:
        misplaced = [key for key in written if shard1_master.exists(key)]
    assert merged == [], f"{len(merged)} of {TRIES} caches mapped shard 0 onto {b}"
    assert misplaced == []
    assert conflict_warnings(caplog, liar, names), [r.getMessage() for r in caplog.records]


def test_a_running_cache_never_flips(
    lying_topology: tuple[LocalSentinelCluster, Liar, list[Address]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every path that asks the sentinels again (discover, the safety net's re-resolve, the
    listener's resync, a replica change) refuses the liar's answer for a running cache too."""
    cluster, liar, sentinels = lying_topology
    names = cluster.master_names
    a, b = (Address(*cluster.master_address(name)) for name in names)
    liar.answers[names[0]] = a  # honest while the cache starts
    pool = ShardedSentinelPool(names, sentinels, sentinel_kwargs=SHORT, listeners=False)
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    try:
        assert pool.discover() == {names[0]: a, names[1]: b}
        liar.answers[names[0]] = b
        shard = pool.shards[0]
        seen = []
        for _ in range(TRIES):
            seen.append(pool.discover()[names[0]])
            pool.reresolve(shard, reason="test", force=True)
            seen.append(shard.address)
            pool.recheck(source="resync after subscribing to the test")
            seen.append(shard.address)
            pool.refresh_replicas(names[0])
            seen.append(shard.address)
        switches = shard.switch_count
    finally:
        pool.close()
    print(f"\nrunning cache: {seen.count(b)} of {len(seen)} answers flipped to {b}")
    assert seen == [a] * len(seen), f"{seen.count(b)} of {len(seen)} answers flipped to {b}"
    assert switches == 0
    assert conflict_warnings(caplog, liar, names)


def test_an_event_naming_another_shards_master_is_refused(
    lying_topology: tuple[LocalSentinelCluster, Liar, list[Address]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The listener's path: a ``+switch-master`` (one sentinel's word) naming shard 1's master
    for shard 0 is refused before ``ROLE`` is even asked, and the refusal names both shards
    and the sentinel."""
    cluster, liar, sentinels = lying_topology
    names = cluster.master_names
    a, b = (Address(*cluster.master_address(name)) for name in names)
    liar.answers[names[0]] = a
    pool = ShardedSentinelPool(names, sentinels, sentinel_kwargs=SHORT, listeners=False)
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    try:
        pool.discover()
        shard = pool.shards[0]
        pool.on_switch_announced(
            shard,
            b,
            source=f"+switch-master from {liar.address}",
            received=time.monotonic(),
            sentinel=liar.address,
        )
        assert (shard.address, shard.switch_count) == (a, 0)
    finally:
        pool.close()
    assert conflict_warnings(caplog, liar, names)


def test_a_node_another_shard_held_is_refused_without_a_majority(
    lying_topology: tuple[LocalSentinelCluster, Liar, list[Address]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Shard 1 fails over; its old master is made a master again by hand (as a stale old master
    back from a partition is). The liar names it for shard 0: it answers ROLE master and no
    shard holds it now, but shard 1 did, and only one sentinel says otherwise."""
    cluster, liar, sentinels = lying_topology
    names = cluster.master_names
    a, b = (Address(*cluster.master_address(name)) for name in names)
    liar.answers[names[0]] = a
    pool = ShardedSentinelPool(names, sentinels, sentinel_kwargs=SHORT, listeners=False)
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    try:
        pool.discover()
        cluster.failover(names[1])
        b2 = Address(*cluster.wait_for_master_change(names[1], b, timeout=30))
        liar.answers[names[1]] = b2
        wait_until(lambda: pool.discover()[names[1]] == b2, 10, "shard 1 to move")
        with cluster.node_client(b) as old:
            wait_until(lambda: role_of(old) == "slave", 30, "the old master to be demoted")
            old.execute_command("REPLICAOF", "NO", "ONE")
            assert role_of(old) == "master"
        liar.answers[names[0]] = b
        shard = pool.shards[0]
        seen = []
        for _ in range(5):
            seen.append(pool.discover()[names[0]])
            pool.reresolve(shard, reason="test", force=True)
            seen.append(shard.address)
    finally:
        pool.close()
    assert seen == [a] * len(seen), seen
    assert conflict_warnings(caplog, liar, names)


def role_of(client: Any) -> str:
    value = client.execute_command("ROLE")[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def test_a_name_whose_only_answers_are_taken_fails_naming_the_conflict(
    lying_topology: tuple[LocalSentinelCluster, Liar, list[Address]],
) -> None:
    """A liar that swaps the two masters leaves a tie for both: neither shard can be told
    apart, so neither is mapped (an error naming both shards and the liar), never merged."""
    cluster, liar, sentinels = lying_topology
    names = cluster.master_names
    a, b = (Address(*cluster.master_address(name)) for name in names)
    liar.answers.update({names[0]: b, names[1]: a})
    pool = ShardedSentinelPool(
        names, sentinels, sentinel_kwargs=SHORT, listeners=False, discovery_timeout=1.0
    )
    try:
        with pytest.raises(ConflictingMasterError) as raised:
            pool.discover()
    finally:
        pool.close()
    message = str(raised.value)
    assert str(liar.address) in message and all(repr(n) in message for n in names), message
