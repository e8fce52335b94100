"""The Django backend under real application servers, through real failovers.

gunicorn (``--preload``, 3 sync workers) and uvicorn (2 workers, async views) serve the tiny
app of this directory (``shapes_*.py``) on a private topology (2 shards, a replica each,
3 sentinels) while a client thread sends requests back to back. Through a planned failover
(``SENTINEL FAILOVER``) and a SIGKILL of a master we count failed requests, and we check on
the sentinels' side (``CLIENT LIST``, sockets mapped to processes through ``/proc``) that each
worker has its own listeners and nobody else does.

What the backend promises, and so what is asserted:

* **Planned failover**: 0 failed requests. The write fence holds writes from the promotion
  events to the switch (``FAILOVER_HOLD``, 2 s), so nothing reaches a master being abandoned.
* **SIGKILL of a master**: the shard has no master until the sentinels promote its replica
  (``down-after-milliseconds``, 1 s here, then the vote and the promotion: 2 to 4 s locally).
  Meanwhile the backend either raises (``IGNORE_EXCEPTIONS`` off: gunicorn here; the view
  answers 503, a *failed* request) or fails open (on: uvicorn here; ``set`` returns False,
  ``get`` misses, the request still succeeds, *degraded*). Either way the bound is: only the
  killed shard's keys are affected, nothing before the kill, nothing later than
  ``RECOVERY_GRACE`` after the sentinels agree on the new master (the listeners learn it from
  ``+switch-master`` within milliseconds; the grace is for a loaded CI machine), each failure
  is fast (the dead node refuses connections), and no read ever returns another value.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from shapes_support import (
    ServerProcess,
    Traffic,
    all_listeners_connected,
    free_port,
    held_by,
    listener_owners,
    probe_workers,
    python_module,
    server_env,
    socket_holders,
)

from sentinel_cache.core.config import PoolConfig
from sentinel_cache.testing import LocalSentinelCluster

pytestmark = [pytest.mark.failover, pytest.mark.server]

SENTINELS = 3
DOWN_AFTER_MS = 1000
GUNICORN_WORKERS = 3
UVICORN_WORKERS = 2
#: Clients at once in the connection count (about 12 requests in flight per worker).
CONCURRENT = 24
# After the sentinels agree on the new master, how long stragglers may still fail: the
# listeners switch within milliseconds; the rest is slack for a shared 2-core CI machine.
RECOVERY_GRACE = 1.0
# A failure on a refused connection is fast; two SOCKET_TIMEOUTs (the app's 1 s) would mean a
# call waited on a dead node.
SLOWEST_FAILURE = 2.0
BASELINE_REQUESTS = 10
AFTER_SWITCH = 1.5  # seconds of traffic kept after the switch, to see the recovery


@dataclass
class Served:
    """A running server on its own topology."""

    cluster: LocalSentinelCluster
    server: ServerProcess
    workers: int
    work_path: str
    status_path: str

    @property
    def port(self) -> int:
        return self.server.port

    def group_pids(self) -> list[int]:
        """The server and every process it started (workers, multiprocessing's helpers)."""
        return self.server.group_pids()


def gunicorn_command(port: int) -> list[str]:
    """gunicorn --preload with GUNICORN_WORKERS sync workers on ``port``."""
    return python_module(
        "gunicorn",
        "--preload",
        "--workers",
        str(GUNICORN_WORKERS),
        "--worker-class",
        "sync",
        "--bind",
        f"127.0.0.1:{port}",
        "--graceful-timeout",
        "2",
        "--log-level",
        "warning",
        "shapes_wsgi:application",
    )  # fmt: skip


@pytest.fixture(scope="class")
def gunicorn_served(server_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """gunicorn --preload, 3 sync workers, IGNORE_EXCEPTIONS off (the view reports raises)."""
    yield from _serve(
        tmp_path_factory.mktemp("gunicorn"),
        "gunicorn",
        gunicorn_command,
        workers=GUNICORN_WORKERS,
        ignore_exceptions=False,
        work_path="/work",
        status_path="/status",
    )


@pytest.fixture(scope="class")
def uvicorn_served(server_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """uvicorn, 2 workers, async views, IGNORE_EXCEPTIONS on (the cache fails open)."""
    yield from _serve(
        tmp_path_factory.mktemp("uvicorn"),
        "uvicorn",
        lambda port: python_module(
            "uvicorn",
            "shapes_asgi:application",
            "--workers",
            str(UVICORN_WORKERS),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
            "--timeout-graceful-shutdown",
            "2",
        ),  # fmt: skip
        workers=UVICORN_WORKERS,
        ignore_exceptions=True,
        work_path="/awork",
        status_path="/astatus",
    )


def _serve(
    tmp: Path,
    name: str,
    argv: Any,
    *,
    workers: int,
    ignore_exceptions: bool,
    work_path: str,
    status_path: str,
    outage_hold: float | None = 0.0,
) -> Iterator[Served]:
    """``outage_hold``: 0 for the shapes that test failing fast and failing open (the default
    would hold the dead shard's calls until the switch instead); None for the default's."""
    cluster = LocalSentinelCluster(
        shards=2, replicas=1, sentinels=SENTINELS, down_after_ms=DOWN_AFTER_MS
    )
    cluster.start()
    try:
        env = server_env(cluster, ignore_exceptions=ignore_exceptions, outage_hold=outage_hold)
        port = free_port()
        server = ServerProcess(name, argv(port), env, tmp / f"{name}.log")
        try:
            server.start(port)
            yield Served(cluster, server, workers, work_path, status_path)
        finally:
            server.stop()
            leftovers = server.group_pids()
            assert not leftovers, f"{name} left processes behind: {leftovers}"
    finally:
        cluster.stop()


# --------------------------------------------------------------------------- shared checks


def master_connections(served: Served) -> dict[tuple[int, str], int]:
    """(pid, master name) -> the data connections that process holds on that master (its
    ``CLIENT LIST`` read first, then the sockets, as :func:`listener_owners` does)."""
    lists = {}
    for name in served.cluster.master_names:
        with redis.Redis(*served.cluster.master_address(name)) as admin:
            lists[name] = admin.client_list()
    holders = socket_holders(served.group_pids())
    counted: dict[tuple[int, str], int] = {}
    for name, entries in lists.items():
        for entry in entries:
            for pid in held_by(holders, entry):
                counted[(pid, name)] = counted.get((pid, name), 0) + 1
    return counted


def check_listeners_per_worker(served: Served) -> dict[int, dict[str, Any]]:
    """Each worker started its core and has a connected listener per sentinel, on sockets of
    its own: one pub/sub connection per sentinel owned by each worker's pid."""
    answers = probe_workers(
        served.port, served.status_path, served.workers, until=all_listeners_connected
    )
    sentinels = {f"{h}:{p}" for h, p in served.cluster.sentinel_addresses}
    for body in answers.values():
        assert set(body["listeners"]) == sentinels, body
        assert len(body["listener_threads"]) == SENTINELS, body
    group = served.group_pids()
    assert len(answers) == served.workers and set(answers) <= set(group), (sorted(answers), group)
    owners = listener_owners(served.cluster, served.server.pid, group)
    for sentinel, per_pid in owners.items():
        for pid in answers:
            assert per_pid.get(pid) == 1, f"{sentinel}: worker {pid} holds {per_pid.get(pid)}"
    return answers


def check_pubsub_total(served: Served, role: str) -> None:
    """Exactly ``workers`` pub/sub connections on every sentinel: the parent that forked or
    spawned the workers (``role``) holds none, even if it used the cache before."""
    workers = check_listeners_per_worker(served)
    owners = listener_owners(served.cluster, served.server.pid, served.group_pids())

    def who(pid: int | None) -> str:
        if pid is None:
            return "unknown or shared"
        if pid == served.server.pid:
            return f"{role} {pid}"
        return f"worker {pid}" if pid in workers else f"other process {pid}"

    named = {
        sentinel: {who(pid): n for pid, n in per_pid.items()}
        for sentinel, per_pid in owners.items()
    }
    totals = {sentinel: sum(per_pid.values()) for sentinel, per_pid in owners.items()}
    print(f"\n{role}: sentinel pub/sub connections by owner: {named}")
    expected = {sentinel: served.workers for sentinel in owners}
    assert totals == expected, (
        f"{served.workers} workers x {SENTINELS} sentinels expected, got {totals}; by owner: "
        f"{named}"
    )


def planned_failover(served: Served, master: str) -> None:
    cluster = served.cluster
    old = cluster.master_address(master)
    with Traffic(served.port, served.work_path) as traffic:
        traffic.wait_for(BASELINE_REQUESTS)
        began = time.monotonic()
        cluster.failover(master)
        new = cluster.wait_for_master_change(master, old, timeout=20)
        switched = time.monotonic()
        traffic.wait_for(BASELINE_REQUESTS)
        time.sleep(0.3)
    during = [r for r in traffic.results if began <= r.ended and r.started <= switched]
    print(
        f"\n{served.server.name} planned failover of {master} {old} -> {new} in "
        f"{switched - began:.2f}s: {traffic.summary(began)}; {len(during)} requests during it"
    )
    failed = traffic.failed()
    assert not failed, [(r.status, r.body, r.error) for r in failed[:5]]
    assert not [r for r in traffic.results if r.field("degraded") or r.field("wrong")]
    assert during, "no request overlapped the failover"
    new_text = f"{new[0]}:{new[1]}"
    index = cluster.master_names.index(master)
    probe_workers(
        served.port,
        served.status_path,
        served.workers,
        until=lambda body: body["masters"][index] == new_text,
        timeout=5,
    )


def sigkill_failover(served: Served, master: str) -> Traffic:
    """SIGKILL ``master``'s node under traffic; checks what holds in either failure mode and
    returns the traffic for the mode-specific counting."""
    cluster = served.cluster
    index = cluster.master_names.index(master)
    with Traffic(served.port, served.work_path) as traffic:
        traffic.wait_for(BASELINE_REQUESTS)
        killed = time.monotonic()
        old = cluster.kill_master(master)
        new = cluster.wait_for_master_change(master, old, timeout=30)
        switched = time.monotonic()
        time.sleep(AFTER_SWITCH)
    affected = [r for r in traffic.results if r.failed or r.field("degraded")]
    print(
        f"\n{served.server.name} SIGKILL of {master} {old}: sentinels agreed on {new} after "
        f"{switched - killed:.2f}s (down-after {DOWN_AFTER_MS} ms); {traffic.summary(killed)}; "
        f"{len(affected)} requests affected"
    )
    assert not [r for r in traffic.results if r.field("wrong")], "a read returned another value"
    assert not [r for r in traffic.results if r.status == 0], [
        r.error for r in traffic.results if r.status == 0
    ][:5]
    for result in affected:
        assert result.ended >= killed, "a request failed before the kill"
        assert result.started <= switched + RECOVERY_GRACE, (
            f"still failing {result.started - switched:.2f}s after the sentinels switched"
        )
        shards = {entry["shard"] for entry in result.field("failures") + result.field("degraded")}
        assert shards == {index}, f"other shards affected: {result.body}"
    for result in traffic.failed():
        assert result.duration < SLOWEST_FAILURE, f"slow failure: {result.duration:.2f}s"
    recovered = [r for r in traffic.results if r.started > switched + RECOVERY_GRACE]
    assert recovered, "no request after the recovery window"
    assert all(not r.failed and not r.field("degraded") for r in recovered)
    return traffic


# --------------------------------------------------------------------------- gunicorn


class TestGunicornPreload:
    """gunicorn --preload, 3 sync workers; the app uses the cache at import (in the arbiter)."""

    def test_status_before_first_use_describes_the_worker(self, gunicorn_served: Served) -> None:
        """Runs first, before any request used the cache in a worker: what a health check
        reading ``pool.status()`` sees in a fresh worker. Fails while a forked child reports
        its parent's state (started, every listener connected) with no listener thread of
        its own; stopping the listeners at fork fixes both this and the count below."""
        answers = probe_workers(gunicorn_served.port, "/status", GUNICORN_WORKERS, query="&touch=0")
        for pid, body in answers.items():
            assert body["listener_threads"] == [], f"worker {pid} runs listeners before any use"
            assert not body["started"] and not any(body["listeners"].values()), (
                f"worker {pid} has no listener thread but reports {body['listeners']}, "
                f"started={body['started']}"
            )

    def test_each_worker_has_its_own_listeners(self, gunicorn_served: Served) -> None:
        answers = check_listeners_per_worker(gunicorn_served)
        assert gunicorn_served.server.pid not in answers

    def test_sentinel_pubsub_connections_are_workers_times_sentinels(
        self, gunicorn_served: Served
    ) -> None:
        """Fails until a process stops its listeners when it forks: the arbiter used the cache
        during preload, so its listeners stay subscribed next to the workers' ((3 + 1) x 3)."""
        check_pubsub_total(gunicorn_served, "arbiter")

    def test_planned_failover_no_failed_request(self, gunicorn_served: Served) -> None:
        planned_failover(gunicorn_served, "shard0")

    def test_sigkill_failures_bounded(self, gunicorn_served: Served) -> None:
        """IGNORE_EXCEPTIONS off: requests touching the dead shard fail (503) until the switch."""
        traffic = sigkill_failover(gunicorn_served, "shard1")
        failed = traffic.failed()
        assert failed, "the dead shard never failed a request: the kill was not observed"
        for result in failed:
            assert result.status == 503, (result.status, result.body)


@pytest.fixture(scope="class")
def gunicorn_defaults_served(
    server_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """gunicorn --preload, 3 sync workers, the outage options left at their defaults."""
    yield from _serve(
        tmp_path_factory.mktemp("gunicorn-defaults"),
        "gunicorn",
        gunicorn_command,
        workers=GUNICORN_WORKERS,
        ignore_exceptions=False,
        work_path="/work",
        status_path="/status",
        outage_hold=None,
    )


class TestGunicornDefaults:
    """The same gunicorn, with the default options: a crash fails no request (issue 36: the
    old default, OUTAGE_HOLD 0, answered 500 to the requests between the kill and the switch)."""

    def test_sigkill_no_failed_request(self, gunicorn_defaults_served: Served) -> None:
        cluster = gunicorn_defaults_served.cluster
        traffic = sigkill_failover(gunicorn_defaults_served, "shard1")
        assert not traffic.failed(), [(r.status, r.body) for r in traffic.failed()[:5]]
        # The kill was met: a request that touched the dead shard waited for the switch.
        hold = PoolConfig.__dataclass_fields__["outage_hold"].default
        slowest = max(r.duration for r in traffic.results)
        assert cluster.down_after_ms / 1000 <= slowest < hold + 1.0, slowest  # + SOCKET_TIMEOUT


# --------------------------------------------------------------------------- uvicorn


class TestUvicornAsync:
    """uvicorn, 2 workers (spawned, each its own event loop), async views with aset/aget."""

    def test_each_worker_has_its_own_listeners(self, uvicorn_served: Served) -> None:
        check_listeners_per_worker(uvicorn_served)

    def test_sentinel_pubsub_connections_are_workers_times_sentinels(
        self, uvicorn_served: Served
    ) -> None:
        check_pubsub_total(uvicorn_served, "supervisor")

    def test_a_worker_holds_one_async_connection_per_shard_under_concurrency(
        self, uvicorn_served: Served
    ) -> None:
        """docs/operations.md (connection sizing): with ``ASYNC_MULTIPLEX`` (the default) an
        ASGI worker's event loop holds 1 connection per shard whatever its concurrency. Per
        worker and master at most 3: that one, the sync pool's from the import-time use, and
        the housekeeping's ``ROLE`` check (``OUTAGE_READS``, the shards have replicas). The pool
        (``SHAPES_ASYNC_MULTIPLEX=0``) held 1 per request in flight instead."""
        served = uvicorn_served
        most: dict[tuple[int, str], int] = {}
        with contextlib.ExitStack() as stack:
            flows = [
                stack.enter_context(Traffic(served.port, served.work_path))
                for _ in range(CONCURRENT)
            ]
            for flow in flows:
                flow.wait_for(3)
            for _ in range(5):  # samples while every client has requests in flight
                for key, count in master_connections(served).items():
                    most[key] = max(most.get(key, 0), count)
                for flow in flows:
                    flow.wait_for(1)
        failed = [r for flow in flows for r in flow.failed()]
        assert not failed, [(r.status, r.body, r.error) for r in failed[:5]]
        workers = set(served.group_pids()) - {served.server.pid}
        assert {pid for pid, _ in most} <= workers, (most, workers)
        assert most and max(most.values()) <= 3, most

    def test_planned_failover_no_failed_request(self, uvicorn_served: Served) -> None:
        planned_failover(uvicorn_served, "shard0")

    def test_sigkill_fails_open(self, uvicorn_served: Served) -> None:
        """IGNORE_EXCEPTIONS on: no request fails; the dead shard's keys miss until the switch."""
        traffic = sigkill_failover(uvicorn_served, "shard1")
        assert not traffic.failed(), [(r.status, r.body) for r in traffic.failed()[:5]]
        assert any(r.field("degraded") for r in traffic.results), "the kill was not observed"
