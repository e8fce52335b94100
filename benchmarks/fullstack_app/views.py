"""The views of the full-stack app and its URLs.

``/amix`` (async, for ASGI) and ``/mix`` (sync, for WSGI) each do the same 6 cache operations
per request on keys spread over a keyspace: get, get_many of 3, set, set of a 4 KB value, incr,
get of a 4 KB value. They answer 200 ``ok``, or 500 naming the error (wrk counts non-2xx
answers; each process also logs every distinct error text once, so the harness can say why).
``/fill`` and ``/afill`` write every key the mix reads (the counters as 0), so a miss or an
``incr`` of a missing key never happens in the timed runs. ``/health`` touches no cache.
"""

from __future__ import annotations

import base64
import random
import sys
from typing import Any

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.urls import path

KEYSPACE = 1000  # small values
BIG_KEYS = 100  # 4 KB values, and as many counters
BIG = base64.b64encode(random.Random(37).randbytes(3072)).decode()  # 4096 chars, incompressible
ERRORS_LOGGED = 20  # distinct error texts logged per process
_logged: set[str] = set()


def small_key(n: int) -> str:
    return f"s:{n % KEYSPACE}"


def big_key(n: int) -> str:
    return f"b:{n % BIG_KEYS}"


def counter_key(n: int) -> str:
    return f"c:{n % BIG_KEYS}"


def small_value(n: int) -> dict[str, Any]:
    """A small record, as a view would cache (msgpack and pickle both carry it)."""
    return {"id": n, "name": f"user-{n}", "score": n * 1.5, "tags": ["a", "b", "c"]}


def plan() -> tuple[int, int, int]:
    """This request's keys: a small-key index, a big key to write and one to read."""
    return random.randrange(KEYSPACE), random.randrange(BIG_KEYS), random.randrange(BIG_KEYS)


def _failed(exc: BaseException) -> HttpResponse:
    text = f"{type(exc).__name__}: {exc}"
    if text not in _logged and len(_logged) < ERRORS_LOGGED:  # a race logs a text twice: fine
        _logged.add(text)
        print(f"FULLSTACK-ERROR {text}", file=sys.stderr, flush=True)
    return HttpResponse(text, status=500, content_type="text/plain")


def mix(request: HttpRequest) -> HttpResponse:
    i, w, r = plan()
    try:
        cache.get(small_key(i))
        cache.get_many([small_key(i + 1), small_key(i + 2), small_key(i + 3)])
        cache.set(small_key(i + 4), small_value(i + 4))
        cache.set(big_key(w), BIG)
        cache.incr(counter_key(w))
        cache.get(big_key(r))
    except Exception as exc:  # counted by the load generator as a 500
        return _failed(exc)
    return HttpResponse(b"ok", content_type="text/plain")


async def amix(request: HttpRequest) -> HttpResponse:
    i, w, r = plan()
    try:
        await cache.aget(small_key(i))
        await cache.aget_many([small_key(i + 1), small_key(i + 2), small_key(i + 3)])
        await cache.aset(small_key(i + 4), small_value(i + 4))
        await cache.aset(big_key(w), BIG)
        await cache.aincr(counter_key(w))
        await cache.aget(big_key(r))
    except Exception as exc:
        return _failed(exc)
    return HttpResponse(b"ok", content_type="text/plain")


def fill_items() -> dict[str, Any]:
    items: dict[str, Any] = {small_key(n): small_value(n) for n in range(KEYSPACE)}
    items.update({big_key(n): BIG for n in range(BIG_KEYS)})
    items.update({counter_key(n): 0 for n in range(BIG_KEYS)})
    return items


def fill(request: HttpRequest) -> HttpResponse:
    try:
        for key, value in fill_items().items():
            cache.set(key, value)
    except Exception as exc:
        return _failed(exc)
    return HttpResponse(b"filled", content_type="text/plain")


async def afill(request: HttpRequest) -> HttpResponse:
    try:
        for key, value in fill_items().items():
            await cache.aset(key, value)
    except Exception as exc:
        return _failed(exc)
    return HttpResponse(b"filled", content_type="text/plain")


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok", content_type="text/plain")


urlpatterns = [
    path("mix", mix),
    path("amix", amix),
    path("fill", fill),
    path("afill", afill),
    path("health", health),
]
