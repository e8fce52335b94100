"""The report: the probes' answers judged, shard by shard and sentinel by sentinel, into a
state with its problems, and the exit code a policy makes of it."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sentinel_cache.core.admin.states import (
    DEGRADED,
    DOWN,
    HEALTHY,
    STATES,
    STATUS_FAIL_ON,
    STATUS_TIMEOUT,
    describe,
    parse_fail_on,
)
from sentinel_cache.core.admin.status.probes import (
    NODE_FIELDS,
    SENTINEL_AUTH_REFUSED,
    SENTINEL_NOT_SENTINEL,
    SENTINEL_UNREACHABLE,
    SentinelProbe,
    milliseconds,
    probe_node,
    probe_sentinels,
)
from sentinel_cache.core.admin.status.views import (
    FAILOVER_IN_PROGRESS,
    MASTER_AUTH_REFUSED,
    MASTER_UNREACHABLE,
    NO_QUORUM,
    NO_REPLICA,
    NOT_MASTER,
    QUORUM_UNKNOWN,
    SENTINELS_DISAGREE,
    MasterView,
    master_view,
    unlisted_masters,
    unlisted_warning,
)
from sentinel_cache.core.config import Address
from sentinel_cache.core.fanout import run_all
from sentinel_cache.core.topology.discovery import instance_healthy

if TYPE_CHECKING:
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

DEFAULT_TIMEOUT = STATUS_TIMEOUT
#: 0 healthy, 1 degraded, 2 down: a state's severity.
EXIT_CODES: Mapping[str, int] = {state: code for code, state in enumerate(STATES)}
#: Exit code of a configuration or usage error: the settings do not parse, nothing was checked.
EXIT_CONFIG = 3


# -- the report --------------------------------------------------------------------------------


class _Problems:
    """Problems with their severity and code; the worst one decides the report's state."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"<_Problems state={self.state} count={len(self.items)}>"

    def add(
        self,
        severity: str,
        code: str,
        message: str,
        *,
        shard: str | None = None,
        sentinel: str | None = None,
    ) -> None:
        self.items.append(
            {
                "severity": severity,
                "code": code,
                "message": message,
                "shard": shard,
                "sentinel": sentinel,
            }
        )

    @property
    def state(self) -> str:
        return max((i["severity"] for i in self.items), key=STATES.index, default=HEALTHY)

    @property
    def issues(self) -> list[dict[str, Any]]:
        # Worst first, so the first line explains the state.
        return sorted(self.items, key=lambda item: -STATES.index(item["severity"]))

    @property
    def messages(self) -> list[str]:
        return [item["message"] for item in self.issues]

    def codes(self, shard: str) -> list[str]:
        return [i["code"] for i in self.issues if i["shard"] == shard]


def _replicas_seen(
    name: str, chosen: Address | None, probes: Sequence[SentinelProbe]
) -> list[dict[str, Any]] | None:
    """Replicas as reported by the first reachable sentinel that agrees on the master."""
    ordered = sorted(probes, key=lambda p: p.masters.get(name) != chosen)
    for probe in ordered:
        found = probe.replicas.get(name)
        if probe.reachable and isinstance(found, list):
            return [
                {
                    "address": str(Address(info.get("ip", "?"), int(info.get("port", 0)))),
                    "flags": info.get("flags", ""),
                    "link": info.get("master-link-status", ""),
                    "healthy": instance_healthy(info)
                    and info.get("master-link-status", "ok") == "ok",
                }
                for info in found
            ]
    return None


def _ckquorum(name: str, view: MasterView, probes: Sequence[SentinelProbe]) -> dict[str, Any]:
    """CKQUORUM as a sentinel that names the master answers it (unknown when none names one:
    the check of a name it cannot resolve says nothing about a quorum)."""
    if view.address is None:
        return {"ok": None, "message": "no sentinel names a master", "sentinel": None}
    ordered = sorted(probes, key=lambda p: p.address not in view.naming)
    for probe in ordered:
        if probe.reachable and name in probe.ckquorum:
            ok, message = probe.ckquorum[name]
            return {"ok": ok, "message": message, "sentinel": str(probe.address)}
    return {"ok": None, "message": "no sentinel reachable", "sentinel": None}


def collect(
    core: ShardedSentinelPool, *, timeout: float = DEFAULT_TIMEOUT, fail_on: str = STATUS_FAIL_ON
) -> dict[str, Any]:
    """A live report of every shard and sentinel of ``core``; never raises for a dead topology.

    Takes at most about four ``timeout`` periods (two rounds, sentinels then masters), usually
    a few milliseconds. Does not start the core: an idle pool is reported from the sentinels.
    ``fail_on`` is the exit-code policy recorded in the report (see :func:`exit_code`).
    """
    fail_on = parse_fail_on(fail_on, STATUS_FAIL_ON)
    began = time.monotonic()
    snapshot = core.status()  # in memory: what this process's client currently believes
    names = list(core.config.masters)
    probes = probe_sentinels(
        core.sentinels.addresses, core.sentinels.kwargs, timeout=timeout, masters=names
    )
    views = {name: master_view(name, probes) for name in names}
    unlisted = unlisted_masters(probes, [*names, *core.config.previous_masters])
    targets = _choose_masters(core, views)
    nodes = _probe_masters(targets, core.config.connection_options(), timeout)
    problems = _Problems()
    notes: list[str] = []
    sentinels = _sentinel_entries(probes, snapshot, core.config.sentinels, problems, notes)
    shards = []
    for shard in snapshot["shards"]:
        name = shard["name"]
        entry = _shard_entry(shard, views[name], targets[name], nodes[name], probes)
        _judge_shard(entry, views[name], nodes[name], problems, notes)
        entry["problem_codes"] = problems.codes(name)
        entry["problem"] = entry["problem_codes"][0] if entry["problem_codes"] else None
        shards.append(entry)
    report = {
        "state": problems.state,
        "exit_code": None,
        "fail_on": fail_on,
        "problems": problems.messages,
        "issues": problems.issues,
        "notes": notes,
        # Monitored by the sentinels, not in MASTERS: a shard left out, or another
        # application's masters on shared sentinels. A warning: it changes no state.
        "unlisted_masters": unlisted,
        "warnings": [unlisted_warning(unlisted)] if unlisted else [],
        "checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "elapsed_ms": milliseconds(time.monotonic() - began),
        "timeout": timeout,
        "pool": {"started": snapshot["started"], "closed": snapshot["closed"]},
        "shards": shards,
        "sentinels": sentinels,
    }
    report["exit_code"] = exit_code(report)
    return report


def _choose_masters(
    core: ShardedSentinelPool, views: Mapping[str, MasterView]
) -> dict[str, tuple[Address | None, str | None]]:
    """Each shard's master as the sentinels name it, else where this process's client still
    goes: a report made inside a running application shows what it serves from."""
    chosen: dict[str, tuple[Address | None, str | None]] = {}
    for name, view in views.items():
        if view.address is not None:
            chosen[name] = (view.address, "sentinels")
        else:
            address = core.shard(name).address
            chosen[name] = (address, None if address is None else "client (last known)")
    return chosen


def _probe_masters(
    targets: Mapping[str, tuple[Address | None, str | None]],
    connection_kwargs: Mapping[str, Any],
    timeout: float,
) -> dict[str, dict[str, Any]]:
    """Every chosen master asked at once (ROLE confirms it is one): the second and last round."""
    tasks = {
        name: functools.partial(probe_node, address, connection_kwargs, timeout)
        for name, (address, _source) in targets.items()
        if address is not None
    }
    outcomes = run_all(tasks, time.monotonic() + 2 * timeout + 0.1, "masters")
    nodes: dict[str, dict[str, Any]] = {}
    for name in targets:
        outcome = outcomes.get(name)
        if isinstance(outcome, BaseException):
            outcome = {**dict.fromkeys(NODE_FIELDS), "role_error": describe(outcome)}
        nodes[name] = outcome if outcome is not None else dict.fromkeys(NODE_FIELDS)
    return nodes


def _sentinel_entries(
    probes: Sequence[SentinelProbe],
    snapshot: Mapping[str, Any],
    configured: Sequence[Address],
    problems: _Problems,
    notes: list[str],
) -> list[dict[str, Any]]:
    """One row per sentinel, each failure named as what it is (silence or a refusal)."""
    listeners = {s["address"]: s["listener_connected"] for s in snapshot["sentinels"]}
    rows = []
    for probe in probes:
        key = str(probe.address)
        listener = listeners.get(key)  # None: this core runs no listeners (not started)
        rows.append(
            {
                "address": key,
                "configured": probe.address in configured,
                "reachable": probe.reachable,
                "state": probe.state,
                "latency_ms": probe.latency_ms,
                "error": probe.error,
                "refused": probe.refused,
                "role": probe.role,
                "listener_connected": listener,
            }
        )
        if probe.state == SENTINEL_AUTH_REFUSED:
            problems.add(
                DEGRADED,
                SENTINEL_AUTH_REFUSED,
                f"sentinel {key}: authentication refused: it {probe.refused} ({probe.error}); "
                f"{probe.hint}",
                sentinel=key,
            )
        elif probe.state == SENTINEL_NOT_SENTINEL:
            problems.add(
                DEGRADED,
                SENTINEL_NOT_SENTINEL,
                f"sentinel {key} is not a sentinel: {probe.hint}",
                sentinel=key,
            )
        elif not probe.reachable:
            problems.add(
                DEGRADED,
                SENTINEL_UNREACHABLE,
                f"sentinel {key} unreachable ({probe.error})",
                sentinel=key,
            )
        elif listener is False:
            notes.append(f"sentinel {key}: the failover listener is not connected")
    return rows


def _master_state(address: Address | None, node: Mapping[str, Any]) -> str | None:
    if address is None:
        return None
    if node["refused"] is not None:
        return "auth_refused"
    if node["role"] is None:
        return "unreachable"
    return "ok" if node["role"] == "master" else "not_master"


def _shard_entry(
    shard: Mapping[str, Any],
    view: MasterView,
    target: tuple[Address | None, str | None],
    node: Mapping[str, Any],
    probes: Sequence[SentinelProbe],
) -> dict[str, Any]:
    """One shard's row: the sentinels' view, its master's answers, this process's memory."""
    name = shard["name"]
    address, source = target
    replicas = _replicas_seen(name, address, probes)
    return {
        "index": shard["index"],
        "name": name,
        "weight": shard["weight"],
        "address": None if address is None else str(address),
        "address_source": source,
        "client_address": shard["address"],
        "role": node["role"],
        "role_error": node["role_error"],
        "master_state": _master_state(address, node),
        "error": node["error"],
        "latency_ms": node["latency_ms"],
        "keys": node["keys"],
        "memory": node["memory"],
        "run_id": node["run_id"],
        "uptime_seconds": node["uptime_seconds"],
        "sentinels_agreeing": view.agreeing,
        "sentinels_total": len(probes),
        "sentinels_disagreeing": view.dissent,
        "sentinels_not_monitoring": [str(a) for a in view.not_monitoring],
        "replicas": replicas,
        "replicas_online": None if replicas is None else sum(r["healthy"] for r in replicas),
        "ckquorum": _ckquorum(name, view, probes),
        "config_epoch": view.epoch,
        "failover_in_progress": view.failover is not None if view.naming else None,
        "failover": view.failover,
        "switch_count": shard["switch_count"],
        "last_switch": shard["last_switch"],
        "last_switch_source": shard["last_switch_source"],
        # Restarts of the master without a switch this process saw (its data lost, unless
        # it persists it): how many, and the last one (when, run ids, how it was seen).
        "restarts": shard["restarts"],
        "last_restart": shard["last_restart"],
        "fenced": shard["fenced"],
        "fence_reason": shard["fence_reason"],
        # OUTAGE_READS, this process: reads a replica answered while the master was unreachable,
        # and for how many seconds the master has been found unreachable (None: it is not).
        "outage_reads": shard.get("outage_reads", 0),
        "unreachable_for": shard.get("unreachable_for"),
        "near_cache": shard.get("near_cache"),  # this process's local copies (NEAR_CACHE)
        # Filled in by collect once judged: the worst problem's code first.
        "problem": None,
        "problem_codes": [],
    }


def _judge_shard(
    entry: Mapping[str, Any],
    view: MasterView,
    node: Mapping[str, Any],
    problems: _Problems,
    notes: list[str],
) -> None:
    """The shard's problems, worst first by severity: down when it has no confirmed master,
    degraded when it serves with less redundancy (no replica, no quorum, a sentinel astray)."""
    name = entry["name"]
    label = f"shard {entry['index']} ({name})"
    address = entry["address"]

    def add(severity: str, code: str, text: str) -> None:
        problems.add(severity, code, f"{label}: {text}", shard=name)

    serving = entry["role"] == "master"
    if view.problem is not None:
        # Serving from the client's last known master keeps it up; otherwise nothing does.
        add(DEGRADED if serving else DOWN, view.problem, view.explain())
    if address is not None:
        if node["refused"] is not None:
            verb, hint = node["refused"]
            add(
                DOWN,
                MASTER_AUTH_REFUSED,
                f"master {address}: authentication refused: it {verb} ({entry['role_error']}); "
                f"{hint}",
            )
        elif entry["role"] is None:
            add(DOWN, MASTER_UNREACHABLE, f"master {address} unreachable ({entry['role_error']})")
        elif not serving:
            add(DOWN, NOT_MASTER, f"{address} reports ROLE {entry['role']}, not master")
    if view.address is not None and view.dissent:
        add(
            DEGRADED,
            SENTINELS_DISAGREE,
            f"sentinels disagree ({view.agreeing} name {address}; {'; '.join(view.dissent)})",
        )
    if entry["replicas_online"] == 0:
        add(DEGRADED, NO_REPLICA, "no replica online, a failover is impossible")
    quorum = entry["ckquorum"]
    if view.problem is None and quorum["ok"] is False:
        if quorum["message"].startswith("NOQUORUM"):
            add(
                DEGRADED,
                NO_QUORUM,
                f"no quorum: a failover cannot be authorized (CKQUORUM on {quorum['sentinel']}: "
                f"{quorum['message']})",
            )
        else:
            add(
                DEGRADED,
                QUORUM_UNKNOWN,
                f"quorum unknown (CKQUORUM on {quorum['sentinel']}: {quorum['message']})",
            )
    if view.failover is not None:
        add(DEGRADED, FAILOVER_IN_PROGRESS, f"failover in progress ({view.failover})")
    if address is not None and entry["client_address"] not in (None, address):
        notes.append(f"{label}: the client still uses {entry['client_address']}")
    if entry["error"]:
        notes.append(f"{label}: master {address}: {entry['error']}")
    if entry["fenced"]:
        notes.append(f"{label}: writes held ({entry['fence_reason']})")
    last = entry["last_restart"]
    if last is not None:
        at = datetime.fromtimestamp(last["at"]).strftime("%Y-%m-%d %H:%M:%S")
        notes.append(
            f"{label}: master {last['address']} restarted without a failover at {at} (run_id "
            f"{last['previous_run_id'] or 'unknown'} -> {last['run_id']}, seen on "
            f"{last['source']}; x{entry['restarts']}): its data was lost unless it persists it"
        )


# -- exit codes --------------------------------------------------------------------------------


def can_serve(report: Mapping[str, Any]) -> bool:
    """True when every shard has a confirmed master (ROLE says so): whatever else is wrong only
    reduces redundancy (a replica, a sentinel, the quorum), and the cache serves."""
    if report.get("state") not in (HEALTHY, DEGRADED):
        return False
    return all(shard.get("role") == "master" for shard in report.get("shards", ()))


def redundancy_reduced(report: Mapping[str, Any]) -> list[str]:
    """The report's degraded problems: what it lacks while it can still serve."""
    issues = report.get("issues")
    if issues is None:  # a report from before issues were recorded
        return list(report.get("problems", ())) if report.get("state") == DEGRADED else []
    return [i["message"] for i in issues if i["severity"] == DEGRADED]


def exit_code(report: Mapping[str, Any], fail_on: str | None = None) -> int:
    """0 healthy, 1 degraded (still serving), 2 down (a shard cannot serve): for a shell or a
    probe to branch on. (3, :data:`EXIT_CONFIG`, is the adapters' for a configuration error.)

    ``fail_on="down"`` exits 0 for a degraded report as long as every shard can serve
    (:func:`can_serve`): a readiness probe then does not fail while a planned failover's old
    master is not yet a replica. Without ``fail_on``, the report's own policy applies
    (``collect(fail_on=...)``), else ``"degraded"``.
    """
    policy = parse_fail_on(fail_on or report.get("fail_on"), STATUS_FAIL_ON)
    state = str(report.get("state"))
    if state not in EXIT_CODES:
        return EXIT_CODES[DOWN]  # an unreadable report is no reason for confidence
    if policy == DOWN and can_serve(report):
        return EXIT_CODES[HEALTHY]
    return EXIT_CODES[state]
