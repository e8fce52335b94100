"""Truthful diagnostics: every failure is reported as what it is, against real topologies.

Unreachable is not "authentication refused", a master name no sentinel monitors is not "no
sentinel reachable", a shard without quorum is named so; ``fail_on="down"`` keeps a readiness
probe green while redundancy is reduced (a planned failover's old master not yet a replica);
a separate status process sees the sentinels' config epoch; repeated re-resolve failures are
logged once per interval with a count.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator

import pytest

from sentinel_cache.core.admin import status
from sentinel_cache.core.config import Address
from sentinel_cache.core.ops.client import execute
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]

NODE_SECRET = "node-secret-diag"
SENTINEL_SECRET = "sentinel-secret-diag"


def _hostport(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def _sentinels(cluster: LocalSentinelCluster) -> list[str]:
    return [_hostport(a) for a in cluster.sentinel_addresses]


def _problem_lines(text: str) -> list[str]:
    """The lines under "problems:" (or "warnings ...:") of a text report."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("problems:", "warnings")))
    return [line for line in lines[start + 1 :] if line.startswith("  - ")]


@pytest.fixture
def secured(make_cluster: ClusterFactory) -> LocalSentinelCluster:
    return make_cluster(
        shards=1,
        replicas=1,
        sentinels=2,
        requirepass=NODE_SECRET,
        sentinel_requirepass=SENTINEL_SECRET,
    )


# -- not monitored -----------------------------------------------------------------------------


def test_a_master_no_sentinel_monitors_is_not_monitored(cluster: LocalSentinelCluster) -> None:
    masters = [*cluster.master_names, "not-monitored"]
    with ShardedSentinelPool(masters, _sentinels(cluster)) as pool:
        report = status.collect(pool)
    assert report["state"] == "down" and report["exit_code"] == 2
    assert status.exit_code(report) == 2
    assert status.exit_code(report, fail_on="down") == 2  # a shard that cannot serve is down
    *served, lost = report["shards"]
    assert all(s["problem"] is None and s["role"] == "master" for s in served)
    assert lost["problem"] == "not_monitored"
    assert lost["address"] is None
    assert lost["sentinels_not_monitoring"] == _sentinels(cluster)
    assert all(s["state"] == "ok" and s["reachable"] for s in report["sentinels"])
    (issue,) = [i for i in report["issues"] if i["shard"] == "not-monitored"]
    assert issue["code"] == "not_monitored" and issue["severity"] == "down"
    text = status.render_text(report)
    (line,) = _problem_lines(text)
    assert "not monitored" in line and "no sentinel monitors master 'not-monitored'" in line
    assert all(address in line for address in _sentinels(cluster))
    assert "no sentinel reachable" not in text  # what this case used to say, falsely
    assert "UNREACHABLE" not in text


def test_a_misspelt_master_name_suggests_the_monitored_one(cluster: LocalSentinelCluster) -> None:
    with ShardedSentinelPool(["Shard1"], _sentinels(cluster)) as pool:
        report = status.collect(pool)
    (problem,) = report["problems"]
    assert "did you mean 'shard1'?" in problem
    assert "'shard0'" in problem  # what the sentinels do monitor


# -- authentication refused vs unreachable -----------------------------------------------------


@pytest.mark.failover
@pytest.mark.parametrize("sentinel_kwargs", [{"password": "wrong-password"}, {}])
def test_a_refused_sentinel_password_is_auth_refused_not_unreachable(
    secured: LocalSentinelCluster, sentinel_kwargs: dict[str, str]
) -> None:
    with ShardedSentinelPool(
        secured.master_names,
        _sentinels(secured),
        password=NODE_SECRET,
        sentinel_kwargs=sentinel_kwargs,
    ) as pool:
        report = status.collect(pool)
    assert report["state"] == "down" and report["exit_code"] == 2
    for sentinel in report["sentinels"]:
        assert sentinel["state"] == "auth_refused"
        assert sentinel["refused"] == "rejected the credentials"
        assert sentinel["reachable"] is False  # it did not answer our questions
    (shard,) = report["shards"]
    assert shard["problem"] == "sentinels_auth_refused"
    codes = {i["code"] for i in report["issues"]}
    assert codes == {"sentinels_auth_refused", "auth_refused"}
    text = status.render_text(report)
    assert text.count("AUTH REFUSED") == 2  # one per sentinel row
    lines = _problem_lines(text)
    assert all("authentication refused" in line for line in lines)
    assert not any("unreachable" in line or "no sentinel reachable" in line for line in lines)
    assert all("SENTINEL_PASSWORD" in line for line in lines)  # what to check
    assert "wrong-password" not in text and SENTINEL_SECRET not in text


@pytest.mark.failover
def test_a_refused_data_node_password_is_the_masters_auth_refused(
    secured: LocalSentinelCluster,
) -> None:
    with ShardedSentinelPool(
        secured.master_names,
        _sentinels(secured),
        password="wrong-node-password",
        sentinel_kwargs={"password": SENTINEL_SECRET},
    ) as pool:
        report = status.collect(pool)
    assert report["state"] == "down"
    (shard,) = report["shards"]
    assert shard["address"] == _hostport(secured.master_address("shard0"))
    assert shard["master_state"] == "auth_refused"
    assert shard["problem"] == "master_auth_refused"
    assert all(s["state"] == "ok" for s in report["sentinels"])
    text = status.render_text(report)
    assert "AUTH REFUSED" in text
    (line,) = _problem_lines(text)
    assert "authentication refused" in line and "USERNAME/PASSWORD" in line
    assert "unreachable" not in line


@pytest.mark.failover
def test_unreachable_and_refused_sentinels_are_told_apart(
    secured: LocalSentinelCluster, make_cluster: ClusterFactory
) -> None:
    secured.stop_sentinel(1)
    with ShardedSentinelPool(
        secured.master_names,
        _sentinels(secured),
        password=NODE_SECRET,
        sentinel_kwargs={"password": "wrong-password"},
        socket_timeout=0.5,
    ) as pool:
        report = status.collect(pool, timeout=0.5)
    first, second = report["sentinels"]
    assert first["state"] == "auth_refused"
    assert second["state"] == "unreachable"
    (shard,) = report["shards"]
    # The one that answered refused us: that is what to fix first.
    assert shard["problem"] == "sentinels_auth_refused"
    problem = report["problems"][0]
    assert "authentication refused by the sentinels" in problem
    assert f"no answer from {second['address']}" in problem


# -- no quorum ---------------------------------------------------------------------------------


@pytest.mark.failover
def test_a_shard_whose_sentinels_cannot_reach_quorum_says_so(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    cluster.stop_sentinel(1)
    cluster.stop_sentinel(2)
    # The remaining sentinel notices its peers are gone within down-after (1 s).
    with cluster.sentinel_client(0) as sentinel:
        deadline = time.monotonic() + 15
        while True:
            try:
                sentinel.execute_command("SENTINEL", "CKQUORUM", "shard0")
            except Exception as exc:
                assert "NOQUORUM" in str(exc)
                break
            assert time.monotonic() < deadline, "the sentinel kept reporting a quorum"
            time.sleep(0.1)
    with ShardedSentinelPool(cluster.master_names, _sentinels(cluster)) as pool:
        report = status.collect(pool, timeout=0.5)
    (shard,) = report["shards"]
    assert shard["role"] == "master"
    assert "no_quorum" in shard["problem_codes"]
    assert report["state"] == "degraded" and report["exit_code"] == 1
    assert status.exit_code(report, fail_on="down") == 0  # it still serves
    assert any(p.startswith("shard 0 (shard0): no quorum") for p in report["problems"])
    assert "no quorum" in status.render_text(report)


# -- planned failover: fail_on, config epoch, failover in progress --------------------------


@contextlib.contextmanager
def _thawed(cluster: LocalSentinelCluster, *nodes: tuple[str, int]) -> Iterator[None]:
    """Whatever the test froze is running again afterwards, even if an assertion failed."""
    try:
        yield
    finally:
        for node in nodes:
            cluster.thaw_node(node)


@pytest.mark.failover
def test_planned_failover_as_a_separate_status_process_sees_it(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3)
    old = cluster.master_address("shard0")
    (replica,) = cluster.replica_addresses("shard0")
    with (
        _thawed(cluster, old, replica),
        ShardedSentinelPool(cluster.master_names, _sentinels(cluster)) as pool,
    ):
        before = status.collect(pool)
        assert before["state"] == "healthy", before["problems"]
        epoch = before["shards"][0]["config_epoch"]
        assert isinstance(epoch, int)
        assert before["shards"][0]["failover_in_progress"] is False

        # 1. The failover starts; the replica, frozen, cannot finish its promotion yet.
        cluster.failover("shard0")
        cluster.freeze_node(replica)
        deadline = time.monotonic() + 5
        while True:
            during = status.collect(pool, timeout=0.5)
            if during["shards"][0]["failover_in_progress"]:
                break
            assert time.monotonic() < deadline, during
            time.sleep(0.05)
        (shard,) = during["shards"]
        assert shard["address"] == _hostport(old) and shard["role"] == "master"
        assert "failover_in_progress" in shard["problem_codes"]
        assert "on sentinel" in shard["failover"]
        assert "FAILOVER" in status.render_text(during)
        assert during["exit_code"] == 1
        assert status.exit_code(during, fail_on="down") == 0

        # 2. Promoted; the old master is not converted into a replica yet (frozen now, so it
        # stays unconverted for as long as this test looks).
        cluster.thaw_node(replica)
        new = cluster.wait_for_master_change("shard0", old)
        with cluster.node_client(old, direct=True) as client:
            assert client.execute_command("ROLE")[0] in (b"master", "master")
        cluster.freeze_node(old)
        after = status.collect(pool, timeout=0.5)
        down_only = status.collect(pool, timeout=0.5, fail_on="down")

    (shard,) = after["shards"]
    assert shard["address"] == _hostport(new) and shard["role"] == "master"
    assert "no_replica" in shard["problem_codes"]
    assert after["state"] == "degraded"
    assert after["exit_code"] == status.exit_code(after) == 1  # the default: fail on degraded
    assert status.can_serve(after)
    assert status.exit_code(after, fail_on="down") == 0
    assert down_only["fail_on"] == "down" and down_only["exit_code"] == 0
    assert status.exit_code(down_only) == 0  # the report's own policy
    assert status.exit_code(down_only, fail_on="degraded") == 1
    assert status.redundancy_reduced(down_only)
    text = status.render_text(down_only)
    assert text.startswith("DEGRADED (exit 0: fail on down only")
    assert "warnings (redundancy reduced):" in text and "problems:" not in text
    # Fresh pool, as in a separate status process: nothing switched in it, yet the sentinels'
    # epoch says a failover happened.
    assert shard["switch_count"] == 0
    assert shard["config_epoch"] > epoch
    assert "last switch (this process)" in text


def test_exit_code_policies() -> None:
    serving = {"state": "degraded", "shards": [{"role": "master"}, {"role": "master"}]}
    assert status.exit_code(serving) == 1
    assert status.exit_code(serving, fail_on="degraded") == 1
    assert status.exit_code(serving, fail_on="down") == 0
    assert status.exit_code({**serving, "fail_on": "down"}) == 0
    lost = {"state": "down", "shards": [{"role": "master"}, {"role": None}]}
    assert status.exit_code(lost, fail_on="down") == 2
    assert not status.can_serve(lost)
    assert status.exit_code({}, fail_on="down") == 2
    assert status.exit_code({"state": "healthy"}, fail_on="down") == 0
    assert status.EXIT_CONFIG == 3 and 3 not in status.EXIT_CODES.values()
    with pytest.raises(ValueError, match="fail_on"):
        status.exit_code(serving, fail_on="never")


def test_master_view_reads_failover_and_epoch_from_the_sentinels_replies() -> None:
    a, b = Address("10.9.0.1", 26379), Address("10.9.0.2", 26379)
    master = Address("10.9.0.10", 6379)
    probes = [
        status.SentinelProbe(
            a,
            state="ok",
            masters={"m": master},
            details={"m": {"config-epoch": "4", "flags": "master"}},
        ),
        status.SentinelProbe(
            b,
            state="ok",
            masters={"m": master},
            details={
                "m": {
                    "config-epoch": "3",
                    "flags": "master,failover_in_progress",
                    "failover-state": "wait_promotion",
                }
            },
        ),
    ]
    view = status.master_view("m", probes)
    assert view.address == master and view.agreeing == 2
    assert view.epoch == 4
    assert view.failover == f"wait_promotion on sentinel {b}"
    assert view.problem is None


# -- logging -----------------------------------------------------------------------------------


@pytest.mark.failover
def test_repeated_reresolve_failures_are_logged_once_per_interval_with_a_count(
    make_cluster: ClusterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=1)
    master = cluster.master_address("shard0")
    with ShardedSentinelPool(  # each call fails at once (OUTAGE_HOLD 0): their count is tested
        cluster.master_names,
        _sentinels(cluster),
        socket_timeout=0.5,
        listeners=False,
        outage_hold=0,
    ) as pool:
        pool.discover()
        shard = pool.shard(0)
        shard.resolve_failures.interval = 1.0  # the production interval is longer
        cluster.stop_sentinel(0)
        cluster.kill_node(master)
        failures = 0
        with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
            until = time.monotonic() + 2.6
            while time.monotonic() < until:
                try:
                    execute(pool, shard, lambda client: client.get("k"))
                except ShardUnavailableError:
                    failures += 1
                time.sleep(0.01)
    logged = [r.getMessage() for r in caplog.records if "re-resolve" in r.getMessage()]
    # Re-resolves run every RERESOLVE_INTERVAL (0.2 s): about 13 failed in 2.6 s.
    assert failures >= 10
    assert 2 <= len(logged) <= 3, logged
    assert "suppressed" not in logged[0]
    counts = [re.search(r"\((\d+) similar messages suppressed in the last 1s\)", m) for m in logged]
    assert all(counts[1:]), logged
    assert sum(int(m.group(1)) for m in counts[1:] if m) >= 4, logged
