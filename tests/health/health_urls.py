"""The URLconf of the health tests: the plain view (with URLconf options), django-health-check's
view with our check, and views whose cache calls django-debug-toolbar's cache panel records
(its own URLs are in ``health_toolbar_urls``: importing them needs ``debug_toolbar`` installed)."""

from __future__ import annotations

from typing import Any

from django.core.cache import caches
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver, path
from health_check.views import HealthCheckView

from sentinel_cache.django.health import health_view

CHECK = "sentinel_cache.django.health.SentinelCacheHealthCheck"


def toolbar_sync(request: HttpRequest, alias: str) -> HttpResponse:
    """Two hits and two misses, as the toolbar counts them, plus a set."""
    cache = caches[alias]
    found: dict[str, Any] = {"missing": cache.get("missing")}
    cache.set("present", "value", 60)
    found["present"] = cache.get("present")
    found["many"] = cache.get_many(["present", "missing-too"])
    return JsonResponse(found)


async def toolbar_async(request: HttpRequest, alias: str) -> HttpResponse:
    """The same calls through the async API."""
    cache = caches[alias]
    found: dict[str, Any] = {"missing": await cache.aget("missing")}
    await cache.aset("present", "value", 60)
    found["present"] = await cache.aget("present")
    found["many"] = await cache.aget_many(["present", "missing-too"])
    return JsonResponse(found)


urlpatterns: list[URLPattern | URLResolver] = [
    path("health/cache/", health_view),
    path("health/cache/strict/", health_view, {"fail_on": "degraded"}),
    path("health/cache/fast/", health_view, {"timeout": 0.3}),
    path("health/cache/sharded/", health_view, {"aliases": ["sharded"]}),
    path("toolbar/sync/<str:alias>/", toolbar_sync),
    path("toolbar/async/<str:alias>/", toolbar_async),
]

urlpatterns += [
    path("ht/", HealthCheckView.as_view(checks=[CHECK])),
    path("ht/strict/", HealthCheckView.as_view(checks=[(CHECK, {"fail_on": "degraded"})])),
]
