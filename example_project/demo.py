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
7. near cache (:mod:`example_project.demo_near`, the ``near`` alias): a feature flag read by
   hundreds of requests is served from this process's memory (hit ratio, and a get timed
   against the network one), then another writer (a plain ``redis.Redis`` client, as a Java
   service would) changes it and the next read returns the new value;
8. online resharding (:mod:`example_project.demo_reshard`): 30 users log in, the third master
   is appended (``PREVIOUS_MASTERS`` deployed), ``sentinel_reshard --dry-run``, then the
   migration with its progress while the users keep requesting pages; deployed without
   ``PREVIOUS_MASTERS``, every key is on its ring owner, no request failed and nobody was
   logged out;
9. warm adoption (:mod:`example_project.demo_adoption`): a site moved from a django-redis server
   with users logged in (``PREVIOUS_CACHE``), none logged out, no miss, then
   ``sentinel_reshard --from-previous-cache`` empties the old server;
10. exercises the Flask app (:mod:`example_project.demo_flask`: ``@cache.cached``,
    ``@cache.memoize``, ``flask sentinel-status``);
11. runs :mod:`example_project.demo_outage`'s steps: a cold expensive page computed once, and a
    crash (SIGKILL) of the session's master under logged-in traffic, nobody logged out;

then stops everything it started. Exit code 0 when every step passed, 1 otherwise. What every
step uses (output, browser, traffic, commands) is in :mod:`example_project.demo_tools`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from typing import Any

from example_project import demo_outage
from example_project.demo_adoption import adoption
from example_project.demo_flask import flask
from example_project.demo_near import near_cache
from example_project.demo_reshard import reshard
from example_project.demo_tools import (
    PASSWORD,
    USERNAME,
    Browser,
    DemoFailure,
    Output,
    Traffic,
    log_in,
    sentinel_status,
)

SPREAD_KEYS = 4000


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
        near_cache(self)
        reshard(self)
        adoption(self)
        flask(self)
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
            text, code = sentinel_status()
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
