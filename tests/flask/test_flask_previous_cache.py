"""Warm adoption from Flask-Caching's Redis backend (issue 25): ``CACHE_OPTIONS=
{"PREVIOUS_CACHE": <the Flask-Caching config being replaced>}``.

The old cache is a plain redis server (the master of a one-node topology the harness starts),
written through Flask-Caching's ``RedisCache`` as the app did; ours is the shared topology, in
a database of its own (DB 1: a ``clear`` marks the database for 10 s, and the other Flask
tests flush theirs). After the switch every key is read without a miss, with its TTL; after
``flask sentinel-reshard --from-previous-cache`` every key is on its shard and none is left."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from durable_support import while_frozen
from flask import Flask
from flask_caching import Cache
from flask_support import build_app, settings_for
from threads import Workers

from sentinel_cache.exceptions import ConfigurationError
from sentinel_cache.testing import LocalSentinelCluster

DB = 1  # no other test uses it


@pytest.fixture(scope="module")
def old(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as topology:
        yield topology


@pytest.fixture
def old_server(old: LocalSentinelCluster) -> Iterator[redis.Redis]:
    client = old.node_client(old.master_address(old.master_names[0]), db=0)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def apps(
    cluster: LocalSentinelCluster, old: LocalSentinelCluster, old_server: Any
) -> Iterator[Any]:
    """(the old app's Cache, the new app, its Cache, its backend): the same prefix."""
    host, port = old.master_address(old.master_names[0])
    prefix = f"app{uuid.uuid4().hex[:8]}_"
    before = {
        "CACHE_TYPE": "RedisCache",
        "CACHE_REDIS_URL": f"redis://{host}:{port}/0",
        "CACHE_KEY_PREFIX": prefix,
    }
    old_app = Flask("before")
    old_app.config.update(before)
    previous = Cache(old_app)
    settings = settings_for(
        cluster,
        CACHE_REDIS_DB=DB,
        CACHE_KEY_PREFIX=prefix,
        CACHE_OPTIONS={"PREVIOUS_CACHE": before},
    )
    app, cache, backend = build_app(settings)
    yield previous, app, cache, backend
    for shard in backend.core.shards:
        shard.client.flushdb()


def test_switching_from_flask_caching_redis(apps: Any, old_server: redis.Redis) -> None:
    previous, app, cache, backend = apps
    prefix = backend.resolved_prefix()
    read = {f"read{i}": [i, f"v{i}"] if i % 2 else i for i in range(300)}
    left = {f"left{i}": {"n": i} for i in range(300)}
    previous.set_many({k: read[k] for k in list(read)[:150]}, timeout=600)
    previous.set_many({k: read[k] for k in list(read)[150:]}, timeout=0)  # never expires
    previous.set_many(left, timeout=600)
    assert len(list(old_server.scan_iter(match=f"{prefix}*"))) == 600

    misses = [key for key, value in read.items() if cache.get(key) != value]
    ttls = [backend.client.get_client(backend._key(k)).pttl(backend._key(k)) for k in read]
    result = app.test_cli_runner().invoke(
        args=["sentinel-reshard", "--from-previous-cache", "--json", "--batch", "40"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    wrong = [k for k, v in {**read, **left}.items() if cache.get(k) != v]
    placed = 0
    for key in [*read, *left]:
        made = backend._key(key)
        held = [s for s in backend.core.shards if s.client.exists(made)]
        placed += held == [backend.core.shard_for(made)]
    print(f"misses {len(misses)}, moved {report['moved']}, placed {placed}")
    assert misses == []
    assert all(0 < t <= 600_000 for t in ttls[:150]) and all(t == -1 for t in ttls[150:])
    assert report["complete"] and report["moved"] == 300 and report["already_present"] == 0
    assert wrong == [] and placed == 600
    assert list(old_server.scan_iter(match=f"{prefix}*")) == []
    again = app.test_cli_runner().invoke(
        args=["sentinel-reshard", "--from-previous-cache", "--json"]
    )
    assert again.exit_code == 0 and json.loads(again.output)["scanned"] == 0


def test_dry_run_counts_and_writes_nothing(apps: Any, old_server: redis.Redis) -> None:
    previous, app, cache, backend = apps
    previous.set_many({"a": 1, "b": 2, "c": 3})
    cache.set("a", "ours")  # ours wins: the old "a" is deleted by the write
    result = app.test_cli_runner().invoke(
        args=["sentinel-reshard", "--from-previous-cache", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert (
        "2 keys in the previous RedisCache" in result.output
        and "2 would be copied" in result.output
    )
    assert len(list(old_server.scan_iter())) == 2


def test_writes_deletes_and_counters(apps: Any, old_server: redis.Redis) -> None:
    previous, app, cache, backend = apps
    previous.set_many({"n": 5, "x": "old", "y": "old", "z": "old", "slot": "taken"})
    assert backend.inc("n") == 6  # from the old value (Flask-Caching's Cache has no inc)
    assert cache.add("slot", "mine") is False and cache.get("slot") == "taken"
    cache.set("x", "new")
    cache.delete("y")
    cache.delete_many("z")
    assert cache.get_many("x", "y", "z") == ["new", None, None]
    assert cache.has("n") and not cache.has("y")
    assert list(old_server.scan_iter()) == []
    previous.set_many({"d": 10, "u": "old", "g": "old"})
    assert backend.dec("d", 3) == 7
    assert backend.get_or_set_many({"g": "computed", "h": "computed"}) == {
        "g": "old",
        "h": "computed",
    }
    assert cache.unlink("u") == ["u"] and cache.get("u") is None
    assert list(old_server.scan_iter()) == []
    previous.set("gone", "old")
    assert cache.clear()
    assert cache.get("gone") is None and list(old_server.scan_iter()) == []


class Paused:
    """A value whose pickling by our copy (after the old cache and its TTL were read) waits
    once for the test: a delete is run in that gap."""

    gate: dict[str, threading.Event] = {}

    def __init__(self, text: str) -> None:
        self.text = text

    def __getstate__(self) -> dict[str, Any]:
        if self.gate:
            reached, go = self.gate.pop("reached"), self.gate.pop("go")
            reached.set()
            assert go.wait(30)
        return self.__dict__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Paused) and other.text == self.text


def test_a_delete_between_a_read_through_and_its_copy_wins(
    apps: Any, old_server: redis.Redis
) -> None:
    previous, app, cache, backend = apps
    previous.set("k", Paused("old"), timeout=0)
    reached, go = threading.Event(), threading.Event()
    Paused.gate.update(reached=reached, go=go)
    outcome: list[Any] = []

    def reader() -> None:
        try:
            outcome.append(cache.get("k"))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert reached.wait(30)
        cache.delete("k")
    finally:
        go.set()
        thread.join(30)
        Paused.gate.clear()
    assert not thread.is_alive()
    assert outcome == [Paused("old")]
    assert cache.get("k") is None
    made = backend._key("k")
    assert not any(s.client.exists(made) for s in backend.core.shards)
    assert list(old_server.scan_iter()) == []


def test_a_bad_previous_cache_is_named(cluster: LocalSentinelCluster) -> None:
    for bad in ("RedisCache", {"CACHE_KEY_PREFIX": "x", "CACHE_REDIS_PASSWORD": "hunter2"}):
        settings = settings_for(cluster, CACHE_OPTIONS={"PREVIOUS_CACHE": bad})
        with pytest.raises(ConfigurationError, match=r"CACHE_OPTIONS\['PREVIOUS_CACHE'\]") as e:
            build_app(settings)
        assert "hunter2" not in str(e.value)  # the keys are named, not the values
    old = {"CACHE_TYPE": "SimpleCache"}
    masters = cluster.config()["masters"]
    settings = settings_for(
        cluster, CACHE_OPTIONS={"PREVIOUS_CACHE": old, "PREVIOUS_MASTERS": masters}
    )
    with pytest.raises(ConfigurationError, match="cannot be combined with PREVIOUS_MASTERS"):
        build_app(settings)


def test_durable_replicas_hold_the_old_copies_until_our_replica_has_them(
    make_cluster: Any, old: LocalSentinelCluster, old_server: redis.Redis
) -> None:
    """The backend's DURABLE_REPLICAS reaches its read-through (its client is the adopter's):
    the old copies are removed only once our frozen replica has the copies (thawed 0.5 s later;
    a 4 s WAIT timeout)."""
    ours = make_cluster(shards=1, replicas=1, sentinels=1)
    host, port = old.master_address(old.master_names[0])
    prefix = f"app{uuid.uuid4().hex[:8]}_"
    before = {
        "CACHE_TYPE": "RedisCache",
        "CACHE_REDIS_URL": f"redis://{host}:{port}/0",
        "CACHE_KEY_PREFIX": prefix,
    }
    old_app = Flask("before")
    old_app.config.update(before)
    previous = Cache(old_app)
    options = {"PREVIOUS_CACHE": before, "DURABLE_REPLICAS": 1, "DURABLE_TIMEOUT_MS": 4000}
    settings = settings_for(ours, CACHE_REDIS_DB=DB, CACHE_KEY_PREFIX=prefix, CACHE_OPTIONS=options)
    _, cache, backend = build_app(settings)
    keys = [f"k{i}" for i in range(10)]
    previous.set_many({k: f"old {k}" for k in keys}, timeout=0)
    stored = [f"{prefix}{k}" for k in keys]
    replica = ours.replica_addresses(ours.master_names[0])[0]
    found, at_thaw, _ = while_frozen(
        ours, replica, lambda: cache.get_many(*keys), lambda: old_server.exists(*stored)
    )
    assert found == [f"old {k}" for k in keys]
    assert at_thaw == [len(keys)]  # the removal waited for the copies' WAIT
    assert old_server.exists(*stored) == 0
    with ours.node_client(replica, db=DB) as node:
        assert node.exists(*[backend._key(k) for k in keys]) == len(keys)


def test_concurrent_first_reads_of_old_only_keys_never_miss(
    apps: Any, old_server: redis.Redis
) -> None:
    """12 threads read the same 100 keys only the old cache has, at once, 3 rounds, with
    ``get`` and ``get_many``: not one miss (a reader that missed here and then on the old cache,
    whose copy another reader had just moved, reads here again before reporting a miss)."""
    previous, _, cache, backend = apps
    keys = {f"race{i}": {"i": i} for i in range(100)}
    misses: list[tuple[int, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(12)

    def reader(round_: int, many: bool) -> None:
        start.wait(timeout=60)
        if many:
            got = dict(zip(keys, cache.get_many(*keys), strict=True))
        else:
            got = {key: cache.get(key) for key in keys}
        with lock:
            misses.extend((round_, key) for key, value in keys.items() if got[key] != value)

    cache.has("-")  # connected: each shard's master known
    for round_ in range(3):
        for shard in backend.core.shards:  # ours emptied behind its back: no tombstones
            for key in shard.client.scan_iter(match=f"{backend.resolved_prefix()}*"):
                shard.client.delete(key)
        previous.set_many(keys, timeout=600)
        start.reset()
        with Workers(timeout=120) as workers:
            for i in range(12):
                workers.spawn(reader, round_, i % 2 == 1)
    print(f"\n{len(misses)} misses of {3 * 12 * len(keys)} reads")
    assert misses == []
