"""Fixtures for the health endpoint tests (``sentinel_cache.core.admin.health`` and its Django and
Flask endpoints), against the shared topology and private, killable ones."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings
from health_support import URLCONF, UseSettings
from minimal_django import configure_django

configure_django()


@pytest.fixture
def use_settings() -> Iterator[UseSettings]:
    """``use_settings(CACHES=..., **more)``: Django settings for the test (our URLconf, the test
    client's host allowed). On teardown closes the cores the caches opened."""
    overrides: list[Any] = []

    def apply(**values: Any) -> None:
        values.setdefault("ROOT_URLCONF", URLCONF)
        values.setdefault("ALLOWED_HOSTS", ["testserver", "localhost", "127.0.0.1"])
        override = override_settings(**values)
        override.enable()
        overrides.append(override)

    yield apply
    for override in reversed(overrides):
        for alias in caches:
            try:
                core = getattr(caches[alias], "core", None)
            except Exception:  # a deliberately broken configuration has no core to close
                continue
            if core is not None:
                core.close()
        override.disable()
