"""The one vocabulary of the operator tools: the states a cache is in, their order, the
``fail_on`` policies and the defaults. The status report (:mod:`.status`, the ``sentinel_status``
commands) and the health check (:mod:`.health`, the HTTP endpoints) both import it, so they
cannot drift apart again.

A cache is ``healthy`` (every shard serves, with its redundancy), ``degraded`` (every shard
serves, something that protects one is missing) or ``down`` (a shard cannot serve). A policy
``fail_on=<state>`` fails from that state on, in the order of :data:`STATES`.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "DEGRADED",
    "DOWN",
    "FAIL_ON",
    "HEALTHY",
    "HEALTH_FAIL_ON",
    "HEALTH_TIMEOUT",
    "STATES",
    "STATUS_FAIL_ON",
    "STATUS_TIMEOUT",
    "describe",
    "fails",
    "parse_fail_on",
    "worst",
]

HEALTHY, DEGRADED, DOWN = "healthy", "degraded", "down"
#: Best first: a state's index is its severity (and the status commands' exit code).
STATES = (HEALTHY, DEGRADED, DOWN)
#: The ``fail_on`` policies, in the same order: fail when degraded or worse, or only when down.
FAIL_ON = (DEGRADED, DOWN)

# The defaults, declared together. The two tools answer two questions, so two defaults each:
#: The status report's timeout of each probe (it makes two rounds: about four of these at most).
STATUS_TIMEOUT = 1.0
#: The health check's whole budget (or the pool's ``SOCKET_TIMEOUT``, if that is shorter).
HEALTH_TIMEOUT = 0.5
#: An operator asking for the status wants to hear of lost redundancy: non-zero when degraded.
STATUS_FAIL_ON = DEGRADED
#: A readiness probe must not flap through a planned failover: fail only when down.
HEALTH_FAIL_ON = DOWN


def parse_fail_on(value: str | None, default: str) -> str:
    """A ``fail_on`` as given (``None``/empty: ``default``; case and spaces ignored); a
    ValueError naming ``fail_on`` and the value if it is none of :data:`FAIL_ON`."""
    if value is None or value == "":
        return default
    policy = str(value).strip().lower()
    if policy not in FAIL_ON:
        raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON)} (got {value!r})")
    return policy


def fails(state: str, fail_on: str) -> bool:
    """Whether ``state`` fails under the policy ``fail_on`` (an unknown state always fails:
    an unreadable verdict is no reason for confidence)."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON)} (got {fail_on!r})")
    if state not in STATES:
        return True
    return STATES.index(state) >= STATES.index(fail_on)


def worst(states: Iterable[str]) -> str:
    """The most severe of ``states`` (``healthy`` if there are none)."""
    return max(states, key=STATES.index, default=HEALTHY)


def describe(exc: BaseException) -> str:
    """``"ConnectionError: Error 111 ..."``, or the type alone for an exception without text."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
