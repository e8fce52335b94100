"""Two steps of ``make demo`` (issue 26): what users never see.

* :func:`cold_page`: many requests at once on a cold expensive page. Under
  ``sentinel_cache.django.cache_page`` (the site's cache has ``STAMPEDE_PROTECTION``) it is
  computed once and every request gets that page; under Django's own ``cache_page``, beside
  it, every request that missed computed it.
* :func:`crash`: the logged-in user's session shard loses its master to a SIGKILL while
  requests that read and write the session keep coming. Reads are answered by the replica
  (``OUTAGE_READS``), writes wait for the sentinels' switch (``OUTAGE_HOLD``): no request
  fails and nobody is logged out.

Each takes the running :class:`~example_project.demo.Demo` and returns None when it passed,
else what went wrong (``demo.py`` turns that into its failure). Run last: the killed master
stays down until the demo stops everything.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

COLD_REQUESTS = 16  # requests sent at once on the cold page
CRASH_TRAFFIC_THREADS = 6  # request loops of the logged-in user during the crash
SETTLED = 1.0  # seconds of traffic kept on the new master after the switch


def _at_once(count: int, send: Callable[[int], Any]) -> list[Any]:
    """``send(n)`` from ``count`` threads released together; their results, in order."""
    start = threading.Barrier(count)
    results: list[Any] = [None] * count

    def one(n: int) -> None:
        start.wait(30)
        try:
            results[n] = send(n)
        except Exception as exc:  # a failed request is a result too
            results[n] = exc

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError("a request of the cold-page step never returned")
    return results


def cold_page(demo: Any) -> str | None:
    from django.core.cache import cache

    from example_project.views import EXPENSIVE_RUNS

    demo.out.step(f"A cold expensive page: {COLD_REQUESTS} requests at once")
    browser_type, base = type(demo.browser), demo.browser.base
    tag = f"t{time.time_ns()}"
    figures = {}
    for kind, path in (("sentinel_cache", "expensive"), ("django", "expensive-django")):

        def send(n: int, path: str = path) -> tuple[int, Any, float]:
            started = time.monotonic()
            status, body = browser_type(base).request(f"/{path}/{tag}/")
            return status, body, time.monotonic() - started

        results = _at_once(COLD_REQUESTS, send)
        failed = [r for r in results if isinstance(r, Exception) or r[0] != 200]
        if failed:
            return f"{len(failed)} of {COLD_REQUESTS} requests for /{path}/ failed: {failed[0]!r}"
        served = {json.loads(body)["report"]["computed_at"] for _, body, _ in results}
        count = int(cache.get(f"{EXPENSIVE_RUNS}:{kind}:{tag}") or 0)
        figures[kind] = (count, len(served), max(took for _, _, took in results))
    runs, pages, slowest = figures["sentinel_cache"]
    demo.out.say(
        f"sentinel_cache.django.cache_page (/expensive/): computed {runs} time(s) for "
        f"{COLD_REQUESTS} requests, {pages} distinct page(s) served, slowest request "
        f"{slowest * 1000:.0f} ms (the others waited for the one computation)"
    )
    django_runs, django_pages, django_slowest = figures["django"]
    demo.out.say(
        f"Django's own cache_page (/expensive-django/), beside it: computed {django_runs} "
        f"time(s), {django_pages} distinct page(s), slowest {django_slowest * 1000:.0f} ms"
    )
    demo.out.say(f"COLD PAGE RESULT: {runs} computation for {COLD_REQUESTS} requests")
    if runs != 1 or pages != 1:
        return f"the cold page was computed {runs} times ({pages} distinct pages), expected 1"
    return None


class _Requests(threading.Thread):
    """The logged-in user's requests, back to back: each reads the session and writes it."""

    def __init__(self, browser: Any, key: str | None) -> None:
        super().__init__(name="demo-crash-traffic", daemon=True)
        self.browser, self.key = browser, key
        self.halt = threading.Event()
        self.log: list[tuple[float, float, str | None]] = []  # (start, end, problem)

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            try:
                status, body = self.browser.request("/api/me/")
                if status != 200:
                    problem: str | None = f"failed: /api/me/ {status}: {body[:120]!r}"
                elif not json.loads(body)["authenticated"]:
                    problem = "logged out: /api/me/ found no user in the session"
                elif self.browser.cookie("sessionid") != self.key:
                    problem = "logged out: a new session cookie"
                else:
                    problem = None
            except Exception as exc:  # a dropped connection is a failed request too
                problem = f"failed: {type(exc).__name__}: {exc}"
            self.log.append((started, time.monotonic(), problem))


def crash(demo: Any) -> str | None:
    from django.core.cache import cache

    browser = demo.browser
    me = browser.json("/api/me/")
    name = demo.masters[int(me["session_shard"])]
    core = cache.core  # type: ignore[attr-defined]
    hold = core.config.outage_hold
    demo.out.step(f"A crash: SIGKILL of {name}'s master under the logged-in user's requests")
    demo.out.say(
        f"OUTAGE_READS {core.config.outage_reads}, OUTAGE_HOLD {hold:g} s; the sentinels' "
        f"down-after-milliseconds {demo.cluster.down_after_ms}"
    )
    shard = core.shard(name)
    deadline = time.monotonic() + 10
    while core.config.outage_reads and not shard.outage_replicas(shard.generation):
        if time.monotonic() > deadline:
            return f"no replica of {name} in step with its master after 10 s"
        time.sleep(0.05)
    old = demo.cluster.master_address(name)
    with demo.cluster.node_client(old) as node:
        if node.execute_command("WAIT", 1, 5000) != 1:  # the login has reached the replica
            return f"{name}'s replica did not acknowledge the session within 5 s"
    key = browser.cookie("sessionid")
    traffic = [_Requests(browser, key) for _ in range(CRASH_TRAFFIC_THREADS)]
    for thread in traffic:
        thread.start()
    try:
        time.sleep(0.5)
        demo.cluster.kill_master(name)
        killed = time.monotonic()
        demo.out.say(f"requests flowing; SIGKILL of {old[0]}:{old[1]} ({name}'s master)")
        new = demo.cluster.wait_for_master_change(name, old, timeout=30)
        while shard.address != tuple(new):
            if time.monotonic() > killed + 30:
                return f"the cache never switched {name} to {new[0]}:{new[1]}"
            time.sleep(0.005)
        switched = time.monotonic() - killed
        time.sleep(SETTLED)
    finally:
        for thread in traffic:
            thread.halt.set()
        for thread in traffic:
            thread.join(hold + 15)
    if any(thread.is_alive() for thread in traffic):
        return "a request of the crash step never returned"
    log = [entry for thread in traffic for entry in thread.log]
    during = [e for e in log if killed <= e[0] < killed + switched]
    failed = [e[2] for e in log if e[2] and e[2].startswith("failed")]
    logged_out = [e[2] for e in log if e[2] and e[2].startswith("logged out")]
    slowest = max(end - start for start, end, _ in log)
    visits = browser.json("/api/me/")["visits"]
    demo.out.say(
        f"the cache switched {name} to {new[0]}:{new[1]} {switched:.2f} s after the kill; "
        f"requests: {len(log)}, {len(during)} of them begun during the outage"
    )
    demo.out.say(
        f"slowest request {slowest * 1000:.0f} ms (its session write held until the switch; "
        f"bound: the switch + 0.5 s = {(switched + 0.5) * 1000:.0f} ms); visits now {visits}"
    )
    demo.out.say(f"CRASH RESULT: {len(failed)} failed requests, {len(logged_out)} logouts")
    for problem in (failed + logged_out)[:5]:
        demo.out.say(problem)
    if failed or logged_out:
        return f"{len(failed)} requests failed and {len(logged_out)} found the user logged out"
    return None


#: The steps, in order (``demo.py`` runs them after its own).
STEPS = (cold_page, crash)
