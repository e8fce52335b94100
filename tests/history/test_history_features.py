"""History scenarios of the features' own multi-step work (issue 35, phase 2b): resharding with
the migration running (a failover landed mid-batch, and inside an operation's own move), the
near cache with a second process writing (and a planned failover), a fork during traffic, and
Valkey 9's coordinated failover. Every operation recorded and judged by the checker's rules;
each failing run prints its seed (replay with ``SENTINEL_CACHE_HISTORY_SEED``). The long
versions (``SENTINEL_CACHE_HISTORY_SCALE``, default 4 there) run under ``make chaos``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from sentinel_cache.testing import LocalSentinelCluster

from . import nemeses
from .checker import Modes
from .nemeses_features import (
    GROWN,
    RESHARD_TOPOLOGY,
    Feature,
    migration,
    run_feature,
)
from .recorder import StepHook
from .scenarios import SCALE_ENV, TOPOLOGY, Scenario, scale, seed

pytestmark = [pytest.mark.history, pytest.mark.failover]


@pytest.fixture(scope="module")
def grown(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """Three masters (a replica each, three sentinels, the fault proxy): the ring grows from
    the first two to all three."""
    with LocalSentinelCluster(**RESHARD_TOPOLOGY) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(**TOPOLOGY) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def valkey9() -> Iterator[LocalSentinelCluster]:
    """The embedded Valkey (9.1) whatever SENTINEL_CACHE_SERVER says: the coordinated failover
    needs Valkey 9.0 or later, so this scenario runs on every CI pass instead of skipping."""
    with LocalSentinelCluster(**TOPOLOGY, server="embedded") as cluster:
        yield cluster


def _judge(feature: Feature, cluster: LocalSentinelCluster) -> None:
    verdict = run_feature(feature, cluster, seed())
    assert verdict.figures["acked writes"] >= 50, verdict.report()
    assert verdict.violations == [], verdict.report()


# ------------------------------------------------------------------ resharding

MOVES = "sentinel_cache.core.ops._sync.moves:Moves._drop_previous"
COPY = "sentinel_cache.core.ops._sync.moves:Moves._restore"
DEL = "sentinel_cache.core.ops.plans:ClientBase.del_commands"
#: Reads racing deletes of keys still on their previous owner: what tombstones are for.
MOVING_DELETES = {"get": 8, "get_many": 4, "delete": 4, "delete_many": 2, "set": 1, "incr": 1}

RESHARDING = [
    Feature(Scenario(
            "reshard, migration, no fault",
            nemesis="reshard migration",
            options=GROWN,
            strike=migration(),
        ), reshard=True),
    Feature(
        Scenario(
            "reshard, planned failover of the target inside a migration batch",
            nemesis="reshard migration, planned failover inside a batch",
            options=GROWN,
            strike=migration(nemeses.planned_failover),
        ),
        target="shard2",
        reshard=True,
    ),
    Feature(
        Scenario(
            "reshard, planned failover of a source inside a migration batch",
            nemesis="reshard migration, planned failover inside a batch",
            options=GROWN,
            strike=migration(nemeses.planned_failover, step="_dump"),
        ),
        target="shard0",
        reshard=True,
    ),
    Feature(
        Scenario(
            "reshard, planned failover of the target inside an operation's move",
            nemesis="planned failover at an operation's move",
            options=GROWN,
            hooks=(StepHook("drop", MOVES),),
            strike=nemeses.AtStep("drop", nemeses.planned_failover),
        ),
        target="shard2",
        reshard=True,
    ),
]


@pytest.mark.parametrize("feature", RESHARDING, ids=[f.name for f in RESHARDING])
def test_resharding(feature: Feature, grown: LocalSentinelCluster) -> None:
    _judge(feature, grown)


# ------------------------------------------------------------------ near cache

#: docs/near-cache.md: another writer's change is seen "within the invalidation's delivery
#: time"; the largest delivery it states (Figures: staleness max 1.76 ms, on a busy machine),
#: rounded up to 2 ms, plus the time the reader process's invalidation thread may wait for the
#: GIL: each of the process's client threads may hold it for a switch interval (5 ms) before it
#: runs (../shared/README.md, "Measuring without fooling yourself"). 22 ms with 4 threads.
NEAR_DELIVERY = 0.002 + sys.getswitchinterval() * 4
NEAR = {"NEAR_CACHE": True}
NEAR_MODES = Modes(lag=NEAR_DELIVERY, why="NEAR_CACHE delivery, docs/near-cache.md Figures")
#: Reads of hot keys a second process overwrites: the near cache keeps what is read.
NEAR_HEAVY = {"get": 12, "get_many": 3, "set": 3, "set_many": 1, "delete": 1, "incr": 1, "add": 1}

NEAR_SCENARIOS = [
    Feature(Scenario("near cache, no fault", options=NEAR, modes=NEAR_MODES, weights=NEAR_HEAVY)),
    Feature(
        Scenario(
            "near cache, planned failover",
            nemesis="planned failover",
            options=NEAR,
            modes=NEAR_MODES,
            weights=NEAR_HEAVY,
        )
    ),
]


@pytest.mark.parametrize("feature", NEAR_SCENARIOS, ids=[f.name for f in NEAR_SCENARIOS])
def test_near_cache(feature: Feature, topology: LocalSentinelCluster) -> None:
    _judge(feature, topology)


# ------------------------------------------------------------------ fork

#: Two processes forked from one whose client (near cache on) was connected and had read every
#: key: each child's threads use the inherited client, the two children's ops judged together.
FORKS = [
    Feature(
        Scenario(
            "fork, inherited client with the near cache, no fault",
            adapter="inherited",
            options=NEAR,
            modes=NEAR_MODES,
            weights=NEAR_HEAVY,
        ),
        context="fork",
    ),
    Feature(
        Scenario(
            "fork, inherited client with the near cache, planned failover",
            adapter="inherited",
            nemesis="planned failover",
            options=NEAR,
            modes=NEAR_MODES,
            weights=NEAR_HEAVY,
        ),
        context="fork",
    ),
]


@pytest.mark.parametrize("feature", FORKS, ids=[f.name for f in FORKS])
def test_fork_during_traffic(feature: Feature, topology: LocalSentinelCluster) -> None:
    _judge(feature, topology)


# ------------------------------------------------------------------ coordinated failover

COORDINATED = Feature(
    Scenario("Valkey 9, coordinated failover", nemesis="coordinated failover"),
    target="shard0",
)


def test_coordinated_failover(valkey9: LocalSentinelCluster) -> None:
    _judge(COORDINATED, valkey9)


# ------------------------------------------------------------------ the long versions

def _scaled(feature: Feature) -> Feature:
    from dataclasses import replace

    factor = scale() if SCALE_ENV in os.environ else 4.0
    return replace(feature, scenario=feature.scenario.scaled(factor))


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.parametrize("feature", RESHARDING, ids=[f.name for f in RESHARDING])
def test_resharding_long(feature: Feature, grown: LocalSentinelCluster) -> None:
    _judge(_scaled(feature), grown)


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.parametrize(
    "feature", [*NEAR_SCENARIOS, *FORKS], ids=[f.name for f in [*NEAR_SCENARIOS, *FORKS]]
)
def test_near_and_fork_long(feature: Feature, topology: LocalSentinelCluster) -> None:
    _judge(_scaled(feature), topology)


# ------------------------------------------------------------------ the net can fail

PLANTED_RESHARD = [
    (
        Feature(
            Scenario(
                "planted: previous owner not consulted, reshard",
                options=GROWN,
                patches=((MOVES, "history.planted_features:previous_not_consulted"),),
            ),
            reshard=True,
        ),
        {"delete-undone", "stale-read", "lost-write"},
    ),
    (
        Feature(
            Scenario(
                "planted: tombstones off, reshard, migration running",
                nemesis="reshard migration",
                options=GROWN,
                weights=MOVING_DELETES,
                strike=migration(),
                patches=(
                    (DEL, "history.planted_features:tombstones_off"),
                    (COPY, "history.planted_features:copy_delayed"),
                ),
            ),
            reshard=True,
            moving_keys=60,  # each moving key is one chance: its first read against a delete
        ),
        {"delete-undone", "stale-read", "lost-write"},
    ),
]

PLANTED_NEAR = [
    (
        Feature(
            Scenario(
                "planted: near-cache invalidations ignored",
                options=NEAR,
                modes=NEAR_MODES,
                weights=NEAR_HEAVY,
                patches=(
                    (
                        "sentinel_cache.core.topology.near:NearCache.invalidate",
                        "history.planted_features:invalidations_ignored",
                    ),
                ),
            )
        ),
        {"stale-read", "delete-undone"},
    ),
]


@pytest.mark.parametrize(
    ("feature", "caught_as"), PLANTED_RESHARD, ids=[f.name for f, _ in PLANTED_RESHARD]
)
def test_planted_resharding_fault_is_reported(
    feature: Feature, caught_as: set[str], grown: LocalSentinelCluster
) -> None:
    verdict = run_feature(feature, grown, seed())
    assert caught_as & set(verdict.by_rule()), verdict.report()


@pytest.mark.parametrize(
    ("feature", "caught_as"), PLANTED_NEAR, ids=[f.name for f, _ in PLANTED_NEAR]
)
def test_planted_near_cache_fault_is_reported(
    feature: Feature, caught_as: set[str], topology: LocalSentinelCluster
) -> None:
    verdict = run_feature(feature, topology, seed())
    assert caught_as & set(verdict.by_rule()), verdict.report()
