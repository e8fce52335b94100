"""django-redis's single-key extras on the sharded backend (issue 24): ``set(nx=, xx=)``,
``incr(ignore_key_check=)`` and past 64 bits, ``pttl``, ``pexpire``, ``expire_at``,
``pexpire_at``, ``keys``. Real servers, both shards."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import pytest

from sentinel_cache import ArgumentTypeError, ArgumentValueError, IncrementError
from sentinel_cache.core.ops._sync import client as sync_client
from sentinel_cache.django import ShardedSentinelCache


def on_both_shards(cache: ShardedSentinelCache, stem: str) -> list[str]:
    names = [f"{stem}{i}" for i in range(12)]
    assert {cache.core.shard_for(cache.make_key(n)).index for n in names} == {0, 1}
    return names


def test_set_nx_and_xx(cache: ShardedSentinelCache) -> None:
    for key in on_both_shards(cache, "nx"):
        assert cache.set(key, 1, nx=True) is True
        assert cache.set(key, 2, nx=True) is False and cache.get(key) == 1
        assert cache.set(key, 3, xx=True) is True and cache.get(key) == 3
        cache.delete(key)
        assert cache.set(key, 4, xx=True) is False and not cache.has_key(key)
    # Expiring at once: nx succeeds only where absent and stores nothing; xx deletes.
    cache.set("nx-old", "v")
    assert cache.set("nx-old", "w", timeout=0, nx=True) is False and cache.get("nx-old") == "v"
    assert cache.set("nx-new", "w", timeout=-1, nx=True) is True and not cache.has_key("nx-new")
    assert cache.set("nx-old", "w", timeout=0, xx=True) is True and not cache.has_key("nx-old")
    assert cache.set("nx-old", "w", timeout=0, xx=True) is False
    with pytest.raises(ArgumentValueError, match="xx"):
        cache.set("nx-both", 1, nx=True, xx=True)
    with pytest.raises(ArgumentValueError, match="client"):
        cache.set("nx-both", 1, client=object())
    assert not cache.has_key("nx-both")


def test_incr_ignore_key_check_creates(cache: ShardedSentinelCache) -> None:
    with pytest.raises(ValueError, match="not found"):
        cache.incr("ikc")
    assert cache.incr("ikc", 5, ignore_key_check=True) == 5
    assert cache.incr("ikc", ignore_key_check=True) == 6
    assert cache.ttl("ikc") is None  # created without expiry, as INCRBY does


def test_incr_past_64_bits_keeps_the_value_and_the_ttl(cache: ShardedSentinelCache) -> None:
    top = 2**63 - 1
    cache.set("big", top, 300)
    assert cache.incr("big") == top + 1
    assert cache.get("big") == top + 1
    assert cache.incr("big", 10) == top + 11
    assert cache.decr("big", 12) == top - 1  # back inside 64 bits: stored raw again
    assert cache.incr("big") == top  # the server's INCRBY again
    raw = cache.core.client_for(cache.make_key("big"))
    assert raw.get(cache.make_key("big")) == str(top).encode()
    assert 290 < cache.ttl("big") <= 300
    cache.set("exact", 2**53)  # past a Lua double's exact range: still exact
    assert cache.incr("exact") == 2**53 + 1 and cache.get("exact") == 2**53 + 1
    cache.set("small", -(2**63), 300)
    assert cache.decr("small") == -(2**63) - 1
    cache.set("word", "not a number")
    with pytest.raises(IncrementError):
        cache.incr("word")


def test_incr_past_64_bits_is_not_lost_to_a_concurrent_write(
    cache: ShardedSentinelCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client writes between the read and the write back: the swap refuses, the value
    is read again, and the result adds to what the other client wrote."""
    cache.set("race", 2**64, 300)
    real_value = sync_client.counter_value
    raced = []

    def read_then_race(codec: Any, data: bytes) -> Any:
        value = real_value(codec, data)
        if not raced:
            raced.append(value)
            cache.set("race", 2**65, 300)  # lands between our read and our swap
        return value

    # the integer the fallback read, as it reads it (counter_value: INCR's rule)
    monkeypatch.setattr(sync_client, "counter_value", read_then_race)
    assert cache.incr("race", 1) == 2**65 + 1
    monkeypatch.undo()
    assert raced == [2**64] and cache.get("race") == 2**65 + 1


def test_pttl_and_millisecond_expiries(cache: ShardedSentinelCache) -> None:
    assert cache.pttl("pt-missing") == 0
    cache.set("pt", 1, None)
    assert cache.pttl("pt") is None
    assert cache.pexpire("pt", 60_000) is True
    assert 55_000 < cache.pttl("pt") <= 60_000
    assert cache.pexpire("pt-missing", 1000) is False
    soon = datetime.datetime.now() + datetime.timedelta(seconds=100)
    assert cache.expire_at("pt", soon) is True
    assert 95 < cache.ttl("pt") <= 100
    assert cache.pexpire_at("pt", int((time.time() + 50) * 1000)) is True
    assert 45_000 < cache.pttl("pt") <= 50_000
    assert cache.expire_at("pt", time.time() + 30) is True
    assert 25 < cache.ttl("pt") <= 30
    assert cache.pexpire_at("pt", 1) is True  # a moment past: the key is gone
    assert not cache.has_key("pt")


def test_bad_expiries_are_refused_before_sending(cache: ShardedSentinelCache) -> None:
    cache.set("bad-exp", 1, None)
    with pytest.raises(ArgumentTypeError, match="ms"):
        cache.pexpire("bad-exp", 1.5)
    with pytest.raises(ArgumentTypeError, match="when"):
        cache.expire_at("bad-exp", "tomorrow")
    with pytest.raises(ArgumentTypeError, match="when"):
        cache.pexpire_at("bad-exp", float("nan"))
    with pytest.raises(ArgumentValueError, match="when"):
        cache.expire_at("bad-exp", 1e300)
    assert cache.ttl("bad-exp") is None  # nothing changed


def test_keys_lists_each_key_once(cache: ShardedSentinelCache) -> None:
    names = on_both_shards(cache, "keys")
    cache.set_many({name: 1 for name in names})
    cache.set("other", 1)
    assert sorted(cache.keys("keys*")) == sorted(names)
    assert cache.keys("nothing-here*") == []


def test_async_twins(cache: ShardedSentinelCache) -> None:
    async def run() -> tuple[Any, ...]:
        added = await cache.aset("a-nx", 1, nx=True), await cache.aset("a-nx", 2, nx=True)
        counted = await cache.aincr("a-ikc", 3, ignore_key_check=True)
        expiry = await cache.apexpire("a-nx", 10_000), await cache.apttl("a-nx")
        found = await cache.akeys("a-*")
        await cache.aclose()
        return added, counted, expiry[0], 0 < expiry[1] <= 10_000, sorted(found)

    assert asyncio.run(run()) == ((True, False), 3, True, True, ["a-ikc", "a-nx"])
