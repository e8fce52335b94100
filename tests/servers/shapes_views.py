"""Views of the server-shape app: cache work spread over every shard, and a per-process status.

``/work`` (sync) and ``/awork`` (async, ``aset``/``aget``) write then read two keys per shard
and say, per key, whether the cache raised (``failures``: answered 503 so a client counts it),
failed open (``degraded``: ``set`` returned False or ``get`` missed under IGNORE_EXCEPTIONS) or
read back something else (``wrong``: must never happen). ``/status`` reports the serving
process and its core's listeners, so a test can check each worker has its own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from typing import Any

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

KEYS_PER_SHARD = 2
_counter = itertools.count()
_keys: list[tuple[str, int]] = []


def keys() -> list[tuple[str, int]]:
    """``KEYS_PER_SHARD`` keys on each shard, with their shard index (ring math, no network)."""
    if not _keys:
        pool = cache.core
        per_shard: dict[int, list[str]] = {i: [] for i in range(len(pool.shards))}
        for n in itertools.count():
            key = f"k{n}"
            index = pool.shard_index(cache.make_key(key))
            if len(per_shard[index]) < KEYS_PER_SHARD:
                per_shard[index].append(key)
            if all(len(v) == KEYS_PER_SHARD for v in per_shard.values()):
                break
        _keys.extend((key, index) for index, group in per_shard.items() for key in group)
    return _keys


def touch_at_import() -> None:
    """Use the cache while the module is imported: under ``gunicorn --preload`` this runs in
    the arbiter before it forks, which is what starts the arbiter's own listeners."""
    cache.set("preloaded-by", os.getpid(), 60)
    cache.get("preloaded-by")


def _outcome(key: str, shard: int, value: str, stored: Any, got: Any) -> tuple[str, dict[str, Any]]:
    entry = {"key": key, "shard": shard, "stored": bool(stored), "got": got}
    if stored and got == value:
        return "ok", entry
    if got is not None and got != value and stored:
        return "wrong", entry
    return "degraded", entry


def _answer(report: dict[str, Any]) -> JsonResponse:
    return JsonResponse(report, status=503 if report["failures"] else 200)


def _report() -> dict[str, Any]:
    return {"pid": os.getpid(), "failures": [], "degraded": [], "wrong": []}


def work(request: HttpRequest) -> JsonResponse:
    report = _report()
    n = next(_counter)
    for key, shard in keys():
        value = f"{os.getpid()}:{n}:{key}"
        try:
            stored = cache.set(key, value, 60)
            got = cache.get(key)
        except Exception as exc:  # the point is to count them, per shard
            report["failures"].append({"shard": shard, "error": f"{type(exc).__name__}: {exc}"})
            continue
        kind, entry = _outcome(key, shard, value, stored, got)
        if kind != "ok":
            report[kind].append(entry)
    return _answer(report)


async def awork(request: HttpRequest) -> JsonResponse:
    report = _report()
    n = next(_counter)
    for key, shard in keys():
        value = f"{os.getpid()}:{n}:{key}"
        try:
            stored = await cache.aset(key, value, 60)
            got = await cache.aget(key)
        except Exception as exc:
            report["failures"].append({"shard": shard, "error": f"{type(exc).__name__}: {exc}"})
            continue
        kind, entry = _outcome(key, shard, value, stored, got)
        if kind != "ok":
            report[kind].append(entry)
    return _answer(report)


def _status() -> dict[str, Any]:
    pool = cache.core
    snapshot = pool.status()
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "started": snapshot["started"],
        "listeners": {s["address"]: s["listener_connected"] for s in snapshot["sentinels"]},
        "listener_threads": sorted(
            t.name for t in threading.enumerate() if t.name.startswith("sentinel_cache-listener")
        ),
        "masters": [s["address"] for s in snapshot["shards"]],
        "keys": keys(),
    }


def status(request: HttpRequest) -> JsonResponse:
    """The core as this process sees it after a cache call (``?touch=0``: without one, as a
    freshly forked worker that has not used the cache yet sees it). ``?hold=S`` keeps a sync
    worker busy so concurrent probes reach every worker."""
    if request.GET.get("touch") != "0":
        cache.get("status-probe")
    time.sleep(float(request.GET.get("hold", 0)))
    return JsonResponse(_status())


async def astatus(request: HttpRequest) -> JsonResponse:
    if request.GET.get("touch") != "0":
        await cache.aget("status-probe")  # this event loop's clients exist, as in /awork
    await asyncio.sleep(float(request.GET.get("hold", 0)))
    return JsonResponse(_status())


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("health", health),
    path("work", work),
    path("awork", awork),
    path("status", status),
    path("astatus", astatus),
]
