"""History scenarios of the asyncio client with ``ASYNC_MULTIPLEX`` (one auto-pipelined
connection per shard master per event loop, ``core/ops/async_mux.py``): CLIENT KILL, a planned
failover and a SIGKILL of a master, judged by the checker's rules like the pooled ones in
``test_history_core``; and a planted fault (the mux's stale-reply check skipped, with the write
fence and the promotion notice) that the checker must report, so these scenarios can fail."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sentinel_cache.testing import LocalSentinelCluster

from .scenarios import SURVIVE_CRASH, TOPOLOGY, Scenario, long_scale, run, seed
from .test_history_core import FENCE, PROMOTION, READ_HEAVY, SKIP

pytestmark = [pytest.mark.history, pytest.mark.failover]

MUX = {"ASYNC_MULTIPLEX": True}


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(**TOPOLOGY) as cluster:
        yield cluster


#: ``async-shared``: one event loop per process shared by its 4 client threads, so their calls
#: are concurrent tasks queued on one connection per shard; ``async``: a loop per thread.
SCENARIOS = [
    Scenario("async mux, CLIENT KILL", adapter="async", nemesis="client kill", options=MUX),
    Scenario(
        "async mux shared loop, CLIENT KILL",
        adapter="async-shared",
        nemesis="client kill",
        options=MUX,
    ),
    Scenario(
        "async mux shared loop, planned failover",
        adapter="async-shared",
        nemesis="planned failover",
        options=MUX,
    ),
    Scenario(
        "async mux shared loop, SIGKILL of a master",
        adapter="async-shared",
        nemesis="kill master",
        options={**MUX, **SURVIVE_CRASH},
    ),
]


def _judge(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    verdict = run(scenario, topology, seed())
    assert verdict.figures["acked writes"] >= 50, verdict.report()
    assert verdict.violations == [], verdict.report()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_history_mux(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    _judge(scenario, topology)


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_history_mux_long(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    _judge(scenario.scaled(long_scale()), topology)


MUX_TRUST = "sentinel_cache.core.ops.async_mux:MuxLink.untrusted"

PLANTED = Scenario(
    "planted: mux trusts late replies, no write fence, planned failover",
    adapter="async-shared",
    nemesis="planned failover",
    options=MUX,
    weights=READ_HEAVY,
    patches=((FENCE, SKIP), (PROMOTION, SKIP), (MUX_TRUST, SKIP)),
)


def test_the_checker_reports_a_planted_fault_in_the_mux(topology: LocalSentinelCluster) -> None:
    verdict = run(PLANTED, topology, seed())
    assert {"lost-write", "stale-read", "counter"} & set(verdict.by_rule()), verdict.report()
