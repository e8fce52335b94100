"""A health endpoint for Flask: every shard of every sentinel_cache cache of the app can serve.

::

    from sentinel_cache.flask.health import init_health

    app = Flask(__name__)
    cache = Cache(app)  # CACHE_TYPE = "sentinel_cache.flask.ShardedSentinelCache"
    init_health(app)    # GET /health/cache

or register the blueprint yourself: ``app.register_blueprint(health_blueprint("/healthz/cache"))``.

The JSON and status codes are those of the Django view (:mod:`sentinel_cache.django.health`):
200 when every shard of every cache took a probe write and returned it (status ``"ok"``, or
``"degraded"`` when redundancy is reduced), 503 when one did not (``"down"``, the failing shards
named); ``?fail_on=degraded`` makes degraded a 503 too, ``?deep=1`` adds the sentinels' view.
Caches with equal connection settings share one core and are probed once, all at once, within
the budget (``timeout``: 0.5 s, or the pool's ``SOCKET_TIMEOUT`` if shorter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from flask_caching import Cache

from sentinel_cache.core.admin import health as core_health
from sentinel_cache.core.admin.states import HEALTH_FAIL_ON
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.flask.cache import ShardedSentinelCache
from sentinel_cache.flask.commands import sentinel_backends

__all__ = ["DEFAULT_URL", "health_blueprint", "init_health"]

DEFAULT_URL = "/health/cache"

CacheLike = Cache | ShardedSentinelCache


def _named_backends(
    app: Flask, caches: Mapping[str, CacheLike] | None
) -> dict[str, ShardedSentinelCache | str]:
    """The caches to check by name: those given, else every sentinel_cache cache of the app
    (``"default"`` when there is one, else ``"cache0"``, ``"cache1"``... in registration order)."""
    if caches is None:
        found = [b for b in sentinel_backends(app) if isinstance(b, ShardedSentinelCache)]
        if len(found) == 1:
            return {"default": found[0]}
        return {f"cache{i}": backend for i, backend in enumerate(found)}
    named: dict[str, ShardedSentinelCache | str] = {}
    extensions = getattr(app, "extensions", {}).get("cache", {})
    for name, cache in caches.items():
        backend = extensions.get(cache) if isinstance(cache, Cache) else cache
        named[name] = (
            backend
            if isinstance(backend, ShardedSentinelCache)
            else "not a sentinel_cache cache of this app"
        )
    return named


def health_blueprint(
    url: str = DEFAULT_URL,
    *,
    name: str = "sentinel_cache_health",
    timeout: float | None = None,
    fail_on: str = HEALTH_FAIL_ON,
    deep: bool = False,
    caches: Mapping[str, CacheLike] | None = None,
) -> Blueprint:
    """A blueprint serving the caches' health as JSON at ``url`` (GET and HEAD).

    ``timeout``: the probe's budget in seconds; ``fail_on``: ``"down"`` (503 only when a shard
    cannot serve: for readiness probes) or ``"degraded"`` (a query's ``?fail_on=`` overrides
    it); ``deep``: add the sentinels' view (a query's ``?deep=1`` asks for it too); ``caches``:
    names and caches (Flask-Caching ``Cache`` objects or backends) to check instead of all.
    """
    core_health.parse_fail_on(fail_on)  # ValueError at registration, not at the first probe
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds (got {timeout!r})")
    blueprint = Blueprint(name, __name__)

    @blueprint.route(url, methods=["GET", "HEAD"])
    def cache_health() -> Response:
        try:
            policy = core_health.parse_fail_on(request.args.get("fail_on"), fail_on)
        except ValueError as exc:
            return _no_store(jsonify({"error": str(exc)}), 400)
        wanted_deep = deep or core_health.parse_flag(request.args.get("deep"))
        app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        backends = _named_backends(app, caches)
        cores: list[tuple[str, ShardedSentinelPool | str]] = [
            (n, b if isinstance(b, str) else b.core) for n, b in backends.items()
        ]
        prefixes = {
            n: b.key_prefix
            for n, b in backends.items()
            if not isinstance(b, str) and isinstance(b.key_prefix, str)
        }
        reports = core_health.check_all(cores, timeout=timeout, deep=wanted_deep)
        code, body = core_health.summary(reports, fail_on=policy, key_prefixes=prefixes)
        return _no_store(jsonify(body), code)

    return blueprint


def _no_store(response: Response, code: int) -> Response:
    response.status_code = code
    response.headers["Cache-Control"] = "no-store, no-cache, must-revalidate, max-age=0"
    return response


def init_health(app: Flask, url: str = DEFAULT_URL, **options: Any) -> Blueprint:
    """Register :func:`health_blueprint` (same options) with ``app``; returns the blueprint."""
    blueprint = health_blueprint(url, **options)
    app.register_blueprint(blueprint)
    return blueprint
