"""What django-debug-toolbar's cache panel sees of our backend, with the toolbar installed and
its middleware serving real requests (docs/observability.md, "django-debug-toolbar").

The panel patches, per request, the sync methods of every cache object Django hands out (``get``,
``set``, ``get_many``, ... on the instance) and counts a ``get`` that returned its default as a
miss. Our sync calls go through those methods, so they are recorded with their hits and misses.
The async API is not patched: Django's default ``aget`` runs the (patched) ``get`` in a thread,
so a backend without async methods of its own shows its async calls as sync ones; ours has native
async methods that never call the sync ones, so the panel does not see them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import debug_toolbar  # noqa: F401  (the [dev] extra installs it: a broken release fails here)
import pytest
from django.test import Client
from health_support import UseSettings, cache_entry
from minimal_django import LOCMEM

from sentinel_cache.testing import LocalSentinelCluster


@pytest.fixture(autouse=True)
def _leave_no_toolbar_behind() -> Iterator[None]:
    """Installing the toolbar registers its system checks for good (they would fail ``check``
    in later tests, once the app is gone) and adds it to MIGRATION_MODULES: undo both."""
    from django.conf import settings
    from django.core.checks.registry import registry

    checks, deployment = set(registry.registered_checks), set(registry.deployment_checks)
    modules = settings.MIGRATION_MODULES
    saved = dict(modules)
    yield
    registry.registered_checks, registry.deployment_checks = checks, deployment
    modules.clear()
    modules.update(saved)


def install_toolbar(cluster: LocalSentinelCluster, use_settings: UseSettings) -> None:
    """The toolbar as a project installs it (cache panel only), our backend as ``sharded``."""
    from django.conf import settings

    use_settings(
        CACHES={"default": LOCMEM, "sharded": cache_entry(cluster), "locmem": dict(LOCMEM)},
        DEBUG=True,
        INTERNAL_IPS=["127.0.0.1"],
        MIDDLEWARE=["debug_toolbar.middleware.DebugToolbarMiddleware"],
        TEMPLATES=[
            {"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}
        ],
        STATIC_URL="/static/",
        DEBUG_TOOLBAR_PANELS=["debug_toolbar.panels.cache.CachePanel"],
        DEBUG_TOOLBAR_CONFIG={"IS_RUNNING_TESTS": False},
    )
    # Separately and after: the apps' ready() runs before the other settings of its override.
    use_settings(
        INSTALLED_APPS=[*settings.INSTALLED_APPS, "debug_toolbar"],
        ROOT_URLCONF="health_toolbar_urls",
    )


def cache_panel(path: str) -> dict[str, Any]:
    """Serve ``path`` through the toolbar's middleware; the cache panel's recorded stats."""
    from debug_toolbar.store import get_store

    store = get_store()
    store.clear()
    response = Client().get(path)
    assert response.status_code == 200, response.content
    (request_id,) = store.request_ids()
    stats: dict[str, Any] = store.panel(request_id, "CachePanel")
    return stats


def calls_of(stats: dict[str, Any], alias: str) -> list[str]:
    return [call["name"] for call in stats["calls"] if call["backend"].startswith(f"{alias} (")]


def test_cache_panel_records_sync_calls_with_hits_and_misses(
    cluster: LocalSentinelCluster, use_settings: UseSettings
) -> None:
    install_toolbar(cluster, use_settings)
    stats = cache_panel("/toolbar/sync/sharded/")
    assert calls_of(stats, "sharded") == ["get", "set", "get", "get_many"]
    assert {c["backend"] for c in stats["calls"]} == {"sharded (ShardedSentinelCache)"}
    # get("missing") and "missing-too" in get_many miss; get("present") and "present" hit.
    assert (stats["hits"], stats["misses"]) == (2, 2)
    assert stats["counts"]["get"] == 2 and stats["counts"]["get_many"] == 1
    assert stats["total_time"] > 0


def test_cache_panel_does_not_see_our_native_async_calls(
    cluster: LocalSentinelCluster, use_settings: UseSettings
) -> None:
    install_toolbar(cluster, use_settings)
    stats = cache_panel("/toolbar/async/sharded/")
    assert calls_of(stats, "sharded") == []  # aget/aset/aget_many: not patched, not recorded
    assert (stats["hits"], stats["misses"]) == (0, 0)
    # Django's own default async methods call the patched sync ones (aget_many calls aget per
    # key), so the panel sees them: what it misses is our backend's native asyncio path, not
    # async views as such.
    stats = cache_panel("/toolbar/async/locmem/")
    assert calls_of(stats, "locmem") == ["get", "set", "get", "get", "get"]
    assert (stats["hits"], stats["misses"]) == (2, 2)
