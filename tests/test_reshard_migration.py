"""Resharding (issue 14): planning a change and the migration that empties the previous owners
(``sentinel_cache.core.admin.reshard``), against real topologies: appending, removing and reweighting;
readers and writers during the migration; TTLs; a failover and a killed master in the middle; a
killed migration resumed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from threads import Workers

from sentinel_cache import ConfigurationError
from sentinel_cache.core.admin import reshard
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.ring import HashRing
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

ClusterFactory = Callable[..., LocalSentinelCluster]

KEYS = [f"mig:{n}" for n in range(3000)]
TTL = 600  # seconds, for most keys
PERSISTENT = KEYS[::10]  # every tenth key has no expiry


def core_for(
    cluster: LocalSentinelCluster, masters: list[str], **options: Any
) -> ShardedSentinelPool:
    options.setdefault("listeners", False)
    return ShardedSentinelPool(masters, cluster.sentinel_addresses, **options)


def value(key: str, version: int = 0) -> str:
    return f"{key}={version}"


def place(cluster: LocalSentinelCluster, masters: list[str], **options: Any) -> float:
    """Flush every node, then write every key under ``masters``; returns when it was written."""
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            node.flushall()
    core = core_for(cluster, masters, **options)
    try:
        client = CacheClient(core, Codec())
        persistent = set(PERSISTENT)
        client.set_many({k: value(k) for k in KEYS if k not in persistent}, TTL)
        client.set_many({k: value(k) for k in PERSISTENT}, None)
        return time.monotonic()
    finally:
        core.close()


def locations(cluster: LocalSentinelCluster) -> dict[str, list[str]]:
    """Key -> the master names whose current master holds it."""
    found: dict[str, list[str]] = {}
    for name in cluster.master_names:
        with cluster.node_client(cluster.master_address(name)) as node:
            for key in node.scan_iter(count=1000):
                found.setdefault(key.decode(), []).append(name)
    return found


def owner_names(masters: list[str], weights: list[int] | None = None) -> dict[str, str]:
    ring = HashRing(weights or [1] * len(masters))
    return {key: masters[ring.shard_index(key)] for key in KEYS}


def expected_pairs(
    before: list[str], after: list[str], before_w: list[int] | None, after_w: list[int] | None
) -> dict[tuple[str, str], int]:
    old, new = owner_names(before, before_w), owner_names(after, after_w)
    pairs: dict[tuple[str, str], int] = {}
    for key in KEYS:
        if old[key] != new[key]:
            pairs[(old[key], new[key])] = pairs.get((old[key], new[key]), 0) + 1
    return pairs


def assert_settled(
    cluster: LocalSentinelCluster,
    masters: list[str],
    weights: list[int] | None = None,
    values: dict[str, str] | None = None,
) -> None:
    """Every key exactly once, on its owner under ``masters``, with its value: none lost, no
    copy left anywhere else."""
    owners = owner_names(masters, weights)
    where = locations(cluster)
    assert set(where) == set(KEYS), f"lost: {sorted(set(KEYS) - set(where))[:5]}"
    misplaced = {k: v for k, v in where.items() if v != [owners[k]]}
    assert not misplaced, (
        f"{len(misplaced)} keys not only on their owner: {list(misplaced.items())[:5]}"
    )
    core = core_for(cluster, masters, weights=weights)
    try:
        got = CacheClient(core, Codec()).get_many(KEYS)
    finally:
        core.close()
    assert got == (values or {k: value(k) for k in KEYS})


# -- what the rings say (no server) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "before_w", "after_w"),
    [
        (["a", "b"], ["a", "b", "c"], None, None),
        (["a", "b", "c"], ["a", "b"], None, None),
        (["a", "b"], ["a", "b"], [1, 1], [1, 3]),
        (["a", "b", "c"], ["a", "d", "c"], None, None),
    ],
    ids=["append", "remove-last", "reweight", "swap-name-behind-position"],
)
def test_minimal_changes_are_not_warned_about(
    before: list[str], after: list[str], before_w: list[int] | None, after_w: list[int] | None
) -> None:
    moves = reshard.movement(before, before_w, after, after_w)
    assert moves.fraction == pytest.approx(moves.minimal, abs=1e-9)
    assert not moves.excessive and moves.warnings == () and moves.shifted == ()
    # The rings' fraction is what keys see: compare with 20,000 keys placed by both rings.
    old = HashRing(before_w or [1] * len(before))
    new = HashRing(after_w or [1] * len(after))
    keys = [f"probe:{n}" for n in range(20000)]
    moved = sum(before[old.shard_index(k)] != after[new.shard_index(k)] for k in keys)
    assert moved / len(keys) == pytest.approx(moves.fraction, abs=0.015)
    if after == ["a", "b", "c"]:  # an append moves about 1/(N+1), all to the new master
        assert moves.fraction == pytest.approx(1 / 3, abs=0.05)
        assert {(a, b) for a, b, _ in moves.pairs} == {("a", "c"), ("b", "c")}


def test_removing_a_master_in_the_middle_is_warned_about() -> None:
    moves = reshard.movement(["a", "b", "c", "d"], None, ["a", "c", "d"])
    assert moves.excessive and moves.fraction > moves.minimal + 0.2
    assert [(s.name, s.previous, s.current) for s in moves.shifted] == [("c", 2, 1), ("d", 3, 2)]
    text = "\n".join(moves.warnings)
    assert "b is removed from the middle" in text and "remove the last master instead" in text
    assert "Sentinel failover" in text
    # The suggestion keeps c at its position and puts d into b's: less moves.
    assert moves.suggestion is not None
    names, weights, fraction = moves.suggestion
    assert names == ("a", "d", "c") and weights == (1, 1, 1) and fraction < moves.fraction - 0.1


@pytest.mark.parametrize(
    ("after", "advice", "suggested"),
    [
        (["a", "c", "b"], "keep the previous order", ("a", "b", "c")),
        (["a", "d", "b", "c"], "append new masters at the end", ("a", "b", "c", "d")),
    ],
    ids=["reorder", "insert-in-the-middle"],
)
def test_shifting_positions_is_warned_about_with_what_to_do(
    after: list[str], advice: str, suggested: tuple[str, ...]
) -> None:
    moves = reshard.movement(["a", "b", "c"], None, after)
    assert moves.excessive
    assert any(advice in w for w in moves.warnings), moves.warnings
    assert moves.suggestion is not None and moves.suggestion[0] == suggested
    assert moves.suggestion[2] == pytest.approx(
        reshard.movement(["a", "b", "c"], None, list(suggested)).fraction
    )
    assert moves.to_dict()["suggestion"]["masters"] == list(suggested)


def test_owner_lookup_is_the_core_ring() -> None:
    core = ShardedSentinelPool(
        ["s0", "s1", "s2"], ["127.0.0.1:1"], weights=[1, 2, 3], listeners=False
    )
    try:
        owner = reshard.owner_lookup(core)
        for n in range(5000):
            key = f"k{n}:{'é' * (n % 3)}".encode()
            assert owner(key) is core.shard_for(key)
        assert owner("a str key") is core.shard_for("a str key")
    finally:
        core.close()


def test_without_previous_masters_it_is_a_configuration_error(
    three: LocalSentinelCluster,
) -> None:
    core = core_for(three, ["shard0", "shard1"])
    try:
        for call in (reshard.migrate, reshard.plan):
            with pytest.raises(ConfigurationError) as caught:
                call(core)
            assert caught.value.option == "PREVIOUS_MASTERS"
            assert "PREVIOUS_MASTERS" in str(caught.value)
    finally:
        core.close()


# -- planning and migrating on a real topology -------------------------------------------------


def test_plan_counts_what_the_migration_then_moves(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    place(three, before)
    expected = expected_pairs(before, after, None, None)
    core = core_for(three, after, previous_masters=before)
    try:
        full = reshard.plan(core)
        assert {(f.source, f.target): f.keys for f in full.flows} == expected
        assert full.complete and full.scanned == len(KEYS) and full.sample is None
        assert full.moving == sum(expected.values())
        assert full.fraction == pytest.approx(full.movement.fraction, abs=0.05)
        assert all(s.complete and s.keys == s.scanned for s in full.shards)
        placed = owner_names(before)
        assert locations(three) == {k: [placed[k]] for k in KEYS}  # nothing moved
        sampled = reshard.plan(core, sample=200)
        assert all(s.scanned == 200 and not s.complete for s in sampled.shards)
        assert sampled.scanned == 400 and sampled.complete
        assert sampled.estimated == pytest.approx(full.moving, rel=0.25)
        data = sampled.to_dict()
        assert data["dry_run"] is True and data["sample"] == 200
        assert {(f["from"], f["to"]) for f in data["flows"]} == set(expected)
        report = reshard.migrate(core)
        assert {(p.source, p.target): p.moved for p in report.pairs} == expected
    finally:
        core.close()


@pytest.mark.parametrize(
    ("before", "after", "before_w", "after_w"),
    [
        (["shard0", "shard1"], ["shard0", "shard1", "shard2"], None, None),
        (["shard0", "shard1", "shard2"], ["shard0", "shard1"], None, None),
        (["shard0", "shard1", "shard2"], ["shard0", "shard2"], None, None),
        (["shard0", "shard1"], ["shard0", "shard1"], [1, 1], [1, 3]),
    ],
    ids=["append", "remove-last", "remove-middle", "reweight"],
)
def test_migration_moves_every_key_to_its_owner_with_its_ttl(
    three: LocalSentinelCluster,
    before: list[str],
    after: list[str],
    before_w: list[int] | None,
    after_w: list[int] | None,
) -> None:
    written = place(three, before, weights=before_w)
    expected = expected_pairs(before, after, before_w, after_w)
    core = core_for(
        three, after, weights=after_w, previous_masters=before, previous_weights=before_w
    )
    try:
        report = reshard.migrate(core, batch=200)
        assert report.complete and report.errors == ()
        assert report.moved == sum(expected.values()) > 0
        assert {(p.source, p.target): p.moved for p in report.pairs} == expected
        assert report.already_present == report.expired == 0
        assert [s.name for s in report.shards] == before
        assert all(s.complete and s.restarts == 0 for s in report.shards)
        assert_settled(three, after, after_w)
        # TTLs kept within a second; keys without expiry still without.
        new = owner_names(after, after_w)
        old = owner_names(before, before_w)
        moved = [k for k in KEYS if old[k] != new[k]]
        with_ttl = [k for k in moved if k not in set(PERSISTENT)][:300]
        persistent = [k for k in moved if k in set(PERSISTENT)]
        assert persistent
        for key in with_ttl + persistent:
            with three.node_client(three.master_address(new[key])) as node:
                ttl = node.pttl(key)
            elapsed_ms = (time.monotonic() - written) * 1000  # at this read, not the first
            if key in persistent:
                assert ttl == -1, key
            else:
                assert abs(ttl - (TTL * 1000 - elapsed_ms)) <= 1000, (key, ttl, elapsed_ms)
        again = reshard.migrate(core)  # idempotent: nothing left to move
        assert again.complete and again.moved == again.already_present == again.expired == 0
        assert again.scanned > 0
    finally:
        core.close()


def test_newer_values_win_and_vanished_keys_are_counted(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    place(three, before)
    old, new = owner_names(before), owner_names(after)
    moving = [k for k in KEYS if old[k] != new[k]]
    newer = moving[:25]
    codec = Codec()
    with three.node_client(three.master_address("shard2")) as node:
        for key in newer:  # written through the new ring, its DEL of the old copy not yet done
            node.set(key, codec.dumps(value(key, 1)), ex=TTL)
    core = core_for(three, after, previous_masters=before)
    try:
        report = reshard.migrate(core)
        assert report.complete
        assert report.already_present == len(newer)
        assert report.moved == len(moving) - len(newer)
        values = {k: value(k, 1 if k in newer else 0) for k in KEYS}
        assert_settled(three, after, values=values)
        # A key scanned, then gone before its DUMP (expired): counted as expired; one already on
        # its owner (a reader moved it): already present.
        migration = reshard.Migration(
            core,
            match="*",
            rate=None,
            batch=10,
            progress=None,
            retry_for=1,
            delete_delay=0,
        )
        tally = reshard.Tally(core.shard("shard0"), 0, False, None)
        migration.tallies.append(tally)
        shard2 = core.shard("shard2")
        migration._move(tally, [(moving[0].encode(), shard2), (b"mig:nowhere", shard2)])
        assert (tally.moved, tally.already_present, tally.expired) == (0, 1, 1)
    finally:
        core.close()


def test_a_reader_never_misses_during_the_migration(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    place(three, before)
    core = core_for(three, after, previous_masters=before)
    reader_core = core_for(three, after, previous_masters=before)
    workers = Workers(timeout=30)
    misses: list[str] = []
    passes = [0]

    def read() -> None:
        client = CacheClient(reader_core, Codec())
        order = list(KEYS)
        rng = random.Random(7)
        while not workers.stop.is_set():
            rng.shuffle(order)
            for start in range(0, len(order), 50):
                batch = order[start : start + 50]
                # Every other batch key by key, the others in one get_many.
                single = start % 100 == 0
                got = {k: client.get(k) for k in batch} if single else client.get_many(batch)
                misses.extend(k for k in batch if got.get(k) != value(k))
            passes[0] += 1

    waits = [0]

    def progress(p: reshard.Progress) -> None:
        # The first two batches wait for a whole pass of the reader each, so every key is read
        # at least twice while the migration is under way, however slow the machine is.
        if p.done or waits[0] >= 2:
            return
        waits[0] += 1
        target, deadline = passes[0] + 1, time.monotonic() + 60
        while passes[0] < target:
            assert time.monotonic() < deadline, "the reader made no pass in 60 s"
            time.sleep(0.005)

    try:
        with workers:
            workers.spawn(read, name="reader")
            report = reshard.migrate(core, rate=1500, batch=100, progress=progress)
            read_during = passes[0]
        assert misses == []
        assert waits[0] == 2 and read_during >= 2, "every key read twice during the migration"
        # The reader's passes copy keys to their owners too: the migration finds them there.
        assert report.complete and report.moved + report.already_present > 0
        expected = sum(expected_pairs(before, after, None, None).values())
        assert report.moved + report.already_present + report.expired <= expected
        assert_settled(three, after)
    finally:
        core.close()
        reader_core.close()


def test_a_writer_during_the_migration_ends_with_its_last_values(
    three: LocalSentinelCluster,
) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    place(three, before)
    old, new = owner_names(before), owner_names(after)
    hot = [k for k in KEYS if old[k] != new[k]][::3] + KEYS[:100]
    core = core_for(three, after, previous_masters=before)
    writer_core = core_for(three, after, previous_masters=before)
    workers = Workers(timeout=30)
    last: dict[str, str] = {}

    def write() -> None:
        client = CacheClient(writer_core, Codec())
        version = 0
        rng = random.Random(3)
        while not workers.stop.is_set():
            version += 1
            chosen = rng.sample(hot, 20)
            if version % 2:
                for key in chosen:
                    client.set(key, value(key, version), TTL)
            else:
                client.set_many({key: value(key, version) for key in chosen}, TTL)
            last.update({key: value(key, version) for key in chosen})

    try:
        with workers:
            workers.spawn(write, name="writer")
            time.sleep(0.05)
            report = reshard.migrate(core, rate=4000, batch=100)
        assert report.complete and len(last) > 100
        assert_settled(three, after, values={k: last.get(k, value(k)) for k in KEYS})
    finally:
        core.close()
        writer_core.close()


def test_rate_limit_and_progress(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    place(three, before)
    seen: list[reshard.Progress] = []
    core = core_for(three, after, previous_masters=before)
    try:
        began = time.monotonic()
        report = reshard.migrate(core, rate=2500, batch=300, progress=seen.append)
        elapsed = time.monotonic() - began
        # A token bucket: one burst of a tenth of a second, then at most 2,500 keys a second.
        assert elapsed >= (report.moved - 250) / 2500
        assert report.rate_limit == 2500
        done = [p for p in seen if p.done]
        assert [p.shard for p in done] == before and all(p.error is None for p in done)
        last = seen[-1]
        assert last.total_moved == report.moved and last.total_scanned == report.scanned
        assert last.fraction == 1.0 and last.eta == 0
        middle = [p for p in seen if not p.done]
        assert middle and all(p.eta is not None and 0 <= p.fraction <= 1 for p in middle)
        # DBSIZE estimates (SCAN may return a key twice while the server rehashes).
        assert all(abs(p.total_keys - len(KEYS)) <= 50 for p in middle)
        first = [p.scanned for p in seen if p.shard == "shard0"]
        assert first == sorted(first)
    finally:
        core.close()


def test_an_unreachable_departing_master_is_reported_not_fatal(
    three: LocalSentinelCluster,
) -> None:
    place(three, ["shard0", "shard1"])
    core = core_for(three, ["shard0", "shard1"], previous_masters=["shard0", "shard1", "ghost"])
    try:
        report = reshard.migrate(core, retry_for=0.3)
        assert not report.complete
        assert [s.name for s in report.shards if not s.complete] == ["ghost"]
        assert report.errors and report.errors[0].startswith("ghost: ")
        assert report.to_dict()["complete"] is False
        text = reshard.render_report(report)
        assert "INCOMPLETE" in text and "ghost" in text
    finally:
        core.close()


def test_an_unavailable_owner_gives_the_source_up_and_loses_nothing(
    three: LocalSentinelCluster,
) -> None:
    before = ["shard0", "shard1"]
    place(three, before)
    placed = owner_names(before)
    core = core_for(three, [*before, "ghost"], previous_masters=before)
    try:
        report = reshard.migrate(core, retry_for=0.3)
        assert not report.complete
        assert {s.name for s in report.shards if not s.complete} == set(before)
        assert all("ghost" in e for e in report.errors), report.errors
        assert report.moved == 0
        # Nothing was deleted anywhere: every key still on its previous owner, readable.
        assert locations(three) == {k: [placed[k]] for k in KEYS}
    finally:
        core.close()


# -- failures in the middle ---------------------------------------------------------------------


@pytest.mark.failover
@pytest.mark.parametrize("how", ["failover", "kill"])
def test_a_source_shard_failing_over_in_the_middle(make_cluster: ClusterFactory, how: str) -> None:
    cluster = make_cluster(shards=3, replicas=1, sentinels=1)
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    place(cluster, before)
    cluster.wait_for_replication()
    core = core_for(cluster, after, previous_masters=before, listeners=True)
    switched: list[Any] = []

    def progress(p: reshard.Progress) -> None:
        if p.shard == "shard1" and not switched and p.scanned >= 200:
            old = cluster.master_address("shard1")
            if how == "failover":
                cluster.failover("shard1")
            else:
                cluster.kill_master("shard1")
            switched.append(cluster.wait_for_master_change("shard1", old))

    try:
        report = reshard.migrate(core, batch=100, progress=progress, retry_for=30)
        assert switched, "shard1 switched during its scan"
        shard1 = next(s for s in report.shards if s.name == "shard1")
        assert report.complete, report.errors
        assert shard1.restarts >= 1  # the scan began again on the new master
        assert core.shard("shard1").address == switched[0]
        assert_settled(cluster, after)
    finally:
        core.close()


def test_a_killed_migration_is_resumed(three: LocalSentinelCluster) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    place(three, before)
    expected = sum(expected_pairs(before, after, None, None).values())
    sentinels = [f"{h}:{p}" for h, p in three.sentinel_addresses]
    script = (
        "import sys\n"
        "from sentinel_cache.core.admin import reshard\n"
        "from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool\n"
        f"core = ShardedSentinelPool({after!r}, {sentinels!r}, previous_masters={before!r})\n"
        "reshard.migrate(core, rate=600, batch=50, progress=lambda p: print(p.total_moved, "
        "flush=True))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if int(line) >= 200:
                break
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    with three.node_client(three.master_address("shard2")) as node:
        there = node.dbsize()
    assert 0 < there < expected, "killed part-way"
    core = core_for(three, after, previous_masters=before)
    try:
        report = reshard.migrate(core)
        assert report.complete
        assert report.moved == expected - there  # only what was left
        assert report.already_present <= there  # restored, old copy not deleted yet at the kill
        assert_settled(three, after)
    finally:
        core.close()


def test_ctrl_c_stops_the_helper_thread_and_a_new_run_finishes(
    three: LocalSentinelCluster,
) -> None:
    before, after = ["shard0", "shard1"], ["shard0", "shard1", "shard2"]
    place(three, before)

    def interrupt(p: reshard.Progress) -> None:
        if p.total_moved:
            raise KeyboardInterrupt

    core = core_for(three, after, previous_masters=before)
    try:
        with pytest.raises(KeyboardInterrupt):
            reshard.migrate(core, batch=100, progress=interrupt)
        deadline = time.monotonic() + 5
        while any(t.name == "sentinel-reshard" for t in threading.enumerate()):
            assert time.monotonic() < deadline, "the helper thread ended"
            time.sleep(0.01)
        report = reshard.migrate(core)
        assert report.complete
        expected = sum(expected_pairs(before, after, None, None).values())
        # What the first run restored stays; its old copies are found and deleted now.
        assert report.moved < expected and report.moved + report.already_present <= expected
        assert_settled(three, after)
    finally:
        core.close()


# -- rendering ---------------------------------------------------------------------------------


def _progress(**changes: Any) -> reshard.Progress:
    base: dict[str, Any] = dict(
        shard="shard0",
        position=0,
        shards=2,
        scanned=500,
        moved=170,
        keys=1000,
        total_scanned=500,
        total_moved=170,
        total_keys=2000,
        elapsed=1.0,
        rate=170.0,
        scan_rate=500.0,
        eta=3.0,
    )
    base.update(changes)
    return reshard.Progress(**base)


def test_progress_bar_on_a_terminal_and_lines_otherwise() -> None:
    out: list[str] = []
    bar = reshard.ProgressPrinter(out.append, tty=True, width=10)
    bar(_progress())
    bar(_progress(scanned=1000, total_scanned=1000, done=True))
    bar.close()
    assert out[0].startswith("\r[##--------]  25% shard 1/2 shard0: scanned 500/~1,000")
    assert "170 keys/s" in out[0] and "ETA 0:03" in out[0]
    assert out[1].startswith("\r[#####-----]  50%") and out[-1] == "\n"

    lines: list[str] = []
    now = [0.0]
    plain = reshard.ProgressPrinter(lines.append, tty=False, interval=5, clock=lambda: now[0])
    plain(_progress())
    now[0] = 1.0
    plain(_progress(scanned=600))  # within the interval: nothing
    plain(_progress(done=True, error="ShardUnavailableError: down"))  # a shard's end: always
    plain.close()
    assert len(lines) == 2 and all("\r" not in line for line in lines)
    assert lines[1].endswith("(given up: ShardUnavailableError: down)\n")
