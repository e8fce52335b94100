"""``sentinel_cache.django.UpdateCacheMiddleware`` / ``FetchFromCacheMiddleware``, Django's
split page cache (issue 26, item 5): with other middleware between them, a cold page
requested at once runs the view once and every request gets that page, sync and async; with
``STAMPEDE_PROTECTION`` off, side by side, the view runs in more than one request. A fetch
without our update outside it releases its lock when the response comes back. Real servers."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings
from django_support import cache_entry, remember, unique_prefix
from threads import Workers

from sentinel_cache.core.ops._sync.stampede import lock_key
from sentinel_cache.django import FetchFromCacheMiddleware, UpdateCacheMiddleware
from sentinel_cache.django.pages import look
from sentinel_cache.testing import LocalSentinelCluster

BODY_SECONDS = 0.2


def caches_for(cluster: LocalSentinelCluster, **options: Any) -> dict[str, Any]:
    prefix = unique_prefix()
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "on": cache_entry(
            cluster, KEY_PREFIX=prefix, OPTIONS={"STAMPEDE_PROTECTION": True, **options}
        ),
        "off": cache_entry(cluster, KEY_PREFIX=prefix + "off"),
    }


def between(get_response: Any) -> Any:
    """A middleware of the site's between the two halves (it sees every response)."""

    def middleware(request: HttpRequest) -> Any:
        response = get_response(request)
        response["X-Between"] = "seen"
        return response

    return middleware


def split_site(ran: list[int]) -> Any:
    """MIDDLEWARE = [Update, between, Fetch] around a view taking BODY_SECONDS."""

    def view(request: HttpRequest) -> HttpResponse:
        ran.append(1)
        time.sleep(BODY_SECONDS)
        return HttpResponse(f"page {uuid.uuid4().hex}")

    return UpdateCacheMiddleware(between(FetchFromCacheMiddleware(view)))


def cold_page(site: Any, requests: int) -> list[bytes]:
    """``requests`` threads request one cold page together; their bodies."""
    path, go = f"/split/{uuid.uuid4().hex}/", threading.Event()
    bodies: list[bytes] = []

    def one() -> None:
        request = RequestFactory().get(path)
        assert go.wait(30)
        response = site(request)
        assert response.status_code == 200 and response["X-Between"] == "seen"
        bodies.append(response.content)

    with Workers(timeout=60) as workers:
        for _ in range(requests):
            workers.spawn(one)
        go.set()
    return bodies


def test_the_split_pair_runs_a_cold_pages_view_once(cluster: LocalSentinelCluster) -> None:
    settings = caches_for(cluster)
    ran_on: list[int] = []
    ran_off: list[int] = []
    with override_settings(CACHES=settings, CACHE_MIDDLEWARE_SECONDS=60):
        with override_settings(CACHE_MIDDLEWARE_ALIAS="on"):
            remember(caches["on"])
            on = cold_page(split_site(ran_on), 8)
        with override_settings(CACHE_MIDDLEWARE_ALIAS="off"):
            remember(caches["off"])
            off = cold_page(split_site(ran_off), 8)
        caches["on"].clear()
        caches["off"].clear()
    assert len(on) == len(off) == 8
    assert ran_on == [1] and len(set(on)) == 1  # one run, its page served to all
    assert len(ran_off) > 1  # Django's split pair: every request that missed ran the view


def test_the_async_split_pair_runs_a_cold_pages_view_once(cluster: LocalSentinelCluster) -> None:
    settings = caches_for(cluster)
    ran: list[int] = []

    async def view(request: HttpRequest) -> HttpResponse:
        ran.append(1)
        await asyncio.sleep(BODY_SECONDS)
        return HttpResponse(f"async page {uuid.uuid4().hex}")

    async def main(site: Any) -> list[Any]:
        path = f"/split-async/{uuid.uuid4().hex}/"
        responses = await asyncio.gather(*(site(RequestFactory().get(path)) for _ in range(10)))
        await caches["on"].aclose()
        return list(responses)

    with override_settings(
        CACHES=settings, CACHE_MIDDLEWARE_ALIAS="on", CACHE_MIDDLEWARE_SECONDS=60
    ):
        remember(caches["on"])
        fetch = FetchFromCacheMiddleware(view)  # the settings are read here, as Django's

        async def between_async(request: HttpRequest) -> Any:
            response = await fetch(request)
            response["X-Between"] = "seen"
            return response

        site = UpdateCacheMiddleware(between_async)
        assert fetch.asynchronous and site.asynchronous
        responses = asyncio.run(main(site))
        caches["on"].clear()
    assert ran == [1]
    assert all(r.status_code == 200 and r["X-Between"] == "seen" for r in responses)
    assert len({r.content for r in responses}) == 1


def test_a_fetch_without_our_update_releases_its_lock_with_the_response(
    cluster: LocalSentinelCluster,
) -> None:
    """Nothing stores the page (no update outside the fetch): the fetch ends its own ticket
    when the response comes back, so the lock is gone and the next request runs the view at
    once, not after the lock's 30 s."""
    settings = caches_for(cluster, STAMPEDE_LOCK_TIMEOUT=30)
    ran: list[int] = []

    def view(request: HttpRequest) -> HttpResponse:
        ran.append(1)
        return HttpResponse("not stored")

    path = f"/fetch-only/{uuid.uuid4().hex}/"
    with override_settings(
        CACHES=settings, CACHE_MIDDLEWARE_ALIAS="on", CACHE_MIDDLEWARE_SECONDS=60
    ):
        cache = remember(caches["on"])
        fetch = FetchFromCacheMiddleware(view)
        _, flight_of, _ = look(fetch, RequestFactory().get(path))
        assert flight_of is not None
        lock = lock_key(flight_of[1])
        assert fetch(RequestFactory().get(path)).content == b"not stored"
        assert not cache.core.client_for(flight_of[1]).exists(lock)
        began = time.monotonic()
        assert fetch(RequestFactory().get(path)).content == b"not stored"
        assert time.monotonic() - began < 5  # not the lock's 30 s
        cache.clear()
    assert ran == [1, 1]
