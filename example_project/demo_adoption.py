"""``make demo``'s warm adoption step (issue 25): a site moved from a django-redis server to the
sharded cache with its users logged in, none logged out (docs/migration.md's runbook).

Before: the site's sessions (and a catalog it caches) live on one plain redis server through
django-redis (the ``legacy`` alias), and users log in through the login form. The switch
deploys the site with its sessions on the sharded cache, ``OPTIONS["PREVIOUS_CACHE"] =
"legacy"``: every user is still logged in (their sessions are read through django-redis and
copied), the catalog is read without a miss; ``sentinel_reshard --from-previous-cache`` moves
what nobody read; the django-redis server is then empty, every key on its shard, and the site
deployed without ``PREVIOUS_CACHE`` still has every user logged in.
"""

from __future__ import annotations

import time
from typing import Any

from example_project.demo_tools import (
    DemoFailure,
    ProgressStream,
    command,
    logged_in_users,
)

USERS = 20
CATALOG = 400  # keys the site cached on the django-redis server
RATE = 500  # keys/s for the migration: slow enough to show its progress


def adoption(demo: Any) -> None:
    """The step, on the running demo (its output, server, browsers and commands)."""
    from django.conf import settings
    from django.core.cache import caches
    from django.test.utils import override_settings

    from example_project.views import SESSION_KEY_PREFIX
    from sentinel_cache.testing import LocalSentinelCluster

    out = demo.out
    out.step("Move a site from a django-redis server with users logged in, none logged out")
    try:
        import django_redis  # noqa: F401
    except ImportError:
        raise DemoFailure(
            "this step needs django-redis (a dev dependency): pip install django-redis"
        ) from None
    old = LocalSentinelCluster(shards=1, replicas=0, sentinels=1).start()
    server = old.node_client(old.master_address(old.master_names[0]), db=0)
    overrides: list[Any] = []
    try:
        host, port = old.master_address(old.master_names[0])
        legacy = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{host}:{port}/0",
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
            "KEY_PREFIX": "shop",
        }
        site = dict(settings.CACHES)
        out.say(
            f"before: the site's sessions and catalog on django-redis at {host}:{port} (a plain redis)"
        )
        overrides.append(
            override_settings(CACHES={**site, "legacy": legacy}, SESSION_CACHE_ALIAS="legacy")
        )
        overrides[-1].enable()
        users = logged_in_users(demo.browser.base, "shopper", USERS)
        catalog = {f"catalog:{n}": {"item": n, "price": n * 3 + 0.99} for n in range(CATALOG)}
        caches["legacy"].set_many(catalog, timeout=3600)
        out.say(
            f"{USERS} users logged in through the login form, {CATALOG} catalog entries cached: "
            f"{server.dbsize()} keys on the django-redis server"
        )

        adopting = {
            **site["default"],
            "OPTIONS": {**site["default"]["OPTIONS"], "PREVIOUS_CACHE": "legacy"},
        }
        out.say(
            "deploy: the sessions on the sharded cache, OPTIONS['PREVIOUS_CACHE'] = 'legacy' "
            "(the django-redis entry left as it was)"
        )
        overrides.pop().disable()
        overrides.append(
            override_settings(
                CACHES={**site, "default": adopting, "legacy": legacy},
                SESSION_CACHE_ALIAS="default",
            )
        )
        overrides[-1].enable()
        cache = caches["default"]
        logged_in = _logged_in(users)
        half = list(catalog)[: CATALOG // 2]
        misses = sum(1 for key in half if cache.get(key) != catalog[key])
        out.say(
            f"after the switch: {logged_in} of {USERS} users still logged in; {len(half)} catalog "
            f"reads, {misses} misses; {server.dbsize()} keys left on the django-redis server"
        )
        if logged_in != USERS or misses:
            raise DemoFailure(
                f"{USERS - logged_in} users logged out, {misses} misses after the switch"
            )

        progress = ProgressStream(out)
        out.say(f"sentinel_reshard --cache default --from-previous-cache --rate {RATE}:")
        code, text, _ = command(
            "sentinel_reshard",
            "--cache",
            "default",
            "--from-previous-cache",
            "--rate",
            str(RATE),
            stderr=progress,
        )
        out.block(text)
        if code != 0:
            raise DemoFailure(f"sentinel_reshard --from-previous-cache exited {code}")
        left = server.dbsize()
        core = cache.core
        keys = [cache.make_key(key) for key in catalog] + [
            cache.make_key(SESSION_KEY_PREFIX + str(browser.cookie("sessionid")))
            for _, browser in users
        ]
        placed = sum(
            1
            for key in keys
            if [s for s in core.shards if s.client.exists(key)] == [core.shard_for(key)]
        )
        wrong = sum(1 for key, value in catalog.items() if cache.get(key) != value)
        out.say(
            f"{left} keys left on the django-redis server; {placed} of {len(keys)} keys on their "
            f"shard; {wrong} catalog entries wrong"
        )
        if left or placed != len(keys) or wrong:
            raise DemoFailure(
                f"after the migration: {left} keys left, {len(keys) - placed} misplaced, {wrong} wrong"
            )

        overrides.pop().disable()
        time.sleep(0.2)
        still = _logged_in(users)
        out.say(f"deployed without PREVIOUS_CACHE: {still} of {USERS} users logged in")
        if still != USERS:
            raise DemoFailure(f"{USERS - still} users logged out once PREVIOUS_CACHE was removed")
    finally:
        while overrides:
            overrides.pop().disable()
        server.close()
        old.stop()


def _logged_in(users: list[tuple[str, Any]]) -> int:
    """How many users ``/api/me/`` (real HTTP, each user's own cookies) says are logged in."""
    seen = 0
    for name, browser in users:
        me = browser.json("/api/me/")
        seen += bool(me["authenticated"] and me["username"] == name)
    return seen
