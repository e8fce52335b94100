"""``make demo``'s online resharding step: users log in, the third master is appended
(``PREVIOUS_MASTERS`` deployed), ``sentinel_reshard --dry-run``, then the migration with its
progress while the users keep requesting pages; deployed without ``PREVIOUS_MASTERS``, every key
is on its ring owner, no request failed and nobody was logged out."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from example_project.demo_tools import (
    USERNAME,
    Browser,
    DemoFailure,
    ProgressStream,
    Traffic,
    command,
    logged_in_users,
)

RESHARD_USERS = 30
RESHARD_RATE = 1000  # keys/s: slow on purpose, so the users' traffic runs through the migration


def deploy(demo: Any, masters: list[str], previous: list[str] | None) -> None:
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
    topology.export(demo.cluster.config()["sentinels"], masters, previous_masters=previous)
    # Left on until the process exits: the next deployment is applied on top of this one.
    override_settings(CACHES=site.cache_settings()).enable()
    demo.masters = list(masters)
    register_switch_callback()
    time.sleep(0.5)  # the requests that started on the old settings finish
    current = {id(caches[alias].core) for alias in settings.CACHES}  # type: ignore[attr-defined]
    for core in replaced:
        if id(core) not in current:
            core.close()
    env = f"SENTINEL_CACHE_MASTERS={','.join(masters)}"
    if previous:
        env += f" SENTINEL_CACHE_PREVIOUS_MASTERS={','.join(previous)}"
    demo.out.say(f"deployed: {env}")


def reshard(demo: Any) -> None:
    """The step, on the running demo."""
    from django.core.cache import caches

    from example_project.views import SESSION_KEY_PREFIX

    assert demo.browser is not None
    before = list(demo.masters)
    added = next(name for name in demo.cluster.master_names if name not in before)
    after = [*before, added]
    demo.out.step(f"Online resharding: append {added} while {RESHARD_USERS} users are logged in")
    started = time.monotonic()
    users = logged_in_users(demo.browser.base, "user", RESHARD_USERS)
    stored = {
        name: caches["default"].make_key(SESSION_KEY_PREFIX + str(browser.cookie("sessionid")))
        for name, browser in users
    }

    def per_shard() -> str:
        core = caches["default"].core  # type: ignore[attr-defined]
        counts = [0] * len(demo.masters)
        for key in stored.values():
            counts[core.shard_index(key)] += 1
        return ", ".join(f"{m} {c}" for m, c in zip(demo.masters, counts, strict=True))

    demo.out.say(
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

    visitor = Browser(demo.browser.base)

    def visit(n: int) -> str | None:
        status, body = visitor.request(f"/api/visit/{n}/")
        return None if status == 200 else f"/api/visit/ {status}: {body[:200]!r}"

    traffic = [
        Traffic("users-1", as_users(active[0::2])),
        Traffic("users-2", as_users(active[1::2])),
        Traffic("visits", visit),
    ]
    demo.out.say(
        f"background traffic: {len(active)} of the users request /api/me/ and /account/ "
        f"in turn, and /api/visit/<n>/ writes keys; the other {len(idle)} stay idle until "
        "the end"
    )
    demo.out.say(
        f"{added} is already monitored by the sentinels (runbook step 1 in "
        "docs/resharding.md): the demo started it with the others, as the local harness "
        "cannot add a master to running sentinels"
    )
    idle_moving: list[str] = []
    for thread in traffic:
        thread.start()
    try:
        time.sleep(0.5)
        demo.out.say(
            f"deploy the site with {added} appended and PREVIOUS_MASTERS (here: its CACHES "
            "computed again from the environment and swapped in, in this process, with "
            "override_settings; the cores of the old settings are then closed)"
        )
        deploy(demo, after, previous=before)
        core = caches["default"].core  # type: ignore[attr-defined]
        idle_moving = [n for n, _ in idle if core.previous_shard_for(stored[n]) is not None]
        demo.out.say(
            f"of the {len(idle)} idle users' sessions, {len(idle_moving)} are on keys the "
            f"append moves to {added}: nobody reads them during the migration, so only the "
            "migration can move them"
        )
        demo.out.say(
            "the plan: sentinel_reshard --cache default --dry-run (the 'near' alias has the "
            "same servers and keys: the default cache's migration moves them for both)"
        )
        code, text, _ = command("sentinel_reshard", "--cache", "default", "--dry-run")
        demo.out.block(text)
        if code != 0:
            raise DemoFailure(f"sentinel_reshard --dry-run exited {code}")
        progress = ProgressStream(demo.out)
        shown = "its progress bar" if progress.tty else "its progress lines (not a terminal)"
        demo.out.say(
            f"the migration: sentinel_reshard --cache default --rate {RESHARD_RATE} "
            f"(throttled so that the users' traffic runs through it), {shown}:"
        )
        code, text, _ = command(
            "sentinel_reshard",
            "--cache",
            "default",
            "--rate",
            str(RESHARD_RATE),
            stderr=progress,
        )
        demo.out.block(text)
        if code != 0:
            raise DemoFailure(f"sentinel_reshard exited {code}")
        if not progress.tty and "(done)" not in "".join(progress.text):
            raise DemoFailure("sentinel_reshard printed no progress")
        code, text, _ = command("sentinel_reshard", "--cache", "default", "--json")
        again = json.loads(text)["default"]
        demo.out.say(
            f"run again: moved {again['moved']} of {again['scanned']:,} keys scanned "
            f"(exit {code}): nothing was left behind"
        )
        if code != 0 or again["moved"] != 0:
            raise DemoFailure(f"a second sentinel_reshard moved {again['moved']} keys")
        demo.out.say("deploy the site without PREVIOUS_MASTERS")
        deploy(demo, after, previous=None)
        time.sleep(0.5)  # some traffic on the final settings
    finally:
        for thread in traffic:
            thread.stop()
    total = sum(t.total for t in traffic)
    failed = [f for t in traffic for f in t.failures]
    demo.out.say(
        f"requests during the resharding: {total}, failed: {len(failed)} "
        f"(slowest {max(t.slowest for t in traffic) * 1000:.0f} ms)"
    )
    core = caches["default"].core  # type: ignore[attr-defined]
    keys = misplaced = 0
    for index, name in enumerate(after):
        with demo.cluster.node_client(demo.cluster.master_address(name)) as node:
            for key in node.scan_iter(count=1000):
                keys += 1
                misplaced += core.shard_index(key) != index
    demo.out.say(
        f"SCAN of every master: {keys} keys, {misplaced} off their ring owner; "
        f"sessions now: {per_shard()}"
    )
    flag = demo.browser.json("/api/flag/")  # its key may have moved too
    demo.out.say(
        f"the feature flag through the near cache: {flag['percent']} (shard {flag['shard']})"
    )
    logged_out = [
        name
        for name, browser in [*users, (USERNAME, demo.browser)]
        if browser.json("/api/me/")["username"] != name
    ]
    still = RESHARD_USERS + 1 - len(logged_out)
    demo.out.say(
        f"still logged in: {still}/{RESHARD_USERS + 1} ({RESHARD_USERS} users and "
        f"{USERNAME!r}; the {len(idle_moving)} idle users whose sessions moved included)"
    )
    demo.out.say(
        f"RESHARD RESULT: {len(failed)} failed requests, {len(logged_out)} logged out, "
        f"{misplaced} keys off their owner"
    )
    demo.reshard_failed = len(failed)
    demo.no_failed_requests(failed, total, "the resharding")
    if logged_out:
        raise DemoFailure(f"logged out by the resharding: {', '.join(logged_out)}")
    if misplaced:
        raise DemoFailure(f"{misplaced} keys are not on their ring owner after the migration")
    if flag["percent"] != 50:
        raise DemoFailure(f"/api/flag/ answers {flag['percent']!r} after the resharding")
