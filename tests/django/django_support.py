"""Helpers shared by the Django adapter's tests and their conftest (a uniquely named module:
``conftest`` is ambiguous as a module name when several test directories have one).

This directory is deliberately not a package: a ``tests/django/__init__.py`` would make it
importable as ``django`` and shadow the real Django.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import django
from django.apps import apps
from django.conf import settings

from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.django import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

HERE = Path(__file__).resolve().parent
BACKEND = "sentinel_cache.django.ShardedSentinelCache"
# Databases of our own on the shared topology, so a prefix-less clear() (FLUSHDB on every
# shard) never touches other directories' keys, and our cores are never theirs.
DJANGO_DB = 5
DJANGO_SUITE_DB = 6

MakeCache = Callable[..., ShardedSentinelCache]

#: Cores opened by the running test; conftest closes them when it ends.
opened: dict[int, ShardedSentinelPool] = {}


def load(name: str, filename: str) -> ModuleType:
    """Import a file of this directory under a unique module name (any pytest import mode)."""
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, HERE / filename)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def configure_django() -> str:
    """Configure Django from ``settings.py`` unless already done; returns our ROOT_URLCONF."""
    if not settings.configured:
        values = load("sentinel_cache_tests_django_settings", "settings.py")
        settings.configure(**{k: getattr(values, k) for k in dir(values) if k.isupper()})
    if not apps.ready:
        django.setup()
    return load("sentinel_cache_tests_django_urls", "urls.py").__name__


def cache_entry(cluster: LocalSentinelCluster, **params: Any) -> dict[str, Any]:
    """A ``CACHES`` entry for this backend on ``cluster``; ``OPTIONS`` given are merged in."""
    config = cluster.config()
    options: dict[str, Any] = {"MASTERS": config["masters"], "DB": DJANGO_DB}
    if config["password"]:
        options["PASSWORD"] = config["password"]
    if config["sentinel_password"]:
        options["SENTINEL_PASSWORD"] = config["sentinel_password"]
    options.update(params.pop("OPTIONS", {}))
    return {"BACKEND": BACKEND, "LOCATION": config["sentinels"], "OPTIONS": options, **params}


def build_cache(entry: dict[str, Any]) -> ShardedSentinelCache:
    """What Django's cache handler does with a ``CACHES`` entry."""
    params = dict(entry)
    params.pop("BACKEND", None)
    location = params.pop("LOCATION", "")
    return ShardedSentinelCache(location, params)


def remember(cache: ShardedSentinelCache) -> ShardedSentinelCache:
    """Note the cache's core so that it is closed when the test ends."""
    opened[id(cache.core)] = cache.core
    return cache


def unique_prefix() -> str:
    return f"dj{uuid.uuid4().hex[:10]}"


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes/contexts; fails on a cycle (which would leak and confuse)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None:
        assert not any(current is s for s in seen), f"exception chain cycle at {current!r}"
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
