"""Issue 11's chaos scenarios, each on its own 2-shard topology with real network faults.

Every round is held to the same verdict (:func:`problems`): 0 acknowledged writes lost, 0
refused, at least MIN_ACKED_PER_SHARD acknowledged writes on each shard, the fault seen to take
effect, no call longer than one socket timeout and its slack (plus FAILOVER_HOLD for calls the
write fence may have held), and the shards the fault does not touch: 0 errors and no call held
by it. Each test adds what its scenario promises (a switch or none, recovery, errors only while
the cut lasted). Run with ``-s`` to see the figures.

The bounds here are correctness bounds (``make test`` runs the single rounds, ``make chaos-ci``
3 heal-at-switch rounds per socket timeout): a hung master costs one socket timeout, never two
(slack: half a socket timeout), and a call of an untouched shard is not held by the fault
(UNTOUCHED_MAX). Issue 11's speed targets (SOCKET_TIMEOUT + 0.1 s, the other shard under 50 ms)
are asserted only by the 60 heal-at-switch rounds of ``make chaos`` and reported by
``python -m benchmarks.chaos``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import pytest

from sentinel_cache.testing import LocalSentinelCluster

from .history import Call, Report
from .scenarios import (
    CLIENT_MASTER,
    CLIENT_SENTINELS,
    HEAL_AFTER,
    HEAL_AT,
    HEAL_BEFORE,
    LATENCY,
    MIN_ACKED_PER_SHARD,
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


def correct_slack(socket_timeout: float) -> float:
    """What a call on a hung master may take beyond one socket timeout: half of one, so that
    a call that cost two timeouts fails and a stall of the shared cores does not."""
    return socket_timeout / 2


def _setting(name: str, default: str, choices: str, valid: Callable[[str], bool]) -> str:
    raw = os.environ.get(name, default)
    if not valid(raw):
        raise ValueError(f"{name} must be {choices}, not {raw!r}")
    return raw


#: Heal-at-switch rounds per socket timeout (``make chaos``: 20; ``make chaos-ci``: 3).
ROUNDS = int(
    _setting(
        "SENTINEL_CACHE_CHAOS_ROUNDS",
        "20",
        "a whole number >= 1",
        lambda v: v.isdigit() and int(v) >= 1,
    )
)
#: 1: those rounds also assert issue 11's speed targets (``make chaos``); 0: they print them.
TARGETS = _setting("SENTINEL_CACHE_CHAOS_TARGETS", "1", "0 or 1", lambda v: v in ("0", "1")) == "1"


def problems(report: Report, *, untouched_max: float | None = UNTOUCHED_MAX) -> list[str]:
    """What is wrong with one round, whatever its scenario (empty: nothing). ``untouched_max``
    None leaves out the bound on the untouched shards' calls (see :func:`run`)."""
    found: list[str] = []
    if report.lost:
        found.append(f"{report.lost} acknowledged writes lost, e.g. {report.lost_sample}")
    if report.refused:
        # A plain SET has no "not stored" answer: a False is a write dropped without an error.
        found.append(f"{report.refused} writes refused (set returned False)")
    for shard in range(TOPOLOGY["shards"]):
        figures = report.shards.get(shard)
        acked = 0 if figures is None else figures.acked
        if acked < MIN_ACKED_PER_SHARD:
            found.append(f"shard {shard}: {acked} acknowledged writes (< {MIN_ACKED_PER_SHARD})")
        if figures is not None and shard != report.affected and figures.errors:
            found.append(f"untouched shard {shard} errors: {dict(figures.error_types)}")
    found += [f"fault not seen to take effect: {gap}" for gap in report.unconfirmed]
    if report.over_bound:
        worst = max(report.over_bound, key=lambda c: c.duration)
        found.append(f"{len(report.over_bound)} calls over their bound; worst {worst}")
    if untouched_max is not None and (held := untouched_over(report, untouched_max)):
        found.append(f"untouched shards' calls over {untouched_max}s: {_calls(held)}")
    return found


def untouched_over(report: Report, limit: float = UNTOUCHED_MAX) -> list[Call]:
    return [c for c in report.untouched_slowest if c.duration > limit]


def _calls(calls: list[Call]) -> str:
    return ", ".join(f"shard {c.shard} {c.duration * 1000:.0f} ms {c.outcome}" for c in calls)


def run(make_cluster: MakeCluster, scenario: str, check: Callable[[Report], None]) -> Report:
    """One round of ``scenario`` on its own topology, judged on everything (:func:`problems`
    and the scenario's own ``check``) at once.

    One more round, on a new topology, is run for exactly one cause, and it must pass whole:
    the round's only fault is ONE call of a shard the fault does not touch over UNTOUCHED_MAX
    (then, by the verdict above: 0 losses, 0 refusals, 0 errors on the untouched shards, the
    fault's own shard within all its bounds). Why: a stall of CI's two shared cores holds one
    call of the test process now and then (commit 820a64c: 311 ms once in CI, in a run that made
    2,061 calls where a quiet one makes 5,000; 369 ms in a loaded run of the 60 rounds), while
    a call held by the fault is held in every round and holds every call that meets it. Any
    other failure, or two such calls, fails at once."""
    report = _round(make_cluster, scenario)
    _judge(report, check, untouched_max=None)
    held = untouched_over(report)
    if not held:
        return report
    assert len(held) == 1, f"untouched shards' calls over {UNTOUCHED_MAX}s: {_calls(held)}"
    print(f"\none more round, after one untouched call over {UNTOUCHED_MAX}s: {_calls(held)}")
    report = _round(make_cluster, scenario)
    _judge(report, check, untouched_max=UNTOUCHED_MAX)
    return report


def _judge(report: Report, check: Callable[[Report], None], *, untouched_max: float | None) -> None:
    found = problems(report, untouched_max=untouched_max)
    assert not found, found
    check(report)


def _round(make_cluster: MakeCluster, scenario: str) -> Report:
    cluster = make_cluster(**TOPOLOGY)
    report = run_scenario(
        scenario, cluster, socket_timeout=SOCKET_TIMEOUT, slack=correct_slack(SOCKET_TIMEOUT)
    )
    print(f"\n{report.summary()}")
    return report


def recovered(report: Report) -> None:
    limit = SOCKET_TIMEOUT + correct_slack(SOCKET_TIMEOUT)
    assert report.recovery is not None, "no successful write on the faulted shard after the heal"
    assert report.recovery <= limit, f"recovery {report.recovery:.3f}s > {limit}s"


def test_master_partitioned_healed_before_the_switch(make_cluster: MakeCluster) -> None:
    def check(report: Report) -> None:
        # The fault bit: calls in flight on the cut master hung until the heal (0.5 s). Not only
        # those that started during the cut: both writers may be in a call when it begins.
        start, heal = report.fault
        hung = [
            c.duration
            for c in report.history
            if c.shard == 0 and c.start <= heal and c.end >= start
        ]
        assert max(hung, default=0.0) >= 0.4, (
            f"the cut did not bite: longest call {max(hung, default=0.0):.3f}s"
        )
        recovered(report)

    run(make_cluster, HEAL_BEFORE, check)


def test_master_partitioned_healed_at_the_switch(make_cluster: MakeCluster) -> None:
    def check(report: Report) -> None:
        assert report.switched
        recovered(report)

    run(make_cluster, HEAL_AT, check)


def test_master_partitioned_healed_after_the_switch(make_cluster: MakeCluster) -> None:
    def check(report: Report) -> None:
        assert report.switched
        recovered(report)

    run(make_cluster, HEAL_AFTER, check)


def test_client_cut_from_its_master_only(make_cluster: MakeCluster) -> None:
    def check(report: Report) -> None:
        assert not report.switched  # the sentinels still see the master: no failover
        start, heal = report.fault
        failed = [c for c in report.history if c.shard == 0 and not c.acked]
        assert failed, "the cut did not bite: no call to the cut master failed"
        # Errors are bounded in time: a failed call ends while the cut lasts or within one
        # timeout after the heal. It may have started just before the cut: a writer can be in
        # a call when the cut begins (CI once saw one start 0.3 ms before it and fail with it).
        end = heal + SOCKET_TIMEOUT + correct_slack(SOCKET_TIMEOUT)
        late = [c for c in failed if not (start <= c.end <= end)]
        assert not late, [
            (round(c.start - start, 3), round(c.end - heal, 3), c.outcome) for c in late
        ]
        recovered(report)

    run(make_cluster, CLIENT_MASTER, check)


def test_client_cut_from_every_sentinel(make_cluster: MakeCluster) -> None:
    def check(report: Report) -> None:
        assert not report.switched
        assert report.errors == 0, dict(report.error_types)

    run(make_cluster, CLIENT_SENTINELS, check)


def test_minority_of_sentinels_partitioned(make_cluster: MakeCluster) -> None:
    def check(report: Report) -> None:
        assert not report.switched
        assert report.errors == 0, dict(report.error_types)

    run(make_cluster, MINORITY, check)


def test_latency_and_loss_on_one_master(make_cluster: MakeCluster) -> None:
    def check(report: Report) -> None:
        assert not report.switched
        assert report.errors == 0, dict(report.error_types)
        start, heal = report.fault
        slowed = [c.duration for c in report.history if c.shard == 0 and start <= c.start <= heal]
        assert statistics.median(slowed) >= 0.1  # the fault bit: a round trip costs the delay
        assert max(slowed) < SOCKET_TIMEOUT  # and every call completed

    run(make_cluster, LATENCY, check)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("socket_timeout", [0.5, 1.0, 5.0])
def test_heal_at_switch_rounds(make_cluster: MakeCluster, socket_timeout: float) -> None:
    """The issue's first target: ROUNDS heal-at-switch rounds lose no acknowledged write, each
    judged by :func:`problems` with no second chance. With TARGETS (``make chaos``), issue 11's
    speed targets are part of the verdict; without (``make chaos-ci``), they are printed."""
    slack = SLACK if TARGETS else correct_slack(socket_timeout)
    began = time.monotonic()
    cluster = make_cluster(**TOPOLOGY)
    failed: list[str] = []
    lost = acked = 0
    for n in range(ROUNDS):
        settle(cluster)
        report = run_scenario(HEAL_AT, cluster, socket_timeout=socket_timeout, slack=slack)
        report.history.clear()  # judged; kept calls would grow GC pauses
        found = problems(report)
        if not report.switched:
            found.append("no switch")
        limit = socket_timeout + slack
        if report.recovery is None or report.recovery > limit:
            found.append(f"recovery {report.recovery} (limit {limit}s)")
        other = report.shards[1].longest_in_window if 1 in report.shards else float("inf")
        target = (
            f"other shard {other * 1000:.0f} ms in the fault (target {OTHER_SHARD_MAX * 1000:.0f})"
        )
        if TARGETS and other > OTHER_SHARD_MAX:
            found.append(target)
        verdict = "ok" if not found else "FAILED: " + "; ".join(found)
        print(
            f"\nround {n + 1} at SOCKET_TIMEOUT {socket_timeout:g}: {verdict}; {target}; {report.summary()}"
        )
        failed += [f"round {n + 1}: {f}" for f in found]
        lost += report.lost
        acked += report.acked
    print(
        f"\n{ROUNDS} rounds at SOCKET_TIMEOUT {socket_timeout:g}: lost {lost} of {acked}, "
        f"{len(failed)} problems, {time.monotonic() - began:.0f}s"
    )
    assert not failed, failed
