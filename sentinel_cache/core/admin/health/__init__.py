"""Health probes for load balancers and orchestrators: can every shard serve right now?

:func:`check` writes and reads back a probe key on every shard's current master, all shards at
once, within a short time budget, and tells two things apart:

* **ready** (can serve): every shard's master took the write and returned it. A shard that did
  not is named, with its master and the error, in ``problems``; the report's status is
  ``"down"``.
* **degraded** (redundancy reduced): every shard serves, but something that protects it is
  missing: a master with no replica online (a failover is impossible: after a planned failover
  too, until the old master has become a replica), a failover listener not connected to its
  sentinel, writes held by a failover in progress, sentinels that could not be asked, a near
  cache that is on but not tracking (for a moment after a switch, or for good), a master
  that restarted without a failover in the last ``RESTART_WARNING_SECONDS`` (its data is lost
  unless it persists it). Listed in ``warnings``; status ``"degraded"``.

A readiness probe should fail only when the cache cannot serve (``fail_on="down"``, the
default of :func:`http_status`), so that it does not flap through a planned failover; an alert
may also fire on ``"degraded"``.

The probe key of a shard is ``sentinel_cache:health:<master name>:<n>``, the first ``n`` the
ring places on that shard (found once per core). It is written with a unique token and a
10-second expiry (``PX``), read back and the master asked ``ROLE`` (which counts its online
replicas), in one round trip, on a connection of the probe's own with the budget as its socket
timeout: the pool's connections serve traffic and have the (longer) ``SOCKET_TIMEOUT``, and the
cache operations' safety net could retry past the budget. What the safety net does first is done
here too: a master that fails the probe makes the shard ask the sentinels again (rate-limited,
as for any cache call), so a probe can move a shard to its new master; if it moved and time is
left, the probe is tried once more there.

Nothing here can hang: every shard is probed on a thread of its own and the report is made when
the budget is spent, a shard still unanswered reported as failed. :func:`check` never raises for
a dead topology. ``deep=True`` adds the sentinels' view (:func:`sentinel_cache.core.admin.status.collect`:
every sentinel asked about every master, replicas, quorum), which takes up to about four budgets.
"""

from __future__ import annotations

from sentinel_cache.core.admin.health.check import (
    DEFAULT_TIMEOUT,
    OK,
    RESTART_WARNING_SECONDS,
    HealthReport,
    budget_for,
    check,
    check_all,
    state_of,
    status_word,
)
from sentinel_cache.core.admin.health.endpoints import (
    http_status,
    parse_fail_on,
    parse_flag,
    summary,
)
from sentinel_cache.core.admin.health.probe import (
    PROBE_PREFIX,
    PROBE_TTL_MS,
    Prober,
    ShardHealth,
    probe_key,
    probe_shard,
    prober_of,
)
from sentinel_cache.core.admin.states import DEGRADED, DOWN, FAIL_ON, HEALTHY

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEGRADED",
    "DOWN",
    "FAIL_ON",
    "HEALTHY",
    "OK",
    "PROBE_PREFIX",
    "PROBE_TTL_MS",
    "RESTART_WARNING_SECONDS",
    "HealthReport",
    "Prober",
    "ShardHealth",
    "budget_for",
    "check",
    "check_all",
    "http_status",
    "parse_fail_on",
    "parse_flag",
    "probe_key",
    "probe_shard",
    "prober_of",
    "state_of",
    "status_word",
    "summary",
]
