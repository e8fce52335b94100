"""Helpers shared by the health tests and their conftest (a uniquely named module: ``conftest``
is ambiguous as a module name when several test directories have one).

This directory is not a package, like ``tests/django`` (a package named after a framework would
shadow it). Django can be configured once per process: whichever test directory's conftest runs
first configures the same minimal baseline, and every test here sets what it needs (CACHES,
ROOT_URLCONF, ALLOWED_HOSTS, the toolbar's apps) with ``override_settings``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from sentinel_cache.testing import LocalSentinelCluster

BACKEND = "sentinel_cache.django.ShardedSentinelCache"
# A database of its own on the shared topology: our cores are never another directory's.
HEALTH_DB = 13
FLASK_HEALTH_DB = 15
URLCONF = "health_urls"

#: The ``use_settings`` fixture: ``use_settings(CACHES=..., **more)``.
UseSettings = Callable[..., None]


def cache_entry(cluster: LocalSentinelCluster, **params: Any) -> dict[str, Any]:
    """A ``CACHES`` entry of our backend on ``cluster`` (DB ``HEALTH_DB``, a fresh prefix)."""
    config = cluster.config()
    options: dict[str, Any] = {"MASTERS": config["masters"], "DB": HEALTH_DB}
    if config["password"]:
        options["PASSWORD"] = config["password"]
    if config["sentinel_password"]:
        options["SENTINEL_PASSWORD"] = config["sentinel_password"]
    options.update(params.pop("OPTIONS", {}))
    params.setdefault("KEY_PREFIX", f"hc{uuid.uuid4().hex[:8]}")
    return {"BACKEND": BACKEND, "LOCATION": config["sentinels"], "OPTIONS": options, **params}


def flask_settings(cluster: LocalSentinelCluster, **overrides: Any) -> dict[str, Any]:
    """Flask-Caching settings of our backend on ``cluster`` (DB ``FLASK_HEALTH_DB``)."""
    config = cluster.config()
    values: dict[str, Any] = {
        "CACHE_TYPE": "sentinel_cache.flask.ShardedSentinelCache",
        "CACHE_REDIS_SENTINELS": config["sentinels"],
        "CACHE_REDIS_SENTINEL_MASTERS": config["masters"],
        "CACHE_REDIS_DB": FLASK_HEALTH_DB,
    }
    if config["password"]:
        values["CACHE_REDIS_PASSWORD"] = config["password"]
    if config["sentinel_password"]:
        values["CACHE_REDIS_SENTINEL_PASSWORD"] = config["sentinel_password"]
    values.update(overrides)
    return values
