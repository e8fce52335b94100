"""Views that use the cache, for requests served through Django's test client."""

from __future__ import annotations

from django.core.cache import caches
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path


def write(request: HttpRequest, key: str) -> HttpResponse:
    value = request.GET["value"]
    stored = caches["sharded"].set(key, value, timeout=60)
    return JsonResponse({"stored": stored})


def read(request: HttpRequest, key: str) -> HttpResponse:
    return JsonResponse({"value": caches["sharded"].get(key)})


def count(request: HttpRequest, key: str) -> HttpResponse:
    cache = caches["sharded"]
    cache.add(key, 0, timeout=60)
    return JsonResponse({"value": cache.incr(key)})


async def async_write(request: HttpRequest, key: str) -> HttpResponse:
    value = request.GET["value"]
    stored = await caches["sharded"].aset(key, value, timeout=60)
    return JsonResponse({"stored": stored, "value": await caches["sharded"].aget(key)})


urlpatterns = [
    path("write/<str:key>", write),
    path("read/<str:key>", read),
    path("count/<str:key>", count),
    path("async-write/<str:key>", async_write),
]
