"""History scenarios of the core: the sync client (2 processes x 4 threads, hot keys) under
each nemesis, the asyncio client and the Django backend under some; every operation recorded
and judged by the checker's rules. Each failing run prints its seed; replay with
``SENTINEL_CACHE_HISTORY_SEED``. The long versions (``SENTINEL_CACHE_HISTORY_SCALE``, default 4
there) run under ``make chaos``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sentinel_cache.testing import LocalSentinelCluster

from .scenarios import SURVIVE_CRASH, TOPOLOGY, Scenario, run, scale, seed

pytestmark = [pytest.mark.history, pytest.mark.failover]


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """One 2x1x3 topology with the fault proxy for the module: every scenario leaves it
    settled (run() waits for that), so the next one starts from a healthy topology."""
    with LocalSentinelCluster(**TOPOLOGY) as cluster:
        yield cluster


SCENARIOS = [
    Scenario("core, no fault"),
    Scenario("core, planned failover", nemesis="planned failover"),
    Scenario("core, SIGKILL of a master", nemesis="kill master", options=SURVIVE_CRASH),
    Scenario("core, CLIENT KILL", nemesis="client kill"),
    Scenario("core, partition healed at the switch", nemesis="partition healed at switch"),
    Scenario("async, planned failover", adapter="async", nemesis="planned failover"),
    Scenario("async, CLIENT KILL", adapter="async", nemesis="client kill"),
    Scenario("django, planned failover", adapter="django", nemesis="planned failover"),
]


def _judge(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    verdict = run(scenario, topology, seed())
    assert verdict.figures["acked writes"] >= 50, verdict.report()
    assert verdict.violations == [], verdict.report()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_history(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    _judge(scenario, topology)


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_history_long(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    factor = scale() if "SENTINEL_CACHE_HISTORY_SCALE" in __import__("os").environ else 4.0
    _judge(scenario.scaled(factor), topology)
