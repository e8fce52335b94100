"""Flask-Caching's and cachelib's own backend test suites, run against our backend.

The test files come from the source distributions of the *installed* versions (downloaded once
into ``.cache/sdists`` with ``pip download``, retried once, by ``upstream_sdist``; a failed
download is a failed test, never a skip). The needed files are extracted into a temporary
directory and imported under unique module names (pytest rewrites their asserts); the classes
below subclass the upstream test classes and provide what their ``conftest.py`` fixtures
provided:

* Flask-Caching ``tests/test_backend_cache.py``: ``GenericCacheTests`` needs ``make_cache``
  (here: the backend built through ``CACHE_TYPE`` by ``Cache(app)``, with and without a key
  prefix, like upstream's ``TestRedisCache``) and ``clock`` (the fake clock; unused because real
  servers expire keys in real time, so ``_can_use_fast_sleep = False`` as upstream's Redis
  tests set it).
* cachelib ``tests/{common,clear,has,delete_many_with_prefix,serializer}.py``: the mixins need
  ``self.cache_factory(**kwargs)`` (an autouse fixture upstream; it empties the database first)
  and the ``key_prefix`` fixture (no prefix / ``"test-key-prefix:"``). They import ``TestData``
  from cachelib's ``conftest``, which is loaded for that (with a stand-in for the ``xprocess``
  plugin it imports only for its server fixtures, which we do not use).

Each suite uses its own database, so the prefix-less runs may flush it.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import shutil
import sys
import tempfile
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask_support import opened, settings_for
from upstream_sdist import extract, sdists

from sentinel_cache.flask import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

FLASK_CACHING_DB = 11
CACHELIB_DB = 12

# distribution -> (files wanted from its tests/ directory, module-name prefix)
WANTED = {
    "flask-caching": (["test_backend_cache.py"], "upstream_flask_caching_"),
    "cachelib": (
        [
            "conftest.py",
            "common.py",
            "clear.py",
            "has.py",
            "delete_many_with_prefix.py",
            "serializer.py",
        ],
        "upstream_cachelib_",
    ),
}


def _load() -> dict[str, types.ModuleType]:
    """Download, extract and import the upstream test modules."""
    archives = sdists(*WANTED)
    workdir = Path(tempfile.mkdtemp(prefix="sentinel_cache_upstream_"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    names: list[str] = []
    for dist, (files, prefix) in WANTED.items():
        extract(archives[dist], [f"tests/{name}" for name in files], workdir, prefix)
        names += [prefix + name[:-3] for name in files]
    pytest.register_assert_rewrite(*names)
    sys.path.insert(0, str(workdir))
    saved = {name: sys.modules.get(name) for name in ("conftest", "xprocess")}
    modules: dict[str, types.ModuleType] = {}
    try:
        if importlib.util.find_spec("xprocess") is None:
            stand_in = types.ModuleType("xprocess")
            stand_in.ProcessStarter = object  # type: ignore[attr-defined]
            sys.modules["xprocess"] = stand_in
        # cachelib's files say ``from conftest import TestData``: give them their own conftest.
        sys.modules["conftest"] = importlib.import_module("upstream_cachelib_conftest")
        for name in names:
            modules[name] = importlib.import_module(name)
    finally:
        sys.path.remove(str(workdir))
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return modules


try:
    _modules = _load()
    LOAD_ERROR: str | None = None
except Exception:
    _modules = {}
    LOAD_ERROR = traceback.format_exc()


def test_upstream_suites_were_loaded() -> None:
    """Fails (never skips) when the sdists cannot be fetched or no longer have the suites."""
    if LOAD_ERROR is not None:
        pytest.fail(f"upstream test suites unavailable:\n{LOAD_ERROR}")
    generic = _modules["upstream_flask_caching_test_backend_cache"].GenericCacheTests
    assert len([n for n in dir(generic) if n.startswith("test_")]) >= 12
    common = _modules["upstream_cachelib_common"].CommonTests
    assert len([n for n in dir(common) if n.startswith("test_")]) >= 10


def _build(cluster: LocalSentinelCluster, db: int, **settings: Any) -> ShardedSentinelCache:
    """The backend exactly as a Flask app gets it: ``Cache(app)`` with CACHE_TYPE."""
    from flask import Flask
    from flask_caching import Cache

    app = Flask("upstream_suites")
    app.config.update(settings_for(cluster, CACHE_REDIS_DB=db, **settings))
    cache = Cache(app)
    backend = app.extensions["cache"][cache]
    assert isinstance(backend, ShardedSentinelCache)
    opened[id(backend.core)] = backend.core
    return backend


def _flush(backend: ShardedSentinelCache) -> None:
    """What upstream's factories do with ``flushdb()``: empty the database on every shard."""
    backend.client.clear(None)


if _modules:
    GenericCacheTests: Any = _modules["upstream_flask_caching_test_backend_cache"].GenericCacheTests
    CommonTests: Any = _modules["upstream_cachelib_common"].CommonTests
    ClearTests: Any = _modules["upstream_cachelib_clear"].ClearTests
    HasTests: Any = _modules["upstream_cachelib_has"].HasTests
    DeleteManyWithPrefixTests: Any = _modules[
        "upstream_cachelib_delete_many_with_prefix"
    ].DeleteManyWithPrefixTests
    SerializerTests: Any = _modules["upstream_cachelib_serializer"].SerializerTests

    class TestFlaskCachingGenericSuite(GenericCacheTests):  # type: ignore[misc]
        """Flask-Caching's GenericCacheTests on a 2-shard Sentinel topology."""

        _can_use_fast_sleep = False  # real servers: as upstream's TestRedisCache

        @pytest.fixture(params=[None, "werkzeug-test-case:"], ids=["no_prefix", "prefix"])
        def make_cache(
            self, request: pytest.FixtureRequest, cluster: LocalSentinelCluster
        ) -> Iterator[Callable[[], ShardedSentinelCache]]:
            backend = _build(cluster, FLASK_CACHING_DB, CACHE_KEY_PREFIX=request.param)
            _flush(backend)
            yield lambda: backend
            _flush(backend)

        @pytest.fixture
        def clock(self, monkeypatch: pytest.MonkeyPatch) -> Any:
            """Flask-Caching's conftest ``clock``: a fake time for cachelib's in-memory caches."""
            import cachelib.file
            import cachelib.simple

            class _Clock:
                def __init__(self, now: float) -> None:
                    self.now = now

                def __call__(self) -> float:
                    return self.now

                def advance(self, seconds: float) -> None:
                    self.now += seconds

            fake = _Clock(1_700_000_000.0)
            monkeypatch.setattr(cachelib.simple, "time", fake)
            monkeypatch.setattr(cachelib.file, "time", fake)
            return fake

    class TestCachelibSuites(  # type: ignore[misc]
        CommonTests, ClearTests, HasTests, DeleteManyWithPrefixTests, SerializerTests
    ):
        """cachelib's shared mixins (as its TestRedisCache combines them) on our backend."""

        @pytest.fixture(params=[None, "test-key-prefix:"], ids=["no_key_prefix", "with_key_prefix"])
        def key_prefix(self, request: pytest.FixtureRequest) -> str | None:
            """cachelib's conftest ``key_prefix``: without a prefix, then with one."""
            return request.param

        @pytest.fixture(autouse=True)
        def cache_factory(
            self,
            request: pytest.FixtureRequest,
            key_prefix: str | None,
            cluster: LocalSentinelCluster,
        ) -> None:
            """cachelib's ``cache_factory``: a fresh cache on an emptied database."""
            names = {
                "key_prefix": "CACHE_KEY_PREFIX",
                "ignore_delete_many_errors": "CACHE_IGNORE_ERRORS",
                "default_timeout": "CACHE_DEFAULT_TIMEOUT",
            }

            def _factory(_self: Any, **kwargs: Any) -> ShardedSentinelCache:
                kwargs.setdefault("key_prefix", key_prefix)
                settings = {names[name]: value for name, value in kwargs.items()}
                backend = _build(cluster, CACHELIB_DB, **settings)
                _flush(backend)
                return backend

            request.cls.cache_factory = _factory
