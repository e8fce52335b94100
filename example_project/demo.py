"""``make demo``: the example project on a real local topology, through a planned failover.

It starts 3 masters (a replica each) and 3 sentinels on loopback, serves the example Django
project over real HTTP from a thread of this process with the first 2 masters as its shards
(the third is monitored by the sentinels but unused until the resharding), and then:

1. shows ``manage.py sentinel_status``;
2. writes a few thousand keys and shows how the Jedis-compatible ring spread them (checked
   against ``DBSIZE`` on every master);
3. shows the low-level cache (``/report/``) and ``cache_page`` (``/clock/``) at work;
4. logs a user in (the session is stored in the sharded cache);
5. fails over the shard that holds the session while requests keep flowing from background
   threads, and reports failed requests (goal: 0), acknowledged writes lost (goal: 0) and
   whether the user is still logged in;
6. shows ``sentinel_status`` again, with the shard's new master;
7. near cache (the ``near`` alias): a feature flag read by hundreds of requests is served from
   this process's memory (hit ratio, and a get timed against the network one), then another
   writer (a plain ``redis.Redis`` client, as a Java service would) changes it and the next
   read returns the new value;
8. online resharding: 30 users log in, the third master is appended (``PREVIOUS_MASTERS``
   deployed), ``sentinel_reshard --dry-run``, then the migration with its progress while the
   users keep requesting pages; deployed without ``PREVIOUS_MASTERS``, every key is on its ring
   owner, no request failed and nobody was logged out;
9. warm adoption (:mod:`example_project.demo_adoption`): a site moved from a django-redis server
   with users logged in (``PREVIOUS_CACHE``), none logged out, no miss, then
   ``sentinel_reshard --from-previous-cache`` empties the old server;
10. exercises the Flask app (``@cache.cached``, ``@cache.memoize``, ``flask sentinel-status``);
11. runs :mod:`example_project.demo_outage`'s steps: a cold expensive page computed once, and a
    crash (SIGKILL) of the session's master under logged-in traffic, nobody logged out;

then stops everything it started. Exit code 0 when every step passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import http.cookiejar
import io
import json
import os
import re
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from example_project import demo_outage
from example_project.demo_adoption import adoption

SPREAD_KEYS = 4000
USERNAME = "demo"
PASSWORD = "sharded-sentinel-demo"  # a throwaway account on a throwaway sqlite database
HOT_READS = 200  # requests that read the feature flag through the near cache
TIMED_READS = 1000  # gets timed with and without the near cache
STALE_LIMIT = 2.0  # seconds an outside write may take to reach the near cache
RESHARD_USERS = 30
RESHARD_RATE = 1000  # keys/s: slow on purpose, so the users' traffic runs through the migration


class DemoFailure(Exception):
    """A step did not do what it should; the message says what and why."""


class Output:
    """Progress lines with the time since the start."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.began = time.monotonic()
        self.steps = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def step(self, title: str) -> None:
        self.steps += 1
        self.line(f"\n== {self.steps}. {title}  [{self.elapsed():5.1f}s]")

    def line(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    def say(self, text: str) -> None:
        self.line(f"   {text}")

    def block(self, text: str) -> None:
        for row in text.rstrip("\n").splitlines():
            self.line(f"   | {row}")


# -- a tiny HTTP client (urllib with cookies) ---------------------------------------------------


class Browser:
    """One user agent: a cookie jar and a base URL; returns (status, body) and never raises on
    an HTTP error status."""

    def __init__(self, base: str, timeout: float = 10.0) -> None:
        self.base = base
        self.timeout = timeout
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def request(self, path: str, data: dict[str, str] | None = None) -> tuple[int, bytes]:
        body = None if data is None else urllib.parse.urlencode(data).encode()
        req = urllib.request.Request(self.base + path, data=body)
        try:
            with self.opener.open(req, timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read()

    def json(self, path: str) -> Any:
        status, body = self.request(path)
        if status != 200:
            raise DemoFailure(f"GET {path} answered {status}: {body[:300]!r}")
        return json.loads(body)

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)


class Traffic(threading.Thread):
    """Sends requests back to back until stopped; counts successes, failures and latencies."""

    def __init__(self, name: str, send: Callable[[int], str | None]) -> None:
        super().__init__(name=f"demo-traffic-{name}", daemon=True)
        self.label = name
        self.send = send  # returns None when the request succeeded, else why it failed
        self.halt = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.slowest = 0.0
        self.acked: list[int] = []

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            n += 1
            started = time.monotonic()
            try:
                problem = self.send(n)
            except Exception as exc:  # a dropped connection is a failed request too
                problem = f"{type(exc).__name__}: {exc}"
            self.slowest = max(self.slowest, time.monotonic() - started)
            if problem is None:
                self.ok += 1
                self.acked.append(n)
            else:
                self.failures.append(problem)

    def stop(self) -> None:
        self.halt.set()
        self.join(15)

    @property
    def total(self) -> int:
        return self.ok + len(self.failures)


class ProgressStream(io.TextIOBase):
    """Where ``sentinel_reshard`` writes its progress: the demo's output, indented like a block,
    live. On a terminal it says so, and the command draws its bar (redrawn with ``\\r``); on
    anything else the command prints plain progress lines."""

    def __init__(self, out: Output) -> None:
        super().__init__()
        self.out = out
        self.tty = bool(getattr(out.stream, "isatty", lambda: False)())
        self.fresh = True
        self.text: list[str] = []

    def isatty(self) -> bool:
        return self.tty

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text.append(text)
        for piece in re.split(r"([\r\n])", text):
            if piece in ("\r", "\n"):
                self.out.stream.write(piece)
                self.fresh = True
            elif piece:
                if self.fresh:
                    self.out.stream.write("   | ")
                    self.fresh = False
                self.out.stream.write(piece)
        self.out.stream.flush()
        return len(text)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``condition`` until it holds; returns the seconds it took, DemoFailure after
    ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise DemoFailure(f"no {what} after {timeout:g}s")
        time.sleep(0.005)
    return time.monotonic() - started


def log_in(browser: Browser, username: str) -> dict[str, Any]:
    """The login form, as a person fills it in; returns ``/api/me/`` afterwards."""
    status, body = browser.request("/accounts/login/")
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', body)
    if status != 200 or token is None:
        raise DemoFailure(f"the login page answered {status} without a CSRF token")
    status, body = browser.request(
        "/accounts/login/",
        {
            "username": username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": token.group(1).decode(),
        },
    )
    if status != 200 or f"Hello {username}".encode() not in body:
        raise DemoFailure(f"{username}'s login did not land on the account page ({status})")
    me: dict[str, Any] = browser.json("/api/me/")
    if not me["authenticated"] or me["username"] != username:
        raise DemoFailure(f"{username} logged in, but /api/me/ says {me['username']!r}")
    return me


# -- the demo ------------------------------------------------------------------------------------


class Demo:
    def __init__(self, out: Output, workdir: str) -> None:
        self.out = out
        self.workdir = workdir
        self.cluster: Any = None
        self.server: Any = None
        self.browser: Browser | None = None
        self.masters: list[str] = []  # the site's MASTERS, as deployed now
        self.failed_requests = 0
        self.reshard_failed = 0

    # Every step in order; run() stops at the first failure.
    def run(self) -> None:
        self.start_topology()
        self.start_django()
        self.show_status("sentinel_status before the failover")
        self.spread_keys()
        self.cached_pages()
        self.log_in()
        self.failover()
        self.status_after_failover()
        self.near_cache()
        self.reshard()
        adoption(self)
        self.flask()
        for step in demo_outage.STEPS:  # a cold page computed once; a crash, nobody logged out
            if (problem := step(self)) is not None:
                raise DemoFailure(problem)

    def stop(self) -> None:
        """Stop everything this demo started (safe after a partial start)."""
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
        with contextlib.suppress(Exception):
            from sentinel_cache.core.topology.sharded_pool import close_all

            close_all()
        if self.cluster is not None:
            self.cluster.stop()

    # -- steps ---------------------------------------------------------------------------------
    def start_topology(self) -> None:
        from sentinel_cache.testing import LocalSentinelCluster, find_server_binary

        self.out.step("Start a local topology: 3 masters (+ 1 replica each), 3 sentinels")
        try:
            binary, kind = find_server_binary()
        except RuntimeError as exc:
            raise DemoFailure(f"no server binary: {exc}") from None
        self.out.say(f"server binary: {binary} ({kind})")
        self.cluster = LocalSentinelCluster(shards=3, replicas=1, sentinels=3).start()
        config = self.cluster.config()
        self.masters = list(config["masters"][:2])
        self.out.say(f"started in {self.cluster.startup_seconds:.2f}s")
        self.out.say(f"sentinels: {', '.join(config['sentinels'])}")
        for name in self.cluster.master_names:
            host, port = self.cluster.master_address(name)
            replicas = ", ".join(f"{h}:{p}" for h, p in self.cluster.replica_addresses(name))
            role = "" if name in self.masters else " (not in MASTERS yet: resharding adds it)"
            self.out.say(f"{name}: master {host}:{port}, replica {replicas}{role}")

    def start_django(self) -> None:
        from example_project.server import DjangoServer, ensure_user, setup_django

        self.out.step("Start the example Django project (settings from SENTINEL_CACHE_* env)")
        config = self.cluster.config()
        setup_django(
            config["sentinels"],
            self.masters,
            database=os.path.join(self.workdir, "example.sqlite3"),
        )
        ensure_user(USERNAME, PASSWORD)
        self.server = DjangoServer().start()
        self.browser = Browser(self.server.url)
        self.out.say(f"SENTINEL_CACHE_SENTINELS={os.environ['SENTINEL_CACHE_SENTINELS']}")
        self.out.say(f"SENTINEL_CACHE_MASTERS={os.environ['SENTINEL_CACHE_MASTERS']}")
        self.out.say(f"serving on {self.server.url} (Django's threaded WSGI server, real HTTP)")
        status, _ = self.browser.request("/")
        if status != 200:
            raise DemoFailure(f"GET / answered {status}")

    def show_status(
        self, title: str, *, wait_healthy: float = 0.0, accept_degraded: bool = False
    ) -> dict[str, Any]:
        """``call_command("sentinel_status")``, shown; returns the last JSON report."""
        from django.core.management import call_command

        self.out.step(title)
        started = time.monotonic()
        first = True
        while True:
            text, code = self._sentinel_status()
            if code == 0 or time.monotonic() - started >= wait_healthy:
                break
            if first:
                first = False
                problems = [row.strip() for row in text.splitlines() if row.startswith("  - ")]
                self.out.say(f"exit {code} for now: {problems[0] if problems else '?'}")
                self.out.say(
                    f"waiting up to {wait_healthy:g}s for the sentinels to see the old master "
                    "back as a replica (they refresh replicas every 10 s)"
                )
            time.sleep(0.25)
        if wait_healthy and time.monotonic() - started > 0.5:
            self.out.say(f"(healthy again after {time.monotonic() - started:.1f}s)")
        self.out.block(text)
        if code == 1 and accept_degraded:
            self.out.say("still DEGRADED (exit 1): serving, but not yet ready for another failover")
        elif code != 0:
            raise DemoFailure(f"sentinel_status exited {code}, expected 0 (healthy)")
        buffer = io.StringIO()
        with contextlib.suppress(SystemExit):  # the exit code was judged above
            call_command("sentinel_status", "--cache", "default", "--json", stdout=buffer)
        report: dict[str, Any] = json.loads(buffer.getvalue())["default"]
        return report

    @staticmethod
    def _sentinel_status(alias: str = "default") -> tuple[str, int]:
        from django.core.management import call_command

        buffer = io.StringIO()
        try:
            call_command("sentinel_status", "--cache", alias, stdout=buffer)
            code = 0
        except SystemExit as exc:  # 1 degraded, 2 down
            code = int(exc.code or 0)
        return buffer.getvalue(), code

    def spread_keys(self) -> None:
        from django.core.cache import cache

        self.out.step(f"Write {SPREAD_KEYS} keys and see how the ring spreads them")
        pool = cache.core  # type: ignore[attr-defined]
        names = self.masters
        before = self._dbsizes()
        keys = [f"spread:{i}" for i in range(SPREAD_KEYS)]
        started = time.perf_counter()
        for i in range(0, len(keys), 1000):
            failed = cache.set_many({key: i for i, key in enumerate(keys[i : i + 1000])}, 600)
            if failed:
                raise DemoFailure(f"set_many could not store {len(failed)} keys")
        took = time.perf_counter() - started
        expected = [0] * len(names)
        for key in keys:
            expected[pool.shard_index(cache.make_key(key))] += 1
        after = self._dbsizes()
        self.out.say(
            f"set_many: {SPREAD_KEYS} keys in {took * 1000:.0f} ms "
            f"(one batch per shard, all shards at once)"
        )
        for index, name in enumerate(names):
            added = after[index] - before[index]
            share = expected[index] / SPREAD_KEYS
            bar = "#" * round(share * 40)
            self.out.say(
                f"shard {index} ({name}): ring says {expected[index]:5d} ({share:6.1%}) "
                f"DBSIZE +{added:<5d} {bar}"
            )
            if added != expected[index]:
                raise DemoFailure(
                    f"shard {index} ({name}) gained {added} keys, the ring placed {expected[index]}"
                )
        sample = cache.get_many(keys[:50])
        if len(sample) != 50:
            raise DemoFailure(f"get_many found {len(sample)} of 50 keys just written")
        self.out.say("every master holds exactly the keys the ring placed on it")

    def _dbsizes(self) -> list[int]:
        sizes = []
        for name in self.masters:
            client = self.cluster.node_client(self.cluster.master_address(name))
            try:
                sizes.append(int(client.dbsize()))
            finally:
                client.close()
        return sizes

    def cached_pages(self) -> None:
        assert self.browser is not None
        self.out.step("Cached pages: the low-level API (/report/) and cache_page (/clock/)")
        first = self.browser.json("/report/?format=json")
        second = self.browser.json("/report/?format=json")
        self.out.say(
            f"/report/: 1st {'hit' if first['hit'] else 'miss'} {first['elapsed_ms']:.0f} ms, "
            f"2nd {'hit' if second['hit'] else 'miss'} {second['elapsed_ms']:.0f} ms "
            f"(entry on shard {second['shard']})"
        )
        if not second["hit"] or second["report"] != first["report"]:
            raise DemoFailure("the second /report/ request did not come from the cache")
        pages = []
        for _ in range(2):
            status, body = Browser(self.browser.base).request("/clock/")
            if status != 200:
                raise DemoFailure(f"GET /clock/ answered {status}")
            found = re.search(rb"<strong>([^<]+)</strong>", body)
            pages.append(found.group(1).decode() if found else "?")
        self.out.say(f"/clock/: generated at {pages[0]}, then served again as {pages[1]}")
        if pages[0] != pages[1]:
            raise DemoFailure("cache_page did not serve the second /clock/ from the cache")

    def log_in(self) -> None:
        assert self.browser is not None
        self.out.step(f"Log in as {USERNAME!r} (the session lives in the sharded cache)")
        me = log_in(self.browser, USERNAME)
        self.session_shard = int(me["session_shard"])
        self.visits_before = int(me["visits"])
        name = self.masters[self.session_shard]
        self.out.say(
            f"logged in; session {self.browser.cookie('sessionid')!s:.8}... is on shard "
            f"{self.session_shard} ({name}), {self.visits_before} visits so far"
        )

    def failover(self) -> None:
        from django.core.cache import cache

        assert self.browser is not None
        name = self.masters[self.session_shard]
        self.out.step(f"Planned failover of {name} (the session's shard) under traffic")
        browser = self.browser
        visitor = Browser(browser.base)

        def visit(n: int) -> str | None:
            status, body = visitor.request(f"/api/visit/{n}/")
            return None if status == 200 else f"/api/visit/ {status}: {body[:200]!r}"

        def session(n: int) -> str | None:
            status, body = browser.request("/api/me/")
            if status != 200:
                return f"/api/me/ {status}: {body[:200]!r}"
            if not json.loads(body)["authenticated"]:
                return "/api/me/ says the user is no longer logged in"
            return None

        traffic = [
            Traffic("visits", visit),
            Traffic("visits-2", visit),
            Traffic("session", session),
        ]
        # The two visit threads write the same keys; that is fine, both are acknowledged writes.
        pool = cache.core  # type: ignore[attr-defined]
        old = self.cluster.master_address(name)
        for thread in traffic:
            thread.start()
        try:
            time.sleep(0.5)
            self.out.say(f"requests flowing; SENTINEL FAILOVER {name} (master {old[0]}:{old[1]})")
            started = time.monotonic()
            self.cluster.failover(name)
            new = self.cluster.wait_for_master_change(name, old, timeout=30)
            promoted = time.monotonic() - started
            new_text = f"{new[0]}:{new[1]}"
            deadline = time.monotonic() + 10
            while pool.shard(name).address != tuple(new):
                if time.monotonic() > deadline:
                    raise DemoFailure(f"the cache never switched {name} to {new_text}")
                time.sleep(0.01)
            followed = time.monotonic() - started
            self.out.say(
                f"sentinels promoted {new_text} after {promoted:.2f}s; "
                f"the cache followed after {followed:.2f}s"
            )
            time.sleep(1.0)  # keep the traffic going on the new master for a while
        finally:
            for thread in traffic:
                thread.stop()
        total = sum(t.total for t in traffic)
        failed = [f for t in traffic for f in t.failures]
        slowest = max(t.slowest for t in traffic)
        self.out.say(
            f"requests during the failover: {total}, failed: {len(failed)} "
            f"(slowest {slowest * 1000:.0f} ms: writes held by the fence, not refused)"
        )
        from example_project.apps import SWITCHES

        for event in list(SWITCHES):
            lag = "" if event["lag_ms"] is None else f", {event['lag_ms']} ms after the event"
            self.out.say(f"on_switch: shard {event['shard']} {event['old']} -> {event['new']}{lag}")
        acked = sorted({n for t in traffic[:2] for n in t.acked})
        found = cache.get_many([f"visit:{n}" for n in acked])
        lost = len(acked) - len(found)
        self.out.say(f"acknowledged visit writes: {len(acked)}, lost: {lost}")
        me = browser.json("/api/me/")
        still = me["authenticated"] and me["username"] == USERNAME
        self.out.say(
            f"session survived: {'yes' if still else 'NO'} "
            f"(still logged in as {me['username']!r}, {me['visits']} visits)"
        )
        self.out.say(f"RESULT: {len(failed)} failed requests, {lost} lost writes")
        self.failed_requests = len(failed)
        self.switched = (name, new_text)
        self.no_failed_requests(failed, total, "the failover")
        if lost:
            raise DemoFailure(f"{lost} acknowledged writes are missing after the failover")
        if not still:
            raise DemoFailure("the user was logged out by the failover")
        if me["visits"] <= self.visits_before:
            raise DemoFailure("the session stopped recording visits")

    def no_failed_requests(self, failed: Sequence[str], total: int, during: str) -> None:
        """Show the first failures and stop the demo if any request failed."""
        if failed:
            for problem in failed[:5]:
                self.out.say(f"failed: {problem}")
            raise DemoFailure(f"{len(failed)} of {total} requests failed during {during}")

    def status_after_failover(self) -> None:
        name, new = self.switched
        # Healthy again once the sentinels see the old master back as the new one's replica
        # (they look at replicas every 10 seconds, so this takes 10-20 s after a failover).
        report = self.show_status(
            f"sentinel_status after the failover ({name} is now at {new})",
            wait_healthy=30,
            accept_degraded=True,
        )
        shard = next(s for s in report["shards"] if s["name"] == name)
        if shard["address"] != new or shard["client_address"] != new:
            raise DemoFailure(
                f"sentinel_status shows {name} at {shard['address']} "
                f"(client {shard['client_address']}), expected {new}"
            )
        self.out.say(f"{name}: master {new}, switches seen by the cache: {shard['switch_count']}")

    def near_cache(self) -> None:
        import redis
        from django.conf import settings
        from django.core.cache import caches

        from example_project.views import FLAG_KEY

        self.out.step("Near cache: a hot feature flag served from this process's memory")
        near, plain = caches["near"], caches["default"]
        core = near.core  # type: ignore[attr-defined]
        key = near.make_key(FLAG_KEY)
        index = core.shard_index(key)
        name = self.masters[index]

        def stats() -> dict[str, Any]:
            counters: dict[str, Any] = core.status()["shards"][index]["near_cache"]
            return counters

        started = time.monotonic()
        near.get(FLAG_KEY)  # the first use starts the core, and a tracker per shard
        wait_for(
            lambda: all(s["near_cache"]["tracked"] for s in core.status()["shards"]),
            5,
            "near-cache tracking on every shard",
        )
        prefixes = settings.CACHES["near"]["OPTIONS"]["NEAR_CACHE_PREFIXES"]
        self.out.say(
            f"the 'near' cache alias (same servers and keys as 'default', with NEAR_CACHE and "
            f"NEAR_CACHE_PREFIXES {prefixes}): every master announces changes of those keys "
            f"to this process (CLIENT TRACKING BCAST), tracked "
            f"{(time.monotonic() - started) * 1000:.0f} ms after its first use"
        )
        before = stats()["invalidations"]
        near.set(FLAG_KEY, 10)
        # BCAST tracking tells every client about every write, ours too: wait for the echo of
        # this one, or it could evict the first copy read after it (one extra miss, harmless).
        wait_for(lambda: stats()["invalidations"] > before, 2, "echo of our own write")
        self.out.say(f"{key} = 10 (set through the cache; its key is on shard {index}, {name})")

        assert self.browser is not None
        reader = Browser(self.browser.base)
        start = stats()
        for _ in range(HOT_READS):
            flag = reader.json("/api/flag/")
            if flag["percent"] != 10:
                raise DemoFailure(f"/api/flag/ answered {flag['percent']!r}, expected 10")
        end = stats()
        hits, misses = end["hits"] - start["hits"], end["misses"] - start["misses"]
        self.out.say(
            f"{HOT_READS} requests to /api/flag/: {hits} reads served from this process's "
            f"memory, {misses} from {name} (hit ratio {hits / max(1, hits + misses):.1%}); "
            f"kept: {end['entries']} entry, {end['bytes']} bytes"
        )
        if hits < HOT_READS * 0.9:
            raise DemoFailure(f"only {hits} of {HOT_READS} reads were near-cache hits")

        local, network = [], []
        for _ in range(TIMED_READS):  # interleaved: both see the same load on this machine
            started = time.perf_counter_ns()
            got_near = near.get(FLAG_KEY)
            middle = time.perf_counter_ns()
            got_plain = plain.get(FLAG_KEY)
            local.append(middle - started)
            network.append(time.perf_counter_ns() - middle)
            if got_near != 10 or got_plain != 10:
                raise DemoFailure(f"read {got_near!r} and {got_plain!r}, expected 10")
        fast, slow = _median(local) / 1000, _median(network) / 1000
        self.out.say(
            f"one get() in this process, median of {TIMED_READS}: {fast:.1f} µs from the near "
            f"cache, {slow:.1f} µs through the 'default' alias (a GET round trip to {name}): "
            f"{slow / fast:.0f}x"
        )
        if fast >= slow:
            raise DemoFailure("a near-cache hit was not faster than a network get")

        address = core.shard_for(key).address
        db = core.config.connection_options().get("db", 0)
        seen = stats()["invalidations"]
        with redis.Redis(host=address.host, port=address.port, db=db) as other:
            other.set(key, 50)  # integers are stored as plain decimal: any client can write one
            written = time.monotonic()
        stale = 0
        while (value := near.get(FLAG_KEY)) != 50:
            if value != 10:
                raise DemoFailure(f"read {value!r} after the outside write, expected 10 or 50")
            if time.monotonic() - written > STALE_LIMIT:
                raise DemoFailure(
                    f"the near cache still served the old value {STALE_LIMIT:g}s after another "
                    f"writer changed {key}: no invalidation arrived"
                )
            stale += 1
        took = time.monotonic() - written
        self.out.say(
            f"another writer (a plain redis.Redis client on {address.host}:{address.port}, "
            f"standing for another process or a Java service): SET {key} 50"
        )
        self.out.say(
            f"the cache read 50 {took * 1000:.2f} ms after that write was acknowledged "
            f"({stale} reads before it still saw 10, while the invalidation was on its way); "
            f"invalidations received: +{stats()['invalidations'] - seen}"
        )
        flag = reader.json("/api/flag/")
        if flag["percent"] != 50:
            raise DemoFailure(f"/api/flag/ still answers {flag['percent']!r} after the change")
        self.out.say("/api/flag/ answers 50 too")
        text, _ = self._sentinel_status("near")
        rows = text.splitlines()
        head = next((i for i, row in enumerate(rows) if row.startswith("near cache")), None)
        if head is None:
            raise DemoFailure("sentinel_status --cache near printed no near-cache table")
        end_row = next((i for i in range(head, len(rows)) if not rows[i].strip()), len(rows))
        self.out.say("sentinel_status --cache near, its near-cache table:")
        self.out.block("\n".join(rows[head:end_row]))

    def deploy(self, masters: list[str], previous: list[str] | None) -> None:
        """Deploy the site with new cache settings, in this process: the environment changes,
        the settings module computes ``CACHES`` again and they replace the running ones
        (``override_settings``: Django builds every cache anew on its next use), and the cores
        of the settings replaced are closed once the requests already running are done, as the
        old processes of a real deployment would exit."""
        from django.conf import settings
        from django.core.cache import caches
        from django.test.utils import override_settings

        from example_project import settings as site
        from example_project import topology
        from example_project.apps import register_switch_callback

        replaced = [caches[alias].core for alias in settings.CACHES]  # type: ignore[attr-defined]
        topology.export(self.cluster.config()["sentinels"], masters, previous_masters=previous)
        # Left on until the process exits: the next deployment is applied on top of this one.
        override_settings(CACHES=site.cache_settings()).enable()
        self.masters = list(masters)
        register_switch_callback()
        time.sleep(0.5)  # the requests that started on the old settings finish
        current = {id(caches[alias].core) for alias in settings.CACHES}  # type: ignore[attr-defined]
        for core in replaced:
            if id(core) not in current:
                core.close()
        env = f"SENTINEL_CACHE_MASTERS={','.join(masters)}"
        if previous:
            env += f" SENTINEL_CACHE_PREVIOUS_MASTERS={','.join(previous)}"
        self.out.say(f"deployed: {env}")

    def reshard(self) -> None:
        from django.core.cache import caches

        from example_project.server import ensure_user
        from example_project.views import SESSION_KEY_PREFIX

        assert self.browser is not None
        before = list(self.masters)
        added = next(name for name in self.cluster.master_names if name not in before)
        after = [*before, added]
        self.out.step(
            f"Online resharding: append {added} while {RESHARD_USERS} users are logged in"
        )
        started = time.monotonic()
        users: list[tuple[str, Browser]] = []
        for n in range(RESHARD_USERS):
            name = f"user{n:02d}"
            ensure_user(name, PASSWORD)
            browser = Browser(self.browser.base)
            log_in(browser, name)
            users.append((name, browser))
        stored = {
            name: caches["default"].make_key(SESSION_KEY_PREFIX + str(browser.cookie("sessionid")))
            for name, browser in users
        }

        def per_shard() -> str:
            core = caches["default"].core  # type: ignore[attr-defined]
            counts = [0] * len(self.masters)
            for key in stored.values():
                counts[core.shard_index(key)] += 1
            return ", ".join(f"{m} {c}" for m, c in zip(self.masters, counts, strict=True))

        self.out.say(
            f"{RESHARD_USERS} users logged in through the login form, each from its own browser, "
            f"in {time.monotonic() - started:.1f}s; their sessions: {per_shard()}"
        )
        active, idle = users[::2], users[1::2]

        def as_users(group: list[tuple[str, Browser]]) -> Callable[[int], str | None]:
            def send(n: int) -> str | None:
                name, browser = group[n % len(group)]
                path = "/account/" if (n // len(group)) % 2 else "/api/me/"
                status, body = browser.request(path)
                if status != 200:
                    return f"{name}: GET {path} answered {status}: {body[:200]!r}"
                if path == "/api/me/":
                    me = json.loads(body)
                    ok = me["authenticated"] and me["username"] == name
                else:
                    ok = f"Hello {name}.".encode() in body
                return None if ok else f"{name} was logged out (GET {path})"

            return send

        visitor = Browser(self.browser.base)

        def visit(n: int) -> str | None:
            status, body = visitor.request(f"/api/visit/{n}/")
            return None if status == 200 else f"/api/visit/ {status}: {body[:200]!r}"

        traffic = [
            Traffic("users-1", as_users(active[0::2])),
            Traffic("users-2", as_users(active[1::2])),
            Traffic("visits", visit),
        ]
        self.out.say(
            f"background traffic: {len(active)} of the users request /api/me/ and /account/ "
            f"in turn, and /api/visit/<n>/ writes keys; the other {len(idle)} stay idle until "
            "the end"
        )
        self.out.say(
            f"{added} is already monitored by the sentinels (runbook step 1 in "
            "docs/resharding.md): the demo started it with the others, as the local harness "
            "cannot add a master to running sentinels"
        )
        idle_moving: list[str] = []
        for thread in traffic:
            thread.start()
        try:
            time.sleep(0.5)
            self.out.say(
                f"deploy the site with {added} appended and PREVIOUS_MASTERS (here: its CACHES "
                "computed again from the environment and swapped in, in this process, with "
                "override_settings; the cores of the old settings are then closed)"
            )
            self.deploy(after, previous=before)
            core = caches["default"].core  # type: ignore[attr-defined]
            idle_moving = [n for n, _ in idle if core.previous_shard_for(stored[n]) is not None]
            self.out.say(
                f"of the {len(idle)} idle users' sessions, {len(idle_moving)} are on keys the "
                f"append moves to {added}: nobody reads them during the migration, so only the "
                "migration can move them"
            )
            self.out.say(
                "the plan: sentinel_reshard --cache default --dry-run (the 'near' alias has the "
                "same servers and keys: the default cache's migration moves them for both)"
            )
            code, text, _ = self._command("sentinel_reshard", "--cache", "default", "--dry-run")
            self.out.block(text)
            if code != 0:
                raise DemoFailure(f"sentinel_reshard --dry-run exited {code}")
            progress = ProgressStream(self.out)
            shown = "its progress bar" if progress.tty else "its progress lines (not a terminal)"
            self.out.say(
                f"the migration: sentinel_reshard --cache default --rate {RESHARD_RATE} "
                f"(throttled so that the users' traffic runs through it), {shown}:"
            )
            code, text, _ = self._command(
                "sentinel_reshard",
                "--cache",
                "default",
                "--rate",
                str(RESHARD_RATE),
                stderr=progress,
            )
            self.out.block(text)
            if code != 0:
                raise DemoFailure(f"sentinel_reshard exited {code}")
            if not progress.tty and "(done)" not in "".join(progress.text):
                raise DemoFailure("sentinel_reshard printed no progress")
            code, text, _ = self._command("sentinel_reshard", "--cache", "default", "--json")
            again = json.loads(text)["default"]
            self.out.say(
                f"run again: moved {again['moved']} of {again['scanned']:,} keys scanned "
                f"(exit {code}): nothing was left behind"
            )
            if code != 0 or again["moved"] != 0:
                raise DemoFailure(f"a second sentinel_reshard moved {again['moved']} keys")
            self.out.say("deploy the site without PREVIOUS_MASTERS")
            self.deploy(after, previous=None)
            time.sleep(0.5)  # some traffic on the final settings
        finally:
            for thread in traffic:
                thread.stop()
        total = sum(t.total for t in traffic)
        failed = [f for t in traffic for f in t.failures]
        self.out.say(
            f"requests during the resharding: {total}, failed: {len(failed)} "
            f"(slowest {max(t.slowest for t in traffic) * 1000:.0f} ms)"
        )
        core = caches["default"].core  # type: ignore[attr-defined]
        keys = misplaced = 0
        for index, name in enumerate(after):
            with self.cluster.node_client(self.cluster.master_address(name)) as node:
                for key in node.scan_iter(count=1000):
                    keys += 1
                    misplaced += core.shard_index(key) != index
        self.out.say(
            f"SCAN of every master: {keys} keys, {misplaced} off their ring owner; "
            f"sessions now: {per_shard()}"
        )
        flag = self.browser.json("/api/flag/")  # its key may have moved too
        self.out.say(
            f"the feature flag through the near cache: {flag['percent']} (shard {flag['shard']})"
        )
        logged_out = [
            name
            for name, browser in [*users, (USERNAME, self.browser)]
            if browser.json("/api/me/")["username"] != name
        ]
        still = RESHARD_USERS + 1 - len(logged_out)
        self.out.say(
            f"still logged in: {still}/{RESHARD_USERS + 1} ({RESHARD_USERS} users and "
            f"{USERNAME!r}; the {len(idle_moving)} idle users whose sessions moved included)"
        )
        self.out.say(
            f"RESHARD RESULT: {len(failed)} failed requests, {len(logged_out)} logged out, "
            f"{misplaced} keys off their owner"
        )
        self.reshard_failed = len(failed)
        self.no_failed_requests(failed, total, "the resharding")
        if logged_out:
            raise DemoFailure(f"logged out by the resharding: {', '.join(logged_out)}")
        if misplaced:
            raise DemoFailure(f"{misplaced} keys are not on their ring owner after the migration")
        if flag["percent"] != 50:
            raise DemoFailure(f"/api/flag/ answers {flag['percent']!r} after the resharding")

    @staticmethod
    def _command(*args: str, stderr: Any = None) -> tuple[int, str, str]:
        """``call_command(*args)``; returns (exit code, stdout, stderr)."""
        from django.core.management import call_command

        out = io.StringIO()
        err = stderr if stderr is not None else io.StringIO()
        try:
            call_command(*args, stdout=out, stderr=err)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        return code, out.getvalue(), err.getvalue() if isinstance(err, io.StringIO) else ""

    def flask(self) -> None:
        from django.core.cache import cache

        from example_project.flask_app import backend, create_app

        self.out.step("The Flask app: @cache.cached, @cache.memoize, flask sentinel-status")
        app = create_app()
        client = app.test_client()
        with app.app_context():
            shared = backend().core is cache.core  # type: ignore[attr-defined]
        self.out.say(
            "Flask-Caching backend built from CACHE_REDIS_SENTINELS; "
            + ("it shares the Django cache's core (equal settings)" if shared else "own core")
        )
        first, second = client.get("/report").get_json(), client.get("/report").get_json()
        self.out.say(
            f"/report (@cache.cached): generated {first['generated_at']}, "
            f"then {second['generated_at']}"
        )
        if first != second:
            raise DemoFailure("@cache.cached did not serve the second /report")
        timings = []
        for _ in range(2):
            started = time.perf_counter()
            result = client.get("/square/12").get_json()
            timings.append((time.perf_counter() - started) * 1000)
        self.out.say(
            f"/square/12 (@cache.memoize): {result['square']}, {timings[0]:.0f} ms then "
            f"{timings[1]:.0f} ms"
        )
        if timings[1] > timings[0]:
            raise DemoFailure("@cache.memoize did not make the second call faster")
        shards = [0] * len(self.masters)
        for n in range(200):
            response = client.get(f"/visit/{n}")
            if response.status_code != 200:
                raise DemoFailure(f"Flask /visit/{n} answered {response.status_code}")
            shards[response.get_json()["shard"]] += 1
        self.out.say(f"/visit/0..199: all stored and read back; per shard {shards}")
        status = client.get("/shards").get_json()
        name, new = self.switched
        flask_view = {s["name"]: s["address"] for s in status["shards"]}
        self.out.say(f"/shards: {flask_view}")
        if flask_view[name] != new:
            raise DemoFailure(f"the Flask app sees {name} at {flask_view[name]}, expected {new}")
        runner = app.test_cli_runner()
        result = runner.invoke(args=["sentinel-status"])
        # Exit 1 (degraded) can come back for a moment while the sentinels are still
        # reconfiguring the old master as a replica, 10-20 s after the failover.
        started, deadline = time.monotonic(), time.monotonic() + 20
        if result.exit_code == 1:
            problems = [r.strip() for r in result.output.splitlines() if r.startswith("  - ")]
            self.out.say(
                f"flask sentinel-status: exit 1 for now ({problems[0] if problems else '?'}); "
                "waiting up to 20s: the sentinels are still settling after the failover"
            )
        while result.exit_code == 1 and time.monotonic() < deadline:
            time.sleep(0.25)
            result = runner.invoke(args=["sentinel-status"])
        waited = time.monotonic() - started
        self.out.say(
            f"flask sentinel-status: exit {result.exit_code}"
            + (f" (after {waited:.1f}s)" if waited > 0.1 else "")
        )
        if result.exit_code != 0:
            self.out.block(result.output)
            raise DemoFailure(f"flask sentinel-status exited {result.exit_code}")


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--server",
        default=None,
        help="redis, valkey, embedded or a binary path (default: $SENTINEL_CACHE_SERVER, auto)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.server:
        os.environ["SENTINEL_CACHE_SERVER"] = args.server
    os.environ["EXAMPLE_ACCESS_LOG"] = "0"  # one line per request would drown the story
    # Dozens of throwaway accounts log in: Django's test-speed hasher (see settings.py).
    os.environ["EXAMPLE_FAST_PASSWORD_HASHER"] = "1"
    out = Output()
    out.line("sentinel_cache demo: a sharded Sentinel cache behind Django and Flask")
    with tempfile.TemporaryDirectory(prefix="sentinel-cache-demo-") as workdir:
        demo = Demo(out, workdir)
        failure: str | None = None
        try:
            demo.run()
        except DemoFailure as exc:
            failure = str(exc)
        except KeyboardInterrupt:
            failure = "interrupted"
        except Exception:
            failure = "unexpected error:\n" + traceback.format_exc()
        finally:
            out.step("Stop everything the demo started")
            demo.stop()
            out.say("web server, cache pools and every server process stopped")
    if failure is not None:
        out.line(f"\nDEMO FAILED after {out.elapsed():.1f}s at step {out.steps - 1}: {failure}")
        return 1
    out.line(
        f"\nDEMO PASSED in {out.elapsed():.1f}s: {demo.failed_requests} failed requests during "
        f"the failover and {demo.reshard_failed} during the resharding, nobody was logged out, "
        "the cache follows the new master, the near cache saw the outside write."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
