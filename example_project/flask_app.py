"""The Flask side of the example: Flask-Caching on the sharded Sentinel cache.

Run it with the topology in the environment (see :mod:`example_project.topology`)::

    flask --app example_project.flask_app run
    flask --app example_project.flask_app sentinel-status
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from flask import Flask, current_app, jsonify
from flask_caching import Cache
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from example_project.topology import from_env
from sentinel_cache.flask.health import init_health

cache = Cache()


def cache_config(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Flask-Caching settings for the topology in the environment."""
    location, options = from_env(environ)
    config: dict[str, Any] = {
        "CACHE_TYPE": "sentinel_cache.flask.ShardedSentinelCache",
        "CACHE_KEY_PREFIX": "example-flask:",
        "CACHE_DEFAULT_TIMEOUT": 300,
        "CACHE_OPTIONS": {"METRICS": True},  # served at /metrics (the [prometheus] extra)
    }
    if isinstance(location, str):
        config["CACHE_REDIS_URL"] = location
    else:
        config["CACHE_REDIS_SENTINELS"] = location
    if "MASTERS" in options:
        config["CACHE_REDIS_SENTINEL_MASTERS"] = options["MASTERS"]
    if "PASSWORD" in options:
        config["CACHE_REDIS_PASSWORD"] = options["PASSWORD"]
    if "SENTINEL_PASSWORD" in options:
        config["CACHE_REDIS_SENTINEL_PASSWORD"] = options["SENTINEL_PASSWORD"]
    if "PREVIOUS_MASTERS" in options:  # during a resharding (docs/resharding.md)
        config["CACHE_OPTIONS"]["PREVIOUS_MASTERS"] = options["PREVIOUS_MASTERS"]
    return config


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@cache.memoize(timeout=60)
def slow_square(n: int) -> dict[str, Any]:
    """Memoized per argument: the second call with the same ``n`` does not sleep."""
    time.sleep(0.1)
    return {"n": n, "square": n * n, "computed_at": _now()}


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The app; ``config`` overrides the settings read from the environment."""
    app = Flask(__name__)
    app.config.update(cache_config() if config is None else config)
    cache.init_app(app)
    init_health(app)  # GET /health/cache: every shard written and read, 200 or 503

    @app.get("/metrics")
    def metrics() -> Any:
        return generate_latest(), 200, {"Content-Type": CONTENT_TYPE_LATEST}

    @app.get("/")
    def index() -> Any:
        return jsonify(
            pages=["/report", "/square/<n>", "/visit/<n>", "/shards"],
            masters=backend().core.config.masters,
        )

    @app.get("/report")
    @cache.cached(timeout=30)
    def report() -> Any:
        started = time.perf_counter()
        time.sleep(0.2)  # the expensive part
        return jsonify(generated_at=_now(), took_ms=round((time.perf_counter() - started) * 1e3))

    @app.get("/square/<int:n>")
    def square(n: int) -> Any:
        return jsonify(slow_square(n))

    @app.get("/visit/<int:n>")
    def visit(n: int) -> Any:
        key = f"visit:{n}"
        cache.set(key, {"n": n}, timeout=600)
        value = cache.get(key)
        ok = value == {"n": n}
        return jsonify(key=key, shard=shard_of(key), ok=ok), 200 if ok else 500

    @app.get("/shards")
    def shards() -> Any:
        pool = backend().core
        if not pool.status()["started"]:
            cache.get("shard-map:probe")  # the first use discovers every shard
        return jsonify(pool.status())

    return app


def backend() -> Any:
    """The :class:`sentinel_cache.flask.ShardedSentinelCache` behind ``cache`` for this app."""
    return cache.cache


def shard_of(key: str) -> int:
    """The shard holding ``key`` (hashed with the key prefix, as stored)."""
    prefix = current_app.config.get("CACHE_KEY_PREFIX") or ""
    return int(backend().core.shard_index(prefix + key))


if __name__ == "__main__":  # pragma: no cover - `python -m example_project.flask_app`
    create_app().run(host="127.0.0.1", port=5000)
