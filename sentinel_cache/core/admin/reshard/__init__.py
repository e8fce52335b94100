"""Resharding (issue 14): plan a change of the shard list, then move the keys whose owner changes.

While ``PREVIOUS_MASTERS`` is set, the transitional ring keeps every key readable (a miss on the
owner is served from the previous owner, and moved). This module empties the previous owners:

* :func:`movement` says what a change of ``MASTERS``/``WEIGHTS`` moves from the rings alone
  (no server is asked): the fraction of the hash space per (from, to) master pair, the least any
  placement could move for the new shares, which masters changed position, and what to do
  instead when the change moves far more than needed.
* :func:`plan` adds what the servers hold: it scans every previous shard (or a sample of each)
  and counts the keys that would move, per pair. Nothing is written.
* :func:`migrate` scans every shard of the previous placement (masters leaving the ring
  included, still followed through the sentinels) and moves each key whose owner is now another
  shard: ``PTTL`` + ``DUMP`` on the source, the ``RESTORE_MISSING`` script on the owner (never
  over a value written meanwhile through the new ring, nor over a delete since: see
  :data:`~sentinel_cache.core.ops.plans.DELETE_MARKED`), then ``DEL`` on the source (with
  ``DURABLE_REPLICAS``, the restores and the deletes each followed by ``WAIT``). Batched
  (one round trip per step and batch, the owners' restores sent together), rate-limited,
  resumable (a second run moves nothing; a killed one is simply run again), and it follows a
  failover of any shard in the middle.

Framework-free: the ``sentinel_reshard`` management command and ``flask sentinel-reshard`` call
these, and render with :func:`render_plan`, :func:`render_report` and :class:`ProgressPrinter`.
"""

from __future__ import annotations

from sentinel_cache.core.admin.reshard.calls import (
    DEFAULT_RETRY_FOR,
    Calls,
    TokenBucket,
    owner_lookup,
    sources,
)
from sentinel_cache.core.admin.reshard.migration import (
    DEFAULT_BATCH,
    DEFAULT_DELETE_DELAY,
    Migration,
    ProgressCallback,
    Tally,
    durability,
    migrate,
)
from sentinel_cache.core.admin.reshard.planning import PLAN_BATCH, Flow, Plan, ShardPlan, plan
from sentinel_cache.core.admin.reshard.rendering import (
    ProgressPrinter,
    render_json,
    render_plan,
    render_report,
)
from sentinel_cache.core.admin.reshard.reports import PairReport, Progress, Report, ShardReport
from sentinel_cache.core.admin.reshard.rings import (
    EXCESS,
    Movement,
    Shift,
    movement,
    movement_of,
    require_previous,
)

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_DELETE_DELAY",
    "DEFAULT_RETRY_FOR",
    "EXCESS",
    "PLAN_BATCH",
    "Calls",
    "Flow",
    "Migration",
    "Movement",
    "PairReport",
    "Plan",
    "Progress",
    "ProgressCallback",
    "ProgressPrinter",
    "Report",
    "ShardPlan",
    "ShardReport",
    "Shift",
    "Tally",
    "TokenBucket",
    "durability",
    "migrate",
    "movement",
    "movement_of",
    "owner_lookup",
    "plan",
    "render_json",
    "render_plan",
    "render_report",
    "require_previous",
    "sources",
]
