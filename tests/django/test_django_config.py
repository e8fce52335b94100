"""Configuration: every LOCATION form, OPTIONS, errors naming the field, and no connection at
construction (``pool_config`` is what ``sentinel_status`` and the system checks read)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django_support import BACKEND, build_cache, cache_entry, remember

from sentinel_cache.core.config import Address
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def backend(location: Any, **params: Any) -> ShardedSentinelCache:
    return ShardedSentinelCache(location, params)


def test_location_list_string_and_url_forms_agree() -> None:
    masters = {"OPTIONS": {"MASTERS": ["shard_a", "shard_b"]}}
    as_list = backend(["10.0.0.1:26379", "10.0.0.2:26380"], **masters).pool_config
    as_text = backend("10.0.0.1:26379,10.0.0.2:26380", **masters).pool_config
    as_url = backend("sentinel://10.0.0.1:26379,10.0.0.2:26380/shard_a,shard_b").pool_config
    assert as_list == as_text == as_url
    assert as_list.sentinels == (Address("10.0.0.1", 26379), Address("10.0.0.2", 26380))
    assert as_list.masters == ("shard_a", "shard_b")


def test_url_carries_credentials_and_query_options() -> None:
    cache = backend("sentinel://app:s%40cret@h1:26379,h2:26379/a,b?db=3&weights=x")
    with pytest.raises(ImproperlyConfigured, match="(?i)weights"):
        cache.pool_config  # noqa: B018 - the property raises
    cache = backend("sentinel://app:s%40cret@h1:26379,h2:26379/a,b?db=3")
    options = cache.pool_config.connection_options()
    assert (options["username"], options["password"], options["db"]) == ("app", "s@cret", 3)


def test_options_reach_the_pool_and_the_cache_options() -> None:
    cache = backend(
        ["h1:26379"],
        OPTIONS={
            "MASTERS": ["a", "b", "c"],
            "WEIGHTS": [1, 2, 1],
            "DB": 4,
            "PASSWORD": "data-secret",
            "SENTINEL_PASSWORD": "sentinel-secret",
            "socket_timeout": 1.5,  # names are case-insensitive, like Django's RedisCache's
            "IGNORE_EXCEPTIONS": True,
            "LOG_IGNORED_EXCEPTIONS_INTERVAL": 30,
            "SERIALIZER": "json",
            "COMPRESSOR": "zlib",
            "MAX_ENTRIES": 1000,  # BaseCache's own option: accepted, unused by Redis
        },
        KEY_PREFIX="site",
        TIMEOUT=60,
        VERSION=3,
    )
    config = cache.pool_config
    assert config.weights == (1, 2, 1)
    assert config.connection_options()["db"] == 4
    assert config.connection_options()["password"] == "data-secret"
    assert config.connection_options()["socket_timeout"] == 1.5
    assert config.sentinel_options()["password"] == "sentinel-secret"
    assert cache.cache_options.ignore_exceptions is True
    assert cache.cache_options.log_ignored_exceptions_interval == 30
    assert cache.cache_options.serializer == "json"
    assert (cache.key_prefix, cache.default_timeout, cache.version) == ("site", 60, 3)
    assert cache.make_key("k") == "site:3:k"
    assert "secret" not in repr(cache)


@pytest.mark.parametrize(
    ("location", "options", "field"),
    [
        (["h:26379"], {"MASTERS": ["a"], "WEIGTHS": [1]}, "did you mean 'WEIGHTS'"),
        (["h:26379"], {}, "MASTERS is required"),
        (["h:26379"], {"MASTERS": ["a", "b"], "WEIGHTS": [1]}, "WEIGHTS"),
        (["h:26379"], {"MASTERS": ["a", "a"]}, "listed twice"),
        (["h:notaport"], {"MASTERS": ["a"]}, "LOCATION"),
        ("", {"MASTERS": ["a"]}, "LOCATION"),
        ("redis://h:6379/0", {"MASTERS": ["a"]}, "LOCATION"),
        (["h:26379"], {"MASTERS": ["a"], "SERIALIZER": "yaml"}, "SERIALIZER"),
        (["h:26379"], {"MASTERS": ["a"], "IGNORE_EXCEPTIONS": "yes"}, "IGNORE_EXCEPTIONS"),
        (["h:26379"], {"MASTERS": ["a"], "MAX_CONNECTIONS": 0}, "max_connections"),
    ],
)
def test_bad_settings_are_improperly_configured_naming_the_field(
    location: Any, options: dict[str, Any], field: str
) -> None:
    cache = backend(location, OPTIONS=options)  # constructing never raises: see below
    for use in (
        lambda: cache.pool_config,
        lambda: cache.core,
        lambda: cache.get("k"),
    ):
        with pytest.raises(ImproperlyConfigured) as raised:
            use()
        assert field.lower() in str(raised.value).lower()
        assert raised.value.__cause__ is None and raised.value.__context__ is None


def test_bad_settings_do_not_break_djangos_own_cache_checks() -> None:
    # Django's checks build every cache (caches[alias]); the error surfaces on use, and as
    # sentinel_cache.E001 from our system check, instead of crashing `manage.py check`.
    broken = {"BACKEND": BACKEND, "LOCATION": ["h:26379"], "OPTIONS": {"MASTERZ": ["a"]}}
    with override_settings(CACHES={"default": broken}):
        cache = caches["default"]
        assert isinstance(cache, ShardedSentinelCache)
        with pytest.raises(ImproperlyConfigured, match="did you mean 'MASTERS'"):
            cache.set("k", 1)


def test_construction_and_pool_config_connect_nowhere() -> None:
    # Nothing listens there: anything that connected would fail or hang.
    cache = backend([f"127.0.0.1:{_closed_port()}"], OPTIONS={"MASTERS": ["a", "b"]})
    assert cache.pool_config.masters == ("a", "b")
    pool = cache.core
    assert pool.status()["started"] is False
    assert all(shard.address is None for shard in pool.shards)
    pool.close()


def test_aliases_with_equal_settings_share_one_core_and_close_keeps_it(
    cluster: LocalSentinelCluster,
) -> None:
    entry = cache_entry(cluster)
    other = cache_entry(cluster, KEY_PREFIX="other")
    with override_settings(CACHES={"default": entry, "a": dict(entry), "b": other}):
        first, second, third = caches["default"], caches["a"], caches["b"]
        assert first is not second
        assert first.core is second.core is third.core  # the key prefix is not the core's
        remember(first)
        first.set("shared-core", 1)
        first.close()
        caches.close_all()  # what Django does at the end of every request
        assert not first.core.closed
        assert second.get("shared-core") == 1
        second.delete("shared-core")


def test_a_closed_core_is_replaced_on_next_use(cluster: LocalSentinelCluster) -> None:
    cache = remember(build_cache(cache_entry(cluster, KEY_PREFIX="replaced")))
    cache.set("k", 1)
    old = cache.core
    old.close()
    assert cache.get("k") == 1
    assert remember(cache).core is not old
    cache.delete("k")


def test_backend_timeouts_follow_django() -> None:
    cache = backend(["h:26379"], OPTIONS={"MASTERS": ["a"]}, TIMEOUT=120)
    assert cache.get_backend_timeout() == 120
    assert cache.get_backend_timeout(DEFAULT_TIMEOUT) == 120
    assert cache.get_backend_timeout(None) is None
    assert cache.get_backend_timeout(0) == 0
    assert cache.get_backend_timeout(-5) == 0
    assert cache.get_backend_timeout(2.5) == 2.5
    forever = backend(["h:26379"], OPTIONS={"MASTERS": ["a"]}, TIMEOUT=None)
    assert forever.get_backend_timeout() is None
