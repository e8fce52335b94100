"""Every live core of this process, for the fork hooks and for metrics scraped from gauges.

It holds cores weakly and knows them only by what the hooks call, so it sits below the sharded
pool (which registers each core it builds); the per-configuration sharing is the pool's own
(:func:`~sentinel_cache.core.topology.sharded_pool.shared_pool`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Protocol, TypeVar


class Tracked(Protocol):
    """What the fork hooks call on a core."""

    closed: bool

    def before_fork(self) -> None: ...

    def after_fork_in_child(self) -> None: ...


C = TypeVar("C", bound=Tracked)

# Every core of this process (weak: a core nobody holds is not kept alive).
_live: weakref.WeakSet[Tracked] = weakref.WeakSet()
# Run in a new child before the cores' own hooks (the pool resets its sharing lock there).
_child_resets: list[Callable[[], None]] = []


def track(core: Tracked) -> None:
    """Let the fork hooks reach ``core`` (every core registers itself when built)."""
    _live.add(core)


def on_fork_in_child(reset: Callable[[], None]) -> None:
    """Call ``reset()`` in every new child, before the cores' ``after_fork_in_child``."""
    _child_resets.append(reset)


def _before_fork() -> None:
    for core in list(_live):
        core.before_fork()


def _after_fork_in_child() -> None:
    for reset in _child_resets:
        reset()
    for core in list(_live):
        core.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def live_cores(kind: type[C]) -> list[C]:
    """Every core of ``kind`` in this process that is not closed (metrics read their gauges)."""
    return [core for core in list(_live) if isinstance(core, kind) and not core.closed]
