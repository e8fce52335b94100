"""``flask sentinel-status`` through Flask's CLI test runner: text, --json and exit codes."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import pytest
from click.testing import CliRunner
from flask import Flask
from flask.cli import FlaskGroup
from flask_caching import Cache
from flask_support import MakeApp, build_app, opened, settings_for

from sentinel_cache.flask import CACHE_TYPE, init_app, sentinel_status_command
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]


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
        # A readiness probe: the cache serves; the lost sentinel is a warning.
        probe = app.test_cli_runner().invoke(args=["sentinel-status", "--fail-on", "down"])
        assert probe.exit_code == 0, probe.output
        assert probe.output.startswith("DEGRADED (exit 0: fail on down only")
        assert "warnings (redundancy reduced):" in probe.output and dead in probe.output
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
        assert "not monitored: no sentinel monitors master 'not-monitored'" in result.output
        assert "no sentinel reachable" not in result.output
        probe = app.test_cli_runner().invoke(args=["sentinel-status", "--fail-on", "down"])
        assert probe.exit_code == 2  # a shard that cannot serve fails every policy
        data = app.test_cli_runner().invoke(args=["sentinel-status", "--json"])
        shard = json.loads(data.output)["shards"][-1]
        assert shard["name"] == "not-monitored" and shard["problem"] == "not_monitored"
    finally:
        backend.core.close()


@pytest.mark.failover
def test_refused_sentinel_password_is_auth_refused(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=1, sentinel_requirepass="right-pw")
    app, _, backend = build_app(settings_for(cluster, CACHE_REDIS_SENTINEL_PASSWORD="wrong-pw"))
    try:
        result = app.test_cli_runner().invoke(args=["sentinel-status"])
        assert result.exit_code == 2, result.output
        assert "AUTH REFUSED" in result.output
        assert "authentication refused" in result.output
        assert "unreachable" not in result.output.lower()
        data = app.test_cli_runner().invoke(args=["sentinel-status", "--json"])
        report = json.loads(data.output)
        assert [s["state"] for s in report["sentinels"]] == ["auth_refused"]
        assert report["shards"][0]["problem"] == "sentinels_auth_refused"
    finally:
        backend.core.close()


def test_configuration_error_exits_3() -> None:
    """Settings that do not parse make the app fail to load: when the command is found before
    the app is loaded (a plugin command, as FlaskGroup looks plugins up), it says so, exit 3."""

    def broken_app() -> Flask:
        app = Flask("broken")
        Cache(app, config={"CACHE_TYPE": CACHE_TYPE, "CACHE_REDIS_SENTINELS": "127.0.0.1:1"})
        return app

    group = FlaskGroup(create_app=broken_app, load_dotenv=False)
    group.add_command(sentinel_status_command)
    result = CliRunner().invoke(group, ["sentinel-status"])
    assert result.exit_code == 3, result.output
    assert "Error: CACHE_REDIS_SENTINEL_MASTERS" in result.output


def test_usage_errors_exit_3(make_app: MakeApp) -> None:
    app, _, _ = make_app()
    runner = app.test_cli_runner()
    for args in (["--fail-on", "sometimes"], ["--timeout", "0"]):
        result = runner.invoke(args=["sentinel-status", *args])
        assert result.exit_code == 3, (args, result.output)
        assert "Error:" in result.output


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
    assert result.exit_code == 3  # a configuration error, not "down"
    assert "no cache of type sentinel_cache.flask.ShardedSentinelCache" in result.output


def test_a_data_node_is_not_a_sentinel_and_an_idle_pool_says_not_started(
    cluster: LocalSentinelCluster,
) -> None:
    """Issue 38: the words of ``manage.py sentinel_status`` (tests/django_ops/test_ops_verdicts.py):
    a data node in the sentinel list is "NOT A SENTINEL", with no ACL advice; a process that has
    run no pool says "not started" in the listener and last-switch columns, as Django's does."""
    node = "{}:{}".format(*cluster.master_address(cluster.master_names[0]))
    settings = settings_for(cluster, CACHE_REDIS_SENTINELS=[*cluster.config()["sentinels"], node])
    app, _, backend = build_app(settings)
    try:
        assert not backend.core.started
        result = app.test_cli_runner().invoke(args=["sentinel-status"])
        assert result.exit_code == 1, result.output
        lines = result.output.splitlines()
        row = next(line for line in lines if line.startswith(node))
        assert "NOT A SENTINEL" in row and "not started" in row
        assert (
            f"sentinel {node} is not a sentinel: {node} (ROLE master): it answers as a Redis "
            in (result.output)
        )
        shard_rows = [line for line in lines if line.startswith(("0 ", "1 "))]
        assert len(shard_rows) == 2 and all("not started" in r for r in shard_rows)
        assert "+sentinel|master" not in result.output
        report = json.loads(app.test_cli_runner().invoke(args=["sentinel-status", "--json"]).output)
        (entry,) = [s for s in report["sentinels"] if s["address"] == node]
        assert entry["state"] == "not_sentinel" and entry["role"] == "master"
    finally:
        backend.core.close()
