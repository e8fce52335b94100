"""django-redis's ``tests/conftest.py``, for its own suite run against ``ShardedSentinelCache``.

Not collected by pytest: ``test_django_redis_suite.py`` copies it as ``tests/conftest.py`` beside
the test files extracted from django-redis's source distribution. Upstream's conftest needs
pytest-xdist (its scheduler) and parametrises every test over twelve django-redis settings
modules; this one keeps its fixtures as they are (``settings``, ``cache``) and parametrises over
one settings module, ``settings/sentinel_cache.py``: django-redis's ``sqlite.py`` translated as
docs/migration.md tells a django-redis team. ``mocker`` is the part of pytest-mock the suite
uses (``mocker.patch`` and ``mocker.patch.object``, undone after the test), as pytest-mock is no
dependency of ours.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from os import environ
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from tests.settings_wrapper import SettingsWrapper

SETTINGS_MODULES = ["sentinel_cache"]


def pytest_configure(config: pytest.Config) -> None:
    sys.path.insert(0, str(Path(__file__).absolute().parent))


@pytest.fixture()
def settings() -> Iterator[SettingsWrapper]:
    """A Django settings object which restores changes after the testrun (upstream's)."""
    wrapper = SettingsWrapper()
    yield wrapper
    wrapper.finalize()


@pytest.fixture()
def cache(cache_settings: str) -> Iterator[Any]:
    """Upstream's: the default cache of ``settings.<cache_settings>``, cleared afterwards."""
    from django import setup

    environ["DJANGO_SETTINGS_MODULE"] = f"settings.{cache_settings}"
    setup()

    from django.core.cache import cache as default_cache

    yield default_cache
    default_cache.clear()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cache" in metafunc.fixturenames or "session" in metafunc.fixturenames:
        metafunc.parametrize("cache_settings", SETTINGS_MODULES)


class _Patch:
    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack

    def __call__(self, target: str, *args: Any, **kwargs: Any) -> Any:
        return self._stack.enter_context(mock.patch(target, *args, **kwargs))

    def object(self, target: Any, attribute: str, *args: Any, **kwargs: Any) -> Any:
        return self._stack.enter_context(mock.patch.object(target, attribute, *args, **kwargs))


@pytest.fixture()
def mocker() -> Iterator[SimpleNamespace]:
    """pytest-mock's ``mocker``, as far as the suite uses it."""
    with contextlib.ExitStack() as stack:
        yield SimpleNamespace(patch=_Patch(stack))
