"""Fixtures for the resharding commands (``manage.py sentinel_reshard``, ``flask
sentinel-reshard``) and a Django session through an append: a private three-master topology."""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings
from minimal_django import LOCMEM, configure_django

from sentinel_cache.core import throttle
from sentinel_cache.testing import LocalSentinelCluster

configure_django()


@pytest.fixture(scope="session")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """Three masters (shard0..2), no replicas, one sentinel; every test flushes what it uses."""
    with LocalSentinelCluster(shards=3, replicas=0, sentinels=1) as cluster:
        yield cluster


@pytest.fixture
def use_caches() -> Iterator[Any]:
    """``use_caches(alias=entry, ..., **settings)``: these CACHES (plus a locmem default) and
    settings for the test, with our app installed (its management commands); the cores the
    caches opened are closed afterwards."""
    overrides: list[Any] = []

    def apply(settings_: Mapping[str, Any] | None = None, **entries: Mapping[str, Any]) -> None:
        for override in reversed(overrides):  # a new deployment replaces the last one
            _close_cores()
            override.disable()
        overrides.clear()
        installed = list(settings.INSTALLED_APPS)
        if not apps.is_installed("sentinel_cache"):
            installed.append("sentinel_cache")
        override = override_settings(
            CACHES={"default": dict(LOCMEM), **entries},
            INSTALLED_APPS=installed,
            **(settings_ or {}),
        )
        override.enable()
        overrides.append(override)

    yield apply
    for override in reversed(overrides):
        _close_cores()
        override.disable()


def _close_cores() -> None:
    for alias in settings.CACHES:
        try:
            core = getattr(caches[alias], "core", None)
        except Exception:  # a deliberately broken configuration has no core to close
            continue
        if core is not None:
            core.close()


@pytest.fixture
def every_log_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Log throttles that let every line through (a clock 100 s further at every look): the
    topology's shards are shared by the tests of a worker, so a line another test logged on a
    shard moments ago would otherwise hold this test's back."""
    clock = itertools.count(0.0, 100.0)
    monkeypatch.setattr(throttle, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
