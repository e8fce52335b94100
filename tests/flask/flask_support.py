"""Helpers shared by the Flask adapter's tests (a uniquely named module: the upstream suites
bring their own ``conftest``).

Every cache here uses a database of its own (``FLASK_DB`` and up), so a prefix-less ``clear()``
(``FLUSHDB`` on every shard) cannot touch keys that other test modules keep in DB 0.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from flask import Flask
from flask_caching import Cache

from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.flask import CACHE_TYPE, ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

FLASK_DB = 9  # this directory's own tests; the upstream suites use 11 and 12

Built = tuple[Flask, Cache, ShardedSentinelCache]
MakeApp = Callable[..., Built]

#: Shared cores opened by the current test module; conftest closes them after it.
opened: dict[int, ShardedSentinelPool] = {}


def settings_for(cluster: LocalSentinelCluster, **overrides: Any) -> dict[str, Any]:
    """The Flask settings that point a cache at ``cluster``."""
    config = cluster.config()
    settings: dict[str, Any] = {
        "CACHE_TYPE": CACHE_TYPE,
        "CACHE_REDIS_SENTINELS": config["sentinels"],
        "CACHE_REDIS_SENTINEL_MASTERS": config["masters"],
        "CACHE_REDIS_DB": FLASK_DB,
    }
    if config["password"]:
        settings["CACHE_REDIS_PASSWORD"] = config["password"]
    if config["sentinel_password"]:
        settings["CACHE_REDIS_SENTINEL_PASSWORD"] = config["sentinel_password"]
    settings.update(overrides)
    return settings


def build_app(settings: dict[str, Any], name: str = "flask_tests") -> Built:
    """A Flask app configured with ``settings`` and its Cache; returns (app, cache, backend)."""
    app = Flask(name)
    app.testing = True
    app.config.update(settings)
    cache = Cache(app)
    backend = app.extensions["cache"][cache]
    assert isinstance(backend, ShardedSentinelCache)
    opened[id(backend.core)] = backend.core
    return app, cache, backend


def unique_prefix() -> str:
    return f"t:{uuid.uuid4().hex[:10]}:"
