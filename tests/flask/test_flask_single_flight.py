"""``sentinel_cache.flask.Cache`` (issue 26, item 5): a cold ``@cached`` view and a cold
``@memoize`` function called at once by many threads and a second process run their body once,
and every caller gets that result; with ``STAMPEDE_PROTECTION`` off, side by side,
Flask-Caching's behaviour: the body runs in more than one. Real servers; the second process is
a real (spawned) process."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
import uuid
from typing import Any

from flask import Flask
from flask_support import opened, settings_for, unique_prefix
from threads import Workers

from sentinel_cache.flask import Cache, ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

THREADS = 12
CHILD_THREADS = 4
BODY_SECONDS = 0.2


class Site:
    """An app with a slow ``@cached`` view and a slow ``@memoize`` function, each run counted
    on the server (every process sees the count) and answering a value of its own."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.app = Flask("single_flight_tests")
        self.app.testing = True
        self.app.config.update(settings)
        self.cache = cache = Cache(self.app)
        with self.app.app_context():
            self.backend: ShardedSentinelCache = cache.cache  # type: ignore[assignment]
        opened[id(self.backend.core)] = self.backend.core

        @self.app.route("/cold/<tag>")
        @cache.cached(timeout=60)
        def cold(tag: str) -> str:
            self.backend.inc(f"runs:{tag}")
            time.sleep(BODY_SECONDS)
            return f"run {uuid.uuid4().hex}"

        @cache.memoize(60)
        def priced(tag: str, n: int) -> str:
            self.backend.inc(f"runs:memo:{tag}")
            time.sleep(BODY_SECONDS)
            return f"{n} priced by {uuid.uuid4().hex}"

        self.priced = priced

    def call(self, kind: str, tag: str) -> str:
        if kind == "view":
            response = self.app.test_client().get(f"/cold/{tag}")
            assert response.status_code == 200
            return response.get_data(as_text=True)
        with self.app.app_context():
            return str(self.priced(tag, 7))

    def runs(self, kind: str, tag: str) -> int:
        return int(self.backend.get(f"runs:{tag}" if kind == "view" else f"runs:memo:{tag}") or 0)


def together(site: Site, kind: str, tag: str, threads: int, go: Any) -> list[str]:
    got: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        assert go.wait(60)
        value = site.call(kind, tag)
        with lock:
            got.append(value)

    with Workers(timeout=60) as workers:
        for _ in range(threads):
            workers.spawn(one)
    return got


def _child(settings: dict[str, Any], kind: str, tag: str, ready: Any, go: Any, out: Any) -> None:
    site = Site(settings)
    site.backend.get("warm-up")  # connected before the race starts
    ready.set()
    got = together(site, kind, tag, CHILD_THREADS, go)
    site.backend.core.close()
    out.put(got)


def race(settings: dict[str, Any], kind: str) -> tuple[int, list[str]]:
    """This process's threads and a second process call one cold view or function together:
    how many times its body ran, and what every caller got."""
    site, tag = Site(settings), uuid.uuid4().hex
    context = multiprocessing.get_context("spawn")
    ready, go, out = context.Event(), context.Event(), context.Queue()
    child = context.Process(target=_child, args=(settings, kind, tag, ready, go, out))
    child.start()
    try:
        site.backend.get("warm-up")
        assert ready.wait(60), "the second process did not start"
        go.set()
        got = together(site, kind, tag, THREADS, go)
        try:
            got += out.get(timeout=60)
        except queue.Empty:
            raise AssertionError("the second process sent nothing") from None
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert len(got) == THREADS + CHILD_THREADS
    return site.runs(kind, tag), got


def test_cold_cached_views_and_memoized_functions_run_once_across_processes(
    cluster: LocalSentinelCluster,
) -> None:
    prefix = unique_prefix()
    on = settings_for(cluster, CACHE_KEY_PREFIX=prefix, CACHE_OPTIONS={"STAMPEDE_PROTECTION": True})
    off = settings_for(cluster, CACHE_KEY_PREFIX=prefix + "off:")
    for kind in ("view", "memoize"):
        on_runs, on_got = race(on, kind)
        off_runs, _ = race(off, kind)
        print(
            f"\ncold {kind}, {THREADS}+{CHILD_THREADS} callers: ran {on_runs}x with "
            f"STAMPEDE_PROTECTION, {off_runs}x without"
        )
        assert on_runs == 1, kind
        assert len(set(on_got)) == 1, (kind, set(on_got))  # everyone got that run's result
        assert off_runs > 1, kind  # Flask-Caching's own: every caller that missed ran it


def test_a_filtered_result_lets_the_waiters_compute_it_themselves(
    cluster: LocalSentinelCluster,
) -> None:
    """A result ``response_filter`` keeps out of the cache is not shared: every caller that
    waited computes its own, once, and nothing is stored."""
    app = Flask("single_flight_filter")
    app.config.update(
        settings_for(
            cluster,
            CACHE_KEY_PREFIX=unique_prefix(),
            CACHE_OPTIONS={"STAMPEDE_PROTECTION": True},
        )
    )
    cache = Cache(app)
    ran: list[int] = []

    @cache.memoize(60, response_filter=lambda value: False)
    def never_kept(n: int) -> str:
        ran.append(1)
        time.sleep(BODY_SECONDS)
        return f"fresh {uuid.uuid4().hex}"

    got: list[str] = []
    go = threading.Event()

    def one() -> None:
        assert go.wait(10)
        with app.app_context():
            got.append(never_kept(1))

    with app.app_context():
        backend = cache.cache
        opened[id(backend.core)] = backend.core
    started = time.monotonic()
    with Workers(timeout=30) as workers:
        for _ in range(5):
            workers.spawn(one)
        go.set()
    elapsed = time.monotonic() - started
    assert len(ran) == 5 and len(set(got)) == 5
    assert elapsed < 2 * BODY_SECONDS + 5  # one wait, then their own run (a hang would not)


def test_the_decorated_function_keeps_flask_cachings_attributes(
    cluster: LocalSentinelCluster,
) -> None:
    app = Flask("single_flight_attributes")
    app.config.update(
        settings_for(
            cluster,
            CACHE_KEY_PREFIX=unique_prefix(),
            CACHE_OPTIONS={"STAMPEDE_PROTECTION": True},
        )
    )
    cache = Cache(app)
    calls: list[int] = []

    @cache.memoize(60)
    def doubled(n: int) -> int:
        calls.append(n)
        return 2 * n

    with app.app_context():
        opened[id(cache.cache.core)] = cache.cache.core
        assert doubled(4) == 8 and doubled(4) == 8 and calls == [4]
        assert doubled.uncached(4) == 8 and calls == [4, 4]
        cache.delete_memoized(doubled)
        assert doubled(4) == 8 and calls == [4, 4, 4]
        doubled.cache_timeout = 5  # read live by Flask-Caching's wrapper
        cache.delete_memoized(doubled, 4)
        doubled(4)
        key = doubled.make_cache_key(doubled.uncached, 4)
        assert 0 < cache.cache.client.ttl(cache.cache.resolved_prefix() + key) <= 5


def steady_reads(cluster: LocalSentinelCluster, early: float) -> tuple[list[float], int]:
    """3 threads request a view cached for 1 s, back to back for 3.5 s, while a prober's plain
    GET of its key every 5 ms counts the times it was missing; returns when each computation
    began, and that count. (A ``@cached`` view: a memoized function's key changes when its
    version key expires, which Flask-Caching gives the value's timeout.)"""
    options = {"STAMPEDE_PROTECTION": True, "STAMPEDE_EARLY_REFRESH": early}
    app = Flask("single_flight_steady")
    prefix = unique_prefix()
    app.config.update(settings_for(cluster, CACHE_KEY_PREFIX=prefix, CACHE_OPTIONS=options))
    cache = Cache(app)
    runs: list[float] = []
    missing = 0

    @app.route("/steady")
    @cache.cached(timeout=1)
    def steady() -> str:
        runs.append(time.monotonic())
        time.sleep(0.05)
        return f"steady {uuid.uuid4().hex}"

    assert app.test_client().get("/steady").status_code == 200  # stored, its duration too
    with app.app_context():
        backend = cache.cache
        opened[id(backend.core)] = backend.core
    stored = prefix + "view//steady"  # Flask-Caching's key_prefix "view/%s", the path
    raw = backend.core.client_for(stored)
    assert raw.get(stored) is not None

    def reader() -> None:
        client = app.test_client()
        while not workers.stop.is_set():
            assert client.get("/steady").status_code == 200
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
    return runs, missing


def test_early_refresh_keeps_a_steadily_read_value_from_expiring(
    cluster: LocalSentinelCluster,
) -> None:
    """With STAMPEDE_EARLY_REFRESH the value is recomputed shortly before it expires, by one
    caller at a time: a prober never finds it missing. Without, beside it, it expires every
    second until a caller recomputes it."""
    runs, missing = steady_reads(cluster, 2.0)  # refreshes earlier: a stalled machine too
    plain_runs, plain_missing = steady_reads(cluster, 0.0)
    print(
        f"\ncached view read for 3.5 s, 1 s timeout: {len(runs)} computations and {missing} "
        f"probes missing with early refresh, {len(plain_runs)} and {plain_missing} without"
    )
    assert missing == 0
    assert 3 <= len(runs) <= 10  # refreshed before each expiry, never a burst
    assert min(b - a for a, b in zip(runs, runs[1:], strict=False)) > 0.05  # never two at once
    assert plain_missing > 0
