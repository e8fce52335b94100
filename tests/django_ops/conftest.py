"""Django settings for the operations tests (system checks, ``sentinel_status``).

Django can be configured once per process, and ``tests/django/`` needs it too: whichever
directory's conftest is imported first calls :func:`minimal_django.configure_django`, guarded by
``settings.configured``, and every test sets its own ``CACHES`` with ``override_settings``.
(The helper belongs in the root conftest; it lives here until the lead moves it.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings
from minimal_django import LOCMEM, configure_django
from ops_support import UseCaches

from sentinel_cache.django.checks import sentinel_aliases


def pytest_configure(config: pytest.Config) -> None:
    configure_django()


@pytest.fixture(autouse=True)
def _sentinel_cache_installed() -> Iterator[None]:
    """Our app (checks, command) even if another directory configured Django without it."""
    if apps.is_installed("sentinel_cache"):
        yield
        return
    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "sentinel_cache"]):
        yield


@pytest.fixture
def use_caches() -> Iterator[UseCaches]:
    """``use_caches(alias=entry, ...)``: these CACHES (plus a locmem default) for the test.

    On teardown, closes the pools the backend opened for them (sockets and listener threads).
    """
    overrides: list[Any] = []

    def apply(**entries: Mapping[str, Any]) -> None:
        override = override_settings(CACHES={"default": dict(LOCMEM), **entries})
        override.enable()
        overrides.append(override)

    yield apply
    for override in reversed(overrides):
        for alias in sentinel_aliases():
            try:
                pool = caches[alias].core  # type: ignore[attr-defined]
            except Exception:  # a deliberately broken configuration has no pool to close
                continue
            pool.close()
        override.disable()
