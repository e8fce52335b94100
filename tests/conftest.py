"""Shared fixtures: real local Sentinel topologies (see ``sentinel_cache.testing``).

``cluster`` is one shared topology for tests that only read/write keys; anything that kills,
fails over or reconfigures uses ``make_cluster`` and gets its own. ``SENTINEL_CACHE_SERVER``
(auto, redis, valkey, embedded or a path) picks the server binary for both.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

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
