"""History scenarios of ``sentinel_reshard --from-previous-cache`` (issue 35): the migration
that empties the previous cache runs while 2 processes of 4 threads read, write and delete the
same hot keys through the adopting Django backend; a variant lands a planned failover of one of
the new cache's shards inside a migration batch (after its read of the old cache, before its
copies). Every op judged by the checker's rules; the final state read through the cache, from
each master and from the old server, which must hold none of the hot keys. A planted fault in
the migration process (its copies written over whatever is there) shows the net can fail. The
long versions (``SENTINEL_CACHE_HISTORY_SCALE``, default 4 there) run under ``make chaos``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sentinel_cache.testing import LocalSentinelCluster

from . import nemeses
from .nemeses_features import ADOPTING_PREFIX, OLD, Feature, old_entry, prefill_old
from .nemeses_previous import MigrationProcess, Outcome, migration_strike, run_migration_feature
from .recorder import StepHook, Workload
from .scenarios import TOPOLOGY, Scenario, long_scale, seed

pytestmark = [pytest.mark.history, pytest.mark.failover]


@pytest.fixture(scope="module")
def topology(server_kind: str) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(**TOPOLOGY) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def old_server(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """The server the site ran on before: one plain node (its sentinel unused)."""
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as cluster:
        yield cluster


#: Reads, writes and deletes of keys the old cache holds, while the migration moves them.
MIGRATING = {
    "get": 6,
    "get_many": 2,
    "delete": 3,
    "delete_many": 1,
    "set": 3,
    "set_many": 1,
    "add": 1,
    "incr": 1,
}
#: The hot keys: more than the clients touch before the migration's batches reach them.
KEYS = 600
#: The migration's copies of one batch (``Adopter._written``): the planned failover lands
#: there, after the batch read the old cache and before its copies are sent.
WRITTEN = "sentinel_cache.core.admin.reshard.previous:Adopter._written"
COPIES = "sentinel_cache.core.admin.reshard.previous:_copies"


def migrating(
    old: LocalSentinelCluster, name: str, factor: float = 1.0
) -> tuple[Feature, MigrationProcess]:
    """The scenario ``name`` and its migration process (built when run: the process is set
    up against this run's options); ``factor``: the long version's (more threads, more keys,
    more traffic after the migration)."""
    address = old.master_address(old.master_names[0])
    options = {OLD: old_entry(address)}
    traffic = {"options": options, "weights": MIGRATING, "before": 0.0, "after": 1.0}
    if name == "plain":
        process = MigrationProcess([], {})
        scenario = Scenario(
            "adoption, --from-previous-cache running",
            adapter="django adopting",
            nemesis="--from-previous-cache",
            strike=migration_strike(process),
            **traffic,  # type: ignore[arg-type]
        )
    elif name == "failover":
        process = MigrationProcess([], {}, hooks=(StepHook("copy", WRITTEN),))
        scenario = Scenario(
            "adoption, --from-previous-cache, planned failover inside a migration batch",
            adapter="django adopting",
            nemesis="--from-previous-cache, planned failover inside a batch",
            strike=migration_strike(process, nemeses.planned_failover, step="copy"),
            **traffic,  # type: ignore[arg-type]
        )
    else:
        assert name == "planted", name
        process = MigrationProcess(
            [],
            {},
            patches=(
                (COPIES, "history.planted_features:copies_over"),
                (WRITTEN, "history.planted_features:written_late"),
            ),
        )
        scenario = Scenario(
            "planted: --from-previous-cache copies over writes and deletes",
            adapter="django adopting",
            nemesis="--from-previous-cache",
            strike=migration_strike(process),
            **traffic,  # type: ignore[arg-type]
        )
    feature = Feature(scenario.scaled(factor), old=address, keys=round(KEYS * factor))
    return feature, process


def _run(feature: Feature, process: MigrationProcess, cluster: LocalSentinelCluster) -> Outcome:
    return run_migration_feature(feature, cluster, seed(), process)


@pytest.fixture(scope="module")
def old_sentinel(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """The site's old cache behind Sentinel: one master, one replica, one sentinel."""
    with LocalSentinelCluster(shards=1, replicas=1, sentinels=1) as cluster:
        yield cluster


def sentinel_old_entry(old: LocalSentinelCluster) -> dict[str, Any]:
    """django-redis's ``SentinelClient`` on ``old`` (our KEY_PREFIX, no expiry)."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{old.master_names[0]}/0",
        "KEY_PREFIX": ADOPTING_PREFIX,
        "TIMEOUT": None,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": [tuple(a) for a in old.sentinel_addresses],
            "SOCKET_TIMEOUT": 0.5,
        },
    }


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.xfail(
    strict=True,
    reason="a limitation (docs/migration.md, What is not guaranteed): the old cache's clients "
    "(django-redis SentinelClient, redis-py's sentinel pool) keep using the demoted master "
    "after a planned failover, so deletes of old copies are lost there and reads there "
    "return deleted keys (521 deletes undone, 550 old values left in one run)",
)
def test_migration_from_a_sentinel_old_cache_failing_over_inside_a_batch(
    topology: LocalSentinelCluster, old_sentinel: LocalSentinelCluster
) -> None:
    """The old cache is a django-redis ``SentinelClient``: its master fails over (planned)
    while a batch holds what it read, so the migration's ``SCAN`` goes on against the
    promoted replica. A run that asks for another (exit 1) gets one; the old cache must end
    empty of the hot keys either way."""
    name = old_sentinel.master_names[0]
    process = MigrationProcess([], {}, hooks=(StepHook("copy", WRITTEN),))

    def old_failover(ctx: nemeses.Context) -> str:
        return "old cache " + nemeses.planned_failover(nemeses.Context(old_sentinel, name))

    scenario = Scenario(
        "adoption, --from-previous-cache, planned failover of a sentinel old cache inside a batch",
        adapter="django adopting",
        nemesis="--from-previous-cache, old cache's failover inside a batch",
        options={OLD: sentinel_old_entry(old_sentinel)},
        weights=MIGRATING,
        before=0.0,
        after=1.0,
        strike=migration_strike(process, old_failover, step="copy"),
    )
    feature = Feature(scenario, old=old_sentinel.master_address(name), keys=KEYS)
    outcome = run_migration_feature(
        feature, topology, seed(), process, lambda: old_sentinel.master_address(name)
    )
    verdict = outcome.verdict
    runs = "; ".join(run.figures() for run in outcome.runs)
    assert verdict.violations == [], f"{verdict.report()}\nmigration runs: {runs}"
    assert outcome.runs[-1].code == 0, runs
    assert outcome.left_on_old == [], f"left on the old cache: {outcome.left_on_old[:10]}; {runs}"


def _judge(outcome: Outcome) -> None:
    verdict = outcome.verdict
    runs = "; ".join(run.figures() for run in outcome.runs)
    assert verdict.figures["acked writes"] >= 50, verdict.report()
    assert verdict.violations == [], f"{verdict.report()}\nmigration runs: {runs}"
    # exit 0: complete, though the clients deleted keys its batches were copying (a key
    # deleted meanwhile is gone, not a reason to run again: tests/test_adoption_migration.py)
    assert [run.code for run in outcome.runs] == [0], runs
    assert outcome.left_on_old == [], f"left on the old cache: {outcome.left_on_old[:10]}; {runs}"


#: The CI set: about 5 s with the migration alone, 14 s with the failover inside a batch (most
#: of it waiting for the demoted master to settle).
@pytest.mark.parametrize("name", ["plain", "failover"])
def test_migration_under_traffic(
    name: str, topology: LocalSentinelCluster, old_server: LocalSentinelCluster
) -> None:
    feature, process = migrating(old_server, name)
    _judge(_run(feature, process, topology))


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.parametrize("name", ["plain", "failover"])
def test_migration_under_traffic_long(
    name: str, topology: LocalSentinelCluster, old_server: LocalSentinelCluster
) -> None:
    feature, process = migrating(old_server, name, long_scale())
    _judge(_run(feature, process, topology))


def test_planted_migration_fault_is_reported(
    topology: LocalSentinelCluster, old_server: LocalSentinelCluster
) -> None:
    """The migration's copies written over whatever ours holds (its guard off), 100 ms after
    the batch read the old cache: a client's write or delete in between is undone."""
    feature, process = migrating(old_server, "planted")
    verdict = _run(feature, process, topology).verdict
    caught = {"stale-read", "delete-undone", "lost-write"} & set(verdict.by_rule())
    assert caught, verdict.report()


def test_a_stuck_migration_fails_with_its_stacks(
    topology: LocalSentinelCluster, old_server: LocalSentinelCluster
) -> None:
    """A migration still running at its deadline fails the scenario (killed, every thread's
    stack in the message) instead of hanging it, as the first attempt's ``Pool`` did."""
    feature, _ = migrating(old_server, "plain")
    assert feature.old is not None
    workload = Workload.hot(f"stuck{seed()}", keys=5)
    prefill_old(feature.old, workload)
    options = {"MASTERS": list(topology.master_names), **feature.scenario.options}
    sentinels = [(h, p) for h, p in topology.sentinel_addresses]
    process = MigrationProcess(
        sentinels, options, patches=((WRITTEN, "history.planted_features:hangs"),), deadline=6
    )
    process.prepare()
    process.go()
    began = time.monotonic()
    with pytest.raises(AssertionError, match="still running 6s after it started") as caught:
        process.wait()
    assert time.monotonic() - began < 6 + 30  # the deadline, then the kill's join (10 s)
    assert "in stuck" in str(caught.value) and "in migrate_previous" in str(caught.value)
    assert not process.proc.is_alive()
