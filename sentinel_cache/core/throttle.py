"""Rate-limited logging: a failure that repeats is logged once per interval, with a count.

A shard whose sentinels are down fails every re-resolve (several a second under traffic); one
line per interval that says how many were suppressed tells the same story without flooding.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class Throttle:
    """Lets one log line through per ``interval`` seconds and counts the ones it holds back."""

    __slots__ = ("interval", "_lock", "_last", "_suppressed")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._suppressed = 0

    def __repr__(self) -> str:
        return f"<Throttle every {self.interval:g}s suppressed={self._suppressed}>"

    def allow(self) -> int | None:
        """None if this occurrence is suppressed, else how many were suppressed before it."""
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.interval:
                self._suppressed += 1
                return None
            self._last = now
            suppressed, self._suppressed = self._suppressed, 0
            return suppressed

    def warn(self, logger: logging.Logger, message: str, *args: Any) -> None:
        """``logger.warning(message, *args)`` unless suppressed; says how many were held back."""
        suppressed = self.allow()
        if suppressed is None:
            return
        if suppressed:
            message += " (%d similar messages suppressed in the last %gs)"
            args = (*args, suppressed, self.interval)
        logger.warning(message, *args)

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
