"""The example project: ``make demo`` passes end to end, and the Flask app works on a topology.

The demo runs in a subprocess: it configures Django for the example project, which a pytest
process that may have configured Django for other tests cannot do.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from example_project import topology
from sentinel_cache.testing import LocalSentinelCluster

ROOT = Path(__file__).resolve().parent.parent
DEMO_TIMEOUT = 120  # seconds; the demo takes about 20-35 (longer on a busy machine)
FLASK_DB = 14  # a database of its own on the shared session topology


@pytest.mark.server
def test_demo_passes_with_no_failed_request() -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "example_project.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "DEMO PASSED" in result.stdout, output
    assert re.search(r"RESULT: 0 failed requests, 0 lost writes", result.stdout), output
    assert "session survived: yes" in result.stdout, output
    assert "every master holds exactly the keys the ring placed on it" in result.stdout, output
    # The near cache: hits served locally, and another writer's change seen by the next reads.
    assert re.search(r"200 requests to /api/flag/: \d+ reads served from this process", output), (
        output
    )
    assert "the cache read 50 " in result.stdout, output
    # Online resharding: an appended master, migrated under traffic, nobody logged out.
    assert "RESHARD RESULT: 0 failed requests, 0 logged out, 0 keys off their owner" in output
    assert re.search(r"shard 2/2 shard1: scanned .* \(done\)", output), output
    assert re.search(r"run again: moved 0 of [\d,]+ keys scanned", output), output
    assert elapsed < DEMO_TIMEOUT


def test_topology_from_the_environment() -> None:
    assert topology.from_env(
        {"SENTINEL_CACHE_SENTINELS": "h1:26379, h2:26379", "SENTINEL_CACHE_MASTERS": "a,b"}
    ) == (["h1:26379", "h2:26379"], {"MASTERS": ["a", "b"]})
    url = "sentinel://h1:26379,h2:26379/a,b?db=2"
    assert topology.from_env(
        {"SENTINEL_CACHE_URL": url, "SENTINEL_CACHE_SENTINEL_PASSWORD": "s"}
    ) == (url, {"SENTINEL_PASSWORD": "s"})
    with pytest.raises(topology.TopologyNotConfigured, match="SENTINEL_CACHE_SENTINELS"):
        topology.from_env({"SENTINEL_CACHE_MASTERS": "a"})
    env: dict[str, str] = {"SENTINEL_CACHE_URL": url}
    topology.export(["h:1"], ["a"], env)
    assert env == {"SENTINEL_CACHE_SENTINELS": "h:1", "SENTINEL_CACHE_MASTERS": "a"}
    # During a resharding (the demo's "deployments"): the masters before the change beside.
    topology.export(["h:1"], ["a", "b"], env, previous_masters=["a"])
    assert topology.from_env(env) == (["h:1"], {"MASTERS": ["a", "b"], "PREVIOUS_MASTERS": ["a"]})
    topology.export(["h:1"], ["a", "b"], env)
    assert "SENTINEL_CACHE_PREVIOUS_MASTERS" not in env


def test_flask_config_from_the_environment() -> None:
    from example_project.flask_app import cache_config

    config = cache_config(
        {
            "SENTINEL_CACHE_SENTINELS": "h1:26379,h2:26379",
            "SENTINEL_CACHE_MASTERS": "a,b",
            "SENTINEL_CACHE_PASSWORD": "p",
        }
    )
    assert config["CACHE_TYPE"] == "sentinel_cache.flask.ShardedSentinelCache"
    assert config["CACHE_REDIS_SENTINELS"] == ["h1:26379", "h2:26379"]
    assert config["CACHE_REDIS_SENTINEL_MASTERS"] == ["a", "b"]
    assert config["CACHE_REDIS_PASSWORD"] == "p"
    resharding = cache_config(
        {
            "SENTINEL_CACHE_SENTINELS": "h1:26379",
            "SENTINEL_CACHE_MASTERS": "a,b",
            "SENTINEL_CACHE_PREVIOUS_MASTERS": "a",
        }
    )
    assert resharding["CACHE_OPTIONS"]["PREVIOUS_MASTERS"] == ["a"]
    url_config = cache_config({"SENTINEL_CACHE_URL": "sentinel://h1:26379/a,b"})
    assert url_config["CACHE_REDIS_URL"] == "sentinel://h1:26379/a,b"
    assert "CACHE_REDIS_SENTINELS" not in url_config


@pytest.fixture
def flask_app(cluster: LocalSentinelCluster) -> Iterator[Any]:
    from example_project.flask_app import backend, cache_config, create_app

    config = cache_config(
        {
            "SENTINEL_CACHE_SENTINELS": ",".join(cluster.config()["sentinels"]),
            "SENTINEL_CACHE_MASTERS": ",".join(cluster.master_names),
        }
    )
    config["CACHE_REDIS_DB"] = FLASK_DB
    config["CACHE_KEY_PREFIX"] = f"example-test-{os.getpid()}-{time.monotonic_ns()}:"
    app = create_app(config)
    yield app
    with app.app_context():
        store = backend()
        store.clear()
        store.core.close()  # this test's own core (its own DB): nobody else uses it


def test_flask_app_smoke(flask_app: Any, cluster: LocalSentinelCluster) -> None:
    client = flask_app.test_client()

    index = client.get("/").get_json()
    assert index["masters"] == cluster.master_names

    first = client.get("/report").get_json()
    second = client.get("/report").get_json()
    assert first == second, "@cache.cached did not serve the second request"

    started = time.perf_counter()
    square = client.get("/square/9").get_json()
    cold = time.perf_counter() - started
    started = time.perf_counter()
    again = client.get("/square/9").get_json()
    warm = time.perf_counter() - started
    assert square == again and square["square"] == 81
    assert warm < cold, "@cache.memoize did not answer from the cache"

    shards = set()
    for n in range(40):
        response = client.get(f"/visit/{n}")
        assert response.status_code == 200, response.get_data(as_text=True)
        shards.add(response.get_json()["shard"])
    assert shards == {0, 1}

    status = client.get("/shards").get_json()
    assert [s["address"] for s in status["shards"]] == [
        "{}:{}".format(*cluster.master_address(name)) for name in cluster.master_names
    ]

    result = flask_app.test_cli_runner().invoke(args=["sentinel-status", "--json"])
    assert result.exit_code == 0, result.output

    health = client.get("/health/cache")
    assert health.status_code == 200 and health.get_json()["ready"] is True, health.get_json()
    scraped = client.get("/metrics").get_data(as_text=True)
    counts = [line for line in scraped.splitlines() if "command_duration_seconds_count{" in line]
    for name in cluster.master_names:  # the calls above were counted, per shard
        assert any(f'shard="{name}"' in line for line in counts), counts


@pytest.mark.server
def test_django_settings_pass_the_system_checks(
    cluster: LocalSentinelCluster, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "EXAMPLE_DATABASE": str(tmp_path / "example.sqlite3"),
        "SENTINEL_CACHE_SENTINELS": ",".join(cluster.config()["sentinels"]),
        "SENTINEL_CACHE_MASTERS": ",".join(cluster.master_names),
    }
    env.pop("SENTINEL_CACHE_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-m", "example_project.manage", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout

    env.pop("SENTINEL_CACHE_SENTINELS")
    result = subprocess.run(
        [sys.executable, "-m", "example_project.manage", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode != 0
    assert "SENTINEL_CACHE_SENTINELS" in result.stderr
