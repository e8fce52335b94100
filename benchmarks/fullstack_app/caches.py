"""The ``CACHES`` entry of each full-stack contender, and where each one runs.

No Django import here: the harness (``benchmarks.fullstack``) reads the contenders from this
module in its own process, and the app's settings build the entry from the environment the
harness gives each server: ``FULLSTACK_CONTENDER`` (an id below), ``FULLSTACK_API`` (``asgi`` or
``wsgi``), ``FULLSTACK_SENTINELS`` (``h:p,h:p``), ``FULLSTACK_MASTERS`` (``a,b,c,d``) and
``FULLSTACK_REDIS`` (``h:p``: the plain server, the first master of that topology).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TIMEOUT = 3600  # every key outlives the run: a miss or an incr of a missing key is a bug


@dataclass(frozen=True)
class FullstackContender:
    """One cache as the app uses it: an id, a label, the PyPI package the benchmark installs
    for it (None: already in the project's environment) and whether it needs Python >= 3.12
    (then it runs from the benchmark's own 3.12 virtualenv)."""

    id: str
    label: str
    package: str | None
    py312: bool
    note: str
    distribution: str = ""  # whose version the report gives (default: ``package``)
    #: A yardstick, not a peer: in the tables, but in no "every contender" target.
    reference: bool = False

    @property
    def reported(self) -> str:
        return self.distribution or self.package or ""


CONTENDERS: tuple[FullstackContender, ...] = (
    FullstackContender(
        "ours_1", "sentinel_cache, 1 shard", None, False,
        "ShardedSentinelCache, MASTERS = the topology's first master (the plain server)",
        "sentinel-cache",
    ),
    FullstackContender(
        "ours_4", "sentinel_cache, 4 shards", None, False,
        "ShardedSentinelCache over the topology's 4 masters", "sentinel-cache",
    ),
    FullstackContender(
        "django_vcache", "django-vcache", "django-vcache", True,
        "django_vcache.backend.ValkeyCache (Rust driver, one multiplexed connection)",
    ),
    FullstackContender(
        "django_cachex", "django-cachex", "django-cachex", True,
        "django_cachex.cache.RedisCache (redis-py)",
    ),
    FullstackContender(
        "django_valkey", "django-valkey", "django-valkey", True,
        "AsyncValkeyCache under ASGI, ValkeyCache under WSGI",
    ),
    FullstackContender(
        "dr_default", "django-redis", None, False,
        "django_redis.cache.RedisCache, DefaultClient (its async API is Django's sync_to_async)",
        "django-redis",
    ),
    FullstackContender(
        "django_redis_cache", "Django RedisCache", None, False,
        "django.core.cache.backends.redis.RedisCache (async: sync_to_async)", "Django",
    ),
    FullstackContender(
        "floor_1", "floor (pure Python, no rules)", None, False,
        "benchmarks.fullstack_app.floor_backend.FloorCache: Django's BaseCache over "
        "benchmarks/floor.py (a blocking socket per thread, hiredis, pickle; no Sentinel, no "
        "failover rule): a yardstick for ours, in no target",
        "sentinel-cache", reference=True,
    ),
)  # fmt: skip
BY_ID = {c.id: c for c in CONTENDERS}


def cache_entry(
    cid: str, api: str, *, sentinels: Sequence[str], masters: Sequence[str], redis: str
) -> dict[str, Any]:
    """The ``CACHES["default"]`` of contender ``cid`` under ``api`` (``asgi`` or ``wsgi``)."""
    if api not in ("asgi", "wsgi"):
        raise ValueError(f"FULLSTACK_API must be 'asgi' or 'wsgi', not {api!r}")
    url = f"redis://{redis}/0"
    entry: dict[str, Any]
    if cid in ("ours_1", "ours_4"):
        wanted = 1 if cid == "ours_1" else 4
        if len(masters) < wanted:
            raise ValueError(f"{cid} needs {wanted} masters, FULLSTACK_MASTERS has {len(masters)}")
        entry = {
            "BACKEND": "sentinel_cache.django.ShardedSentinelCache",
            "LOCATION": list(sentinels),
            "OPTIONS": {"MASTERS": list(masters[:wanted])},
        }
    elif cid == "django_vcache":
        entry = {"BACKEND": "django_vcache.backend.ValkeyCache", "LOCATION": url}
    elif cid == "django_cachex":
        entry = {"BACKEND": "django_cachex.cache.RedisCache", "LOCATION": url}
    elif cid == "django_valkey":
        backend = (
            "django_valkey.async_cache.cache.AsyncValkeyCache"
            if api == "asgi"
            else "django_valkey.cache.ValkeyCache"
        )
        entry = {"BACKEND": backend, "LOCATION": f"valkey://{redis}/0"}
    elif cid == "dr_default":
        entry = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    elif cid == "floor_1":
        entry = {"BACKEND": "benchmarks.fullstack_app.floor_backend.FloorCache", "LOCATION": redis}
    elif cid == "django_redis_cache":
        entry = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url}
    else:
        raise ValueError(f"FULLSTACK_CONTENDER {cid!r} is not one of {sorted(BY_ID)}")
    return {**entry, "TIMEOUT": TIMEOUT, "KEY_PREFIX": f"fs-{cid}"}


def from_environment(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The entry the environment names (what the app's settings call)."""
    try:
        cid = environ["FULLSTACK_CONTENDER"]
    except KeyError:
        raise ValueError(
            "FULLSTACK_CONTENDER is not set: the harness names the contender"
        ) from None
    return cache_entry(
        cid,
        environ.get("FULLSTACK_API", "asgi"),
        sentinels=[s for s in environ.get("FULLSTACK_SENTINELS", "").split(",") if s],
        masters=[m for m in environ.get("FULLSTACK_MASTERS", "").split(",") if m],
        redis=environ.get("FULLSTACK_REDIS", "127.0.0.1:6379"),
    )
