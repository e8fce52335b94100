"""The check: every shard probed at once within the budget, the redundancy warnings, the
report (and several cores checked at once)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sentinel_cache.core.admin import status as status_module
from sentinel_cache.core.admin.health.probe import Prober, ShardHealth, probe_shard, prober_of
from sentinel_cache.core.admin.states import (
    DEGRADED,
    DOWN,
    HEALTH_TIMEOUT,
    HEALTHY,
    describe,
)
from sentinel_cache.core.fanout import Fanout, run_all
from sentinel_cache.core.topology.discovery import redact

if TYPE_CHECKING:
    from sentinel_cache.core.topology.shard import Shard
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool


#: The default budget in seconds (or the pool's ``SOCKET_TIMEOUT``, if that is shorter).
DEFAULT_TIMEOUT = HEALTH_TIMEOUT
#: A master's restart without a failover (data lost) keeps the health degraded this long.
RESTART_WARNING_SECONDS = 300.0

#: The report's ``status`` word for :data:`~sentinel_cache.core.admin.states.HEALTHY`: the
#: endpoints said ``"ok"`` before the tools shared one vocabulary, and monitors match it. The
#: report's ``state`` says ``"healthy"``, as the status report does.
OK = "ok"


def status_word(state: str) -> str:
    """The ``status`` field's word for a state (``"ok"`` for healthy, else the state)."""
    return OK if state == HEALTHY else state


def state_of(status: str) -> str:
    """The state a ``status`` word (or a state) stands for."""
    return HEALTHY if status == OK else status


@dataclass(frozen=True)
class HealthReport:
    """What :func:`check` found; :meth:`as_dict` is the JSON the health endpoints serve."""

    #: ``"ok"``, ``"degraded"`` (serving, redundancy reduced) or ``"down"`` (a shard cannot serve).
    status: str
    #: Every shard took the write and returned it: the cache can serve.
    ready: bool
    #: Serving with reduced redundancy (see ``warnings``); False when down.
    degraded: bool
    shards: tuple[ShardHealth, ...]
    #: One line per failing shard, naming it (empty when ready).
    problems: tuple[str, ...]
    #: What reduces redundancy, one line each.
    warnings: tuple[str, ...]
    timeout: float
    elapsed_ms: float
    checked_at: str
    #: Per sentinel address: is this process's failover listener connected (None: no listener).
    listeners: Mapping[str, bool | None] = field(default_factory=dict)
    #: The sentinels' view (:func:`sentinel_cache.core.admin.status.collect`) when asked ``deep=True``.
    deep: Mapping[str, Any] | None = None

    @property
    def state(self) -> str:
        """``healthy``, ``degraded`` or ``down``: the words of the status report."""
        return state_of(self.status)

    @property
    def failing(self) -> list[str]:
        """The labels (``"1 (shard_b)"``) of the shards that failed the probe."""
        return [shard.label for shard in self.shards if not shard.ok]

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (``json.dumps`` takes it as it is)."""
        data = {"state": self.state, **dataclasses.asdict(self)}
        data["problems"] = list(self.problems)
        data["warnings"] = list(self.warnings)
        data["shards"] = [
            {**shard, "warnings": list(shard["warnings"])} for shard in data["shards"]
        ]
        data["listeners"] = dict(self.listeners)
        if self.deep is None:
            del data["deep"]
        return data


def budget_for(core: ShardedSentinelPool, timeout: float | None = None) -> float:
    """``timeout``, or by default :data:`DEFAULT_TIMEOUT` or the pool's ``SOCKET_TIMEOUT``,
    whichever is shorter."""
    if timeout is not None:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds (got {timeout!r})")
        return float(timeout)
    socket_timeout = core.config.connection_options().get("socket_timeout")
    if isinstance(socket_timeout, (int, float)) and 0 < socket_timeout < DEFAULT_TIMEOUT:
        return float(socket_timeout)
    return DEFAULT_TIMEOUT


def check(
    core: ShardedSentinelPool, *, timeout: float | None = None, deep: bool = False
) -> HealthReport:
    """Probe every shard of ``core`` at once; returns within about ``timeout`` seconds (four
    of them with ``deep``), whatever the state of the topology. See the module docstring.

    ``timeout`` defaults to :data:`DEFAULT_TIMEOUT` (0.5 s) or the pool's ``SOCKET_TIMEOUT``,
    whichever is shorter; it bounds the whole check and every socket operation of the probes.
    The first check in a process starts the core (discovery) if nothing else has.
    """
    budget = budget_for(core, timeout)
    began = time.monotonic()
    deadline = began + budget
    collected = (
        Fanout(
            {"deep": lambda: status_module.collect(core, timeout=budget, fail_on=DOWN)},
            name="sentinel_cache-health-deep",
        )
        if deep
        else None
    )
    prober = prober_of(core)
    tasks = {
        shard.index: functools.partial(probe_shard, core, prober, shard, budget, deadline)
        for shard in core.shards
    }
    outcomes = run_all(tasks, deadline, "health")
    shards = tuple(
        _outcome(core.shards[index], prober, outcome, budget)
        for index, outcome in sorted(outcomes.items())
    )
    prober.keep_only(shard.address for shard in core.shards)
    deep_report: dict[str, Any] | None = None
    if collected is not None:
        deep_report = _deep_report(collected, began + 4 * budget + 0.2)
    snapshot = core.status()
    listeners = {s["address"]: s["listener_connected"] for s in snapshot["sentinels"]}
    shards = tuple(_with_warnings(shard, core, snapshot) for shard in shards)
    warnings = [w for shard in shards for w in shard.warnings]
    warnings += [
        f"sentinel {address}: the failover listener is not connected (failovers are learnt "
        "only when a call fails)"
        for address, connected in listeners.items()
        if connected is False
    ]
    if deep_report is not None:
        warnings += [f"sentinels: {message}" for message in _deep_messages(deep_report)]
    problems = tuple(shard.error or "" for shard in shards if not shard.ok)
    ready = not problems
    degraded = ready and bool(warnings)
    return HealthReport(
        status=status_word(DOWN if not ready else DEGRADED if degraded else HEALTHY),
        ready=ready,
        degraded=degraded,
        shards=shards,
        problems=problems,
        warnings=tuple(dict.fromkeys(warnings)),
        timeout=budget,
        elapsed_ms=round((time.monotonic() - began) * 1000, 2),
        checked_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        listeners=listeners,
        deep=deep_report,
    )


def _outcome(
    shard: Shard, prober: Prober, outcome: ShardHealth | BaseException, budget: float
) -> ShardHealth:
    if isinstance(outcome, ShardHealth):
        return outcome
    address = shard.address
    where = "" if address is None else f"master {address}: "
    why = (
        f"no answer within {budget:g}s"
        if isinstance(outcome, TimeoutError)
        else f"probe failed: {describe(outcome)}"
    )
    return ShardHealth(
        shard.index,
        shard.name,
        False,
        None if address is None else str(address),
        None,
        redact(f"shard {shard.label}: {where}{why}", prober.secrets),
        prober.keys[shard.index],
        fenced=shard.fenced,
    )


def _with_warnings(
    shard: ShardHealth, core: ShardedSentinelPool, snapshot: Mapping[str, Any]
) -> ShardHealth:
    """The shard's redundancy warnings: from the probe (ROLE) and the core's memory."""
    if not shard.ok:
        return shard
    found: list[str] = []
    label = f"shard {shard.label}"
    if shard.replicas_online == 0:
        found.append(
            f"{label}: master {shard.address} has no replica online: a failover is impossible"
        )
    memory = snapshot["shards"][shard.index]
    if memory["fenced"]:
        found.append(f"{label}: writes held ({memory['fence_reason']})")
    if memory["error"]:
        found.append(f"{label}: the sentinels could not be asked: {memory['error']}")
    near = memory.get("near_cache")
    if near is not None and not near["tracked"]:
        found.append(
            f"{label}: the near cache is on but not tracking the master (nothing is kept or "
            "served locally; every read goes to the server)"
        )
    restart = memory["last_restart"]
    if restart is not None and time.time() - restart["at"] < RESTART_WARNING_SECONDS:
        found.append(
            f"{label}: master {restart['address']} restarted without a failover "
            f"{time.time() - restart['at']:.0f}s ago (run_id {restart['previous_run_id'] or 'unknown'}"
            f" -> {restart['run_id']}): its data was lost unless it persists it"
        )
    if not found:
        return shard
    return dataclasses.replace(shard, warnings=tuple(found), fenced=memory["fenced"])


def _deep_report(collected: Fanout[str, dict[str, Any]], deadline: float) -> dict[str, Any]:
    found = dict(collected.collect(deadline))
    if "deep" not in found:
        return {"state": None, "error": "the sentinels' view was not ready in time"}
    report = found["deep"]
    if isinstance(report, BaseException):
        return {"state": None, "error": describe(report)}
    return dict(report)


def _deep_messages(report: Mapping[str, Any]) -> list[str]:
    """What the sentinels' view adds: its problems, all of them warnings here (a shard whose
    probe worked serves, whatever the sentinels say)."""
    if report.get("state") is None:
        return [str(report.get("error"))]
    return [i["message"] for i in report.get("issues", ())]


def check_all(
    cores: Sequence[tuple[str, ShardedSentinelPool | str]],
    *,
    timeout: float | None = None,
    deep: bool = False,
) -> dict[str, HealthReport | str]:
    """:func:`check` every distinct core at once (caches with equal settings share one core:
    it is checked once); a name mapped to a string keeps that string (a configuration error)."""
    unique: dict[int, ShardedSentinelPool] = {}
    for _, core in cores:
        if not isinstance(core, str):
            unique.setdefault(id(core), core)
    if len(unique) == 1:
        ((key, only),) = unique.items()
        results: Mapping[int, HealthReport | BaseException] = {
            key: check(only, timeout=timeout, deep=deep)
        }
    else:
        longest = max((budget_for(core, timeout) for core in unique.values()), default=0.0)
        wait = longest * (4 if deep else 1) + 1.0  # each check keeps its own budget
        results = run_all(
            {
                key: functools.partial(check, core, timeout=timeout, deep=deep)
                for key, core in unique.items()
            },
            time.monotonic() + wait,
            "health-cores",
        )
    reports: dict[str, HealthReport | str] = {}
    for name, core in cores:
        if isinstance(core, str):
            reports[name] = core
            continue
        outcome = results[id(core)]
        reports[name] = (
            outcome if isinstance(outcome, HealthReport) else f"check failed: {describe(outcome)}"
        )
    return reports
