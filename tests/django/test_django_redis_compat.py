"""What a django-redis project brings along works here or fails saying what replaces it: its
settings for ignored exceptions (``LOG_IGNORED_EXCEPTIONS``, ``DJANGO_REDIS_IGNORE_EXCEPTIONS``,
``DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS``, ``DJANGO_REDIS_LOGGER``), ``DJANGO_REDIS_SCAN_ITERSIZE``,
its options with no meaning here, our ``get_redis_connection`` (django-redis's own, called on
this cache: tests/django_redis_suite), and the results django-redis gives
(``delete_many``'s count, ``ttl`` in whole seconds). On real servers: the session topology, and
a port where no sentinel listens for a cache whose every shard is unavailable."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django_support import MakeCache, build_cache, cache_entry, remember

from sentinel_cache.django import ShardedSentinelCache, get_redis_connection
from sentinel_cache.exceptions import ArgumentTypeError
from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.processes import free_ports


def dead_cache(cluster: LocalSentinelCluster, **options: Any) -> ShardedSentinelCache:
    """A cache on a port where no sentinel listens: every shard unavailable, found out fast."""
    (port,) = free_ports(1)
    entry = cache_entry(cluster, OPTIONS={"DISCOVERY_TIMEOUT": 0.3, **options})
    entry["LOCATION"] = [f"127.0.0.1:{port}"]
    return remember(build_cache(entry))


def default_cache() -> ShardedSentinelCache:
    cache = caches["default"]
    assert isinstance(cache, ShardedSentinelCache)
    return cache


def ignored(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and "IGNORE_EXCEPTIONS" in r.message]


def three_gets(cache: ShardedSentinelCache) -> None:
    assert cache.get("key") is None
    assert cache.get("key", "default") == "default"
    assert cache.get("key", default="default") == "default"


# -- ignored exceptions -----------------------------------------------------------------------
def test_log_ignored_exceptions_option_logs_every_ignored_exception(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cache = dead_cache(cluster, IGNORE_EXCEPTIONS=True, LOG_IGNORED_EXCEPTIONS=True)
    assert cache.cache_options.log_ignored_exceptions_interval == 0
    with caplog.at_level(logging.WARNING):
        three_gets(cache)
    assert len(ignored(caplog, "sentinel_cache.django")) == 3


def test_without_it_ignored_exceptions_are_logged_rate_limited(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cache = dead_cache(cluster, IGNORE_EXCEPTIONS=True, LOG_IGNORED_EXCEPTIONS=False)
    assert cache.cache_options.log_ignored_exceptions_interval == 10
    with caplog.at_level(logging.WARNING):
        three_gets(cache)
    assert len(ignored(caplog, "sentinel_cache.django")) == 1


def test_django_redis_globals_ignore_and_log_on_their_logger(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(
        DJANGO_REDIS_IGNORE_EXCEPTIONS=True,
        DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS=True,
        DJANGO_REDIS_LOGGER="project.cache",
    ):
        cache = dead_cache(cluster)
        assert cache.cache_options.ignore_exceptions is True
        with caplog.at_level(logging.WARNING):
            three_gets(cache)
            assert cache.set("key", 1) is False
    assert len(ignored(caplog, "project.cache")) == 4
    assert ignored(caplog, "sentinel_cache.django") == []


def test_the_caches_own_ignore_exceptions_wins_over_the_global(
    cluster: LocalSentinelCluster,
) -> None:
    with (
        override_settings(DJANGO_REDIS_IGNORE_EXCEPTIONS=True),
        pytest.raises(redis.ConnectionError),
    ):
        dead_cache(cluster, IGNORE_EXCEPTIONS=False).get("key")
    with override_settings(DJANGO_REDIS_IGNORE_EXCEPTIONS=False):
        assert dead_cache(cluster, IGNORE_EXCEPTIONS=True).get("key", 7) == 7
    with pytest.raises(redis.ConnectionError):  # neither: exceptions raise
        dead_cache(cluster).get("key")


def test_a_global_log_switch_leaves_a_caches_own_interval(cluster: LocalSentinelCluster) -> None:
    with override_settings(DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS=True):
        cache = dead_cache(cluster, LOG_IGNORED_EXCEPTIONS_INTERVAL=60)
        assert cache.cache_options.log_ignored_exceptions_interval == 60
        assert dead_cache(cluster).cache_options.log_ignored_exceptions_interval == 0


@pytest.mark.parametrize(
    ("settings", "options", "named"),
    [
        ({}, {"LOG_IGNORED_EXCEPTIONS": "yes"}, "LOG_IGNORED_EXCEPTIONS: must be True or False"),
        (
            {},
            {"LOG_IGNORED_EXCEPTIONS": True, "LOG_IGNORED_EXCEPTIONS_INTERVAL": 5},
            "LOG_IGNORED_EXCEPTIONS: True logs every ignored exception, which contradicts "
            "LOG_IGNORED_EXCEPTIONS_INTERVAL=5",
        ),
        ({"DJANGO_REDIS_IGNORE_EXCEPTIONS": 1}, {}, "DJANGO_REDIS_IGNORE_EXCEPTIONS: must be"),
        ({"DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS": "y"}, {}, "DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS"),
        ({"DJANGO_REDIS_LOGGER": 5}, {}, "DJANGO_REDIS_LOGGER: must be a logger's name"),
        ({"DJANGO_REDIS_SCAN_ITERSIZE": 0}, {}, "DJANGO_REDIS_SCAN_ITERSIZE: must be a positive"),
        ({}, {"CLIENT_CLASS": "django_redis.client.ShardClient"}, "CLIENT_CLASS: a django-redis"),
        ({}, {"CONNECTION_POOL_KWARGS": {}}, "MAX_CONNECTIONS and the other keyword arguments"),
        ({}, {"SENTINELS": [("h", 26379)]}, "the sentinels are LOCATION here"),
        (
            {},
            {"COMPRESSOR": "django_redis.compressors.lz4.Lz4Compressor"},
            """COMPRESSOR: django-redis's Lz4Compressor has no equivalent here; use "zlib" or""",
        ),
    ],
)
def test_bad_or_django_redis_only_settings_are_refused_naming_them(
    settings: dict[str, Any], options: dict[str, Any], named: str
) -> None:
    with override_settings(**settings):
        cache = ShardedSentinelCache(["127.0.0.1:1"], {"OPTIONS": {"MASTERS": ["a"], **options}})
    with pytest.raises(ImproperlyConfigured) as raised:
        cache.get("k")  # on first use, as every configuration error (the check says it first)
    assert named in str(raised.value)


def test_scan_itersize_global_is_delete_patterns_batch(
    make_cache: MakeCache, masters: dict[str, redis.Redis]
) -> None:
    """``delete_pattern`` unlinks the keys a shard's SCAN found in batches of ``itersize``:
    counted on the servers, the global sets that batch as django-redis's does."""

    def unlinks() -> int:
        stats = [m.info("commandstats").get("cmdstat_unlink", {}) for m in masters.values()]
        return sum(int(s.get("calls", 0)) for s in stats)

    counts = {}
    for itersize in (None, 3):
        with override_settings(
            **({} if itersize is None else {"DJANGO_REDIS_SCAN_ITERSIZE": itersize})
        ):
            cache = make_cache()
        # 12 keys on each shard (the prefix is new per cache, so is the placement: 24 keys
        # taken in turn once put 5 on one shard, under the 2 batches of 3 counted below).
        per_shard: dict[int, list[str]] = {}
        for i in range(1000):
            index = cache.core.shard_for(cache.make_key(f"it{i}")).index
            per_shard.setdefault(index, [])
            if len(per_shard[index]) < 12:
                per_shard[index].append(f"it{i}")
        keys = [key for group in per_shard.values() for key in group]
        assert sorted(len(group) for group in per_shard.values()) == [12, 12]
        cache.set_many(dict.fromkeys(keys, 1))
        before = unlinks()
        assert cache.delete_pattern("it*") == 24
        counts[itersize] = unlinks() - before
    assert counts[None] == 2  # the default: one batch per shard
    assert counts[3] >= 4  # at least two batches on each shard


@pytest.mark.parametrize(
    ("serializer", "compressor", "codec"),
    [
        ("django_redis.serializers.json.JSONSerializer", None, ("json", None)),
        ("django_redis.serializers.msgpack.MSGPackSerializer", None, ("msgpack", None)),
        (
            "django_redis.serializers.pickle.PickleSerializer",
            "django_redis.compressors.zlib.ZlibCompressor",
            ("pickle", "zlib"),
        ),
        (None, "django_redis.compressors.identity.IdentityCompressor", ("pickle", None)),
    ],
)
def test_django_redis_serializer_and_compressor_paths_carry_over(
    make_cache: MakeCache, serializer: str | None, compressor: str | None, codec: tuple[Any, ...]
) -> None:
    options = {"SERIALIZER": serializer, "COMPRESSOR": compressor}
    cache = make_cache(OPTIONS={k: v for k, v in options.items() if v is not None})
    assert (cache.cache_options.serializer, cache.cache_options.compressor) == codec
    value = {"text": "x" * 2000, "n": [1, 2]}
    cache.set("codec", value)
    assert cache.get("codec") == value


# -- get_redis_connection ---------------------------------------------------------------------
def test_get_redis_connection_is_the_raw_client_of_the_keys_shard(
    cluster: LocalSentinelCluster, make_cache: MakeCache
) -> None:
    entry = cache_entry(cluster, KEY_PREFIX="raw")
    with override_settings(CACHES={"default": entry}):
        cache = remember(default_cache())
        names = {cache.core.shard_for(f"board{i}").name: f"board{i}" for i in range(50)}
        assert len(names) == 2, "the sample must span both shards"
        for name, key in names.items():
            connection = get_redis_connection("default", key=key)
            assert isinstance(connection, redis.Redis)
            connection.zadd(key, {"ada": 3})
            other = next(n for n in names if n != name)
            with cluster.node_client(cluster.master_address(name), db=entry["OPTIONS"]["DB"]) as on:
                assert on.zscore(key, "ada") == 3
            with cluster.node_client(
                cluster.master_address(other), db=entry["OPTIONS"]["DB"]
            ) as off:
                assert off.exists(key) == 0
            connection.delete(key)
        with pytest.raises(ArgumentTypeError, match=r"get_redis_connection\('default'\) needs"):
            get_redis_connection("default")


def test_get_redis_connection_needs_no_key_on_one_shard(cluster: LocalSentinelCluster) -> None:
    entry = cache_entry(cluster, OPTIONS={"MASTERS": cluster.master_names[:1]})
    with override_settings(CACHES={"default": entry}):
        remember(default_cache())
        connection = get_redis_connection(write=True)
        connection.set("one-shard-probe", b"here")
        master = cluster.master_address(cluster.master_names[0])
        with cluster.node_client(master, db=entry["OPTIONS"]["DB"]) as node:
            assert node.get("one-shard-probe") == b"here"
        connection.delete("one-shard-probe")


def test_get_redis_connection_of_another_backend_names_django_redis() -> None:
    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    with (
        override_settings(CACHES={"default": locmem}),
        pytest.raises(TypeError, match="django_redis.get_redis_connection"),
    ):
        get_redis_connection("default", key="k")


# -- django-redis's results -------------------------------------------------------------------
def test_delete_many_returns_how_many_were_deleted(cache: ShardedSentinelCache) -> None:
    keys = [f"dm{i}" for i in range(30)]
    assert {cache.core.shard_for(cache.make_key(k)).index for k in keys} == {0, 1}
    assert cache.set_many({k: 1 for k in keys[:20]}) == []
    assert cache.delete_many(keys) == 20  # the 10 never set are not counted
    assert cache.delete_many(keys) == 0
    assert cache.delete_many([]) is None  # Django's contract (its suite checks it)
    assert cache.set_many({k: 1 for k in keys[:5]}) == []
    assert asyncio.run(cache.adelete_many(keys)) == 5
    assert asyncio.run(cache.adelete_many([])) is None


def test_ttl_is_whole_seconds_as_djangos_redis_ttl(cache: ShardedSentinelCache) -> None:
    cache.set("t", 1, timeout=100.4)  # Redis's TTL rounds: 100 for 99.5 <= left < 100.5
    left = cache.ttl("t")
    assert type(left) is int and left == 100
    cache.set("t", 1, timeout=300)
    assert type(asyncio.run(cache.attl("t"))) is int
    cache.set("t", 1, timeout=None)
    assert cache.ttl("t") is None
    assert cache.ttl("missing") == 0
