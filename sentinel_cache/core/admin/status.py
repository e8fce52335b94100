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

import difflib
import functools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import redis

from sentinel_cache.core.admin.states import (
    DEGRADED,
    DOWN,
    FAIL_ON,
    HEALTHY,
    STATES,
    STATUS_FAIL_ON,
    STATUS_TIMEOUT,
    describe,
    parse_fail_on,
)
from sentinel_cache.core.config import Address
from sentinel_cache.core.fanout import run_all
from sentinel_cache.core.topology.discovery import (
    config_epoch,
    direct_client,
    instance_healthy,
    redact,
    refusal,
    reply_address,
    reply_fields,
    reply_text,
    secret_values,
)

if TYPE_CHECKING:
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEGRADED",
    "DOWN",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "FAIL_ON",
    "HEALTHY",
    "PROBLEMS",
    "MasterView",
    "SentinelProbe",
    "can_serve",
    "collect",
    "exit_code",
    "master_view",
    "probe_sentinels",
    "redundancy_reduced",
    "render_json",
    "render_text",
    "run_all",
]

DEFAULT_TIMEOUT = STATUS_TIMEOUT
#: 0 healthy, 1 degraded, 2 down: a state's severity.
EXIT_CODES: Mapping[str, int] = {state: code for code, state in enumerate(STATES)}
#: Exit code of a configuration or usage error: the settings do not parse, nothing was checked.
EXIT_CONFIG = 3

# What a sentinel did when asked.
SENTINEL_OK, SENTINEL_UNREACHABLE, SENTINEL_AUTH_REFUSED = "ok", "unreachable", "auth_refused"

# A shard's problems (the report's ``problem``/``problem_codes``; :data:`PROBLEMS` has the words).
NOT_MONITORED = "not_monitored"
SENTINELS_UNREACHABLE = "sentinels_unreachable"
SENTINELS_AUTH_REFUSED = "sentinels_auth_refused"
SENTINELS_FAILED = "sentinels_failed"
MASTER_UNREACHABLE = "master_unreachable"
MASTER_AUTH_REFUSED = "master_auth_refused"
NOT_MASTER = "not_master"
SENTINELS_DISAGREE = "sentinels_disagree"
NO_REPLICA = "no_replica"
NO_QUORUM = "no_quorum"
QUORUM_UNKNOWN = "quorum_unknown"
FAILOVER_IN_PROGRESS = "failover_in_progress"

#: Every shard problem code, in words (what the text report says).
PROBLEMS: Mapping[str, str] = {
    NOT_MONITORED: "not monitored: no sentinel that answered monitors this master name",
    SENTINELS_UNREACHABLE: "no sentinel reachable",
    SENTINELS_AUTH_REFUSED: "authentication refused by the sentinels",
    SENTINELS_FAILED: "no sentinel answered (errors)",
    MASTER_UNREACHABLE: "master unreachable",
    MASTER_AUTH_REFUSED: "authentication refused by the master",
    NOT_MASTER: "the named master is not a master",
    SENTINELS_DISAGREE: "sentinels disagree about the master",
    NO_REPLICA: "no replica online",
    NO_QUORUM: "no quorum: the sentinels cannot authorize a failover",
    QUORUM_UNKNOWN: "the quorum check failed",
    FAILOVER_IN_PROGRESS: "failover in progress",
}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _client(address: Address, kwargs: Mapping[str, Any], timeout: float) -> redis.Redis:
    return direct_client(
        address,
        kwargs,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        max_connections=1,
    )


def _close(client: redis.Redis) -> None:
    try:
        client.close()
    finally:
        client.connection_pool.disconnect()


def _timed_ping(client: redis.Redis) -> float:
    started = time.perf_counter()
    client.ping()
    return _ms(time.perf_counter() - started)


# -- sentinels ---------------------------------------------------------------------------------


@dataclass
class SentinelProbe:
    """What one sentinel answered: its state, latency and, per master, its view.

    ``state`` is ``"ok"`` (it answered), ``"unreachable"`` (refused, timed out, or the
    connection failed) or ``"auth_refused"`` (it refused our credentials, our ACL user or our
    certificates: ``refused`` says which, ``hint`` what to check).
    """

    address: Address
    state: str = SENTINEL_UNREACHABLE
    latency_ms: float | None = None
    error: str | None = None
    refused: str | None = None
    hint: str | None = None
    masters: dict[str, Address | None | BaseException] = field(default_factory=dict)
    replicas: dict[str, list[dict[str, str]] | BaseException] = field(default_factory=dict)
    ckquorum: dict[str, tuple[bool, str]] = field(default_factory=dict)
    details: dict[str, dict[str, str]] = field(default_factory=dict)  # SENTINEL MASTER replies
    monitored: list[str] | None = None  # every master name it monitors (SENTINEL MASTERS)

    @property
    def reachable(self) -> bool:
        """It answered (an ``auth_refused`` sentinel is reachable on the network, but did not)."""
        return self.state == SENTINEL_OK

    def __repr__(self) -> str:
        state = f"{self.latency_ms}ms" if self.reachable else f"{self.state} ({self.error})"
        return f"<SentinelProbe {self.address} {state}>"


def _master_answer(reply: Any) -> Address | None | BaseException:
    if isinstance(reply, BaseException):
        return reply
    if not reply:
        return None
    try:
        return reply_address(*reply)
    except (TypeError, ValueError) as exc:  # a garbled reply costs this answer, not the probe
        return exc


def _monitored_names(reply: Any) -> list[str] | None:
    if not isinstance(reply, (list, tuple)):
        return None
    names = []
    for item in reply:
        try:
            names.append(reply_fields(item)["name"])
        except (KeyError, TypeError, IndexError, AttributeError):
            continue
    return names


def _probe_sentinel(
    address: Address, kwargs: Mapping[str, Any], masters: Sequence[str], timeout: float
) -> SentinelProbe:
    probe = SentinelProbe(address)
    client = _client(address, kwargs, timeout)
    try:
        results: list[Any] = []
        if masters:
            # One round trip for every question; it also opens the connection, so the timed
            # PING below measures the round trip alone, not the TCP/TLS handshake.
            pipe = client.pipeline(transaction=False)
            for name in masters:
                pipe.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
                pipe.execute_command("SENTINEL", "REPLICAS", name)
                pipe.execute_command("SENTINEL", "CKQUORUM", name)
                pipe.execute_command("SENTINEL", "MASTER", name)
            pipe.execute_command("SENTINEL", "MASTERS")
            results = pipe.execute(raise_on_error=False)
        else:
            client.ping()
        probe.latency_ms = _timed_ping(client)
        probe.state = SENTINEL_OK
    except (redis.RedisError, OSError) as exc:
        probe.error = redact(describe(exc), secret_values(kwargs))
        refused = refusal(exc, "sentinel")
        if refused is not None:
            probe.state = SENTINEL_AUTH_REFUSED
            probe.refused, probe.hint = refused
        return probe
    finally:
        _close(client)
    for i, name in enumerate(masters):
        master, replicas, quorum, detail = results[4 * i : 4 * i + 4]
        probe.masters[name] = _master_answer(master)
        if isinstance(replicas, BaseException):
            probe.replicas[name] = replicas
        else:
            probe.replicas[name] = [reply_fields(item) for item in replicas or ()]
        if isinstance(quorum, BaseException):
            probe.ckquorum[name] = (False, str(quorum))
        else:
            probe.ckquorum[name] = (True, reply_text(quorum))
        if detail and not isinstance(detail, BaseException):
            probe.details[name] = reply_fields(detail)
    if masters:
        probe.monitored = _monitored_names(results[-1])
    return probe


def probe_sentinels(
    addresses: Sequence[Address],
    sentinel_kwargs: Mapping[str, Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    masters: Sequence[str] = (),
) -> list[SentinelProbe]:
    """Ask every sentinel at once (PING, plus each master's view if ``masters`` are given).

    Returns one probe per address, in the given order, within about two ``timeout`` periods.
    """
    tasks = {
        address: functools.partial(_probe_sentinel, address, sentinel_kwargs, masters, timeout)
        for address in addresses
    }
    outcomes = run_all(tasks, time.monotonic() + 2 * timeout + 0.1, "sentinels")
    probes = []
    for address in addresses:
        outcome = outcomes[address]
        if isinstance(outcome, BaseException):
            outcome = SentinelProbe(address, error=describe(outcome))
        probes.append(outcome)
    return probes


@dataclass
class MasterView:
    """What the sentinels, taken together, say about one master name.

    ``address`` is the master most of the answering sentinels name (None if none does);
    ``naming`` the sentinels that name it; ``not_monitoring`` those that answered they do not
    know the name; ``refused``, ``unreachable`` and ``failed`` those that gave no answer, and
    why. ``epoch`` is the highest config epoch of the sentinels naming ``address`` (it goes up
    with every failover) and ``failover`` names a failover of this master in progress.
    """

    name: str
    address: Address | None = None
    asked: list[Address] = field(default_factory=list)
    naming: list[Address] = field(default_factory=list)
    not_monitoring: list[Address] = field(default_factory=list)
    dissent: list[str] = field(default_factory=list)
    refused: list[tuple[Address, str]] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    unreachable: list[tuple[Address, str]] = field(default_factory=list)
    failed: list[tuple[Address, str]] = field(default_factory=list)
    monitored: set[str] = field(default_factory=set)
    epoch: int | None = None
    failover: str | None = None

    @property
    def agreeing(self) -> int:
        return len(self.naming)

    @property
    def problem(self) -> str | None:
        """Why no sentinel named a master (None when one did): a sentinel that answered it
        does not know the name outweighs the ones that did not answer."""
        if self.address is not None:
            return None
        if self.not_monitoring:
            return NOT_MONITORED
        if self.refused:
            return SENTINELS_AUTH_REFUSED
        if self.failed:
            return SENTINELS_FAILED
        return SENTINELS_UNREACHABLE

    def explain(self) -> str:
        """In words, why no sentinel named a master ("" when one did)."""
        problem = self.problem
        if problem is None:
            return ""
        if problem == NOT_MONITORED:
            text = (
                f"not monitored: no sentinel monitors master {self.name!r} (asked "
                f"{', '.join(map(str, self.not_monitoring))}{self._silent()})"
            )
            return text + self.suggestion()
        if problem == SENTINELS_AUTH_REFUSED:
            return (
                f"no master known: authentication refused by the sentinels "
                f"({_pairs(self.refused)}{self._silent(refused=False)}); {'; '.join(self.hints)}"
            )
        if problem == SENTINELS_FAILED:
            return (
                f"no master known: no sentinel answered for {self.name!r} "
                f"({_pairs(self.failed)}{self._silent(failed=False)})"
            )
        return f"no master known: no sentinel reachable ({_pairs(self.unreachable)})"

    def suggestion(self) -> str:
        """ "; the sentinels monitor: ..." (with the likeliest intended name) for a name none of
        them monitors, so a typo in MASTERS explains itself."""
        if not self.monitored:
            return ""
        known = sorted(self.monitored)
        close = difflib.get_close_matches(self.name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"; they monitor: {', '.join(map(repr, known))}{hint}"

    def _silent(self, *, refused: bool = True, failed: bool = True) -> str:
        parts = [f"; no answer from {_pairs(self.unreachable)}"] if self.unreachable else []
        if refused and self.refused:
            parts.append(f"; authentication refused by {_pairs(self.refused)}")
        if failed and self.failed:
            parts.append(f"; errors from {_pairs(self.failed)}")
        return "".join(parts)


def _pairs(items: Sequence[tuple[Address, str]]) -> str:
    """``"a, b: why; c: why else"``: sentinels that failed alike are named together."""
    grouped: dict[str, list[str]] = {}
    for address, text in items:
        grouped.setdefault(text, []).append(str(address))
    return "; ".join(f"{', '.join(addresses)}: {text}" for text, addresses in grouped.items())


def master_view(name: str, probes: Sequence[SentinelProbe]) -> MasterView:
    """What the sentinels say about ``name``: the address most of them name (ties: the earlier
    sentinel), who agrees, and why each of the others did not (the report's words for it)."""
    view = MasterView(name, asked=[p.address for p in probes])
    votes: dict[Address, int] = {}
    for probe in probes:
        answer = probe.masters.get(name)
        if probe.reachable and isinstance(answer, Address):
            votes[answer] = votes.get(answer, 0) + 1
    view.address = max(votes, key=lambda a: votes[a]) if votes else None  # keeps the first tie
    for probe in probes:
        if probe.state == SENTINEL_AUTH_REFUSED:
            view.refused.append((probe.address, f"it {probe.refused} ({probe.error})"))
            if probe.hint and probe.hint not in view.hints:
                view.hints.append(probe.hint)
            continue
        if not probe.reachable:
            view.unreachable.append((probe.address, str(probe.error)))
            continue
        view.monitored.update(probe.monitored or ())
        if name not in probe.masters:
            continue  # not asked about masters (a PING-only probe)
        answer = probe.masters[name]
        if view.address is not None and answer == view.address:
            view.naming.append(probe.address)
        elif answer is None:
            view.not_monitoring.append(probe.address)
            view.dissent.append(f"{probe.address} does not monitor {name!r}")
        elif isinstance(answer, BaseException):
            view.dissent.append(f"{probe.address}: {describe(answer)}")
            refused = refusal(answer, "sentinel")
            if refused is None:
                view.failed.append((probe.address, describe(answer)))
            else:
                view.refused.append((probe.address, f"it {refused[0]} ({describe(answer)})"))
                if refused[1] not in view.hints:
                    view.hints.append(refused[1])
        else:
            view.dissent.append(f"{probe.address} names {answer}")
    _read_epochs(view, probes)
    return view


def _read_epochs(view: MasterView, probes: Sequence[SentinelProbe]) -> None:
    """The config epoch of the named master and any failover in progress, from SENTINEL MASTER:
    the sentinels' own record of failovers, true for every process (the last-switch time of a
    pool is only what that process saw)."""
    epochs = []
    for probe in probes:
        detail = probe.details.get(view.name)
        if not probe.reachable or detail is None:
            continue
        if probe.address in view.naming:
            epochs.append(config_epoch(detail))
        flags = detail.get("flags", "").split(",")
        if "failover_in_progress" in flags and view.failover is None:
            state = detail.get("failover-state") or "started"
            view.failover = f"{state} on sentinel {probe.address}"
    view.epoch = max(epochs) if epochs else None


# -- data nodes --------------------------------------------------------------------------------

_NODE_FIELDS = (
    "role",
    "role_error",
    "refused",
    "error",
    "latency_ms",
    "keys",
    "memory",
    "run_id",
    "uptime_seconds",
)


def _probe_node(address: Address, kwargs: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """ROLE, PING latency, DBSIZE and used memory of one data node.

    ``role_error`` means the node could not say what it is (``refused``: it refused our
    credentials; ``(what it did, what to check)``); ``error`` is a later failure.
    """
    found: dict[str, Any] = dict.fromkeys(_NODE_FIELDS)
    client = _client(address, kwargs, timeout)
    try:
        try:
            found["role"] = reply_text(client.execute_command("ROLE")[0])
        except (redis.RedisError, OSError) as exc:
            found["role_error"] = redact(describe(exc), secret_values(kwargs))
            found["refused"] = refusal(exc, "data node")
            return found
        found["latency_ms"] = _timed_ping(client)
        pipe = client.pipeline(transaction=False)
        pipe.dbsize()
        pipe.info("memory")
        pipe.info("server")
        keys, memory, server = pipe.execute(raise_on_error=False)
        if not isinstance(keys, BaseException):
            found["keys"] = int(keys)
        if isinstance(memory, Mapping):
            found["memory"] = memory.get("used_memory_human")
        if isinstance(server, Mapping):  # a young uptime with no failover: an empty restart?
            found["run_id"] = server.get("run_id")
            found["uptime_seconds"] = server.get("uptime_in_seconds")
    except (redis.RedisError, OSError) as exc:
        found["error"] = describe(exc)
    finally:
        _close(client)
    return found


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
        "checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "elapsed_ms": _ms(time.monotonic() - began),
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
        name: functools.partial(_probe_node, address, connection_kwargs, timeout)
        for name, (address, _source) in targets.items()
        if address is not None
    }
    outcomes = run_all(tasks, time.monotonic() + 2 * timeout + 0.1, "masters")
    nodes: dict[str, dict[str, Any]] = {}
    for name in targets:
        outcome = outcomes.get(name)
        if isinstance(outcome, BaseException):
            outcome = {**dict.fromkeys(_NODE_FIELDS), "role_error": describe(outcome)}
        nodes[name] = outcome if outcome is not None else dict.fromkeys(_NODE_FIELDS)
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


# -- rendering ---------------------------------------------------------------------------------


def render_json(report: Mapping[str, Any], *, indent: int | None = 2) -> str:
    return json.dumps(report, indent=indent, default=str)


def _cell(value: Any, empty: str = "-") -> str:
    if value is None or value == "":
        return empty
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) for cell, width in zip(cells, widths, strict=True)
        ).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return "-"
    return text if len(text) <= width else text[: width - 3] + "..."


def _role_cell(shard: Mapping[str, Any]) -> str:
    if shard["role"] is not None:
        return str(shard["role"])
    state = shard.get("master_state")
    if state == "auth_refused":
        return "AUTH REFUSED"
    if state == "unreachable":
        return "UNREACHABLE"
    return "ERROR" if shard["role_error"] else "-"


def _replicas_cell(shard: Mapping[str, Any]) -> str:
    replicas = shard["replicas"]
    if replicas is None:
        return "?"
    healthy = [r["address"] for r in replicas if r["healthy"]]
    text = f"{len(healthy)}/{len(replicas)}"
    return f"{text} {','.join(healthy)}" if healthy else text


def _switch_cell(shard: Mapping[str, Any], started: bool) -> str:
    if not started:
        return "-"  # this process runs no pool: it has seen nothing switch
    if not shard["switch_count"] or shard["last_switch"] is None:
        return "never"
    at = datetime.fromtimestamp(shard["last_switch"]).strftime("%Y-%m-%d %H:%M:%S")
    return f"{at} via {shard['last_switch_source']} (x{shard['switch_count']})"


def _epoch_cell(shard: Mapping[str, Any]) -> str:
    epoch = shard.get("config_epoch")
    text = "?" if epoch is None else str(epoch)
    return f"{text} FAILOVER" if shard.get("failover_in_progress") else text


_SENTINEL_STATES = {
    SENTINEL_OK: "ok",
    SENTINEL_UNREACHABLE: "UNREACHABLE",
    SENTINEL_AUTH_REFUSED: "AUTH REFUSED",
}


def _sentinel_state_cell(sentinel: Mapping[str, Any]) -> str:
    state = sentinel.get("state")
    if state is None:  # a report from before sentinels had a state
        return "ok" if sentinel["reachable"] else "UNREACHABLE"
    return _SENTINEL_STATES.get(str(state), str(state))


def _summary(report: Mapping[str, Any]) -> str:
    """ "DEGRADED (exit 1)", or how the policy changed the exit code."""
    state, code = report["state"], report["exit_code"]
    if report.get("fail_on") == DOWN and state == DEGRADED and code == EXIT_CODES[HEALTHY]:
        return f"{state.upper()} (exit {code}: fail on down only, every shard can serve)"
    return f"{state.upper()} (exit {code})"


def _quorum_cell(quorum: Mapping[str, Any]) -> str:
    if quorum["ok"] is None:
        return "?"
    return "ok" if quorum["ok"] else "FAIL"


def _listener_cell(value: bool | None) -> str:
    if value is None:
        return "-"
    return "connected" if value else "DISCONNECTED"


def render_text(report: Mapping[str, Any], *, title: str | None = None) -> str:
    """A terminal table: a summary line, one row per shard and per sentinel, then problems."""
    shards, sentinels = report["shards"], report["sentinels"]
    head = f"{title}: " if title else ""
    lines = [
        f"{head}{_summary(report)}: {len(shards)} shards, "
        f"{len(sentinels)} sentinels, checked {report['checked_at']} in "
        f"{report['elapsed_ms']:.0f} ms",
        "",
    ]
    lines += _table(
        [
            "#",
            "shard",
            "weight",
            "master",
            "role",
            "sentinels",
            "quorum",
            "epoch",
            "replicas",
            "ping ms",
            "keys",
            "memory",
            "last switch (this process)",
            "fence",
        ],
        [
            [
                str(s["index"]),
                s["name"],
                str(s["weight"]),
                _cell(s["address"]),
                _role_cell(s),
                f"{s['sentinels_agreeing']}/{s['sentinels_total']}",
                _quorum_cell(s["ckquorum"]),
                _epoch_cell(s),
                _replicas_cell(s),
                _cell(s["latency_ms"]),
                _cell(s["keys"]),
                _cell(s["memory"]),
                _switch_cell(s, bool(report["pool"]["started"])),
                f"HELD ({s['fence_reason']})" if s["fenced"] else "open",
            ]
            for s in shards
        ],
    )
    lines.append("")
    lines += _table(
        ["sentinel", "state", "ping ms", "listener", "error"],
        [
            [
                s["address"] + ("" if s["configured"] else " (learned)"),
                _sentinel_state_cell(s),
                _cell(s["latency_ms"]),
                _listener_cell(s["listener_connected"]),
                _short(s["error"]),
            ]
            for s in sentinels
        ],
    )
    near = [(s["name"], s["near_cache"]) for s in shards if s.get("near_cache")]
    if near:
        lines.append("")
        lines += _table(
            [
                "near cache (this process)",
                "tracked",
                "entries",
                "bytes",
                "hit ratio",
                "invalidations",
                "flushes",
            ],
            [
                [
                    name,
                    "yes" if n["tracked"] else "NO",
                    str(n["entries"]),
                    str(n["bytes"]),
                    _cell(n["hit_ratio"]),
                    str(n["invalidations"]),
                    ", ".join(f"{cause} {count}" for cause, count in n["flushes"].items()) or "-",
                ]
                for name, n in near
            ],
        )
    if report["problems"]:
        # Under fail-on down, a degraded report's problems are warnings: they do not fail it.
        warnings = report["exit_code"] == EXIT_CODES[HEALTHY]
        heading = "warnings (redundancy reduced):" if warnings else "problems:"
        lines += ["", heading] + [f"  - {p}" for p in report["problems"]]
    if report["notes"]:
        lines += ["", "notes:"] + [f"  - {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"
