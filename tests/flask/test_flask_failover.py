"""``@cache.cached`` and ``@cache.memoize`` views keep answering through planned failovers.

The app runs with ``debug=True`` so Flask-Caching re-raises backend errors instead of logging
them and calling the view uncached: any cache error is a failed request here.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

import pytest
from flask import Flask, request
from flask_caching import Cache
from flask_support import settings_for
from threads import Workers
from waiting import wait_until

from sentinel_cache.flask import ShardedSentinelCache
from sentinel_cache.testing import LocalSentinelCluster

pytestmark = pytest.mark.failover

ClusterFactory = Callable[..., LocalSentinelCluster]


def make_app(cluster: LocalSentinelCluster) -> tuple[Flask, ShardedSentinelCache, dict[str, int]]:
    app = Flask("failover_views")
    app.testing = True
    app.debug = True
    app.config.update(settings_for(cluster, CACHE_KEY_PREFIX="fo:", CACHE_REDIS_DB=0))
    cache = Cache(app)
    calls = {"view": 0, "memo": 0}

    @cache.memoize(timeout=30)
    def square(n: int) -> int:
        calls["memo"] += 1
        return n * n

    @app.route("/cached/<int:n>")
    @cache.cached(timeout=30, query_string=True)
    def cached_view(n: int) -> str:
        calls["view"] += 1
        return f"cached {n} {request.args.get('q', '')}"

    @app.route("/memo/<int:n>")
    def memo_view(n: int) -> str:
        return f"memo {square(n)}"

    backend = app.extensions["cache"][cache]
    return app, backend, calls


class Traffic(threading.Thread):
    """Requests through the test client in a loop: fresh query strings (cache writes) and
    repeated ones (cache reads), on keys of both shards."""

    def __init__(self, app: Flask, worker: int) -> None:
        super().__init__(name=f"traffic-{worker}", daemon=True)
        self.client = app.test_client()
        self.worker = worker
        self.ok = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        for i in itertools.count():
            if self.halt.is_set():
                return
            n = i % 32
            for url, expected in (
                (f"/cached/{n}?q={self.worker}-{i}", f"cached {n} {self.worker}-{i}"),
                (f"/cached/{n}?q=hot", f"cached {n} hot"),
                (f"/memo/{n}", f"memo {n * n}"),
                (f"/memo/{1000 + self.worker * 100000 + i}", None),
            ):
                try:
                    response = self.client.get(url)
                    body = response.get_data(as_text=True)
                    if response.status_code != 200:
                        self.failures.append(f"{url}: HTTP {response.status_code}: {body[:200]}")
                    elif expected is not None and body != expected:
                        self.failures.append(f"{url}: unexpected body {body!r}")
                    else:
                        self.ok += 1
                except Exception as exc:  # reported by the test
                    self.failures.append(f"{url}: {type(exc).__name__}: {exc}")
            time.sleep(0.002)


def test_cached_and_memoized_views_through_planned_failover(
    make_cluster: ClusterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=3)
    app, backend, calls = make_app(cluster)
    traffic = [Traffic(app, worker) for worker in range(2)]
    workers = Workers(timeout=10)
    try:
        with caplog.at_level(logging.ERROR, logger="flask_caching"):
            for thread in traffic:
                workers.start(thread)
            wait_until(lambda: sum(t.ok for t in traffic) >= 50, 15, "traffic before the failover")
            before = {name: cluster.master_address(name) for name in cluster.master_names}
            for name in cluster.master_names:  # both shards, at once
                cluster.failover(name)
            after = {
                name: cluster.wait_for_master_change(name, before[name], timeout=30)
                for name in cluster.master_names
            }
            deadline = time.monotonic() + 15
            while any(
                backend.core.shard(name).address != after[name] for name in cluster.master_names
            ):
                assert time.monotonic() < deadline, backend.core.status()
                time.sleep(0.02)
            on_new = sum(t.ok for t in traffic) + 100  # requests served by the new masters
            wait_until(lambda: sum(t.ok for t in traffic) >= on_new, 15, "traffic on the new masters")
            served_before_stop = sum(t.ok for t in traffic)
    finally:
        for thread in traffic:
            thread.halt.set()
        workers.join()

    try:
        failures = [f for t in traffic for f in t.failures]
        assert not failures, failures[:10]
        assert served_before_stop > 100
        assert not [r for r in caplog.records if "cache backend" in r.getMessage()]
        assert all(backend.core.shard(n).switch_count >= 1 for n in cluster.master_names)

        # The cache still caches: a hot page is computed once, then served from the new masters.
        client = app.test_client()
        done = calls["view"]
        assert client.get("/cached/7?q=after").status_code == 200
        assert client.get("/cached/7?q=after").status_code == 200
        assert calls["view"] == done + 1
        # Writes land on the new masters, where the ring places them.
        assert backend.set("after", "failover")
        shard = backend.core.shard_index("fo:after")
        with cluster.node_client(after[cluster.master_names[shard]]) as plain:
            assert plain.execute_command("ROLE")[0] in (b"master", "master")
            assert plain.exists("fo:after") == 1
    finally:
        backend.core.close()
