"""What the health endpoints serve: the HTTP status and the JSON body over several caches,
and their query parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sentinel_cache.core.admin import states
from sentinel_cache.core.admin.health.check import HealthReport, state_of, status_word
from sentinel_cache.core.admin.states import (
    DEGRADED,
    DOWN,
    HEALTH_FAIL_ON,
    HEALTHY,
)


def http_status(status: str, fail_on: str = HEALTH_FAIL_ON) -> int:
    """200, or 503 when ``status`` (a state, or the ``status`` word) fails under ``fail_on``:
    ``"down"``, or ``"degraded"`` too with ``fail_on="degraded"``."""
    return 503 if states.fails(state_of(status), fail_on) else 200


def summary(
    reports: Mapping[str, HealthReport | str],
    *,
    fail_on: str = HEALTH_FAIL_ON,
    key_prefixes: Mapping[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the JSON body of a health endpoint over several caches.

    ``reports`` maps a cache's name (a Django alias) to its report, or to the text of the error
    that kept it from being checked (a configuration that does not parse: that cache is down).
    No cache at all is ``"down"`` too: the endpoint was set up for a cache that is not there.
    """
    caches: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    warnings: list[str] = []
    for name, report in reports.items():
        if isinstance(report, HealthReport):
            entry = report.as_dict()
            problems += [f"{name}: {p}" for p in report.problems]
            warnings += [f"{name}: {w}" for w in report.warnings]
        else:
            entry = {
                "state": DOWN,
                "status": DOWN,
                "ready": False,
                "degraded": False,
                "error": report,
            }
            problems.append(f"{name}: {report}")
        if key_prefixes is not None and name in key_prefixes:
            entry = {"key_prefix": key_prefixes[name], **entry}
        caches[name] = entry
    if not reports:
        problems.append("no sentinel_cache cache is configured")
    ready = not problems
    state = DOWN if not ready else DEGRADED if warnings else HEALTHY
    code = http_status(state, fail_on)
    body = {
        "state": state,
        "status": status_word(state),
        "ready": ready,
        "degraded": ready and bool(warnings),
        "fail_on": fail_on,
        "http_status": code,
        "problems": problems,
        "warnings": warnings,
        "caches": caches,
    }
    return code, body


def parse_fail_on(value: str | None, default: str = HEALTH_FAIL_ON) -> str:
    """A ``fail_on`` from a query string (``None``/empty: ``default``); ValueError if unknown."""
    return states.parse_fail_on(value, default)


def parse_flag(value: str | None) -> bool:
    """``?deep=1`` (``1``, ``true``, ``yes``, ``on``) as a bool."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")
