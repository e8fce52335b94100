"""Every public error the core raises is declared in ``sentinel_cache/exceptions.py`` and derives
from the one root, so ``except SentinelCacheError`` catches all of them (issue 23)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import sentinel_cache
import sentinel_cache.core
import sentinel_cache.exceptions
from sentinel_cache.exceptions import SentinelCacheError

CORE_MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(sentinel_cache.core.__path__, "sentinel_cache.core.")
)


@pytest.mark.parametrize("name", CORE_MODULES)
def test_core_declares_no_public_error_of_its_own(name: str) -> None:
    module = importlib.import_module(name)
    own = [
        cls.__name__
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseException)
        and cls.__module__ == name
        and not cls.__name__.startswith("_")
    ]
    assert own == [], f"{name} declares {own}: declare them in sentinel_cache/exceptions.py"


def test_every_error_derives_from_the_root_and_is_exported() -> None:
    declared = [
        cls
        for _, cls in inspect.getmembers(sentinel_cache.exceptions, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == "sentinel_cache.exceptions"
    ]
    assert len(declared) >= 20
    for cls in declared:
        assert issubclass(cls, SentinelCacheError), cls
        assert cls.__name__ in sentinel_cache.exceptions.__all__, cls
        assert getattr(sentinel_cache, cls.__name__) is cls, cls
