"""``flask sentinel-status`` through Flask's CLI test runner: text, --json and exit codes."""

from __future__ import annotations

import json
import socket

from flask import Flask
from flask_caching import Cache
from flask_support import MakeApp, build_app, opened, settings_for

from sentinel_cache.flask import init_app
from sentinel_cache.testing import LocalSentinelCluster


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_text_report_healthy(cluster: LocalSentinelCluster, make_app: MakeApp) -> None:
    app, _, backend = make_app(CACHE_KEY_PREFIX="cli:")
    backend.set("warm", 1)  # the report also works on an idle pool; this one has started
    result = app.test_cli_runner().invoke(args=["sentinel-status"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("HEALTHY (exit 0): 2 shards, 3 sentinels")
    for name in cluster.master_names:
        host, port = cluster.master_address(name)
        assert name in result.output
        assert f"{host}:{port}" in result.output
    backend.delete("warm")


def test_json_report(cluster: LocalSentinelCluster, make_app: MakeApp) -> None:
    app, _, _ = make_app()
    result = app.test_cli_runner().invoke(args=["sentinel-status", "--json", "--timeout", "2"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["state"] == "healthy"
    assert report["exit_code"] == 0
    assert report["timeout"] == 2.0
    assert [s["name"] for s in report["shards"]] == cluster.master_names
    assert [s["address"] for s in report["shards"]] == [
        "{}:{}".format(*cluster.master_address(n)) for n in cluster.master_names
    ]


def test_unreachable_sentinel_is_degraded_exit_1(cluster: LocalSentinelCluster) -> None:
    dead = f"127.0.0.1:{_closed_port()}"
    settings = settings_for(cluster, CACHE_REDIS_SENTINELS=[*cluster.config()["sentinels"], dead])
    app, _, backend = build_app(settings)
    try:
        result = app.test_cli_runner().invoke(args=["sentinel-status", "--json"])
        assert result.exit_code == 1, result.output
        report = json.loads(result.output)
        assert report["state"] == "degraded"
        assert any(dead in problem for problem in report["problems"])
        text = app.test_cli_runner().invoke(args=["sentinel-status"])
        assert text.exit_code == 1
        assert text.output.startswith("DEGRADED (exit 1)")
    finally:
        backend.core.close()


def test_unknown_master_is_down_exit_2(cluster: LocalSentinelCluster) -> None:
    settings = settings_for(
        cluster, CACHE_REDIS_SENTINEL_MASTERS=[*cluster.master_names, "not-monitored"]
    )
    app, _, backend = build_app(settings)
    try:
        result = app.test_cli_runner().invoke(args=["sentinel-status"])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("DOWN (exit 2)")
        assert "not-monitored" in result.output
    finally:
        backend.core.close()


def test_two_caches_on_two_cores(cluster: LocalSentinelCluster, make_app: MakeApp) -> None:
    """Caches sharing a core are reported once; distinct cores each get a report."""
    app, _, _ = make_app(CACHE_KEY_PREFIX="a:")
    Cache(app, config={**settings_for(cluster), "CACHE_KEY_PREFIX": "b:"})  # same core
    result = app.test_cli_runner().invoke(args=["sentinel-status", "--json"])
    assert result.exit_code == 0
    assert isinstance(json.loads(result.output), dict)
    other = Cache(app, config={**settings_for(cluster), "CACHE_REDIS_DB": 10})  # another core
    pool = app.extensions["cache"][other].core
    opened[id(pool)] = pool
    result = app.test_cli_runner().invoke(args=["sentinel-status", "--json"])
    reports = json.loads(result.output)
    assert isinstance(reports, list) and len(reports) == 2
    text = app.test_cli_runner().invoke(args=["sentinel-status"])
    assert text.output.count("HEALTHY (exit 0)") == 2
    assert "cache with prefix 'a:', 'b:'" in text.output


def test_app_without_our_cache() -> None:
    app = Flask("no_cache")
    init_app(app)
    result = app.test_cli_runner().invoke(args=["sentinel-status"])
    assert result.exit_code == 2
    assert "no cache of type sentinel_cache.flask.ShardedSentinelCache" in result.output
