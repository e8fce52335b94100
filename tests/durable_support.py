"""What the durability tests (``DURABLE_REPLICAS``: writes, resharding's moves, warm adoption)
share: a call made while one replica is frozen (``SIGSTOP``: its link stays open and silent, so
a ``WAIT`` for it waits) and thawed a moment later by a joined worker, and the shortfall lines
logged when a ``WAIT`` came back short."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from threads import Workers

from sentinel_cache.core.config import Address
from sentinel_cache.testing import LocalSentinelCluster

T = TypeVar("T")


def while_frozen(
    cluster: LocalSentinelCluster,
    replica: Address,
    call: Callable[[], T],
    at_thaw: Callable[[], Any] = lambda: None,
    *,
    thaw_after: float = 0.5,
) -> tuple[T, list[Any], bool]:
    """``call()`` with ``replica`` frozen, thawed ``thaw_after`` seconds in (``at_thaw()``
    looked at just before): its result, what ``at_thaw`` saw (empty if the call returned
    before the thaw), and whether the call returned after the thaw."""
    seen: list[Any] = []
    thawed = threading.Event()

    def thaw() -> None:
        seen.append(at_thaw())
        thawed.set()
        cluster.thaw_node(replica)

    try:
        cluster.freeze_node(replica)
        with Workers(timeout=30) as workers:
            workers.after(thaw_after, thaw)
            result = call()
            returned_after_thaw = thawed.is_set()
    finally:
        cluster.thaw_node(replica)
    return result, seen, returned_after_thaw


def shortfalls(caplog: pytest.LogCaptureFixture, timeout_ms: int) -> list[str]:
    """The log lines of writes no replica acknowledged within ``timeout_ms`` (of 1 asked)."""
    shortfall = f"acknowledged by 0 of 1 replicas within {timeout_ms} ms"
    return [message for message in caplog.messages if shortfall in message]
