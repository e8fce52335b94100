"""History scenarios of ``get_or_set`` under faults (issue 35, phase 2c): stampede-protected
``get_or_set`` calls whose computation takes 0.3-1 s while a planned failover, or a SIGKILL of
the first shard's master (``OUTAGE_HOLD`` 5 so the store is held through the switch), lands
during a computation: the first caller to reach ``_compute_and_store`` for a key of shard 0 (lock
taken, about to compute) pauses there until the failover is over, then computes and stores on
the new master.
Judged by every register rule: the value stored after the first computation
(``get-or-set-stored``), callers converge on it, nothing stale (``stale-read``), nothing lost."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sentinel_cache.testing import LocalSentinelCluster

from . import nemeses
from .recorder import OPS, OpSpec, StepHook, Workload, _get_or_set
from .scenarios import SURVIVE_CRASH, TOPOLOGY, Scenario, long_scale, run, seed

pytestmark = [pytest.mark.history, pytest.mark.failover]

COMPUTE = "sentinel_cache.core.ops._sync.stampede:StampedeOperations._compute_and_store"
HOOKS = (StepHook("compute", "history.test_history_stampede:compute_step"),)


def compute_step() -> None:
    """The step the hook names: a computation of a key on shard 0 (the nemeses' target) is
    about to begin, its lock taken. Does nothing itself."""


def with_compute_step(original: Any) -> Any:
    """Instrumentation (no change of behaviour) for ``_compute_and_store``: call
    :func:`compute_step` first when the key lives on shard 0."""

    def compute_and_store(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        if self.core.shard_for(key).index == 0:
            compute_step()  # looked up at call time: the hook wraps the module's attribute
        return original(self, key, *args, **kwargs)

    return compute_and_store


def _computing(rng: random.Random, w: Workload, value: Callable[[], str]) -> Any:
    """A key's get_or_set whose computation takes 0.3-1 s."""
    return (rng.choice(w.keys),), (value(), True, round(rng.uniform(0.3, 1.0), 3))


OPS["get_or_set_computing"] = OpSpec(
    _computing, lambda a, k, x: a.get_or_set(k[0], *x), _get_or_set, weight=0
)
#: The client processes import this module too (a no-op patch): the op above is theirs as well.
REGISTER = ("history.test_history_stampede:registered", "history.ops_scans:unchanged")
STEP = (COMPUTE, "history.test_history_stampede:with_compute_step")
registered = True

#: get_or_set and reads only (plus a rare delete, so keys go missing and are computed again).
WEIGHTS = {"get_or_set_computing": 2, "get": 6, "delete": 1}


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(**TOPOLOGY) as cluster:
        yield cluster


SCENARIOS = [
    Scenario(
        "core, get_or_set computing through a SIGKILL",
        nemesis="kill master",
        options=SURVIVE_CRASH,
        weights=WEIGHTS,
        hooks=HOOKS,
        strike=nemeses.AtStep("compute", nemeses.kill_master),
        patches=(REGISTER, STEP),
        after=2.0,
    ),
]
#: Long only (``make chaos``): a planned failover settles for about 8 s (the demoted master
#: reconfigured), which the CI set cannot afford twice more.
LONG_ONLY = [
    Scenario(
        "core, get_or_set computing through a planned failover",
        nemesis="planned failover",
        weights=WEIGHTS,
        hooks=HOOKS,
        strike=nemeses.AtStep("compute", nemeses.planned_failover),
        patches=(REGISTER, STEP),
        after=2.0,
    ),
]


def _judge(scenario: Scenario, topology: LocalSentinelCluster) -> None:
    verdict = run(scenario, topology, seed())
    ops = verdict.history.ops
    calls = [op for op in ops if op.name == "get_or_set_computing" and op.kind == "ok"]
    own = sum(1 for op in calls if op.value == op.args[0])
    print(f"{scenario.name}: {len(calls)} get_or_set, {own} returned their own computation")
    struck = verdict.history.events[0].detail
    assert "nothing struck" not in struck, struck
    assert len(calls) >= 20, verdict.report()
    assert verdict.violations == [], verdict.report()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_history_get_or_set_under_faults(
    scenario: Scenario, topology: LocalSentinelCluster
) -> None:
    _judge(scenario, topology)


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.parametrize(
    "scenario", SCENARIOS + LONG_ONLY, ids=[s.name for s in SCENARIOS + LONG_ONLY]
)
def test_history_get_or_set_under_faults_long(
    scenario: Scenario, topology: LocalSentinelCluster
) -> None:
    factor = long_scale()
    _judge(scenario.scaled(factor), topology)
