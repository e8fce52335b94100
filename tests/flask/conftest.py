"""Fixtures for the Flask adapter's tests: apps whose Flask-Caching backend is built through
``CACHE_TYPE`` against the shared session topology (``cluster``, from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask_support import Built, MakeApp, build_app, opened, settings_for, unique_prefix

from sentinel_cache.flask import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture(scope="module", autouse=True)
def _close_flask_pools() -> Iterator[None]:
    """Close the shared cores this module's caches opened: no listener thread or socket of
    ours outlives the module (other modules count threads)."""
    yield
    for pool in list(opened.values()):
        pool.close()
    opened.clear()


@pytest.fixture
def make_app(cluster: LocalSentinelCluster) -> MakeApp:
    """``make_app(**settings)``: an app on the session topology (DB ``FLASK_DB``, no prefix
    unless given)."""

    def factory(**overrides: Any) -> Built:
        return build_app(settings_for(cluster, **overrides))

    return factory


@pytest.fixture(params=["prefix", "no_prefix"])
def backend(request: pytest.FixtureRequest, make_app: MakeApp) -> Iterator[ShardedSentinelCache]:
    """The backend with a fresh unique prefix, and without one (on an emptied database)."""
    if request.param == "prefix":
        _, _, cache = make_app(CACHE_KEY_PREFIX=unique_prefix())
    else:
        _, _, cache = make_app(CACHE_KEY_PREFIX=None)
    cache.clear()
    yield cache
    cache.clear()
