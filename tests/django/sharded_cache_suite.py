"""Django's own cache test suite (``BaseCacheTests``) against ``ShardedSentinelCache``.

Not collected by pytest: ``test_django_suite.py`` copies it, as ``cache/tests_sharded.py``, into
the ``cache`` test package extracted from Django's source distribution and runs it with
``python -m django test cache.tests_sharded``; the topology arrives in environment variables.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from django.core.cache import caches
from django.test import TestCase, override_settings

from sentinel_cache.django import ShardedSentinelCache

from .tests import BaseCacheTests, caches_setting_for_tests

OPTIONS: dict[str, Any] = {
    "MASTERS": os.environ["SENTINEL_CACHE_TEST_MASTERS"].split(","),
    "DB": int(os.environ["SENTINEL_CACHE_TEST_DB"]),
}
if os.environ.get("SENTINEL_CACHE_TEST_PASSWORD"):
    OPTIONS["PASSWORD"] = os.environ["SENTINEL_CACHE_TEST_PASSWORD"]
if os.environ.get("SENTINEL_CACHE_TEST_SENTINEL_PASSWORD"):
    OPTIONS["SENTINEL_PASSWORD"] = os.environ["SENTINEL_CACHE_TEST_SENTINEL_PASSWORD"]

SHARDED = {
    "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
    "LOCATION": os.environ["SENTINEL_CACHE_TEST_SENTINELS"],
    "OPTIONS": OPTIONS,
}


# Culling is Django's own bookkeeping for size-limited backends; Redis evicts by its
# maxmemory-policy, so "cull"/"zero_cull" are excluded exactly as for Django's RedisCache.
@override_settings(CACHES=caches_setting_for_tests(base=SHARDED, exclude={"cull", "zero_cull"}))
class ShardedSentinelCacheTests(BaseCacheTests, TestCase):
    # incr() on a value that is not an integer: the server's error, as with RedisCache.
    incr_decr_type_error = redis.ResponseError

    def test_runs_on_the_sharded_backend(self) -> None:
        """Guard: the suite above really exercised both shards of this backend."""
        cache = caches["default"]
        self.assertIsInstance(cache, ShardedSentinelCache)
        assert isinstance(cache, ShardedSentinelCache)
        keys = [f"spread{i}" for i in range(40)]
        cache.set_many(dict.fromkeys(keys, 1))
        shards = {cache.core.shard_for(cache.make_key(k)).index for k in keys}
        self.assertEqual(shards, {0, 1})
        self.assertEqual(cache.get_many(keys), dict.fromkeys(keys, 1))
