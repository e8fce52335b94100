"""A dead shard: IGNORE_EXCEPTIONS fails open per shard (the other shard keeps working), logs at
most once per shard per interval, and nothing raises with an exception-chain cycle."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django_support import build_cache, cache_entry, exception_chain

from sentinel_cache import ShardUnavailableError
from sentinel_cache.core import throttle
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]
DEAD, LIVE = 1, 0
#: These tests are about what a call does once it fails: with the default OUTAGE_HOLD each
#: would first wait for a switch that never comes (the sentinels here are too patient), and
#: reads would be answered by the replica (OUTAGE_READS). Both off: fail at once, as they test.
FAIL_FAST = {"OUTAGE_HOLD": 0, "OUTAGE_READS": False}


class Clock:
    """A monotonic clock the test moves by hand (only the fail-open log throttle uses it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(throttle, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


@pytest.fixture
def dead_shard(make_cluster: ClusterFactory) -> Iterator[LocalSentinelCluster]:
    """Two shards; shard 1's master killed, and sentinels too patient to fail it over."""
    cluster = make_cluster(shards=2, replicas=1, sentinels=3, down_after_ms=600_000)
    yield cluster


def split_keys(cache: ShardedSentinelCache, count: int = 10) -> tuple[list[str], list[str]]:
    dead: list[str] = []
    live: list[str] = []
    i = 0
    while len(dead) < count or len(live) < count:
        key = f"k{i}"
        i += 1
        index = cache.core.shard_for(cache.make_key(key)).index
        bucket = dead if index == DEAD else live
        if len(bucket) < count:
            bucket.append(key)
    return dead, live


def ignored_logs(caplog: pytest.LogCaptureFixture, shard_label: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "sentinel_cache.django" and f"shard {shard_label} " in r.getMessage()
    ]


def test_ignore_exceptions_fails_open_per_shard(
    dead_shard: LocalSentinelCluster, caplog: pytest.LogCaptureFixture, clock: Clock
) -> None:
    cluster = dead_shard
    cache = build_cache(
        cache_entry(
            cluster,
            KEY_PREFIX="fo",
            OPTIONS=FAIL_FAST | {"IGNORE_EXCEPTIONS": True, "LOG_IGNORED_EXCEPTIONS_INTERVAL": 60},
        )
    )
    try:
        dead, live = split_keys(cache)
        cache.set_many({k: k for k in dead + live})
        counter = next(
            f"n{i}"
            for i in range(100)
            if cache.core.shard_for(cache.make_key(f"n{i}")).index == LIVE
        )
        cache.set(counter, 1)
        label = cache.core.shards[DEAD].label
        cluster.kill_master(cluster.master_names[DEAD])
        caplog.set_level(logging.WARNING, logger="sentinel_cache.django")

        d, lv = dead[0], live[0]
        assert cache.get(d) is None
        assert cache.get(d, "default") == "default"
        assert cache.get(lv) == lv
        assert cache.set(d, 1) is False
        assert cache.set(lv, "new") is True and cache.get(lv) == "new"
        assert cache.add(dead[1], 1) is False
        assert cache.touch(d, 10) is False
        assert cache.has_key(d) is False
        assert cache.delete(d) is False
        assert cache.ttl(d) == 0
        assert cache.expire(d, 5) is False and cache.persist(d) is False
        assert cache.get_or_set(d, 5) == 5
        with pytest.raises(ValueError) as raised:
            cache.incr(d)
        assert exception_chain(raised.value) == [raised.value]  # raised from nothing
        assert cache.incr(counter) == 2

        assert cache.get_many(dead + live) == {k: k for k in live if k != lv} | {lv: "new"}
        assert sorted(cache.set_many({k: 0 for k in dead + live})) == sorted(dead)
        assert cache.get_many(live) == {k: 0 for k in live}
        assert cache.delete_many(dead + live[:5]) == 5  # the dead shard's keys are not counted
        assert cache.get_many(live) == {k: 0 for k in live[5:]}
        assert sorted(cache.iter_keys("k*")) == sorted(live[5:])
        assert cache.delete_pattern("k*") == 5
        cache.set("left", 1)
        assert cache.clear() is False  # the live shard is cleared, the dead one skipped
        assert cache.get(counter) is None

        # The same, natively async.
        async def main() -> None:
            assert await cache.aget(d, "dflt") == "dflt"
            assert await cache.aset(d, 1) is False
            assert await cache.aset(lv, "a") is True and await cache.aget(lv) == "a"
            assert await cache.aadd(dead[2], 1) is False
            assert await cache.atouch(d) is False
            assert await cache.ahas_key(d) is False
            assert await cache.adelete(d) is False
            with pytest.raises(ValueError) as araised:
                await cache.aincr(d)
            assert exception_chain(araised.value) == [araised.value]
            assert sorted(await cache.aset_many({k: 1 for k in dead + live})) == sorted(dead)
            assert await cache.aget_many(dead + live) == {k: 1 for k in live}
            assert await cache.adelete_many(dead + live) == len(live)
            assert await cache.aget_many(live) == {}
            assert await cache.aget_or_set(d, 9) == 9
            assert [k async for k in cache.aiter_keys("*")] == []
            assert await cache.aclear() is False

        asyncio.run(main())

        # A shard left out of a scan (iter_keys, delete_pattern, clear, aiter_keys, aclear) is
        # logged every time: the result says nothing of it...
        scans = [r for r in ignored_logs(caplog, label) if "skipped it" in r.getMessage()]
        assert len(scans) == 5, [r.getMessage() for r in scans]
        # ...the dozens of other ignored failures on the dead shard: once in the interval...
        assert len(ignored_logs(caplog, label)) == 1 + len(scans)
        assert "IGNORE_EXCEPTIONS" in ignored_logs(caplog, label)[0].getMessage()
        assert ignored_logs(caplog, cache.core.shards[LIVE].label) == []
        # ...and again once the interval has passed (shared by every cache object of the core).
        clock.now += 61
        other_alias = build_cache(
            cache_entry(
                cluster,
                KEY_PREFIX="fo",
                OPTIONS=FAIL_FAST
                | {"IGNORE_EXCEPTIONS": True, "LOG_IGNORED_EXCEPTIONS_INTERVAL": 60},
            )
        )
        assert other_alias.core is cache.core
        assert other_alias.get(d) is None and cache.get(d) is None
        assert len(ignored_logs(caplog, label)) == 2 + len(scans)
    finally:
        cache.core.close()


def test_without_ignore_errors_raise_without_chain_cycles(
    dead_shard: LocalSentinelCluster,
) -> None:
    cluster = dead_shard
    cache = build_cache(cache_entry(cluster, KEY_PREFIX="raise", OPTIONS=FAIL_FAST))
    try:
        dead, live = split_keys(cache, 5)
        cache.set_many({k: 1 for k in dead + live})
        cluster.kill_master(cluster.master_names[DEAD])
        calls: list[Callable[[], Any]] = [
            lambda: cache.get_many(dead + live),
            lambda: cache.set_many({k: 1 for k in dead + live}),
            lambda: cache.delete_many(dead + live),
            lambda: cache.clear(),
            lambda: list(cache.iter_keys("*")),
            lambda: asyncio.run(cache.aget(dead[0])),
            lambda: asyncio.run(cache.aset_many({k: 1 for k in dead + live})),
            lambda: asyncio.run(cache.aget_many(dead + live)),
            lambda: asyncio.run(cache.aincr(dead[0])),
        ]
        for call in (
            lambda: cache.get(dead[0]),
            lambda: cache.set(dead[0], 1),
            lambda: cache.incr(dead[0]),
        ):
            with pytest.raises(ShardUnavailableError) as unavailable:
                call()
            assert exception_chain(unavailable.value)[1:] and isinstance(
                unavailable.value.__cause__, redis.ConnectionError
            )
        for call in calls:
            with pytest.raises(redis.ConnectionError) as raised:
                call()
            exception_chain(raised.value)  # asserts there is no cycle
        assert cache.set(live[0], 2) and cache.get(live[0]) == 2  # the other shard still works
    finally:
        cache.core.close()
