"""``django_redis.get_redis_connection(alias)`` on our cache (it calls
``cache.client.get_client(write)``) fails saying what replaces it, rather than with redis-py's
``key must be str or bytes, got bool``."""

from __future__ import annotations

import django_redis
import pytest
from django.core.cache import caches
from django.test import override_settings

from sentinel_cache.django import ShardedSentinelCache, get_redis_connection
from sentinel_cache.exceptions import ArgumentTypeError
from sentinel_cache.testing import LocalSentinelCluster


def test_django_redis_get_redis_connection_names_ours(cluster: LocalSentinelCluster) -> None:
    config = cluster.config()
    options = {"MASTERS": config["masters"], "PASSWORD": config["password"]}
    if config["sentinel_password"]:
        options["SENTINEL_PASSWORD"] = config["sentinel_password"]
    entry = {
        "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
        "LOCATION": config["sentinels"],
        "OPTIONS": {k: v for k, v in options.items() if v},
    }
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        assert isinstance(cache, ShardedSentinelCache)
        try:
            with pytest.raises(ArgumentTypeError) as raised:
                django_redis.get_redis_connection("default")
            assert "sentinel_cache.django.get_redis_connection(alias, key=...)" in str(raised.value)
            with pytest.raises(ArgumentTypeError):
                django_redis.get_redis_connection("default", write=False)
            assert get_redis_connection("default", key="k").ping() is True  # what it names
        finally:
            cache.core.close()
