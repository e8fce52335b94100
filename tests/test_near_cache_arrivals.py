"""A near-cache copy is not served once its invalidation has reached the process, however long
the tracker thread waits to apply it (the GIL held by busy client threads, a starved CPU): a
hit looks at the invalidation socket, and at the tracker's "applying" flag, first
(``near_tracking.Arrivals``). Found by the history checker: with 16 busy threads per process
on a loaded machine, reads 120-200 ms after an acknowledged overwrite returned the old copy.

Real servers; the tracker is held where a starved one would be: before it reads the socket
(the invalidation waits there), and while it applies what it read.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_near_cache_truth import near_status, outsider, tracked
from waiting import wait_until

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology import near_tracking
from sentinel_cache.core.topology.near import NearCache
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

HOLD_S = 10  # the longest the tracker is held: the test releases it far sooner


@pytest.fixture
def core(cluster: LocalSentinelCluster, near_push: bool) -> Iterator[ShardedSentinelPool]:
    made = ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        near_cache=True,
        near_cache_push=near_push,
        db=10,
    )
    CacheClient(made, Codec()).clear(None)
    wait_until(lambda: tracked(made), 5, "tracking")
    yield made
    made.close()


def _kept(client: CacheClient, core: ShardedSentinelPool, key: str) -> None:
    """``key`` written as "old" and read until its copy serves the reads."""
    assert client.set(key, "old", 600) is True

    def hit() -> bool:
        before = near_status(core, key)["hits"]
        assert client.get(key) == "old"
        return near_status(core, key)["hits"] > before

    wait_until(hit, 5, "a near-cache hit")


class _HeldSelect:
    """The tracker module's ``select``, whose ``select`` blocks while ``held`` is set: each
    tracker thread waits there as a starved one would, its invalidations left on its socket.
    Other threads pass (in push mode a write's caller waits there for its reply)."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()
        self.waiting: set[threading.Thread] = set()
        self.poll = select.poll
        self.POLLIN = select.POLLIN

    def select(self, *args: Any) -> Any:
        tracker = threading.current_thread().name.startswith("sentinel_cache-near-")
        if tracker and self.held.is_set():
            self.waiting.add(threading.current_thread())
            assert self.release.wait(HOLD_S), "the test never released the tracker"
        return select.select(*args)


def test_an_invalidation_waiting_on_the_socket_is_not_served_past(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = CacheClient(core, Codec())
    key = "arrivals:socket"
    _kept(client, core, key)
    shim = _HeldSelect()
    monkeypatch.setattr(near_tracking, "select", shim)
    shim.held.set()
    try:
        # every shard's tracker held (one of them tracks the key)
        wait_until(lambda: len(shim.waiting) == len(core.shards), HOLD_S, "trackers held")
        # Another writer, acknowledged: its invalidation is on the tracker's socket now.
        other = outsider(core, key)
        other.set(key, Codec().dumps("new"))
        other.close()
        print("STATUS", near_status(core, key))
        got = [client.get(key) for _ in range(3)]
        print("STATUS", near_status(core, key))
    finally:
        shim.held.clear()
        shim.release.set()
    assert got == ["new"] * 3


def test_an_invalidation_being_applied_is_not_served_past(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = CacheClient(core, Codec())
    key = "arrivals:applying"
    _kept(client, core, key)
    applying, release = threading.Event(), threading.Event()
    original = NearCache.invalidate

    def invalidate(self: NearCache, index: int, keys: Any) -> None:
        if keys is not None and any(key.encode() in raw for raw in keys):
            applying.set()  # read off the socket, not applied: the tracker is held here
            assert release.wait(HOLD_S), "the test never released the tracker"
        original(self, index, keys)

    monkeypatch.setattr(NearCache, "invalidate", invalidate)
    try:
        other = outsider(core, key)
        other.set(key, Codec().dumps("new"))
        other.close()
        assert applying.wait(HOLD_S), "the invalidation never reached the tracker"
        got = [client.get(key) for _ in range(3)]
    finally:
        release.set()
    assert got == ["new"] * 3


def test_a_kept_write_whose_writer_connection_was_killed_is_resent_on_the_pool(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync ``set`` of a kept key goes on the near cache's writer connection. Killed by the
    node (``CLIENT KILL``, as the sentinels do on every reconfiguration) before the tracker
    noticed, the write is sent again on the master's pool (it was never sent, or it is
    idempotent): before, that resend asked the pool-less writer to disconnect its pool and
    raised ``AttributeError``."""
    client = CacheClient(core, Codec())
    key = "arrivals:writer-killed"
    _kept(client, core, key)
    shim = _HeldSelect()
    monkeypatch.setattr(near_tracking, "select", shim)
    shim.held.set()
    try:
        wait_until(lambda: len(shim.waiting) == len(core.shards), HOLD_S, "trackers held")
        admin = outsider(core, key)
        assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 2
        admin.close()
        assert client.set(key, "after the kill", 600) is True
    finally:
        shim.held.clear()
        shim.release.set()
    assert client.get(key) == "after the kill"


def test_an_invalidation_applied_between_the_lookup_and_the_check_is_not_served_past(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reading thread finds the copy, then waits for the GIL while the tracker reads and
    applies an invalidation that had arrived before the read began; when the reader looks,
    nothing is pending any more. It must look the copy up again rather than serve the one it
    found (the history checker's near-cache finding: reads 2 to 25 ms after another process's
    acknowledged overwrite returned the old copy, on a loaded machine with 16 threads)."""
    client = CacheClient(core, Codec())
    key = "arrivals:between"
    _kept(client, core, key)
    shim = _HeldSelect()
    monkeypatch.setattr(near_tracking, "select", shim)
    shim.held.set()
    original = near_tracking.Arrivals.pending
    looked: list[bool] = []

    def pending(self: near_tracking.Arrivals) -> bool:
        if not looked:  # the reader has found the copy: now the tracker runs, to the end
            shim.held.clear()
            shim.release.set()
            wait_until(lambda: near_status(core, key)["entries"] == 0, HOLD_S, "applied")
            wait_until(lambda: not original(self), HOLD_S, "nothing pending")
        looked.append(True)
        return original(self)

    try:
        wait_until(lambda: len(shim.waiting) == len(core.shards), HOLD_S, "trackers held")
        other = outsider(core, key)
        other.set(key, Codec().dumps("new"))  # acknowledged: its invalidation has arrived
        other.close()
        monkeypatch.setattr(near_tracking.Arrivals, "pending", pending)
        got = client.get(key)
    finally:
        shim.held.clear()
        shim.release.set()
    assert looked, "the read never looked for pending invalidations"
    assert got == "new"
