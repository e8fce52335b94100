"""A backend object built from settings already seen costs a lookup, not a parse (issue 37,
item 5): Django builds one per ASGI request (``caches`` is a context-local) and per thread.

Instances from equal settings share the parsed configuration, codec and clients; any difference
the parser could see (a value's type, an option, a django-redis global under
``override_settings``) parses afresh; a bad configuration still fails on first use and in the
system checks; what Django's ``BaseCache`` keeps per instance stays per instance. No timing
here: ``benchmarks/construct.py`` measures the cost."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django_support import build_cache, cache_entry, remember
from threads import Workers

from sentinel_cache.core.memo import Memo, settings_key
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.django.checks import check_configuration
from sentinel_cache.testing import LocalSentinelCluster

LOCATION = ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]


def settings(**options: Any) -> dict[str, Any]:
    """A fresh params dict (as Django's cache handler copies one per build)."""
    return {"OPTIONS": {"MASTERS": ["shard_a", "shard_b"], **options}}


def build(location: Any = None, **options: Any) -> ShardedSentinelCache:
    return ShardedSentinelCache(list(location or LOCATION), settings(**options))


# -- the key -----------------------------------------------------------------------------------
def test_keys_tell_apart_what_compares_equal_across_types() -> None:
    def key(value: Any) -> Any:
        return settings_key({"DB": value})

    assert len({key(1), key(True), key(1.0)}) == 3  # 1 == True == 1.0, parsed differently
    assert key([1, 2]) != key((1, 2))
    assert key(0.0) != key(-0.0)
    assert key(float("nan")) == key(float("nan"))  # a NaN keys as itself: parsed the same
    assert key({"a": 1, "b": 2}) == key({"a": 1, "b": 2})
    assert key("1") != key(1) and key(b"1") != key("1")
    assert key(None) != key(()) != key([])


def test_keys_refuse_objects_with_state_of_their_own() -> None:
    class Serializer:
        def dumps(self, value: Any) -> bytes:
            return b""

    class Text(str):
        pass

    assert settings_key({"SERIALIZER": Serializer()}) is None  # an instance: parsed each time
    assert settings_key({"MASTERS": [Text("a")]}) is None  # a str subclass (a lazy string)
    cycle: list[Any] = []
    cycle.append(cycle)
    assert settings_key(cycle) is None
    # Classes and functions key by identity: the same class, the same key.
    assert settings_key(Serializer) == settings_key(Serializer) is not None
    assert settings_key(len) is not None


def test_the_memo_is_bounded_and_keeps_the_first_value_stored() -> None:
    memo: Memo[object] = Memo(3)
    first = object()
    assert memo.put("a", first) is first
    assert memo.put("a", object()) is first  # two builders at once: both get the first
    for name in "bcdefg":
        memo.put(name, object())
    assert len(memo) == 3
    assert memo.get("a") is None and memo.get("g") is not None  # the oldest went first
    assert repr(memo) == "<Memo 3/3>"
    with pytest.raises(ValueError, match="at least one"):
        Memo(0)


# -- what is shared and what is not --------------------------------------------------------------
def test_equal_settings_share_the_parsed_configuration_and_codec() -> None:
    first, second = build(DB=3), build(DB=3)
    assert first is not second
    assert first.pool_config is second.pool_config
    assert first.cache_options is second.cache_options
    assert first._codec_or_raise() is second._codec_or_raise()


def test_different_settings_parse_afresh() -> None:
    base = build(DB=3)
    assert build(DB=4).pool_config is not base.pool_config
    assert build(DB=4).pool_config.connection_options()["db"] == 4
    assert build(["10.0.0.9:26379"], DB=3).pool_config is not base.pool_config
    assert build(DB=3, SOCKET_TIMEOUT=1).pool_config is not base.pool_config
    assert build(DB=3, SERIALIZER="json").cache_options.serializer == "json"
    assert base.cache_options.serializer != "json"


def test_a_value_equal_but_of_another_type_is_parsed_and_refused() -> None:
    assert build(DB=1).pool_config.connection_options()["db"] == 1
    wrong = build(DB=True)  # True == 1: a memo keyed on equality would hand back DB 1
    with pytest.raises(ImproperlyConfigured, match="DB: must be an integer"):
        wrong.pool_config  # noqa: B018 - the property raises


def test_options_that_cannot_be_keyed_are_parsed_each_time() -> None:
    class Name(str):  # a str subclass (a lazy string is one): not trusted to key by value
        pass

    first = ShardedSentinelCache(LOCATION, {"OPTIONS": {"MASTERS": [Name("shard_a")]}})
    second = ShardedSentinelCache(LOCATION, {"OPTIONS": {"MASTERS": [Name("shard_a")]}})
    assert first.pool_config == second.pool_config
    assert first.pool_config is not second.pool_config


def test_ever_new_settings_do_not_grow_the_memo_without_bound() -> None:
    """At most 64 settings are kept (docs/benchmarks.md): the oldest go first."""
    first = build(DB=2, SOCKET_TIMEOUT=3.5)
    assert build(DB=2, SOCKET_TIMEOUT=3.5).pool_config is first.pool_config
    for n in range(65):
        last = build(DB=2, SOCKET_TIMEOUT=3.5 + (n + 1) / 1000)
    assert build(DB=2, SOCKET_TIMEOUT=3.5).pool_config is not first.pool_config  # dropped
    assert build(DB=2, SOCKET_TIMEOUT=3.5 + 65 / 1000).pool_config is last.pool_config


def test_what_base_cache_keeps_stays_per_instance() -> None:
    params = settings(DB=3)
    one = ShardedSentinelCache(LOCATION, {**params, "KEY_PREFIX": "one", "TIMEOUT": 10})
    two = ShardedSentinelCache(LOCATION, {**params, "KEY_PREFIX": "two", "VERSION": 2})
    assert one.pool_config is two.pool_config
    assert (one.key_prefix, one.default_timeout, one.version) == ("one", 10, 1)
    assert (two.key_prefix, two.default_timeout, two.version) == ("two", 300, 2)
    assert one.make_key("k") == "one:1:k" and two.make_key("k") == "two:2:k"


# -- the django-redis globals --------------------------------------------------------------------
def test_override_settings_of_a_django_redis_global_is_honoured() -> None:
    assert not build(DB=3).cache_options.ignore_exceptions
    with override_settings(DJANGO_REDIS_IGNORE_EXCEPTIONS=True):
        assert build(DB=3).cache_options.ignore_exceptions
        with override_settings(DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS=True):
            assert build(DB=3).cache_options.log_ignored_exceptions_interval == 0
        assert build(DB=3).cache_options.log_ignored_exceptions_interval != 0
    assert not build(DB=3).cache_options.ignore_exceptions


def test_override_settings_of_the_logger_and_itersize_is_honoured(
    cluster: LocalSentinelCluster,
) -> None:
    entry = cache_entry(cluster, OPTIONS={"IGNORE_EXCEPTIONS": True})
    assert remember(build_cache(entry)).client.fail_open.logger.name == "sentinel_cache.django"
    with override_settings(DJANGO_REDIS_LOGGER="construct.test", DJANGO_REDIS_SCAN_ITERSIZE=7):
        cache = remember(build_cache(entry))
        assert cache.client.fail_open.logger is logging.getLogger("construct.test")
        assert cache._delete_pattern("x*").kwargs == {"count": 7}
    cache = remember(build_cache(entry))
    assert cache.client.fail_open.logger.name == "sentinel_cache.django"
    assert cache._delete_pattern("x*").kwargs["count"] != 7


def test_settings_configured_after_a_build_are_read_for_the_next() -> None:
    """Built before ``settings.configure()`` (no signal is sent then), and after it: the
    globals configured are seen. In a fresh interpreter, as settings are configured here."""
    script = textwrap.dedent(
        """
        from django.conf import settings
        from sentinel_cache.django import ShardedSentinelCache
        params = {"OPTIONS": {"MASTERS": ["a"]}}
        before = ShardedSentinelCache("10.0.0.1:26379", params)
        settings.configure(DJANGO_REDIS_IGNORE_EXCEPTIONS=True)
        after = ShardedSentinelCache("10.0.0.1:26379", params)
        print(before.cache_options.ignore_exceptions, after.cache_options.ignore_exceptions)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_a_bad_global_is_refused_naming_it() -> None:
    with override_settings(DJANGO_REDIS_SCAN_ITERSIZE=0):
        cache = build(DB=3)
        with pytest.raises(ImproperlyConfigured, match="DJANGO_REDIS_SCAN_ITERSIZE"):
            cache.pool_config  # noqa: B018 - the property raises
    assert build(DB=3).pool_config.connection_options()["db"] == 3


# -- errors as before ------------------------------------------------------------------------
def test_a_bad_configuration_errors_on_first_use_every_time() -> None:
    for _ in range(3):  # never memoized: each instance parses and fails alike
        cache = build(WEIGTHS=[1, 2])
        with pytest.raises(ImproperlyConfigured, match="did you mean 'WEIGHTS'"):
            cache.get("k")
        with pytest.raises(ImproperlyConfigured, match="WEIGTHS"):
            asyncio.run(cache.aget("k"))


def test_a_bad_configuration_is_still_E001_in_the_checks() -> None:
    bad = {
        "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
        "LOCATION": LOCATION,
        "OPTIONS": {"MASTERS": ["a"], "SOCKET_TIMEOUT": -1},
    }
    for _ in range(2):
        with override_settings(CACHES={"default": bad}):
            (error,) = check_configuration(None)
        assert error.id == "sentinel_cache.E001"
        assert "SOCKET_TIMEOUT" in error.msg


# -- the clients, on a real topology -------------------------------------------------------------
def test_instances_share_their_clients_and_keep_their_keys_apart(
    cluster: LocalSentinelCluster,
) -> None:
    entry = cache_entry(cluster)
    one = remember(build_cache({**entry, "KEY_PREFIX": "construct-one"}))
    two = remember(build_cache({**entry, "KEY_PREFIX": "construct-two"}))
    assert one.client is two.client
    one.set("k", "from one")
    two.set("k", "from two")
    assert (one.get("k"), two.get("k")) == ("from one", "from two")
    one.core.close()  # a closed core: the next use of either instance builds one client anew
    renewed = one.client
    assert renewed is not None and not renewed.core.closed
    assert two.client is renewed
    remember(one)
    assert two.get("k") == "from two"
    one.delete("k")
    two.delete("k")


def test_the_asyncio_client_is_shared_across_event_loops(cluster: LocalSentinelCluster) -> None:
    entry = cache_entry(cluster)
    one = remember(build_cache({**entry, "KEY_PREFIX": "construct-aone"}))
    two = remember(build_cache({**entry, "KEY_PREFIX": "construct-aone"}))
    asyncio.run(one.aset("k", 1))  # one loop
    assert asyncio.run(two.aget("k")) == 1  # another loop, the same client
    assert one.aclient is two.aclient
    asyncio.run(one.adelete("k"))


def test_threads_building_at_once_get_one_parse(cluster: LocalSentinelCluster) -> None:
    entry = cache_entry(cluster, OPTIONS={"SOCKET_TIMEOUT": 4.25})  # settings no test used
    start = threading.Barrier(8)
    built: list[ShardedSentinelCache] = []

    def construct() -> None:
        start.wait(timeout=10)
        cache = build_cache(entry)
        cache.set("construct-thread", 1)
        built.append(cache)

    with Workers(timeout=30) as workers:
        for n in range(8):
            workers.spawn(construct, name=f"construct-{n}")
    assert len(built) == 8
    remember(built[0])
    assert len({id(cache.pool_config) for cache in built}) == 1
    built[0].delete("construct-thread")
