"""History scenarios of the scans (issue 35, phase 2c): ``iter_keys`` and ``delete_pattern``
through the Django API (``SCAN`` with ``itersize`` 2, so each shard's scan takes several steps)
while a planned failover or a SIGKILL of the first shard's master lands mid-scan: the first
client to take a ``SCAN`` reply pauses there (``StepHook`` on ``ShardScan.take``) until the
failover is over, so its next ``SCAN`` meets the new master, where its cursor means nothing
(core/ops/scan.py begins the shard's scan again). Judged by ``scan-missed`` (a key present
throughout a scan is returned; duplicates allowed, as Redis's ``SCAN`` allows them) and by the
register rules for ``delete_pattern`` (a delete of every key of the pattern)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sentinel_cache.testing import LocalSentinelCluster

from . import nemeses
from .ops_scans import MID_SCAN, MID_SCAN_HOOK, REGISTER, duplicates
from .recorder import StepHook
from .scenarios import SURVIVE_CRASH, TOPOLOGY, Scenario, long_scale, run, seed

pytestmark = [pytest.mark.history, pytest.mark.failover]

COMMAND = "sentinel_cache.core.ops.scan:ShardScan.command"
#: The first client whose scan of a shard gets past half the server's table pauses there.
HOOKS = (StepHook("scan step", MID_SCAN_HOOK),)
#: Writes dominate, so most keys are present when a scan runs; delete_pattern now and then.
SCAN_WEIGHTS = {
    "set": 4,
    "set_extra": 4,
    "get": 2,
    "set_many": 1,
    "delete": 1,
    "iter_keys": 3,
    "delete_pattern": 1,
}


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(**TOPOLOGY) as cluster:
        yield cluster


def _scan(name: str, strike: nemeses.Strike, nemesis: str, **kw: object) -> Scenario:
    return Scenario(
        name,
        adapter="django",
        nemesis=nemesis,
        weights=SCAN_WEIGHTS,
        hooks=HOOKS,
        strike=nemeses.AtStep("scan step", strike),
        patches=(REGISTER, MID_SCAN),
        **kw,  # type: ignore[arg-type]
    )


SCENARIOS = [
    _scan("django, scan, planned failover mid-scan", nemeses.planned_failover, "planned failover"),
    _scan(
        "django, scan, SIGKILL mid-scan",
        nemeses.kill_master,
        "kill master",
        options=SURVIVE_CRASH,
    ),
]


def _judge(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    verdict = run(scenario, topology, seed())
    scans = [op for op in verdict.history.ops if op.name == "iter_keys" and op.kind == "ok"]
    print(f"{scenario.name}: {len(scans)} scans, {duplicates(verdict.history.ops)} duplicates")
    struck = verdict.history.events[0].detail
    assert "nothing struck" not in struck, struck
    assert len(scans) >= 20, verdict.report()
    # the final read straight from the masters found the keys (the stored names are right)
    from_masters = [op for op in verdict.history.ops if op.name == "final_master_get"]
    assert len(from_masters) == 15 and any(op.value is not None for op in from_masters)
    assert verdict.violations == [], verdict.report()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_history_scans(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    _judge(scenario, topology)


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_history_scans_long(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    factor = long_scale()
    _judge(scenario.scaled(factor), topology)


# ---------------------------------------------------------------- the net can fail

PLANTED = Scenario(
    "planted: scan not restarted on a switch, planned failover mid-scan",
    adapter="django",
    nemesis="planned failover",
    weights={"set": 3, "set_extra": 6, "get": 1, "iter_keys": 3},
    hooks=HOOKS,
    strike=nemeses.AtStep("scan step", nemeses.planned_failover),
    patches=(REGISTER, MID_SCAN, (COMMAND, "history.ops_scans:scan_never_restarts")),
)


def test_the_checker_reports_a_scan_that_keeps_its_cursor_across_a_switch(
    topology: LocalSentinelCluster,
) -> None:
    verdict = run(PLANTED, topology, seed())
    assert "scan-missed" in verdict.by_rule(), verdict.report()
