"""The report for a terminal (a summary line, a table per shard and per sentinel, the problems)
and as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sentinel_cache.core.admin.states import (
    DEGRADED,
    DOWN,
    HEALTHY,
)
from sentinel_cache.core.admin.status.judge import EXIT_CODES
from sentinel_cache.core.admin.status.probes import (
    SENTINEL_AUTH_REFUSED,
    SENTINEL_NOT_SENTINEL,
    SENTINEL_OK,
    SENTINEL_UNREACHABLE,
)


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


#: The listener and last-switch cells of a process that has run no pool (a separate
#: ``sentinel_status`` or ``flask sentinel-status``), in words, the same in Django and Flask.
NOT_STARTED = "not started"


def _switch_cell(shard: Mapping[str, Any], started: bool) -> str:
    if not started:
        return NOT_STARTED  # this process runs no pool: it has seen nothing switch
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
    SENTINEL_NOT_SENTINEL: "NOT A SENTINEL",
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
        return NOT_STARTED  # this process runs no pool, so no listener
    return "connected" if value else "DISCONNECTED"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def render_text(report: Mapping[str, Any], *, title: str | None = None) -> str:
    """A terminal table: a summary line, one row per shard and per sentinel, then problems."""
    shards, sentinels = report["shards"], report["sentinels"]
    head = f"{title}: " if title else ""
    lines = [
        f"{head}{_summary(report)}: {_count(len(shards), 'shard')}, "
        f"{_count(len(sentinels), 'sentinel')}, checked {report['checked_at']} in "
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
    outages = [
        f"{s['name']} {s['outage_reads']}"
        + (
            ""
            if s.get("unreachable_for") is None
            else f" (master unreachable for {s['unreachable_for']:.1f} s)"
        )
        for s in shards
        if s.get("outage_reads") or s.get("unreachable_for") is not None
    ]
    if outages:
        lines += [
            "",
            "reads answered by a replica, master unreachable (this process): " + ", ".join(outages),
        ]
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
                    (f"yes ({n['mode']})" if n.get("mode") else "yes") if n["tracked"] else "NO",
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
    if report.get("warnings"):
        lines += ["", "warnings:"] + [f"  - {w}" for w in report["warnings"]]
    if report["notes"]:
        lines += ["", "notes:"] + [f"  - {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"
