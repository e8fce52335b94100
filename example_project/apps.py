"""The example app: records every master switch through the core's ``on_switch`` callback."""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any

from django.apps import AppConfig

# The last switches seen by this process, newest last (shown on /shards/).
SWITCHES: collections.deque[dict[str, Any]] = collections.deque(maxlen=20)
_registered = threading.Lock()
_done: list[Any] = []


def record_switch(event: Any) -> None:
    """``on_switch`` callback: runs on a listener thread, so it only appends to a deque."""
    SWITCHES.append(
        {
            "shard": event.shard_index,
            "name": event.name,
            "old": None if event.old is None else str(event.old),
            "new": str(event.new),
            "source": event.source,
            "lag_ms": None if event.lag is None else round(event.lag * 1000, 1),
            "at": event.at,
        }
    )


def register_switch_callback() -> None:
    """Register :func:`record_switch` once on the default cache's core (connects nowhere)."""
    from django.core.cache import caches

    pool = caches["default"].core  # type: ignore[attr-defined]
    with _registered:
        if any(p is pool for p in _done):
            return
        pool.on_switch(record_switch)
        _done.append(pool)


class ExampleConfig(AppConfig):
    name = "example_project"
    label = "example_project"
    verbose_name = "sentinel_cache example project"

    def ready(self) -> None:
        from django.core.exceptions import ImproperlyConfigured

        # Bad cache settings: `manage.py check` reports them (sentinel_cache.E001).
        with contextlib.suppress(ImproperlyConfigured):
            register_switch_callback()
