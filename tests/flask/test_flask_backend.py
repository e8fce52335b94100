"""Every backend method on real servers, with and without a key prefix; placement, batching,
serializer swaps, atomic counters and IGNORE_EXCEPTIONS."""

from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from cachelib.serializers import BaseSerializer, JSONSerializer
from flask_support import FLASK_DB, MakeApp, build_app, settings_for, unique_prefix
from threads import Workers

from sentinel_cache import ConfigurationError, SerializationError, ShardUnavailableError
from sentinel_cache.core.serializers import Codec
from sentinel_cache.flask import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture
def masters(cluster: LocalSentinelCluster) -> Iterator[list[redis.Redis]]:
    """Plain redis-py clients on each shard's master (FLASK_DB), in shard order."""
    clients = [
        cluster.node_client(cluster.master_address(name), db=FLASK_DB)
        for name in cluster.master_names
    ]
    yield clients
    for client in clients:
        client.close()


def stored(backend: ShardedSentinelCache, masters: list[redis.Redis], key: str) -> Any:
    """The raw bytes under ``key``'s final name, read from the master the ring names."""
    final = backend.key_prefix + key
    return masters[backend.core.shard_index(final)].get(final)


def pttl(backend: ShardedSentinelCache, masters: list[redis.Redis], key: str) -> int:
    final = backend.key_prefix + key
    return int(masters[backend.core.shard_index(final)].pttl(final))


# -- single key ------------------------------------------------------------------------------


def test_set_get_delete(backend: ShardedSentinelCache) -> None:
    assert backend.get("missing") is None
    assert backend.set("k", {"a": [1, 2]}) is True
    assert backend.get("k") == {"a": [1, 2]}
    assert backend.set("k", "again") is True
    assert backend.get("k") == "again"
    assert backend.delete("k") is True
    assert backend.delete("k") is False
    assert backend.get("k") is None
    for value in (True, False, None, 0, -7, 2**70, b"raw", "text", 1.5, (1, "a")):
        assert backend.set("v", value)
        got = backend.get("v")
        assert got == value and type(got) is type(value)


def test_add(backend: ShardedSentinelCache) -> None:
    assert backend.add("k", 1) is True
    assert backend.add("k", 2) is False
    assert backend.get("k") == 1


def test_has(backend: ShardedSentinelCache) -> None:
    assert backend.has("k") is False
    backend.set("k", None)  # a cached None still exists
    assert backend.has("k") is True


def test_timeouts(backend: ShardedSentinelCache, masters: list[redis.Redis]) -> None:
    backend.default_timeout = 300
    backend.set("default", 1)
    assert 299_000 < pttl(backend, masters, "default") <= 300_000
    backend.set("forever", 1, timeout=0)
    assert pttl(backend, masters, "forever") == -1
    backend.set("td", 1, timeout=dt.timedelta(seconds=30))
    assert 29_000 < pttl(backend, masters, "td") <= 30_000
    backend.set_many({"m1": 1, "m2": 2}, timeout=0)
    assert pttl(backend, masters, "m1") == -1
    backend.add("added", 1, timeout=20)
    assert 19_000 < pttl(backend, masters, "added") <= 20_000
    backend.add("added0", 1, timeout=0)
    assert pttl(backend, masters, "added0") == -1
    # A negative timeout: the entry is expired at once, so nothing is left.
    backend.set("forever", 2, timeout=-1)
    assert backend.get("forever") is None
    assert backend.add("neg", 1, timeout=-1) is False
    assert backend.has("neg") is False


def test_default_timeout_zero_never_expires(make_app: MakeApp, masters: list[redis.Redis]) -> None:
    _, _, backend = make_app(CACHE_KEY_PREFIX=unique_prefix(), CACHE_DEFAULT_TIMEOUT=0)
    backend.set("k", 1)
    assert pttl(backend, masters, "k") == -1
    backend.delete("k")


# -- counters --------------------------------------------------------------------------------


def test_inc_dec(backend: ShardedSentinelCache, masters: list[redis.Redis]) -> None:
    assert backend.inc("new") == 1  # a missing key counts from 0, as in cachelib
    assert backend.dec("new2", 5) == -5
    assert backend.get("new2") == -5
    assert backend.set("n", 10, timeout=100)
    assert stored(backend, masters, "n") == b"10"  # integers are stored raw
    assert backend.inc("n", 5) == 15
    assert backend.dec("n", 3) == 12
    assert backend.get("n") == 12
    assert 99_000 < pttl(backend, masters, "n") <= 100_000  # INCRBY keeps the TTL
    backend.set("text", "abc")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        backend.inc("text")


def test_inc_dec_are_atomic_under_threads(backend: ShardedSentinelCache) -> None:
    backend.set("hits", 0)
    start = threading.Barrier(8)

    def work(up: bool) -> None:
        start.wait(30)
        for _ in range(150):
            if up:
                backend.inc("hits", 2)
            else:
                backend.dec("hits")

    with Workers(timeout=60) as workers:
        for i in range(8):
            workers.spawn(work, i % 2 == 0, name=f"inc-dec-{i}")
    assert backend.get("hits") == 4 * 150 * 2 - 4 * 150


# -- many keys -------------------------------------------------------------------------------

PAIRS = {f"key{i}": [i, str(i)] for i in range(40)}


def test_set_many_get_many_get_dict(backend: ShardedSentinelCache) -> None:
    assert backend.set_many(PAIRS) == list(PAIRS)
    keys = [*reversed(PAIRS), "absent", "key3"]
    assert backend.get_many(*keys) == [PAIRS.get(k) for k in keys]
    assert backend.get_dict("key1", "absent") == {"key1": [1, "1"], "absent": None}
    assert backend.get_many() == []
    assert backend.set_many({}) == []


def test_delete_many_and_unlink(backend: ShardedSentinelCache) -> None:
    backend.set_many(PAIRS)
    keys = [*PAIRS][:20]
    assert backend.delete_many(*keys, "absent") == [*keys, "absent"]
    assert backend.get_many(*keys) == [None] * 20
    rest = [*PAIRS][20:]
    assert backend.unlink(*rest) == rest
    assert not any(backend.has(k) for k in rest)
    assert backend.delete_many() == []
    assert backend.unlink() == []


def test_delete_many_reports_keys_that_survive(backend: ShardedSentinelCache) -> None:
    """A key re-created between DEL and the check fails; RuntimeError unless ignored."""
    backend.set_many({"a": 1, "b": 2})
    real = backend.client.scatter

    def resurrect_b(plan: Any, **options: Any) -> Any:
        replies = real(plan, **options)
        for shard, commands in plan.items():
            for i, command in enumerate(commands):
                if command == ("EXISTS", backend.key_prefix + "b"):
                    replies[shard][i] = 1
        return replies

    backend.client.scatter = resurrect_b  # type: ignore[method-assign]
    try:
        backend.ignore_delete_many_errors = False
        with pytest.raises(RuntimeError, match=r"Failed to delete keys: \['b'\]"):
            backend.delete_many("a", "b")
        backend.ignore_delete_many_errors = True
        assert backend.delete_many("a", "b") == ["a"]
    finally:
        del backend.client.scatter


def test_multi_key_calls_send_one_batch_per_shard(backend: ShardedSentinelCache) -> None:
    plans: list[dict[Any, list[tuple[Any, ...]]]] = []
    real = backend.client.scatter

    def spy(plan: Any, **options: Any) -> Any:
        plans.append(plan)
        return real(plan, **options)

    backend.client.scatter = spy  # type: ignore[method-assign]
    try:
        backend.set_many(PAIRS)
        backend.get_many(*PAIRS)
        backend.delete_many(*PAIRS)
    finally:
        del backend.client.scatter
    assert len(plans) == 3  # one scatter per call ...
    for plan in plans:
        assert len(plan) == 2  # ... covering both shards at once
    mget = plans[1]
    assert all(len(commands) == 1 and commands[0][0] == "MGET" for commands in mget.values())
    sent = [key for commands in mget.values() for key in commands[0][1:]]
    assert sorted(sent) == sorted(backend.key_prefix + k for k in PAIRS)


# -- placement -------------------------------------------------------------------------------


def test_placement_hashes_the_final_key(
    cluster: LocalSentinelCluster, make_app: MakeApp, masters: list[redis.Redis]
) -> None:
    """Where a plain client finds each key is exactly ring(prefix + key) (Jedis placement)."""
    prefix = unique_prefix()
    _, _, backend = make_app(CACHE_KEY_PREFIX=prefix)
    keys = [f"user:{i}" for i in range(200)]
    backend.set_many(dict.fromkeys(keys, "v"))
    per_shard = [0, 0]
    moved = 0
    for key in keys:
        index = backend.core.ring.shard_index(prefix + key)
        assert masters[index].exists(prefix + key) == 1, key
        assert masters[1 - index].exists(prefix + key) == 0, key
        per_shard[index] += 1
        moved += index != backend.core.ring.shard_index(key)
    assert min(per_shard) > 50, per_shard
    assert moved > 20  # the prefix really takes part in the hash
    assert backend.delete_many(*keys) == keys


# -- clear -----------------------------------------------------------------------------------


def test_clear_removes_only_this_prefix_on_every_shard(
    make_app: MakeApp, masters: list[redis.Redis]
) -> None:
    _, _, mine = make_app(CACHE_KEY_PREFIX=unique_prefix() + "a*[x]?")  # glob chars escaped
    _, _, other = make_app(CACHE_KEY_PREFIX=unique_prefix())
    mine.set_many(PAIRS)
    other.set_many(PAIRS)
    assert {mine.core.shard_index(mine.key_prefix + k) for k in PAIRS} == {0, 1}
    assert mine.clear() is True
    assert mine.get_many(*PAIRS) == [None] * len(PAIRS)
    assert other.get_many(*PAIRS) == list(PAIRS.values())
    assert other.clear() is True
    for client in masters:
        assert not list(client.scan_iter(match=other.key_prefix + "*"))


def test_clear_without_prefix_flushes_the_database(
    cluster: LocalSentinelCluster, make_app: MakeApp, masters: list[redis.Redis]
) -> None:
    _, _, backend = make_app(CACHE_KEY_PREFIX=None)
    backend.set_many(PAIRS)
    for client in masters:
        client.set("foreign-key-in-this-db", 1)
    elsewhere = cluster.node_client(cluster.master_address(cluster.master_names[0]), db=0)
    try:
        elsewhere.set("flask-tests:db0-survives", 1)
        assert backend.clear() is True
        for client in masters:
            assert client.dbsize() == 0  # FLUSHDB ASYNC empties the keyspace at once
        assert elsewhere.get("flask-tests:db0-survives") == b"1"
    finally:
        elsewhere.delete("flask-tests:db0-survives")
        elsewhere.close()


def test_db_setting_reaches_the_servers(cluster: LocalSentinelCluster, make_app: MakeApp) -> None:
    prefix = unique_prefix()
    _, _, backend = make_app(CACHE_KEY_PREFIX=prefix, CACHE_REDIS_DB=10)
    backend.set("k", 1)
    name = cluster.master_names[backend.core.shard_index(prefix + "k")]
    with cluster.node_client(cluster.master_address(name), db=10) as db10:
        assert db10.get(prefix + "k") == b"1"
    with cluster.node_client(cluster.master_address(name), db=FLASK_DB) as db9:
        assert db9.get(prefix + "k") is None
    backend.delete("k")


# -- serializer ------------------------------------------------------------------------------


class CountingJSON(JSONSerializer):
    def __init__(self) -> None:
        self.dumped = self.loaded = 0

    def dumps(self, value: Any, *args: Any, **kwargs: Any) -> bytes | None:
        self.dumped += 1
        return super().dumps(value)

    def loads(self, bvalue: Any, *args: Any, **kwargs: Any) -> Any:
        self.loaded += 1
        return super().loads(bvalue)


def test_serializer_swap_to_json(backend: ShardedSentinelCache, masters: list[redis.Redis]) -> None:
    assert isinstance(backend.serializer, Codec)
    backend.set("before", {"pickled": (1, 2)})
    serializer = CountingJSON()
    backend.serializer = serializer
    assert backend.serializer is serializer
    assert backend.set("doc", {"a": [1, None, True]})
    assert stored(backend, masters, "doc") == b'\xfe\xf0{"a": [1, null, true]}'
    assert backend.get("doc") == {"a": [1, None, True]}
    assert (serializer.dumped, serializer.loaded) == (1, 1)
    # Integers bypass it and stay raw, so INCRBY works.
    assert backend.set("count", 41)
    assert stored(backend, masters, "count") == b"41"
    assert backend.inc("count") == 42
    assert backend.get("count") == 42
    assert backend.set_many({"x": "y", "n": 3}) == ["x", "n"]
    assert backend.get_many("x", "n", "absent") == ["y", 3, None]
    assert backend.add("doc2", [1]) and backend.get("doc2") == [1]
    # A value pickled before the swap is a miss now: a codec not configured for pickle never
    # unpickles unsigned data (the codec's safety rule), so nothing stale or unsafe comes back.
    assert backend.get("before") is None


def test_serializer_that_cannot_serialize(backend: ShardedSentinelCache) -> None:
    backend.serializer = JSONSerializer()  # cachelib's returns None (and logs) on failure
    with pytest.raises(SerializationError):
        backend.set("k", {1, 2})
    assert backend.has("k") is False


def test_serializer_keeps_signing_and_compression(
    make_app: MakeApp, masters: list[redis.Redis]
) -> None:
    _, _, backend = make_app(
        CACHE_KEY_PREFIX=unique_prefix(),
        CACHE_SERIALIZER=BaseSerializer,  # cachelib's pickle serializer, via Flask-Caching
        CACHE_OPTIONS={"SIGNING_KEY": "0123456789abcdef", "COMPRESSOR": "zlib"},
    )
    assert isinstance(backend.serializer, BaseSerializer)
    value = "x" * 5000
    backend.set("big", value)
    raw = stored(backend, masters, "big")
    assert raw[:1] == b"\xff" and len(raw) < 1000  # signed and compressed
    assert backend.get("big") == value
    # A tampered value is a miss, not an unpickled payload.
    final = backend.key_prefix + "big"
    masters[backend.core.shard_index(final)].set(final, raw[:-1] + bytes([raw[-1] ^ 1]))
    assert backend.get("big") is None
    backend.clear()


def test_json_via_options_on_real_servers(make_app: MakeApp, masters: list[redis.Redis]) -> None:
    _, _, backend = make_app(CACHE_KEY_PREFIX=unique_prefix(), CACHE_OPTIONS={"SERIALIZER": "json"})
    backend.set("k", {"a": 1})
    assert stored(backend, masters, "k") == b'\xfe\x20{"a":1}'
    assert backend.get("k") == {"a": 1}
    with pytest.raises(ConfigurationError):
        backend.serializer = 42
    backend.clear()


# -- Flask-Caching front door ----------------------------------------------------------------


def test_through_flask_caching_cache_object(cluster: LocalSentinelCluster) -> None:
    app, cache, backend = build_app(settings_for(cluster, CACHE_KEY_PREFIX=unique_prefix()))
    with app.app_context():
        assert cache.set("a", 1) and cache.add("b", 2)
        assert cache.get_many("a", "b") == [1, 2]
        assert cache.get_dict("a", "b") == {"a": 1, "b": 2}
        assert cache.has("a")
        assert cache.unlink("a") == ["a"]
        assert cache.delete_many("b") == ["b"]
        assert cache.set_many({"c": 3}) == ["c"]
        assert cache.delete("c")
        assert cache.clear()


# -- IGNORE_EXCEPTIONS -----------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ignore_exceptions_turns_outages_into_misses(caplog: pytest.LogCaptureFixture) -> None:
    settings = {
        "CACHE_TYPE": "sentinel_cache.flask.ShardedSentinelCache",
        "CACHE_REDIS_SENTINELS": [f"127.0.0.1:{_closed_port()}"],
        "CACHE_REDIS_SENTINEL_MASTERS": ["nowhere"],
        "CACHE_KEY_PREFIX": "p:",
        "CACHE_OPTIONS": {
            "IGNORE_EXCEPTIONS": True,
            "LOG_IGNORED_EXCEPTIONS_INTERVAL": 60,
            "LISTENERS": False,
            "DISCOVERY_TIMEOUT": 0.2,  # the first call gives up on discovery after this
        },
    }
    _, _, backend = build_app(settings)
    try:
        with caplog.at_level(logging.WARNING, logger="sentinel_cache.flask"):
            assert backend.get("k") is None
            assert backend.set("k", 1) is False
            assert backend.add("k", 1) is False
            assert backend.has("k") is False
            assert backend.delete("k") is False
            assert backend.inc("k") is None
            assert backend.dec("k") is None
            assert backend.get_many("a", "b") == [None, None]
            assert backend.set_many({"a": 1}) == []
            assert backend.delete_many("a") == []
            assert backend.unlink("a") == []
            assert backend.clear() is False
        ignored = [r for r in caplog.records if r.name == "sentinel_cache.flask"]
        assert len(ignored) == 2, [r.getMessage() for r in ignored]
        # rate-limited: one report per shard per interval...
        assert (
            "cache shard 0 (nowhere) unavailable (no master known): GET ignored"
            in ignored[0].getMessage()
        )
        # ...but a shard left out of clear() is reported every time
        assert "clear skipped it (IGNORE_EXCEPTIONS)" in ignored[1].getMessage()

        backend.client.fail_open.ignore = False
        with pytest.raises(redis.ConnectionError):
            backend.get("k")
        with pytest.raises(redis.ConnectionError):
            backend.set_many({"a": 1})
    finally:
        backend.core.close()


def test_ignore_exceptions_degrades_per_shard(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    """With one shard unavailable, the other shard keeps serving its keys in multi-key calls."""
    _, _, backend = make_app(
        CACHE_KEY_PREFIX=unique_prefix(),
        CACHE_REDIS_SENTINEL_MASTERS=["shard0", "nope"],
        CACHE_OPTIONS={"IGNORE_EXCEPTIONS": True, "DISCOVERY_TIMEOUT": 0.2},
    )
    prefix = backend.key_prefix
    keys = [f"k{i}" for i in range(30)]
    up = [k for k in keys if backend.core.shard_index(prefix + k) == 0]
    down = [k for k in keys if k not in up]
    assert up and down
    try:
        with caplog.at_level(logging.WARNING, logger="sentinel_cache.flask"):
            assert backend.set_many({k: k.upper() for k in keys}) == up
            assert backend.get_many(*keys) == [k.upper() if k in up else None for k in keys]
            assert backend.get(up[0]) == up[0].upper()
            assert backend.get(down[0]) is None
            assert backend.set(down[0], 1) is False
            assert backend.delete_many(*keys) == up  # no RuntimeError for the skipped shard
            assert backend.get_many(*up) == [None] * len(up)
            assert backend.clear() is False  # shard 1 was skipped
        logged = [r.getMessage() for r in caplog.records if r.name == "sentinel_cache.flask"]
        assert (
            len(logged) == 2
            and "shard 1 (nope) unavailable (no master known): set_many ignored" in logged[0]
            and "shard 1 (nope) unavailable (no master known): clear skipped it" in logged[1]
        ), logged
    finally:
        backend.core.close()


def test_without_ignore_exceptions_errors_surface(make_app: MakeApp) -> None:
    _, _, backend = make_app(
        CACHE_KEY_PREFIX="p:",
        CACHE_REDIS_SENTINEL_MASTERS=["shard0", "nope"],
        CACHE_OPTIONS={"DISCOVERY_TIMEOUT": 0.2},
    )
    keys = [f"k{i}" for i in range(20)]
    with pytest.raises(ShardUnavailableError, match="nope"):
        backend.get_many(*keys)
    backend.core.close()


def test_passwords_end_to_end(make_cluster: Callable[..., LocalSentinelCluster]) -> None:
    """CACHE_REDIS_PASSWORD reaches the data nodes, CACHE_REDIS_SENTINEL_PASSWORD the sentinels."""
    secured = make_cluster(
        shards=2, replicas=1, sentinels=1, requirepass="data-pw", sentinel_requirepass="sent-pw"
    )
    settings = settings_for(secured, CACHE_KEY_PREFIX="pw:")
    assert settings["CACHE_REDIS_PASSWORD"] == "data-pw"
    assert settings["CACHE_REDIS_SENTINEL_PASSWORD"] == "sent-pw"
    app, _, backend = build_app(settings)
    try:
        assert backend.set_many({f"k{i}": i for i in range(10)}) == [f"k{i}" for i in range(10)]
        assert backend.get_many("k0", "k9") == [0, 9]
        result = app.test_cli_runner().invoke(args=["sentinel-status"])
        assert result.exit_code == 0, result.output
    finally:
        backend.core.close()
    wrong = settings_for(
        secured,
        CACHE_REDIS_PASSWORD="nope",
        CACHE_OPTIONS={"LISTENERS": False, "DISCOVERY_TIMEOUT": 0.2},
    )
    _, _, denied = build_app(wrong)
    try:
        with pytest.raises(redis.ConnectionError, match="(?i)auth|password|NOAUTH|WRONGPASS"):
            denied.get("k0")
    finally:
        denied.core.close()
