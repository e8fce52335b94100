"""``sentinel_cache.django.cache_page`` and ``CacheMiddleware`` (issue 26, item 5): a cold page
requested at once by many threads and a second process runs its view once, and every request
gets that response; with ``STAMPEDE_PROTECTION`` off, side by side, Django's behaviour: the view
runs in more than one of them. Real servers; the second process is a real (spawned) process."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
import time
import uuid
from typing import Any

from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.template import engines
from django.template.response import TemplateResponse
from django.test import RequestFactory, override_settings
from django.utils.cache import get_cache_key
from django_support import cache_entry, configure_django, remember, unique_prefix
from threads import Workers

from sentinel_cache.core.ops._sync.stampede import lock_key
from sentinel_cache.django.pages import CacheMiddleware, cache_page
from sentinel_cache.testing import LocalSentinelCluster

THREADS = 12
CHILD_THREADS = 4
BODY_SECONDS = 0.2


def caches_for(cluster: LocalSentinelCluster) -> dict[str, Any]:
    """The same servers twice: ``on`` with STAMPEDE_PROTECTION, ``off`` without."""
    prefix = unique_prefix()
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "on": cache_entry(cluster, KEY_PREFIX=prefix, OPTIONS={"STAMPEDE_PROTECTION": True}),
        "off": cache_entry(cluster, KEY_PREFIX=prefix + "off"),
    }


def slow_view(alias: str) -> Any:
    """A view whose body takes 200 ms; each run counted on the server (every process sees it)
    and answering a body of its own, so a response tells which run made it."""

    @cache_page(60, cache=alias)
    def view(request: HttpRequest) -> HttpResponse:
        caches[alias].incr("runs", ignore_key_check=True)
        time.sleep(BODY_SECONDS)
        return HttpResponse(f"run {uuid.uuid4().hex}")

    return view


def runs(alias: str) -> int:
    return int(caches[alias].get("runs") or 0)


def requests(view: Any, path: str, threads: int, go: Any) -> list[bytes]:
    """``threads`` requests for ``path``, sent together once ``go`` is set; their bodies."""
    bodies: list[bytes] = []
    lock = threading.Lock()

    def one() -> None:
        request = RequestFactory().get(path)
        assert go.wait(60)
        response = view(request)
        assert response.status_code == 200
        with lock:
            bodies.append(response.content)

    with Workers(timeout=60) as workers:
        for _ in range(threads):
            workers.spawn(one)
    return bodies


def _child(settings: dict[str, Any], alias: str, path: str, ready: Any, go: Any, out: Any) -> None:
    """The second process: the same view, its own Django and cache, requests sent on ``go``."""
    configure_django()
    with override_settings(CACHES=settings):
        view = slow_view(alias)
        caches[alias].get("warm-up")  # connected before the race starts
        ready.set()
        bodies = requests(view, path, CHILD_THREADS, go)
        caches[alias].core.close()
    out.put(bodies)


def race(cluster: LocalSentinelCluster, settings: dict[str, Any], alias: str) -> list[bytes]:
    """This process's threads and a second process request one cold page together."""
    path = f"/cold/{uuid.uuid4().hex}/"
    context = multiprocessing.get_context("spawn")
    ready, go, out = context.Event(), context.Event(), context.Queue()
    child = context.Process(target=_child, args=(settings, alias, path, ready, go, out))
    child.start()
    try:
        view = slow_view(alias)
        remember(caches[alias]).get("warm-up")
        assert ready.wait(60), "the second process did not start"
        go.set()
        bodies = requests(view, path, THREADS, go)
        try:
            bodies += out.get(timeout=60)
        except queue.Empty:
            raise AssertionError("the second process sent no responses") from None
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    return bodies


def test_a_cold_page_runs_its_view_once_across_threads_and_processes(
    cluster: LocalSentinelCluster,
) -> None:
    settings = caches_for(cluster)
    with override_settings(CACHES=settings):
        on = race(cluster, settings, "on")
        off = race(cluster, settings, "off")
        on_runs, off_runs = runs("on"), runs("off")
        caches["on"].clear()
        caches["off"].clear()
    print(
        f"\ncold page, {THREADS}+{CHILD_THREADS} requests: view ran {on_runs}x with "
        f"STAMPEDE_PROTECTION, {off_runs}x without"
    )
    assert len(on) == len(off) == THREADS + CHILD_THREADS
    assert on_runs == 1
    assert len(set(on)) == 1 and on[0].startswith(b"run ")  # everyone got that run's page
    assert off_runs > 1  # Django's own: every request that missed ran the view


def test_async_views_run_once_per_cold_page(cluster: LocalSentinelCluster) -> None:
    settings = caches_for(cluster)
    ran: list[int] = []

    @cache_page(60, cache="on")
    async def view(request: HttpRequest) -> HttpResponse:
        ran.append(1)
        await asyncio.sleep(BODY_SECONDS)
        return HttpResponse(f"async run {uuid.uuid4().hex}")

    async def main() -> list[bytes]:
        path = f"/async/{uuid.uuid4().hex}/"
        responses = await asyncio.gather(*(view(RequestFactory().get(path)) for _ in range(10)))
        await caches["on"].aclose()
        return [r.content for r in responses]

    with override_settings(CACHES=settings):
        remember(caches["on"])
        bodies = asyncio.run(main())
        caches["on"].clear()
    assert ran == [1]
    assert len(bodies) == 10 and len(set(bodies)) == 1


def test_a_response_that_is_not_stored_lets_the_waiters_run_the_view(
    cluster: LocalSentinelCluster,
) -> None:
    """A private page is never cached: the requests that waited for it run the view
    themselves (nobody is served another's private page), and nobody waits twice."""
    settings = caches_for(cluster)
    ran: list[str] = []
    lock = threading.Lock()

    @cache_page(60, cache="on")
    def view(request: HttpRequest) -> HttpResponse:
        user = request.headers["X-User"]
        with lock:
            ran.append(user)
        time.sleep(BODY_SECONDS)
        response = HttpResponse(f"private to {user}")
        response["Cache-Control"] = "private"
        return response

    got: dict[str, bytes] = {}
    go = threading.Event()

    def one(user: str) -> None:
        request = RequestFactory().get("/private/", headers={"X-User": user})
        assert go.wait(10)
        got[user] = view(request).content

    with override_settings(CACHES=settings):
        remember(caches["on"])
        started = time.monotonic()
        with Workers(timeout=30) as workers:
            for n in range(6):
                workers.spawn(one, f"u{n}")
            go.set()
        elapsed = time.monotonic() - started
        caches["on"].clear()
    assert got == {f"u{n}": f"private to u{n}".encode() for n in range(6)}
    assert sorted(ran) == [f"u{n}" for n in range(6)]
    assert elapsed < 2 * BODY_SECONDS + 5  # one wait, then their own run (a hang would not)


def test_template_responses_are_stored_before_the_waiters_look(
    cluster: LocalSentinelCluster,
) -> None:
    settings = caches_for(cluster)
    ran: list[int] = []
    templates = [{"BACKEND": "django.template.backends.django.DjangoTemplates"}]

    @cache_page(60, cache="on")
    def view(request: HttpRequest) -> TemplateResponse:
        ran.append(1)
        time.sleep(BODY_SECONDS)
        template = engines["django"].from_string("page {{ n }}")
        return TemplateResponse(request, template, {"n": uuid.uuid4().hex})

    with override_settings(CACHES=settings, TEMPLATES=templates):
        remember(caches["on"])
        go = threading.Event()
        go.set()
        bodies = requests(view, f"/template/{uuid.uuid4().hex}/", 6, go)
        caches["on"].clear()
    assert ran == [1] and len(set(bodies)) == 1


def test_the_middleware_serves_a_cold_page_once(cluster: LocalSentinelCluster) -> None:
    """``CacheMiddleware`` as a site's middleware (``get_response`` is the rest of the site)."""
    settings = caches_for(cluster)
    ran: list[int] = []

    def site(request: HttpRequest) -> HttpResponse:
        ran.append(1)
        time.sleep(BODY_SECONDS)
        return HttpResponse(f"site {uuid.uuid4().hex}")

    with override_settings(
        CACHES=settings, CACHE_MIDDLEWARE_ALIAS="on", CACHE_MIDDLEWARE_SECONDS=60
    ):
        remember(caches["on"])
        middleware = CacheMiddleware(site)
        go = threading.Event()
        go.set()
        bodies = requests(middleware, f"/site/{uuid.uuid4().hex}/", 8, go)
        caches["on"].clear()
    assert ran == [1] and len(set(bodies)) == 1


def steady_reads(cluster: LocalSentinelCluster, early: float) -> tuple[list[float], int]:
    """3 threads request a page cached for 1 s, back to back for 3.5 s, while a prober's plain
    GET of the page's key every 5 ms counts the times it was missing; returns when each
    computation began, and that count."""
    options = {"STAMPEDE_PROTECTION": True, "STAMPEDE_EARLY_REFRESH": early}
    settings = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "steady": cache_entry(cluster, KEY_PREFIX=unique_prefix(), OPTIONS=options),
    }
    runs: list[float] = []
    missing = 0
    path = f"/steady/{uuid.uuid4().hex}/"

    @cache_page(1, cache="steady")
    def view(request: HttpRequest) -> HttpResponse:
        runs.append(time.monotonic())
        time.sleep(0.05)
        return HttpResponse(f"steady {uuid.uuid4().hex}")

    with override_settings(CACHES=settings):
        cache = remember(caches["steady"])
        view(RequestFactory().get(path))  # the first computation: stored, its duration too
        key = get_cache_key(RequestFactory().get(path), None, "GET", cache=cache)
        assert key is not None
        stored = cache.make_key(key)
        raw = cache.core.client_for(stored)

        def reader() -> None:
            while not workers.stop.is_set():
                assert view(RequestFactory().get(path)).status_code == 200
                time.sleep(0.002)

        def prober() -> None:
            nonlocal missing
            while not workers.stop.is_set():
                missing += raw.get(stored) is None
                time.sleep(0.005)

        with Workers(timeout=30) as workers:
            for _ in range(3):
                workers.spawn(reader)
            workers.spawn(prober)
            time.sleep(3.5)
        cache.clear()
    return runs, missing


def test_early_refresh_keeps_a_steadily_read_page_from_expiring(
    cluster: LocalSentinelCluster,
) -> None:
    """With STAMPEDE_EARLY_REFRESH the page is recomputed shortly before it expires, by one
    request at a time: a prober never finds it missing. Without, beside it, it expires every
    second until a request recomputes it."""
    runs, missing = steady_reads(cluster, 2.0)  # refreshes earlier: a stalled machine too
    plain_runs, plain_missing = steady_reads(cluster, 0.0)
    print(
        f"\npage read for 3.5 s, 1 s timeout: {len(runs)} computations and {missing} "
        f"probes missing with early refresh, {len(plain_runs)} and {plain_missing} without"
    )
    assert missing == 0
    assert 3 <= len(runs) <= 10  # refreshed before each expiry, never a burst
    assert min(b - a for a, b in zip(runs, runs[1:], strict=False)) > 0.05  # never two at once
    assert plain_missing > 0


def test_a_dead_holders_lock_delays_a_page_by_at_most_its_timeout(
    cluster: LocalSentinelCluster,
) -> None:
    """A holder that died mid-computation (its lock left on the server, nobody to release it):
    the next request waits for the lock to expire, then runs the view itself; it never hangs."""
    settings = caches_for(cluster)
    settings["on"]["OPTIONS"]["STAMPEDE_LOCK_TIMEOUT"] = 1
    ran: list[int] = []

    @cache_page(60, cache="on")
    def view(request: HttpRequest) -> HttpResponse:
        ran.append(1)
        return HttpResponse("after the dead holder")

    path = f"/dead/{uuid.uuid4().hex}/"
    with override_settings(CACHES=settings):
        cache = remember(caches["on"])
        middleware = CacheMiddleware(view, page_timeout=60, cache_alias="on")
        _, flight_of, _ = middleware._look(RequestFactory().get(path))
        assert flight_of is not None
        key = flight_of[1]
        cache.core.client_for(key).set(lock_key(key), "a holder that died", px=1000)
        started = time.monotonic()
        response = view(RequestFactory().get(path))
        waited = time.monotonic() - started
        assert view(RequestFactory().get(path)).content == response.content  # stored
        cache.clear()
    assert response.content == b"after the dead holder" and ran == [1]
    assert 0.9 < waited < 1 + 2  # waited for the lock (not ignored), not beyond its expiry
