"""The Flask health blueprint: the same JSON and status codes as the Django view."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from flask_caching import Cache
from health_support import flask_settings

from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.flask import ShardedSentinelCache
from sentinel_cache.flask.health import health_blueprint, init_health
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]


@pytest.fixture
def opened() -> Iterator[list[ShardedSentinelPool]]:
    cores: list[ShardedSentinelPool] = []
    yield cores
    for core in cores:
        core.close()


def make_app(
    cluster: LocalSentinelCluster, opened: list[ShardedSentinelPool], **settings: Any
) -> tuple[Flask, Cache]:
    app = Flask("health_tests")
    app.testing = True
    app.config.update(flask_settings(cluster, **settings))
    cache = Cache(app)
    backend = app.extensions["cache"][cache]
    assert isinstance(backend, ShardedSentinelCache)
    opened.append(backend.core)
    return app, cache


def started(core: ShardedSentinelPool) -> None:
    core.discover()
    deadline = time.monotonic() + 5
    while not ((states := core.listener_states()) and all(states.values())):
        assert time.monotonic() < deadline, states
        time.sleep(0.01)


def get(app: Flask, path: str) -> tuple[int, dict[str, Any], float]:
    began = time.monotonic()
    response = app.test_client().get(path)
    elapsed = time.monotonic() - began
    assert response.mimetype == "application/json", response.data
    return response.status_code, response.get_json(), elapsed


def hostport(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def test_blueprint_reports_every_shard(
    cluster: LocalSentinelCluster, opened: list[ShardedSentinelPool]
) -> None:
    app, cache = make_app(cluster, opened, CACHE_KEY_PREFIX="hf:")
    init_health(app)
    started(app.extensions["cache"][cache].core)
    code, body, _ = get(app, "/health/cache")
    assert code == 200, body
    assert (body["status"], body["ready"], body["fail_on"]) == ("ok", True, "down")
    report = body["caches"]["default"]
    assert report["key_prefix"] == "hf:"
    assert [s["name"] for s in report["shards"]] == cluster.master_names
    for shard in report["shards"]:
        assert shard["ok"] and shard["address"] == hostport(cluster.master_address(shard["name"]))
    client = app.test_client()
    assert client.head("/health/cache").status_code == 200
    assert "no-store" in client.get("/health/cache").headers["Cache-Control"]
    assert client.post("/health/cache").status_code == 405
    code, body, _ = get(app, "/health/cache?fail_on=sometimes")
    assert code == 400 and "fail_on" in body["error"]


def test_several_caches_and_a_chosen_one(
    cluster: LocalSentinelCluster, opened: list[ShardedSentinelPool]
) -> None:
    app, first = make_app(cluster, opened, CACHE_KEY_PREFIX="a:")
    second = Cache(app, config={**flask_settings(cluster), "CACHE_KEY_PREFIX": "b:"})
    init_health(app)
    app.register_blueprint(
        health_blueprint("/health/second", name="second_health", caches={"second": second})
    )
    code, body, _ = get(app, "/health/cache")
    assert code == 200 and set(body["caches"]) == {"cache0", "cache1"}
    assert [body["caches"][n]["key_prefix"] for n in ("cache0", "cache1")] == ["a:", "b:"]
    code, body, _ = get(app, "/health/second")
    assert code == 200 and set(body["caches"]) == {"second"}
    with pytest.raises(ValueError, match="fail_on"):
        health_blueprint(fail_on="often")
    assert first is not second


def test_an_app_without_a_sentinel_cache_is_down() -> None:
    app = Flask("no_cache")
    init_health(app)
    code, body, _ = get(app, "/health/cache")
    assert code == 503 and body["problems"] == ["no sentinel_cache cache is configured"]


@pytest.mark.failover
def test_killed_master_is_named_then_healthy_again_after_the_failover(
    make_cluster: ClusterFactory, opened: list[ShardedSentinelPool]
) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=3)
    app, cache = make_app(cluster, opened)
    init_health(app, "/healthz")
    started(app.extensions["cache"][cache].core)
    assert get(app, "/healthz")[0] == 200

    old = cluster.kill_master("shard0")
    code, body, elapsed = get(app, "/healthz")
    assert elapsed < 0.5 + 0.5, elapsed
    assert code == 503 and body["status"] == "down", body
    assert [s["ok"] for s in body["caches"]["default"]["shards"]] == [False, True]
    assert body["problems"][0].startswith(f"default: shard 0 (shard0): master {hostport(old)}: ")

    deadline = time.monotonic() + 30
    while (result := get(app, "/healthz"))[0] != 200:
        assert time.monotonic() < deadline, result[1]["problems"]
        time.sleep(0.1)
    code, body, _ = result
    new = hostport(cluster.wait_for_master_change("shard0", old))  # every sentinel agrees
    assert body["caches"]["default"]["shards"][0]["address"] == new != hostport(old)
    assert body["status"] == "degraded" and body["ready"], body
    assert get(app, "/healthz?fail_on=degraded")[0] == 503
