"""A scenario = (workload, nemesis, options, rules that apply), run and judged the same way
every time by :func:`run`: client processes start, traffic runs ``before`` seconds, the nemesis
strikes (and is over), traffic runs ``after`` more seconds, the clients stop, the topology
settles, process 0 reads every key, and :func:`~history.checker.check` judges the history.

Seeds: ``SENTINEL_CACHE_HISTORY_SEED`` replays one (the op draws and the key prefix follow it;
thread timing does not, so a replay re-runs the same schedule of ops, not the same
interleaving); otherwise a fresh one is drawn and printed. ``SENTINEL_CACHE_HISTORY_SCALE``
(a number, default 1) multiplies the traffic time and the clients per process of the long
versions (``make chaos``).
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from chaos.scenarios import settle

from sentinel_cache.testing import LocalSentinelCluster

from . import final_masters, nemeses
from .checker import STRICT, Modes, Verdict, check
from .recorder import Event, History, Plan, Recorder, StepHook, Workload

SEED_ENV = "SENTINEL_CACHE_HISTORY_SEED"
_RUNS = itertools.count()
SCALE_ENV = "SENTINEL_CACHE_HISTORY_SCALE"

#: What every history scenario runs on (faults=True: the proxy, for partitions).
TOPOLOGY: dict[str, Any] = {"shards": 2, "replicas": 1, "sentinels": 3, "faults": True}

#: The options of a crash (SIGKILL) scenario: writes held through the failover instead of
#: failing, so the run has acknowledged writes to judge on the faulted shard.
SURVIVE_CRASH: dict[str, Any] = {"OUTAGE_HOLD": 5}


@dataclass(frozen=True)
class Scenario:
    name: str
    adapter: str = "core"  # an ADAPTERS entry
    nemesis: str = "none"  # a NEMESES entry (or ``strike`` for an AtStep / custom one)
    options: dict[str, Any] = field(default_factory=dict)
    modes: Modes = STRICT
    rules: tuple[str, ...] | None = None  # None: every rule
    processes: int = 2
    threads: int = 4
    before: float = 1.0
    after: float = 1.5
    weights: dict[str, int] | None = None
    hooks: tuple[StepHook, ...] = ()
    patches: tuple[tuple[str, str], ...] = ()
    strike: nemeses.Strike | None = None

    def scaled(self, factor: float) -> Scenario:
        return replace(
            self,
            threads=max(1, round(self.threads * factor)),
            before=self.before * factor,
            after=self.after * factor,
        )


def seed() -> int:
    """The seed of this run: the env var's, or a fresh one (printed either way)."""
    raw = os.environ.get(SEED_ENV)
    if raw is not None:
        if not raw.isdigit():
            raise ValueError(f"{SEED_ENV} must be a whole number, not {raw!r}")
        chosen = int(raw)
    else:
        chosen = random.SystemRandom().randrange(10**9)
    print(f"history seed {chosen} (replay: {SEED_ENV}={chosen})", file=sys.stderr)
    return chosen


def scale() -> float:
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        factor = float(raw)
    except ValueError:
        factor = 0.0
    if not factor > 0:
        raise ValueError(f"{SCALE_ENV} must be a number above 0, not {raw!r}")
    return factor


#: The long versions' factor when SENTINEL_CACHE_HISTORY_SCALE is not set.
LONG_SCALE = 4.0


def long_scale() -> float:
    """How much longer and wider the long versions (``make chaos``) run: the environment's
    factor, or :data:`LONG_SCALE`."""
    return scale() if SCALE_ENV in os.environ else LONG_SCALE


def run(
    scenario: Scenario,
    cluster: LocalSentinelCluster,
    run_seed: int,
    *,
    modes_from_events: Callable[[list[Event]], Modes] | None = None,
    keyspace: Callable[[Workload], bool] | None = None,
) -> Verdict:
    """Record ``scenario`` on ``cluster`` (settled, faults cleared) and judge it;
    ``modes_from_events``: the modes depend on when the nemesis struck (a relaxation that
    holds only inside the fault's window); ``keyspace``: the keys a run needs (a planted fault
    that only keys on two shards can show): prefixes are drawn until it says yes."""
    slug = "".join(c if c.isalnum() else "-" for c in scenario.name)[:24]
    # fresh keys for every run of the session (a replayed seed runs twice on one topology)
    workload = Workload.hot(f"h{run_seed}.{next(_RUNS)}:{slug}")
    while keyspace is not None and not keyspace(workload):
        workload = Workload.hot(f"h{run_seed}.{next(_RUNS)}:{slug}")
    options = {"MASTERS": list(cluster.master_names), **scenario.options}
    plan = plan_for(scenario, cluster, options, workload, run_seed)
    history, events, settled = record(scenario, cluster, plan, target=cluster.master_names[0])
    history.ops += final_masters.read_masters(cluster, scenario.adapter, options, workload)
    history.events = events
    modes = scenario.modes if modes_from_events is None else modes_from_events(events)
    return judged(scenario, history, modes, settled)


def plan_for(
    scenario: Scenario,
    cluster: LocalSentinelCluster,
    options: dict[str, Any],
    workload: Workload,
    run_seed: int,
    *,
    patches: tuple[tuple[str, str], ...] = (),
) -> Plan:
    """What the client processes run: the scenario's adapter, ops and hooks on ``workload``
    (``patches``: planted before the scenario's own)."""
    return Plan(
        scenario.adapter,
        [tuple(a) for a in cluster.sentinel_addresses],  # type: ignore[misc]
        options,
        workload,
        run_seed,
        processes=scenario.processes,
        threads=scenario.threads,
        weights=scenario.weights,
        hooks=scenario.hooks,
        patches=(*patches, *scenario.patches),
    )


def record(
    scenario: Scenario,
    cluster: LocalSentinelCluster,
    plan: Plan,
    *,
    target: str,
    context: str = "spawn",
) -> tuple[History, list[Event], float]:
    """The clients run ``before`` seconds, the nemesis strikes ``target`` (and is over), they
    run ``after`` more, stop, and the topology settles: the history, the nemesis's events and
    how long the settling took."""
    recorder = Recorder(plan, context=context)
    ctx = nemeses.Context(cluster, target, recorder)
    strike = scenario.strike or nemeses.NEMESES[scenario.nemesis]
    recorder.start()
    try:
        try:
            time.sleep(scenario.before)
            nemeses.run(scenario.nemesis, strike, ctx)
            time.sleep(scenario.after)
        finally:
            recorder.stop()
            cluster.clear_faults()
        settled = settle(cluster, demote=True)  # the clients have stopped
    except BaseException:
        recorder.abort()
        raise
    return recorder.finish(), ctx.events, settled


def judged(scenario: Scenario, history: History, modes: Modes, settled: float) -> Verdict:
    """The checker's verdict on ``history`` by the scenario's rules, printed."""
    verdict = check(history, modes, scenario.rules)
    verdict.figures["settled ms"] = round(settled * 1000)
    print(f"{scenario.name}: {verdict.report()}", file=sys.stderr)
    return verdict
