"""``flask sentinel-reshard`` through Flask's CLI test runner: the dry run, the migration,
progress, JSON, several caches and exit codes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from durable_support import shortfalls
from flask import Flask
from flask_caching import Cache
from reshard_support import AFTER, BEFORE, KEYS, locations, moving, owner, place

from sentinel_cache.flask import CACHE_TYPE
from sentinel_cache.testing import LocalSentinelCluster

Apps = Any


@pytest.fixture
def make_app(topology: LocalSentinelCluster) -> Iterator[Apps]:
    """``make_app(masters, **options)``: a Flask app with our cache on the topology."""
    built: list[Any] = []

    def factory(masters: list[str], prefix: str = "", **options: Any) -> Flask:
        app = Flask("reshard_tests")
        app.config.update(
            CACHE_TYPE=CACHE_TYPE,
            CACHE_REDIS_SENTINELS=topology.config()["sentinels"],
            CACHE_REDIS_SENTINEL_MASTERS=masters,
            CACHE_KEY_PREFIX=prefix,
            CACHE_OPTIONS={"LISTENERS": False, **options},
        )
        cache = Cache(app)
        built.append(app.extensions["cache"][cache])
        return app

    yield factory
    for backend in built:
        backend.core.close()


def test_registered_by_init_app(make_app: Apps) -> None:
    app = make_app(BEFORE)
    assert {"sentinel-status", "sentinel-reshard"} <= set(app.cli.commands)


def test_dry_run_then_migration(topology: LocalSentinelCluster, make_app: Apps) -> None:
    place(topology)
    app = make_app(AFTER, PREVIOUS_MASTERS=BEFORE)
    runner = app.test_cli_runner()
    dry = runner.invoke(args=["sentinel-reshard", "--dry-run", "--json", "--sample", "5000"])
    assert dry.exit_code == 0, dry.output
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] is True and plan["sample"] == 5000
    assert {(f["from"], f["to"]): f["keys"] for f in plan["flows"]} == moving()
    assert locations(topology) == {k: [owner(k, BEFORE)] for k in KEYS}  # nothing moved

    result = runner.invoke(args=["sentinel-reshard", "--json", "--rate", "50000"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # no progress with --json
    report = json.loads(result.stdout)
    assert report["complete"] is True and report["rate_limit"] == 50000
    assert {(p["from"], p["to"]): p["moved"] for p in report["pairs"]} == moving()
    assert locations(topology) == {k: [owner(k, AFTER)] for k in KEYS}

    again = runner.invoke(args=["sentinel-reshard"])
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("Migration done in ") and "0 keys moved" in again.stdout
    assert again.stderr.splitlines()[-1].endswith("(done)")


def test_several_caches_and_the_cache_option(
    topology: LocalSentinelCluster, make_app: Apps
) -> None:
    place(topology)
    app = make_app(AFTER, PREVIOUS_MASTERS=BEFORE)
    app.config.update(CACHE_KEY_PREFIX="other:", CACHE_OPTIONS={"LISTENERS": False, "DB": 1})
    extra = Cache(app)  # a second cache, on another database without PREVIOUS_MASTERS
    try:
        runner = app.test_cli_runner()
        chosen = runner.invoke(args=["sentinel-reshard", "--dry-run", "--cache", ""])
        assert chosen.exit_code == 0, chosen.output
        assert chosen.stdout.startswith("Dry run: PREVIOUS_MASTERS [shard0, shard1]")
        plain = runner.invoke(args=["sentinel-reshard", "--cache", "other:"])
        assert plain.exit_code == 3 and "PREVIOUS_MASTERS" in plain.stderr
        missing = runner.invoke(args=["sentinel-reshard", "--cache", "nope:"])
        assert missing.exit_code == 3 and "no cache of type" in missing.stderr
    finally:
        app.extensions["cache"][extra].core.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "0"], "Invalid value for '--rate'"),
        (["--sample", "10"], "--sample needs --dry-run"),
        (["--batch", "0"], "Invalid value for '--batch'"),
    ],
)
def test_usage_errors_exit_3(make_app: Apps, args: list[str], message: str) -> None:
    app = make_app(AFTER, PREVIOUS_MASTERS=BEFORE)
    result = app.test_cli_runner().invoke(args=["sentinel-reshard", *args])
    assert result.exit_code == 3, result.output
    assert message in result.stderr


def test_without_previous_masters_exit_3(make_app: Apps) -> None:
    app = make_app(AFTER)
    result = app.test_cli_runner().invoke(args=["sentinel-reshard"])
    assert result.exit_code == 3
    assert "PREVIOUS_MASTERS" in result.stderr


def test_a_shard_given_up_exits_1(topology: LocalSentinelCluster, make_app: Apps) -> None:
    place(topology)
    app = make_app(BEFORE, PREVIOUS_MASTERS=[*BEFORE, "ghost"])
    result = app.test_cli_runner().invoke(args=["sentinel-reshard", "--json", "--retry-for", "0.2"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["complete"] is False and report["errors"][0].startswith("ghost: ")


def test_durable_replicas_applies_to_the_migration(
    topology: LocalSentinelCluster,
    make_app: Apps,
    caplog: pytest.LogCaptureFixture,
    every_log_line: None,
) -> None:
    """The cache's DURABLE_REPLICAS reaches the migration (no replicas here: every WAIT falls
    short, and is logged)."""
    place(topology)
    app = make_app(AFTER, PREVIOUS_MASTERS=BEFORE, DURABLE_REPLICAS=1, DURABLE_TIMEOUT_MS=20)
    caplog.set_level(logging.WARNING, logger="sentinel_cache")
    result = app.test_cli_runner().invoke(args=["sentinel-reshard", "--json"])
    assert result.exit_code == 0, result.output
    assert set(shortfalls(caplog, 20)) == {
        f"write to shard {name} acknowledged by 0 of 1 replicas within 20 ms" for name in AFTER
    }
    assert locations(topology) == {k: [owner(k, AFTER)] for k in KEYS}
