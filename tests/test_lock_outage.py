"""``cache.lock()`` through a crash (issue 36 item 13): its commands go through the safety net
as every other operation's. Before, a lock was redis-py's on a raw client: with the master
SIGKILLed, acquires raised redis-py's bare ``ConnectionError`` naming an address and no shard,
and ``OUTAGE_HOLD`` did not hold them. Now they raise ``ShardUnavailableError`` naming the shard,
and with ``OUTAGE_HOLD`` wait for the new master. The acquire and the release are safe to send
again (the acquire recognises its own token, the release deletes only its own), so a reply lost
in flight does not turn into a wrong answer. Real servers, a real SIGKILL."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.exceptions import LockNotOwnedError
from threads import Workers
from waiting import key_on, wait_until

from sentinel_cache import ShardUnavailableError
from sentinel_cache.core.ops import client as client_module
from sentinel_cache.core.ops._sync import runner as runner_module
from sentinel_cache.core.ops.client import CacheClient, CacheLock
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]
DOWN_AFTER_MS = 1000
#: What docs/failover.md advises for that down-after (given explicitly: the default may change).
HOLD = 5.0
THREADS = 4


@dataclass
class Attempt:
    began: float
    acquired_at: float | None  # when its acquire returned True
    error: BaseException | None


def started(make_cluster: ClusterFactory, hold: float) -> tuple[LocalSentinelCluster, Any]:
    cluster = make_cluster(shards=2, replicas=1, sentinels=3, down_after_ms=DOWN_AFTER_MS)
    pool = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, outage_hold=hold, outage_reads=True
    )
    pool.discover()
    wait_until(
        lambda: all(s["listener_connected"] for s in pool.status()["sentinels"]), 5, "listeners"
    )
    return cluster, pool


def through_a_crash(
    cluster: LocalSentinelCluster, pool: ShardedSentinelPool
) -> tuple[list[Attempt], float, float]:
    """``THREADS`` threads take and release locks on shard 0 (a new key each time, so nobody
    waits for another) while its master is SIGKILLed; until this process has switched and half
    a second after. The attempts, when the kill was and when this process switched."""
    client = CacheClient(pool, Codec())
    shard, name = pool.shards[0], cluster.master_names[0]
    attempts: list[Attempt] = []

    def work(workers: Workers, n: int) -> None:
        count = 0
        while not workers.stop.is_set():
            key = key_on(pool, 0, f"lock-{n}-{count}")
            count += 1
            attempt = Attempt(time.monotonic(), None, None)
            attempts.append(attempt)
            try:
                lock = client.lock(key, timeout=30)
                assert lock.acquire(blocking=False), "a free lock was not acquired"
                attempt.acquired_at = time.monotonic()
                lock.release()
            except AssertionError:
                raise
            except Exception as exc:
                attempt.error = exc
            workers.stop.wait(0.005)

    generation = shard.generation
    with Workers(timeout=HOLD + 20) as workers:
        for n in range(THREADS):
            workers.spawn(work, workers, n, name=f"locker {n}")
        wait_until(lambda: len(attempts) > 4 * THREADS, 10, "locks taken before the kill")
        killed_at = time.monotonic()
        old = cluster.kill_master(name)
        cluster.wait_for_master_change(name, old, timeout=30)
        wait_until(lambda: shard.generation != generation, 10, "this process's switch")
        switched_at = time.monotonic()
        # locks taken on the new master too, by every thread
        seen = len(attempts)
        wait_until(lambda: len(attempts) > seen + 2 * THREADS, 10, "locks after the switch")
    return attempts, killed_at, switched_at


def test_locks_are_held_through_a_sigkill_with_outage_hold(make_cluster: ClusterFactory) -> None:
    cluster, pool = started(make_cluster, HOLD)
    try:
        attempts, killed_at, switched_at = through_a_crash(cluster, pool)
    finally:
        pool.close()
    during = [a for a in attempts if killed_at <= a.began < switched_at]
    lost = [a for a in attempts if isinstance(a.error, LockNotOwnedError)]
    errors = [a.error for a in attempts if a.error is not None and a not in lost]
    print(
        f"\nlocks through a SIGKILL, OUTAGE_HOLD {HOLD:g}: {len(attempts)} acquire+release, "
        f"{len(during)} begun during the outage, {len(errors)} failed, {len(lost)} released "
        f"after the crash lost them; switch {switched_at - killed_at:.2f}s after the kill"
    )
    assert errors == [], errors[:3]
    assert during, "no lock was taken during the outage"
    assert all(a.acquired_at is not None for a in during)  # each held, then taken
    # A lock the crash lost (acquired on the old master, not replicated before the kill) is
    # no longer owned at its release: redis-py's error says so, as it would without a crash.
    assert all(a.acquired_at is not None and a.acquired_at < killed_at + 0.5 for a in lost)


def test_without_a_hold_the_error_names_the_shard(make_cluster: ClusterFactory) -> None:
    cluster, pool = started(make_cluster, 0)
    label = pool.shards[0].label
    try:
        attempts, _, _ = through_a_crash(cluster, pool)
    finally:
        pool.close()
    errors = [a.error for a in attempts if a.error is not None]
    print(f"\nlocks through a SIGKILL, OUTAGE_HOLD 0: {len(attempts)}, {len(errors)} failed")
    assert errors, "the crash failed no lock: the test did not see the outage"
    wrong = [e for e in errors if not isinstance(e, (ShardUnavailableError, LockNotOwnedError))]
    assert wrong == [], [f"{type(e).__module__}.{type(e).__name__}: {e}" for e in wrong[:3]]
    unnamed = [e for e in errors if isinstance(e, ShardUnavailableError) and label not in str(e)]
    assert unnamed == [], [str(e) for e in unnamed[:3]]


# -- what may be sent again: a reply lost after the server ran the command --------------------
@pytest.fixture
def core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, db=11)
    yield pool
    pool.close()


def lose_replies(monkeypatch: pytest.MonkeyPatch, times: int) -> list[Any]:
    """The next ``times`` round trips of a lock run on the server, then their connection
    closes before the reply is read (what a master does when it is reconfigured or dies)."""
    real, lost = client_module.send, []

    def send(redis_client: Any, commands: Any) -> Any:
        replies = real(redis_client, commands)
        if len(lost) < times:
            lost.append(commands)
            raise redis.ConnectionError("Connection closed by server.")
        return replies

    monkeypatch.setattr(client_module, "send", send, raising=False)  # the release's
    monkeypatch.setattr(runner_module, "send", send)  # the other commands'
    return lost


def test_an_acquire_whose_reply_was_lost_is_acquired(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent again after its reply was lost, the acquire finds its own token: held (a bare
    ``SET NX`` resent answers "taken", and the lock stays held by nobody until it expires)."""
    client = CacheClient(core, Codec())
    key = f"lost-acquire-{time.time_ns()}"
    lock = client.lock(key, timeout=30)
    assert isinstance(lock, CacheLock)
    lost = lose_replies(monkeypatch, 1)
    assert lock.acquire(blocking=False)
    assert len(lost) == 1
    assert lock.owned() and 0 < core.client_for(key).pttl(key) <= 30_000
    assert not client.lock(key, timeout=30).acquire(blocking=False)  # held: nobody else gets it
    lock.release()
    assert not lock.locked()


def test_a_release_whose_reply_was_lost_is_released(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The compare-and-delete ran, its reply was lost, the resend finds the lock gone: released
    (logged), not ``LockNotOwnedError``; a release sent once that finds it gone still raises."""
    client = CacheClient(core, Codec())
    key = f"lost-release-{time.time_ns()}"
    lock = client.lock(key, timeout=30)
    assert lock.acquire(blocking=False)
    lost = lose_replies(monkeypatch, 1)
    with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
        lock.release()
    assert len(lost) == 1 and not lock.locked()
    assert any("released by a resend" in r.getMessage() for r in caplog.records)
    expired = client.lock(key, timeout=0.05)
    assert expired.acquire(blocking=False)
    wait_until(lambda: not expired.locked(), 5, "the lock's expiry")
    with pytest.raises(LockNotOwnedError):
        expired.release()


def test_an_additive_extend_whose_reply_was_lost_raises_the_shards_error(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent twice, ``extend`` would add twice: its outcome unknown, it raises the shard's error,
    as ``incr`` does, and added once."""
    client = CacheClient(core, Codec())
    key = f"lost-extend-{time.time_ns()}"
    lock = client.lock(key, timeout=10)
    assert lock.acquire(blocking=False)
    lose_replies(monkeypatch, 1)
    with pytest.raises(ShardUnavailableError, match=re.escape(core.shard_for(key).label)):
        lock.extend(100)
    assert 100_000 < core.client_for(key).pttl(key) <= 110_000
    assert lock.extend(5, replace_ttl=True) and core.client_for(key).pttl(key) <= 5_000
    lock.release()


def test_the_locks_writes_wait_for_replicas_with_durable_replicas(
    core: ShardedSentinelPool,
) -> None:
    """``DURABLE_REPLICAS``: the acquire and the release are each followed by the ``WAIT``
    every other write sends (counted on the master), so a crash right after them loses neither."""
    client = CacheClient(core, Codec(), durable_replicas=1, durable_timeout_ms=2000)
    key = f"durable-{time.time_ns()}"
    master = core.client_for(key)

    def waits() -> int:
        return int(master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

    before = waits()
    lock = client.lock(key, timeout=30)
    assert lock.acquire(blocking=False)
    lock.release()
    assert waits() - before == 2
