"""A live health report of a sharded Sentinel cache, shared by the Django and Flask commands.

:func:`collect` asks every sentinel and every shard's master directly, on fresh short-timeout
connections (never the pool's own sockets, which serve traffic), so a status check neither waits
behind the application nor disturbs it. All probes run at once on daemon threads with a hard
deadline: a black-holed node costs one timeout, and a report comes back even when every node is
down. The report is plain JSON-able data; :func:`render_text` and :func:`render_json` format it,
and :func:`exit_code` turns it into a process exit code under a ``fail_on`` policy.

Every failure is named for what it is, because each has another fix: a sentinel that does not
answer (state ``unreachable``) is not one that refuses our credentials (``auth_refused``); a
master name that no sentinel monitors (problem ``not_monitored``) is not a shard whose sentinels
are down (``sentinels_unreachable``), nor one whose sentinels cannot authorize a failover
(``no_quorum``). :data:`PROBLEMS` lists every shard problem code with its words.
"""

from __future__ import annotations

from sentinel_cache.core.admin.states import DEGRADED, DOWN, FAIL_ON, HEALTHY
from sentinel_cache.core.admin.status.judge import (
    DEFAULT_TIMEOUT,
    EXIT_CODES,
    EXIT_CONFIG,
    can_serve,
    collect,
    exit_code,
    redundancy_reduced,
)
from sentinel_cache.core.admin.status.probes import (
    NODE_FIELDS,
    SENTINEL_AUTH_REFUSED,
    SENTINEL_NOT_SENTINEL,
    SENTINEL_OK,
    SENTINEL_UNREACHABLE,
    SentinelProbe,
    probe_node,
    probe_sentinels,
)
from sentinel_cache.core.admin.status.rendering import render_json, render_text
from sentinel_cache.core.admin.status.views import (
    FAILOVER_IN_PROGRESS,
    MASTER_AUTH_REFUSED,
    MASTER_UNREACHABLE,
    NO_QUORUM,
    NO_REPLICA,
    NOT_MASTER,
    NOT_MONITORED,
    PROBLEMS,
    QUORUM_UNKNOWN,
    SENTINELS_AUTH_REFUSED,
    SENTINELS_DISAGREE,
    SENTINELS_FAILED,
    SENTINELS_UNREACHABLE,
    MasterView,
    master_view,
    unlisted_masters,
    unlisted_warning,
)
from sentinel_cache.core.fanout import run_all

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEGRADED",
    "DOWN",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "FAILOVER_IN_PROGRESS",
    "FAIL_ON",
    "HEALTHY",
    "MASTER_AUTH_REFUSED",
    "MASTER_UNREACHABLE",
    "NODE_FIELDS",
    "NOT_MASTER",
    "NOT_MONITORED",
    "NO_QUORUM",
    "NO_REPLICA",
    "PROBLEMS",
    "QUORUM_UNKNOWN",
    "SENTINELS_AUTH_REFUSED",
    "SENTINELS_DISAGREE",
    "SENTINELS_FAILED",
    "SENTINELS_UNREACHABLE",
    "SENTINEL_AUTH_REFUSED",
    "SENTINEL_NOT_SENTINEL",
    "SENTINEL_OK",
    "SENTINEL_UNREACHABLE",
    "MasterView",
    "SentinelProbe",
    "can_serve",
    "collect",
    "exit_code",
    "master_view",
    "probe_node",
    "probe_sentinels",
    "redundancy_reduced",
    "render_json",
    "render_text",
    "run_all",
    "unlisted_masters",
    "unlisted_warning",
]
