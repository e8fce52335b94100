"""The example pages: each shows one way a Django project uses the sharded cache."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.cache import cache, caches
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_page

from example_project.apps import SWITCHES, register_switch_callback
from sentinel_cache import StaleReplyError
from sentinel_cache.django import cache_page as single_flight_cache_page

REPORT_KEY = "report:primes"
REPORT_SECONDS = 30
# What a session's key looks like to the cache (django.contrib.sessions.backends.cache).
SESSION_KEY_PREFIX = "django.contrib.sessions.cache"
# A feature flag: the percentage of users who get the new checkout. Read on every request (through
# the "near" cache alias), changed now and then by anyone: an admin, another service, redis-cli.
FLAG_KEY = "flags:new-checkout"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _shard_of(key: str) -> int:
    """The shard the ring places this cache key on (the final key, prefix and version included)."""
    return int(cache.core.shard_index(cache.make_key(key)))  # type: ignore[attr-defined]


def expensive_report(limit: int = 300_000) -> dict[str, Any]:
    """A deliberately slow computation standing in for an expensive query."""
    started = time.perf_counter()
    sieve = bytearray([1]) * (limit + 1)
    sieve[0:2] = b"\x00\x00"
    for n in range(2, int(limit**0.5) + 1):
        if sieve[n]:
            sieve[n * n :: n] = bytes(len(range(n * n, limit + 1, n)))
    primes = [n for n in range(limit + 1) if sieve[n]]
    time.sleep(0.2)  # the network round trips of the "real" query
    return {
        "limit": limit,
        "count": len(primes),
        "largest": primes[-1],
        "computed_at": _now(),
        "compute_ms": round((time.perf_counter() - started) * 1000, 1),
    }


def index(request: HttpRequest) -> HttpResponse:
    return render(request, "example_project/index.html", {"masters": _masters()})


def report(request: HttpRequest) -> HttpResponse:
    """The low-level API: the expensive part is cached for REPORT_SECONDS."""
    started = time.perf_counter()
    data = cache.get(REPORT_KEY)
    hit = data is not None
    if data is None:
        data = expensive_report()
        cache.set(REPORT_KEY, data, REPORT_SECONDS)
    context = {
        "report": data,
        "hit": hit,
        "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
        "shard": _shard_of(REPORT_KEY),
    }
    if request.GET.get("format") == "json":
        return JsonResponse(context)
    return render(request, "example_project/report.html", context)


@cache_page(15)
def clock(request: HttpRequest) -> HttpResponse:
    """A whole response cached by ``cache_page``: the time stays put for 15 seconds."""
    return render(request, "example_project/clock.html", {"generated_at": _now()})


# How many times the expensive page was computed (counted on the servers: every process).
EXPENSIVE_RUNS = "expensive:runs"


def _expensive(kind: str, tag: str) -> HttpResponse:
    runs = cache.incr(f"{EXPENSIVE_RUNS}:{kind}:{tag}", ignore_key_check=True)  # type: ignore[call-arg]
    report = expensive_report()  # about 0.3 s
    return JsonResponse({"report": report, "computation": runs, "cache_page": kind})


@single_flight_cache_page(60)
def expensive(request: HttpRequest, tag: str) -> HttpResponse:
    """An expensive page cached by ``sentinel_cache.django.cache_page``: with
    STAMPEDE_PROTECTION, requests that miss it together wait for one computation."""
    return _expensive("sentinel_cache", tag)


@cache_page(60)
def expensive_django(request: HttpRequest, tag: str) -> HttpResponse:
    """The same page under Django's own ``cache_page``: every request that misses computes."""
    return _expensive("django", tag)


@login_required
def account(request: HttpRequest) -> HttpResponse:
    """A logged-in page; the session it reads lives in the sharded cache."""
    request.session["visits"] = request.session.get("visits", 0) + 1
    return render(request, "example_project/account.html", _session_info(request))


def me(request: HttpRequest) -> JsonResponse:
    """JSON for scripts: who is logged in, and on which shard the session lives."""
    if request.user.is_authenticated:
        request.session["visits"] = request.session.get("visits", 0) + 1
    return JsonResponse(_session_info(request))


def _session_info(request: HttpRequest) -> dict[str, Any]:
    session_key = request.session.session_key
    shard = None if session_key is None else _shard_of(SESSION_KEY_PREFIX + session_key)
    return {
        "authenticated": request.user.is_authenticated,
        "username": request.user.get_username() if request.user.is_authenticated else None,
        "visits": request.session.get("visits", 0),
        "session_shard": shard,
    }


def flag(request: HttpRequest) -> JsonResponse:
    """A feature flag read through the near cache: a hit costs no round trip, and a change made
    anywhere evicts this process's copy as soon as the server announces it."""
    near = caches["near"]
    percent = near.get(FLAG_KEY, 0)
    shard = int(near.core.shard_index(near.make_key(FLAG_KEY)))  # type: ignore[attr-defined]
    return JsonResponse({"flag": FLAG_KEY, "percent": percent, "shard": shard})


def visit(request: HttpRequest, n: int) -> JsonResponse:
    """Write one key, read it back, bump a counter: cache traffic on every shard."""
    key = f"visit:{n}"
    stored = cache.set(key, {"n": n, "at": _now()}, 600)
    value = cache.get(key)
    try:
        cache.add("visits:total", 0, None)
        total: int | None = cache.incr("visits:total")
    except StaleReplyError:
        # The increment was in flight when the shard began a failover: whether it counted is
        # unknown (never silently lost). A best-effort counter just shows "unknown" this time.
        total = None
    ok = bool(stored) and value is not None and value["n"] == n
    return JsonResponse(
        {"key": key, "shard": _shard_of(key), "ok": ok, "total": total}, status=200 if ok else 500
    )


def _masters() -> list[str]:
    return list(settings.CACHES["default"].get("OPTIONS", {}).get("MASTERS", []))


def shard_map() -> dict[str, Any]:
    """The live shard map: the core's in-memory ``status()`` plus the switches seen here."""
    register_switch_callback()
    pool = cache.core  # type: ignore[attr-defined]
    if not pool.status()["started"]:
        cache.get("shard-map:probe")  # the first use discovers every shard
    snapshot = pool.status()
    return {
        "shards": snapshot["shards"],
        "sentinels": snapshot["sentinels"],
        "switches": list(SWITCHES),
        "checked_at": _now(),
    }


def shards(request: HttpRequest) -> HttpResponse:
    data = shard_map()
    if request.GET.get("format") == "json":
        return JsonResponse(data)
    return render(request, "example_project/shards.html", data)


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition of this process's metrics (the cache's, with ``METRICS``)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
