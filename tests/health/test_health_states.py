"""Status and health speak one vocabulary (``sentinel_cache.core.admin.states``, issue 23): the same
states, the same ``fail_on`` order and verdicts, and on a real topology the same state for the
same cache; the health report keeps its ``status`` word ``ok`` beside the shared ``state``."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from health_support import HEALTH_DB

from sentinel_cache.core.admin import health, states, status
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


def test_one_set_of_states_and_one_fail_on_order() -> None:
    assert status.FAIL_ON is health.FAIL_ON is states.FAIL_ON == ("degraded", "down")
    assert (status.HEALTHY, status.DEGRADED, status.DOWN) == states.STATES
    assert (health.HEALTHY, health.DEGRADED, health.DOWN) == states.STATES
    assert status.EXIT_CODES == {"healthy": 0, "degraded": 1, "down": 2}


@pytest.mark.parametrize("fail_on", states.FAIL_ON)
@pytest.mark.parametrize("state", states.STATES)
def test_a_policy_gives_the_same_verdict_in_both(state: str, fail_on: str) -> None:
    """What fails the status command (non-zero exit) fails the endpoint (503), and the other
    way round, for every state and policy (a report whose every shard has a master)."""
    report = {"state": state, "shards": [{"role": "master"}]}
    command_fails = status.exit_code(report, fail_on) != 0
    endpoint_fails = health.http_status(state, fail_on) == 503
    assert command_fails == endpoint_fails == states.fails(state, fail_on)
    assert health.http_status(health.status_word(state), fail_on) == health.http_status(
        state, fail_on
    )  # the endpoint's "ok" means healthy


def test_an_unknown_policy_is_refused_naming_it_in_both() -> None:
    for refuse in (
        lambda: status.exit_code({"state": "healthy", "shards": []}, "sometimes"),
        lambda: health.http_status("healthy", "sometimes"),
        lambda: health.parse_fail_on("sometimes"),
    ):
        with pytest.raises(
            ValueError, match=r"fail_on must be one of degraded, down \(got 'sometimes'\)"
        ):
            refuse()


def started(core: ShardedSentinelPool) -> ShardedSentinelPool:
    core.discover()
    deadline = time.monotonic() + 5
    while not ((listening := core.listener_states()) and all(listening.values())):
        assert time.monotonic() < deadline, listening
        time.sleep(0.01)
    return core


@pytest.fixture
def core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    config = cluster.config()
    pool = ShardedSentinelPool(
        config["masters"],
        config["sentinels"],
        db=HEALTH_DB,
        password=config["password"],
        sentinel_kwargs={"password": config["sentinel_password"]},
    )
    yield started(pool)
    pool.close()


def test_a_healthy_cache_is_healthy_in_both(core: ShardedSentinelPool) -> None:
    report = health.check(core, timeout=2.0)
    data = report.as_dict()
    assert (data["state"], data["status"], data["ready"]) == ("healthy", "ok", True), data
    assert report.state == status.collect(core, timeout=2.0)["state"] == "healthy"
    code, body = health.summary({"default": report})
    assert (code, body["state"], body["status"]) == (200, "healthy", "ok")
    assert body["caches"]["default"]["state"] == "healthy"


def test_a_cache_with_no_sentinel_is_down_in_both() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pool = ShardedSentinelPool(["shard0"], [f"127.0.0.1:{port}"])
    try:
        report = health.check(pool, timeout=0.3)
        assert (report.state, report.status, report.ready) == ("down", "down", False)
        assert status.collect(pool, timeout=0.3)["state"] == "down"
        code, body = health.summary({"default": report})
        assert (code, body["state"], body["status"]) == (503, "down", "down")
    finally:
        pool.close()
