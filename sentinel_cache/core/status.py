"""A live health report of a sharded Sentinel cache, shared by the Django and Flask commands.

:func:`collect` asks every sentinel and every shard's master directly, on fresh short-timeout
connections (never the pool's own sockets, which serve traffic), so a status check neither waits
behind the application nor disturbs it. All probes run at once on daemon threads with a hard
deadline: a black-holed node costs one timeout, and a report comes back even when every node is
down. The report is plain JSON-able data; :func:`render_text` and :func:`render_json` format it.
"""

from __future__ import annotations

import functools
import json
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from sentinel_cache.core.config import Address
from sentinel_cache.core.discovery import (
    direct_client,
    instance_healthy,
    reply_address,
    reply_fields,
    reply_text,
)

if TYPE_CHECKING:
    from sentinel_cache.core.sharded_pool import ShardedSentinelPool

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXIT_CODES",
    "SentinelProbe",
    "collect",
    "exit_code",
    "probe_sentinels",
    "render_json",
    "render_text",
    "run_all",
]

DEFAULT_TIMEOUT = 1.0
HEALTHY, DEGRADED, DOWN = "healthy", "degraded", "down"
EXIT_CODES: Mapping[str, int] = {HEALTHY: 0, DEGRADED: 1, DOWN: 2}
_SEVERITY = (HEALTHY, DEGRADED, DOWN)

K = TypeVar("K")
T = TypeVar("T")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def run_all(
    tasks: Mapping[K, Callable[[], T]], deadline: float, what: str
) -> dict[K, T | BaseException]:
    """Run every task on its own daemon thread; one still running at the deadline maps to a
    TimeoutError, and is left to finish on its own (its sockets have timeouts too)."""
    inbox: queue.Queue[tuple[K, T | BaseException]] = queue.Queue()

    def run(key: K, task: Callable[[], T]) -> None:
        try:
            inbox.put((key, task()))
        except BaseException as exc:  # reported in the result, never lost on a thread
            inbox.put((key, exc))

    for key, task in tasks.items():
        threading.Thread(
            target=run, args=(key, task), name=f"sentinel_cache-status-{what}", daemon=True
        ).start()
    results: dict[K, T | BaseException] = {}
    while len(results) < len(tasks):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            key, outcome = inbox.get(timeout=remaining)
        except queue.Empty:
            break
        results[key] = outcome
    for key in tasks:
        if key not in results:
            results[key] = TimeoutError(f"no answer before the status deadline ({what})")
    return results


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
    """What one sentinel answered: reachability, latency and, per master, its view."""

    address: Address
    reachable: bool = False
    latency_ms: float | None = None
    error: str | None = None
    masters: dict[str, Address | None | BaseException] = field(default_factory=dict)
    replicas: dict[str, list[dict[str, str]] | BaseException] = field(default_factory=dict)
    ckquorum: dict[str, tuple[bool, str]] = field(default_factory=dict)

    def __repr__(self) -> str:
        state = f"{self.latency_ms}ms" if self.reachable else f"unreachable ({self.error})"
        return f"<SentinelProbe {self.address} {state}>"


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
            results = pipe.execute(raise_on_error=False)
        else:
            client.ping()
        probe.latency_ms = _timed_ping(client)
        probe.reachable = True
    except (redis.RedisError, OSError) as exc:
        probe.error = _describe(exc)
        return probe
    finally:
        _close(client)
    for i, name in enumerate(masters):
        master, replicas, quorum = results[3 * i : 3 * i + 3]
        if isinstance(master, BaseException):
            probe.masters[name] = master
        else:
            probe.masters[name] = reply_address(*master) if master else None
        if isinstance(replicas, BaseException):
            probe.replicas[name] = replicas
        else:
            probe.replicas[name] = [reply_fields(item) for item in replicas or ()]
        if isinstance(quorum, BaseException):
            probe.ckquorum[name] = (False, str(quorum))
        else:
            probe.ckquorum[name] = (True, reply_text(quorum))
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
            outcome = SentinelProbe(address, error=_describe(outcome))
        probes.append(outcome)
    return probes


# -- data nodes --------------------------------------------------------------------------------

_NODE_FIELDS = ("role", "role_error", "error", "latency_ms", "keys", "memory")


def _probe_node(address: Address, kwargs: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """ROLE, PING latency, DBSIZE and used memory of one data node.

    ``role_error`` means the node could not say what it is; ``error`` is a later failure.
    """
    found: dict[str, Any] = dict.fromkeys(_NODE_FIELDS)
    client = _client(address, kwargs, timeout)
    try:
        try:
            found["role"] = reply_text(client.execute_command("ROLE")[0])
        except (redis.RedisError, OSError) as exc:
            found["role_error"] = _describe(exc)
            return found
        found["latency_ms"] = _timed_ping(client)
        pipe = client.pipeline(transaction=False)
        pipe.dbsize()
        pipe.info("memory")
        keys, memory = pipe.execute(raise_on_error=False)
        if not isinstance(keys, BaseException):
            found["keys"] = int(keys)
        if isinstance(memory, Mapping):
            found["memory"] = memory.get("used_memory_human")
    except (redis.RedisError, OSError) as exc:
        found["error"] = _describe(exc)
    finally:
        _close(client)
    return found


# -- the report --------------------------------------------------------------------------------


class _Problems:
    """Problems with their severity; the worst one decides the report's state."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def __repr__(self) -> str:
        return f"<_Problems state={self.state} count={len(self.items)}>"

    def add(self, severity: str, message: str) -> None:
        self.items.append((severity, message))

    @property
    def state(self) -> str:
        return max((s for s, _ in self.items), key=_SEVERITY.index, default=HEALTHY)

    @property
    def messages(self) -> list[str]:
        # Worst first, so the first line explains the state.
        ordered = sorted(self.items, key=lambda item: -_SEVERITY.index(item[0]))
        return [message for _, message in ordered]


def _pick_master(
    name: str, probes: Sequence[SentinelProbe]
) -> tuple[Address | None, int, list[str]]:
    """The address most reachable sentinels name (ties: the earlier sentinel), its votes, and
    how each reachable sentinel that did not name it answered instead."""
    votes: dict[Address, int] = {}
    for probe in probes:
        answer = probe.masters.get(name)
        if probe.reachable and isinstance(answer, Address):
            votes[answer] = votes.get(answer, 0) + 1
    chosen = max(votes, key=lambda a: votes[a]) if votes else None  # max keeps the first tie
    dissent = []
    for probe in probes:
        if not probe.reachable:
            continue
        answer = probe.masters.get(name)
        if answer == chosen:
            continue
        if answer is None:
            dissent.append(f"{probe.address} does not monitor {name!r}")
        elif isinstance(answer, BaseException):
            dissent.append(f"{probe.address}: {_describe(answer)}")
        else:
            dissent.append(f"{probe.address} names {answer}")
    return chosen, votes.get(chosen, 0) if chosen else 0, dissent


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


def _ckquorum(name: str, probes: Sequence[SentinelProbe]) -> dict[str, Any]:
    for probe in probes:
        if probe.reachable and name in probe.ckquorum:
            ok, message = probe.ckquorum[name]
            return {"ok": ok, "message": message, "sentinel": str(probe.address)}
    return {"ok": None, "message": "no sentinel reachable", "sentinel": None}


def collect(core: ShardedSentinelPool, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """A live report of every shard and sentinel of ``core``; never raises for a dead topology.

    Takes at most about four ``timeout`` periods (two rounds, sentinels then masters), usually
    a few milliseconds. Does not start the core: an idle pool is reported from the sentinels.
    """
    began = time.monotonic()
    snapshot = core.status()  # in memory: what the application's client currently believes
    config = core.config
    names = list(config.masters)
    addresses = core.sentinels.addresses
    listeners = {s["address"]: s["listener_connected"] for s in snapshot["sentinels"]}
    problems = _Problems()
    notes: list[str] = []

    probes = probe_sentinels(addresses, core.sentinels.kwargs, timeout=timeout, masters=names)
    sentinels = []
    for probe in probes:
        key = str(probe.address)
        listener = listeners.get(key)  # None: this core runs no listeners (not started)
        sentinels.append(
            {
                "address": key,
                "configured": probe.address in config.sentinels,
                "reachable": probe.reachable,
                "latency_ms": probe.latency_ms,
                "error": probe.error,
                "listener_connected": listener,
            }
        )
        if not probe.reachable:
            problems.add(DEGRADED, f"sentinel {key} unreachable ({probe.error})")
        elif listener is False:
            notes.append(f"sentinel {key}: the failover listener is not connected")

    # Second round: each shard's master, as the sentinels name it (or as the core last knew).
    chosen: dict[str, tuple[Address | None, str | None, int, list[str]]] = {}
    for shard in snapshot["shards"]:
        name = shard["name"]
        address, agreeing, dissent = _pick_master(name, probes)
        source: str | None = "sentinels" if address is not None else None
        if address is None:  # no sentinel could say: check where the application still goes
            address = core.shard(name).address
            source = None if address is None else "client (last known)"
        chosen[name] = (address, source, agreeing, dissent)
    node_kwargs = config.connection_options()
    tasks = {
        name: functools.partial(_probe_node, address, node_kwargs, timeout)
        for name, (address, *_rest) in chosen.items()
        if address is not None
    }
    nodes = run_all(tasks, time.monotonic() + 2 * timeout + 0.1, "masters")

    shards = []
    for shard in snapshot["shards"]:
        name = shard["name"]
        label = f"shard {shard['index']} ({name})"
        address, source, agreeing, dissent = chosen[name]
        node = nodes.get(name) or dict.fromkeys(_NODE_FIELDS)
        if isinstance(node, BaseException):
            node = {**dict.fromkeys(_NODE_FIELDS), "role_error": _describe(node)}
        replicas = _replicas_seen(name, address, probes)
        online = None if replicas is None else sum(1 for r in replicas if r["healthy"])
        quorum = _ckquorum(name, probes)
        entry: dict[str, Any] = {
            "index": shard["index"],
            "name": name,
            "weight": shard["weight"],
            "address": None if address is None else str(address),
            "address_source": source,
            "client_address": shard["address"],
            "role": node["role"],
            "role_error": node["role_error"],
            "error": node["error"],
            "latency_ms": node["latency_ms"],
            "keys": node["keys"],
            "memory": node["memory"],
            "sentinels_agreeing": agreeing,
            "sentinels_total": len(probes),
            "sentinels_disagreeing": dissent,
            "replicas": replicas,
            "replicas_online": online,
            "ckquorum": quorum,
            "switch_count": shard["switch_count"],
            "last_switch": shard["last_switch"],
            "last_switch_source": shard["last_switch_source"],
            "fenced": shard["fenced"],
            "fence_reason": shard["fence_reason"],
        }
        shards.append(entry)

        if address is None:
            why = "; ".join(dissent) if dissent else "no sentinel reachable"
            problems.add(DOWN, f"{label}: no master known ({why})")
        elif entry["role"] is None:
            problems.add(DOWN, f"{label}: master {address} unreachable ({entry['role_error']})")
        elif entry["role"] != "master":
            problems.add(DOWN, f"{label}: {address} reports ROLE {entry['role']}, not master")
        if dissent and address is not None:
            problems.add(
                DEGRADED,
                f"{label}: sentinels disagree ({agreeing} name {address}; {'; '.join(dissent)})",
            )
        if online == 0:
            problems.add(DEGRADED, f"{label}: no replica online, a failover is impossible")
        if quorum["ok"] is False:
            problems.add(
                DEGRADED, f"{label}: CKQUORUM on {quorum['sentinel']}: {quorum['message']}"
            )
        if address is not None and shard["address"] not in (None, str(address)):
            notes.append(f"{label}: the client still uses {shard['address']}")
        if entry["error"]:
            notes.append(f"{label}: master {address}: {entry['error']}")
        if shard["fenced"]:
            notes.append(f"{label}: writes held ({shard['fence_reason']})")

    state = problems.state
    return {
        "state": state,
        "exit_code": EXIT_CODES[state],
        "problems": problems.messages,
        "notes": notes,
        "checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "elapsed_ms": _ms(time.monotonic() - began),
        "timeout": timeout,
        "pool": {"started": snapshot["started"], "closed": snapshot["closed"]},
        "shards": shards,
        "sentinels": sentinels,
    }


def exit_code(report: Mapping[str, Any]) -> int:
    """0 healthy, 1 degraded, 2 down (a shell or a probe can branch on it)."""
    return EXIT_CODES.get(str(report.get("state")), EXIT_CODES[DOWN])


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
    if shard["role_error"]:
        return "ERROR"
    return "-"


def _replicas_cell(shard: Mapping[str, Any]) -> str:
    replicas = shard["replicas"]
    if replicas is None:
        return "?"
    healthy = [r["address"] for r in replicas if r["healthy"]]
    text = f"{len(healthy)}/{len(replicas)}"
    return f"{text} {','.join(healthy)}" if healthy else text


def _switch_cell(shard: Mapping[str, Any]) -> str:
    if not shard["switch_count"] or shard["last_switch"] is None:
        return "never"
    at = datetime.fromtimestamp(shard["last_switch"]).strftime("%Y-%m-%d %H:%M:%S")
    return f"{at} via {shard['last_switch_source']} (x{shard['switch_count']})"


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
        f"{head}{report['state'].upper()} (exit {report['exit_code']}): {len(shards)} shards, "
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
            "replicas",
            "ping ms",
            "keys",
            "memory",
            "last switch",
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
                _replicas_cell(s),
                _cell(s["latency_ms"]),
                _cell(s["keys"]),
                _cell(s["memory"]),
                _switch_cell(s),
                f"HELD ({s['fence_reason']})" if s["fenced"] else "open",
            ]
            for s in shards
        ],
    )
    lines.append("")
    lines += _table(
        ["sentinel", "reachable", "ping ms", "listener", "error"],
        [
            [
                s["address"] + ("" if s["configured"] else " (learned)"),
                _cell(s["reachable"]),
                _cell(s["latency_ms"]),
                _listener_cell(s["listener_connected"]),
                _short(s["error"]),
            ]
            for s in sentinels
        ],
    )
    if report["problems"]:
        lines += ["", "problems:"] + [f"  - {p}" for p in report["problems"]]
    if report["notes"]:
        lines += ["", "notes:"] + [f"  - {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"
