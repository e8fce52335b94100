"""The Django health endpoints: ``health_view`` and the django-health-check check, through the
test client, on the shared topology and on private ones whose masters are killed or failed over."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client
from health_support import UseSettings, cache_entry
from minimal_django import LOCMEM

from sentinel_cache.core.config import Address
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]


def get(path: str) -> tuple[int, dict[str, Any], float]:
    began = time.monotonic()
    response = Client().get(path)
    elapsed = time.monotonic() - began
    assert response["Content-Type"] == "application/json", response.content
    return response.status_code, response.json(), elapsed


def wait_for_listeners(alias: str, timeout: float = 5.0) -> None:
    """The core of ``alias`` started and every failover listener subscribed."""
    core = caches[alias].core  # type: ignore[attr-defined]
    core.discover()
    deadline = time.monotonic() + timeout
    while not ((states := core.listener_states()) and all(states.values())):
        assert time.monotonic() < deadline, states
        time.sleep(0.01)


def hostport(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def test_view_reports_every_shard_of_every_alias(
    cluster: LocalSentinelCluster, use_settings: UseSettings
) -> None:
    entry = cache_entry(cluster)
    use_settings(
        CACHES={"default": LOCMEM, "sharded": entry, "sessions": {**entry, "KEY_PREFIX": "s"}}
    )
    wait_for_listeners("sharded")
    code, body, _ = get("/health/cache/")
    assert code == 200, body
    assert (body["status"], body["ready"], body["fail_on"]) == ("ok", True, "down")
    assert set(body["caches"]) == {"sharded", "sessions"}  # the locmem default is not ours
    report = body["caches"]["sharded"]
    assert report["key_prefix"] == entry["KEY_PREFIX"]
    assert [s["name"] for s in report["shards"]] == cluster.master_names
    for shard in report["shards"]:
        assert shard["ok"] and shard["address"] == hostport(cluster.master_address(shard["name"]))
    # Equal settings share one core: probed once, the same report for both aliases.
    assert body["caches"]["sessions"]["checked_at"] == report["checked_at"]

    code, body, _ = get("/health/cache/sharded/")
    assert code == 200 and set(body["caches"]) == {"sharded"}
    code, body, _ = get("/health/cache/?fail_on=sometimes")
    assert code == 400 and "fail_on" in body["error"]
    assert Client().post("/health/cache/").status_code == 405
    assert "no-cache" in Client().get("/health/cache/")["Cache-Control"]


def test_view_names_an_alias_that_cannot_be_built(
    cluster: LocalSentinelCluster, use_settings: UseSettings
) -> None:
    broken = cache_entry(cluster, OPTIONS={"SOCKET_TIMEOUT": "soon"})
    use_settings(CACHES={"default": LOCMEM, "sharded": cache_entry(cluster), "broken": broken})
    code, body, _ = get("/health/cache/")
    assert code == 503 and body["status"] == "down"
    assert body["caches"]["sharded"]["ready"] is True
    assert body["caches"]["broken"]["ready"] is False
    assert body["problems"][0].startswith("broken: the cache could not be built: ")
    assert "SOCKET_TIMEOUT" in body["problems"][0]


def test_no_sentinel_cache_configured_is_down(use_settings: UseSettings) -> None:
    use_settings(CACHES={"default": LOCMEM})
    code, body, _ = get("/health/cache/")
    assert code == 503 and body["problems"] == ["no sentinel_cache cache is configured"]


def test_health_check_plugin_on_a_healthy_topology(
    cluster: LocalSentinelCluster, use_settings: UseSettings
) -> None:
    use_settings(CACHES={"default": LOCMEM, "sharded": cache_entry(cluster)})
    wait_for_listeners("sharded")
    response = Client().get("/ht/?format=json")
    assert response.status_code == 200, response.content
    assert response.json() == {"SentinelCacheHealthCheck(alias=None)": "OK"}


@pytest.mark.failover
def test_killed_master_is_named_then_healthy_again_after_the_failover(
    make_cluster: ClusterFactory, use_settings: UseSettings
) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=3)
    use_settings(CACHES={"default": LOCMEM, "sharded": cache_entry(cluster)})
    wait_for_listeners("sharded")
    assert get("/health/cache/")[0] == 200

    old = cluster.kill_master("shard1")
    code, body, elapsed = get("/health/cache/")
    assert elapsed < 0.5 + 0.5, elapsed  # the default budget, with room for a busy machine
    assert code == 503 and body["status"] == "down", body
    shards = body["caches"]["sharded"]["shards"]
    assert [s["ok"] for s in shards] == [True, False]
    assert shards[1]["address"] == hostport(old)
    assert body["problems"][0].startswith(f"sharded: shard 1 (shard1): master {hostport(old)}: ")
    # django-health-check's view: a failure naming the shard.
    response = Client().get("/ht/?format=json")
    assert response.status_code == 500
    (message,) = response.json().values()
    assert message.startswith("Unavailable: sharded: shard 1 (shard1): master "), message

    deadline = time.monotonic() + 30
    while (result := get("/health/cache/"))[0] != 200:
        assert time.monotonic() < deadline, result[1]["problems"]
        time.sleep(0.1)
    new = cluster.wait_for_master_change("shard1", old)  # every sentinel agrees
    code, body, _ = result
    shard = body["caches"]["sharded"]["shards"][1]
    assert shard["ok"] and shard["address"] == hostport(new) != hostport(old)
    # The old master is dead, so the new one has no replica: serving, redundancy reduced.
    assert (body["status"], body["ready"], body["degraded"]) == ("degraded", True, True), body
    assert any(
        w.startswith(f"sharded: shard 1 (shard1): master {hostport(new)} has no replica online")
        for w in body["warnings"]
    ), body["warnings"]
    assert get("/health/cache/strict/")[0] == 503  # fail_on=degraded in the URLconf
    assert get("/health/cache/?fail_on=degraded")[0] == 503
    assert Client().get("/ht/?format=json").status_code == 200
    strict = Client().get("/ht/strict/?format=json")
    assert strict.status_code == 500
    assert "Warning: sharded: shard 1 (shard1)" in next(iter(strict.json().values()))


@pytest.mark.failover
def test_planned_failover_never_fails_readiness_once_the_new_master_is_confirmed(
    make_cluster: ClusterFactory, use_settings: UseSettings
) -> None:
    cluster = make_cluster(shards=2, replicas=1, sentinels=3)
    use_settings(CACHES={"default": LOCMEM, "sharded": cache_entry(cluster)})
    wait_for_listeners("sharded")
    assert get("/health/cache/")[0] == 200
    old = hostport(cluster.master_address("shard0"))

    cluster.failover("shard0")
    seen: list[tuple[int, str, str, list[str]]] = []  # code, status, shard 0's master, warnings
    confirmed_at: float | None = None
    deadline = time.monotonic() + 20
    while confirmed_at is None or time.monotonic() < confirmed_at + 1.5:
        assert time.monotonic() < deadline, seen[-5:]
        code, body, _ = get("/health/cache/")
        master = body["caches"]["sharded"]["shards"][0]["address"]
        seen.append((code, body["status"], master, body["warnings"]))
        if confirmed_at is None and master != old:
            confirmed_at = time.monotonic()
        time.sleep(0.02)
    new = hostport(Address(*cluster.wait_for_master_change("shard0", Address(*old.split(":")))))
    after = seen[next(i for i, s in enumerate(seen) if s[2] != old) :]
    assert {s[2] for s in after} == {new}
    assert all(code == 200 for code, *_ in after), [s[:2] for s in after]
    # The old master is not a replica yet (the sentinels convert it seconds later): the new
    # one has none online, which the report shows as degraded while readiness holds.
    degraded = [s for s in after if s[1] == "degraded"]
    assert degraded, after[:3]
    assert any(
        w.startswith(f"sharded: shard 0 (shard0): master {new} has no replica online")
        for w in degraded[0][3]
    ), degraded[0][3]
