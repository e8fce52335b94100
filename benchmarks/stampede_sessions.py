"""Part 4 of :mod:`benchmarks.stampede`: a master SIGKILLed under 200 requests/s of Django
cache-session reads and writes (4 logged-in users at 50/s, their sessions on that master), the
sentinels' ``down-after-milliseconds`` 1000, on a fresh topology per run."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from sentinel_cache.testing import LocalSentinelCluster
from tests.threads import Workers

SESSION_USERS, SESSION_RATE = 4, 50.0  # 4 x 50 = 200 requests/s
DOWN_AFTER_MS, HOLD_S = 1000, 5.0


@dataclass
class Sessions:
    requests: int = 0
    failed: int = 0  # the save raised: a 500
    logged_out: int = 0  # the load found no user (Django's cache sessions swallow the error)
    new_keys: int = 0  # a logged-out user's save made a new session (a new cookie)
    slowest_s: float = 0.0
    switch_s: float = 0.0  # from the kill to the cache's switch
    rate: float = 0.0


def _django() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(USE_TZ=True, INSTALLED_APPS=[], CACHES={})
        django.setup()


def sessions_through_a_crash(options: dict[str, Any], db: int) -> Sessions:
    """One run on a fresh topology, with the cache ``options`` given (``OUTAGE_*``), in
    database ``db``."""
    _django()
    from django.contrib.sessions.backends.base import SessionBase
    from django.contrib.sessions.backends.cache import KEY_PREFIX, SessionStore

    from sentinel_cache.django import ShardedSentinelCache

    cluster = LocalSentinelCluster(shards=2, replicas=1, sentinels=3, down_after_ms=DOWN_AFTER_MS)
    cluster.start()
    config = cluster.config()
    cache = ShardedSentinelCache(
        config["sentinels"],
        {"KEY_PREFIX": "bench", "OPTIONS": {"MASTERS": config["masters"], "DB": db, **options}},
    )
    core = cache.core

    def store(key: str | None = None) -> SessionStore:
        """Django's cache SessionStore on ``cache`` (not on ``caches[SESSION_CACHE_ALIAS]``)."""
        session = SessionStore.__new__(SessionStore)
        session._cache = cache  # type: ignore[attr-defined]
        SessionBase.__init__(session, key)
        return session

    try:
        keys: list[str] = []
        while len(keys) < SESSION_USERS:  # logged-in users whose sessions live on shard 0
            session = store()
            session["_auth_user_id"] = str(len(keys))
            session.save()
            if core.shard_for(cache.make_key(KEY_PREFIX + session.session_key)).index == 0:
                keys.append(session.session_key)  # type: ignore[arg-type]
        shard, name = core.shards[0], cluster.master_names[0]
        deadline = time.monotonic() + 10
        while core.config.outage_reads and not shard.outage_replicas(shard.generation):
            if time.monotonic() > deadline:
                raise RuntimeError("no replica in step with shard 0's master")
            time.sleep(0.05)
        with cluster.node_client(shard.address) as node:
            node.execute_command("WAIT", 1, 5000)  # the logins reached the replica
        outcome, lock = Sessions(), threading.Lock()
        generation, stop = shard.generation, threading.Event()

        def user(n: int, key: str) -> None:
            due = time.monotonic()
            while not stop.is_set():
                began = time.monotonic()
                request = store(key)  # what SessionMiddleware does per request
                out = request.get("_auth_user_id") != str(n)
                request["seen"] = began
                try:
                    request.save()
                    failed = False
                except Exception:
                    failed = True
                took = time.monotonic() - began
                with lock:
                    outcome.requests += 1
                    outcome.failed += failed
                    outcome.logged_out += out
                    outcome.slowest_s = max(outcome.slowest_s, took)
                    if not failed and request.session_key != key:
                        outcome.new_keys += 1
                        key = request.session_key  # type: ignore[assignment]
                due = max(due + 1 / SESSION_RATE, time.monotonic() - 1 / SESSION_RATE)
                time.sleep(max(0.0, due - time.monotonic()))

        started = time.monotonic()
        with Workers(timeout=HOLD_S + 30) as workers:
            for n, key in enumerate(keys):
                workers.spawn(user, n, key)
            time.sleep(0.5)
            old = cluster.kill_master(name)
            killed = time.monotonic()
            while shard.generation == generation:
                if time.monotonic() > killed + 30:
                    raise RuntimeError("the cache did not switch within 30 s")
                time.sleep(0.005)
            outcome.switch_s = time.monotonic() - killed
            time.sleep(1.0)
            stop.set()
        outcome.rate = outcome.requests / (time.monotonic() - started)
        cluster.wait_for_master_change(name, old, timeout=30)
        return outcome
    finally:
        core.close()
        cluster.stop()
