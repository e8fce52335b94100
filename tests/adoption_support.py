"""Warm adoption's scenario (issue 25), shared by the tests that switch a Django site from
Django's ``RedisCache`` (tests/django) and from django-redis (tests/django_redis_suite): the
site's keys and logged-in users written through the old backend on a plain redis server, then
the site switched to our cache with ``PREVIOUS_CACHE``, read, and emptied by
``sentinel_reshard --from-previous-cache``. Imports no django-redis itself."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.contrib.sessions.backends.cache import KEY_PREFIX as SESSION_PREFIX
from django.contrib.sessions.backends.cache import SessionStore
from django.core.cache import caches
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from sentinel_cache.management.commands.sentinel_reshard import Command as Reshard
from sentinel_cache.testing import LocalSentinelCluster

OUR_DB = 5


def whoami(request: HttpRequest) -> HttpResponse:
    """The logged-in user's id as the session middleware loaded it (None: logged out)."""
    return JsonResponse({"user": request.session.get("_auth_user_id")})


urlpatterns = [path("whoami", whoami)]


def ours(cluster: LocalSentinelCluster, **params: Any) -> dict[str, Any]:
    config = cluster.config()
    options = {"MASTERS": config["masters"], "DB": OUR_DB, **params.pop("OPTIONS", {})}
    return {
        "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
        "LOCATION": config["sentinels"],
        "OPTIONS": options,
        **params,
    }


def old_url(old: LocalSentinelCluster, db: int = 0, name: str | None = None) -> str:
    host, port = old.master_address(name or old.master_names[0])
    return f"redis://{host}:{port}/{db}"


@contextmanager
def site(ours_entry: dict[str, Any], old_entry: dict[str, Any]) -> Iterator[None]:
    """Settings of a site with the cache session engine: "default" is ours adopting "old"."""
    entry = {**ours_entry, "OPTIONS": {**ours_entry["OPTIONS"], "PREVIOUS_CACHE": "old"}}
    with override_settings(
        CACHES={"default": entry, "old": old_entry},
        SESSION_ENGINE="django.contrib.sessions.backends.cache",
        SESSION_CACHE_ALIAS="default",
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware"],
        ROOT_URLCONF=__name__,
    ):
        try:
            yield
        finally:  # not clear(): its mark would stop the next test's copies for 10 s
            cache = caches["default"]
            for shard in cache.core.shards:
                if shard.address is None:  # a test killed it (a private topology, stopped after)
                    continue
                for key in shard.client.scan_iter(match=f"{cache.key_prefix}:*"):
                    shard.client.delete(key)
            for alias in ("default", "old"):
                caches[alias].close()


def values(n: int, tag: str) -> dict[str, Any]:
    """Keys of every kind a site stores: text, integers (counters), dicts, bytes, lists."""
    kinds = [
        lambda i: f"text {i} \u00e9",
        lambda i: i * 7,
        lambda i: {"id": i, "tags": ["a", "b"]},
        lambda i: bytes([i % 256]) * 5,
        lambda i: [i, str(i), None],
    ]
    return {f"{tag}:{i}": kinds[i % len(kinds)](i) for i in range(n)}


def log_in(n: int) -> dict[str, str]:
    """``n`` users logged in through the old cache: session key -> user id."""
    users = {}
    for i in range(n):
        session = SessionStore()
        session._cache = caches["old"]
        session["_auth_user_id"] = str(1000 + i)
        session.save()
        users[session.session_key] = str(1000 + i)  # type: ignore[index]
    return users


def logged_in(users: dict[str, str]) -> int:
    """How many of the users a request through the Django test client sees logged in."""
    client = Client()
    seen = 0
    for session_key, user in users.items():
        client.cookies["sessionid"] = session_key
        response = client.get("/whoami")
        assert response.status_code == 200
        seen += response.json()["user"] == user
    return seen


def old_keys(server: redis.Redis, prefix: str) -> list[bytes]:
    return list(server.scan_iter(match=f"{prefix}*", count=1000))


def on_their_shard(cache: Any, keys: list[str]) -> int:
    """How many of the keys are on the shard the ring gives them, and on no other."""
    found = 0
    for key in keys:
        made = cache.make_key(key)
        owner = cache.core.shard_for(made)
        held = [shard for shard in cache.core.shards if shard.client.exists(made)]
        found += held == [owner]
    return found


def migrate(*args: str) -> dict[str, Any]:
    """``manage.py sentinel_reshard --from-previous-cache --json``: its report."""
    out = io.StringIO()
    call_command(
        Reshard(), "--from-previous-cache", "--json", *args, stdout=out, stderr=io.StringIO()
    )
    return dict(json.loads(out.getvalue()))


def run_scenario(
    cluster: LocalSentinelCluster, old_servers: list[redis.Redis], old_entry: dict[str, Any]
) -> dict[str, Any]:
    """The issue's target; returns the figures (the caller asserts on them)."""
    prefix = f"site{uuid.uuid4().hex[:8]}"
    old_entry = {**old_entry, "KEY_PREFIX": prefix}
    with site(ours(cluster, KEY_PREFIX=prefix), old_entry):
        old = caches["old"]
        read, left = values(300, "read"), values(300, "left")
        old.set_many(dict(list(read.items())[:150]), timeout=600)
        old.set_many(dict(list(read.items())[150:]), timeout=None)
        old.set_many(left, timeout=600)
        users = log_in(200)
        per_server = [len(old_keys(server, prefix)) for server in old_servers]

        cache = caches["default"]  # the switch: the site now reads and writes ours
        misses = [key for key, value in read.items() if cache.get(key) != value]
        ttls = [cache.ttl(key) for key in read]
        users_in = logged_in(users)
        report = migrate("--batch", "50")
        again = migrate()
        every = {**read, **left}
        after = [key for key, value in every.items() if cache.get(key) != value]
        sessions = [SESSION_PREFIX + key for key in users]
        return {
            "old_keys_before": sum(per_server),
            "old_keys_per_server": per_server,
            "misses": len(misses),
            "ttl_kept": sum(1 for t in ttls[:150] if t is not None and 0 < t <= 600),
            "persistent": sum(1 for t in ttls[150:] if t is None),
            "logged_in": users_in,
            "users": len(users),
            "report": report,
            "second_run": again,
            "wrong_after": len(after),
            "on_their_shard": on_their_shard(cache, [*every, *sessions]),
            "keys": len(every) + len(sessions),
            "left_on_old": sum(len(old_keys(server, prefix)) for server in old_servers),
        }
