"""OUTAGE_READS' staleness (issue 36): a replica whose stream from the master was cut silently
(no FIN, no RST: its ``ROLE`` still says ``connected`` for the replica's ``repl-timeout``) kept
answering outage reads with what it had before the cut, 4 s and 377 writes old in the trial.
Now an outage read goes only to a replica at most ``OUTAGE_READS_MAX_LAG`` behind the master
(replication offsets, see ``core/topology/replicas.py``): the fault proxy cuts the master's
stream to its replica, writes go on, the master is SIGKILLed, and every value an outage read
returns must hold every write acknowledged more than the bound before the kill. ``-s`` prints
the figures."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from waiting import wait_until

from sentinel_cache.core.config import PoolConfig
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ShardUnavailableError
from sentinel_cache.testing import LocalSentinelCluster

pytestmark = pytest.mark.failover

ClusterFactory = Callable[..., LocalSentinelCluster]
DOWN_AFTER_MS = 1000
#: The bound under test: the default's.
MAX_LAG = PoolConfig.__dataclass_fields__["outage_reads_max_lag"].default
#: A write every 5 ms, as tests/test_outage.py's.
PACE = 0.005


@dataclass
class Outage:
    """One crash: when each write was acknowledged, and what the outage reads saw."""

    acked: list[float] = field(default_factory=list)  # acked[i]: write of value i answered
    killed_at: float = 0.0
    served: list[int] = field(default_factory=list)  # values outage reads returned
    refused: list[str] = field(default_factory=list)  # their errors, when none was fresh

    def staleness(self, value: int) -> float:
        """How long before the kill the first write a read of ``value`` misses was
        acknowledged (0: it misses none). The master applied it earlier still."""
        if value + 1 >= len(self.acked):
            return 0.0
        return self.killed_at - self.acked[value + 1]

    def summary(self) -> str:
        stale = [self.staleness(v) for v in self.served]
        missed = [len(self.acked) - 1 - v for v in self.served]
        return (
            f"{len(self.acked)} writes; {len(self.served)} outage reads answered, oldest "
            f"{max(stale, default=0.0):.2f} s behind the kill ({max(missed, default=0)} writes), "
            f"{len(self.refused)} refused"
        )


def crash_with_cut(make_cluster: ClusterFactory, cut_before: float | None) -> Outage:
    """Write through the crash of shard 0's master, its stream to the replica cut
    ``cut_before`` seconds before the kill (None: no cut), then read until the switch."""
    cluster = make_cluster(
        shards=1, replicas=1, sentinels=3, down_after_ms=DOWN_AFTER_MS, faults=True
    )
    name = cluster.master_names[0]
    # OUTAGE_HOLD 0: a read no replica may answer raises at once, so it is seen as refused.
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, outage_hold=0)
    client = CacheClient(pool, Codec())
    shard = pool.shards[0]
    outage = Outage()
    key = "staleness"

    def write_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            client.set(key, len(outage.acked), None)
            outage.acked.append(time.monotonic())
            time.sleep(PACE)

    try:
        pool.discover()
        replica = shard.replicas[0]
        write_for(0.5)
        # The replica dated by the housekeeper (a master check, then the replica's) and found
        # current: the bound is measured from there, not from a start-up without figures.
        wait_until(
            lambda: (
                shard.replica_lag(replica, shard.generation) < MAX_LAG / 3
                and bool(shard.outage_replicas(shard.generation))
            ),
            30,
            "the replica seen in step and current",
        )
        if cut_before is not None:
            cluster.partition(name, peers=[replica], direction="outbound")
            write_for(cut_before)
        else:
            write_for(0.5)
        generation = shard.generation
        outage.killed_at = time.monotonic()
        cluster.kill_master(name)
        deadline = time.monotonic() + 30
        while shard.generation == generation:
            assert time.monotonic() < deadline, "no switch within 30 s of the kill"
            answered = shard.outage_reads
            try:
                value = client.get(key)
            except ShardUnavailableError as exc:
                outage.refused.append(str(exc))
            else:
                if shard.outage_reads > answered:  # else the new master answered
                    outage.served.append(value)
            time.sleep(0.01)
    finally:
        pool.close()
        if cut_before is not None:
            cluster.heal()
    return outage


@pytest.mark.parametrize(
    "cut_before", [None, 1.0, MAX_LAG + 2.0], ids=["no-cut", "cut-1s", "cut-5s"]
)
def test_outage_reads_are_never_older_than_the_bound(
    make_cluster: ClusterFactory, cut_before: float | None
) -> None:
    outage = crash_with_cut(make_cluster, cut_before)
    print(
        f"\nSIGKILL, stream cut {cut_before} s before, OUTAGE_READS_MAX_LAG {MAX_LAG:g}: "
        f"{outage.summary()}"
    )
    too_old = [(v, round(outage.staleness(v), 3)) for v in outage.served]
    too_old = [(v, s) for v, s in too_old if s > MAX_LAG]
    assert not too_old, f"outage reads older than {MAX_LAG} s: {too_old[:5]}"
    if cut_before is None:
        # A current replica still answers: the bound refuses only what it must.
        assert outage.served and not outage.refused, outage.refused[:3]
    if cut_before is not None and cut_before > MAX_LAG:
        # Every read during the outage was refused, and its error says why.
        assert not outage.served and outage.refused
        assert all("OUTAGE_READS_MAX_LAG" in e for e in outage.refused), outage.refused[:3]
