"""Turns the collected figures into tables (plain text and Markdown) and PASS/FAIL targets."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.contenders import SPEC_BY_ID
from benchmarks.measure import OPERATIONS, summarize

FLOOR = "raw"
OURS = "ours_django"


def _fmt_us(ns: float) -> str:
    us = ns / 1000
    return f"{us:,.0f}" if us >= 100 else f"{us:.1f}"


def latency_table(latency: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]], dict]:
    """Rows of "median µs (x floor)" per contender and operation; also the summary dict."""
    ops = [op for op, _ in OPERATIONS]
    summary: dict[str, dict[str, Any]] = {}
    for op in ops:
        per = latency.get(op, {})
        floor = per.get(FLOOR)
        floor_median = summarize(floor["samples_ns"])["median"] if floor else None
        floor_rounds = floor["round_medians_ns"] if floor else None
        for cid, data in per.items():
            if not data["samples_ns"]:
                continue
            stats = summarize(data["samples_ns"])
            entry = summary.setdefault(cid, {})
            ratio = stats["median"] / floor_median if floor_median else None
            paired = (
                [a / b for a, b in zip(data["round_medians_ns"], floor_rounds, strict=False)]
                if floor_rounds
                else []
            )
            entry[op] = {
                "errors": data.get("errors", 0),
                "last_error": data.get("last_error"),
                "median_us": stats["median"] / 1000,
                "client_cpu_us": data["cpu_ns"] / max(1, stats["n"]) / 1000,
                "p90_us": stats["p90"] / 1000,
                "n": stats["n"],
                "round_medians_us": [v / 1000 for v in data["round_medians_ns"]],
                "x_floor": ratio,
                "x_floor_per_round": paired,
            }
    header = ["contender", "masters", *ops]
    rows = []
    for cid in _ordered(summary):
        row = [SPEC_BY_ID[cid].label, SPEC_BY_ID[cid].masters]
        for op in ops:
            cell = summary[cid].get(op)
            if cell is None:
                row.append("-")
                continue
            ratio = cell["x_floor"]
            row.append(
                f"{_fmt_us(cell['median_us'] * 1000)}"
                + ("" if ratio is None or cid == FLOOR else f" ({ratio:.2f}x)")
            )
        rows.append(row)
    return header, rows, summary


def cpu_table(summary: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Client CPU µs per call (thread time in the calls): the library's own work, which the
    noise of a shared machine (waiting for a server process to be scheduled) does not touch."""
    ops = [op for op, _ in OPERATIONS]
    header = ["contender", *ops]
    rows = []
    for cid in _ordered(summary):
        floor = summary.get(FLOOR, {})
        row = [SPEC_BY_ID[cid].label]
        for op in ops:
            cell = summary[cid].get(op)
            if cell is None:
                row.append("-")
                continue
            base = floor.get(op, {}).get("client_cpu_us")
            ratio = cell["client_cpu_us"] / base if base and cid != FLOOR else None
            row.append(f"{cell['client_cpu_us']:.1f}" + (f" ({ratio:.2f}x)" if ratio else ""))
        rows.append(row)
    return header, rows


def throughput_table(
    results: dict[str, dict[str, Any]], threads: int
) -> tuple[list[str], list[list[str]], dict]:
    summary: dict[str, dict[str, Any]] = {}
    for cid, data in results.items():
        values = data["round_ops_per_s"]
        summary[cid] = {
            "median_ops_per_s": statistics.median(values),
            "round_ops_per_s": values,
            "errors": data["errors"],
        }
    floor = summary.get(FLOOR, {}).get("median_ops_per_s")
    base = summary.get("dr_default", {}).get("median_ops_per_s")
    base_rounds = summary.get("dr_default", {}).get("round_ops_per_s")
    for s in summary.values():  # paired: each round's ratio to django-redis in that round
        s["x_dr_default_per_round"] = (
            [a / b for a, b in zip(s["round_ops_per_s"], base_rounds, strict=False)]
            if base_rounds
            else []
        )
        s["x_dr_default_paired_median"] = (
            statistics.median(s["x_dr_default_per_round"]) if base_rounds else None
        )
    header = [
        "contender",
        f"{threads}-thread 90/10 ops/s (median)",
        "rounds min-max",
        "x floor",
        "x django-redis Default",
        "paired x django-redis (median of rounds)",
    ]
    rows = []
    for cid in _ordered(summary):
        s = summary[cid]
        med = s["median_ops_per_s"]
        rows.append(
            [
                SPEC_BY_ID[cid].label,
                f"{med:,.0f}",
                f"{min(s['round_ops_per_s']):,.0f}-{max(s['round_ops_per_s']):,.0f}",
                f"{med / floor:.2f}" if floor else "-",
                f"{med / base:.2f}" if base else "-",
                f"{s['x_dr_default_paired_median']:.2f}" if base else "-",
            ]
        )
        s["x_floor"] = med / floor if floor else None
        s["x_dr_default"] = med / base if base else None
    return header, rows, summary


def async_table(results: dict[str, dict[str, Any]], concurrency: int) -> tuple[list, list, dict]:
    summary: dict[str, dict[str, Any]] = {}
    for cid, data in results.items():
        summary[cid] = {
            "aget_median_us": summarize(data["aget_samples_ns"])["median"] / 1000,
            "aset_median_us": summarize(data["aset_samples_ns"])["median"] / 1000,
            "aget_concurrent_ops_per_s": statistics.median(data["aget_concurrent_ops_per_s"]),
        }
    header = [
        "contender (async API)",
        "aget µs (median)",
        "aset µs (median)",
        f"aget x{concurrency} tasks ops/s",
    ]
    rows = [
        [
            SPEC_BY_ID[cid].label + (" (native asyncio)" if cid == OURS else " (sync_to_async)"),
            f"{summary[cid]['aget_median_us']:.1f}",
            f"{summary[cid]['aset_median_us']:.1f}",
            f"{summary[cid]['aget_concurrent_ops_per_s']:,.0f}",
        ]
        for cid in _ordered(summary)
    ]
    return header, rows, summary


def failover_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [
        "contender",
        "start-up, 2/3 sentinels black-holed",
        "planned failover: acked writes lost",
        "write errors / longest write gap",
        "errors on the other shard",
        "frozen master: other shard's slowest write",
        "SIGKILL: +switch-master to first good write",
        "SIGKILL: kill to first good write",
    ]
    rows = []
    for data in results.values():
        if "error" in data:
            rows.append([data["label"], f"failed: {data['error']}", "", "", "", "", "", ""])
            continue
        start = data["startup_2_of_3_blackholed"]
        planned, kill, frozen = data["planned"], data["sigkill"], data["frozen"]
        after = kill["switch_to_first_write_ms"]
        startup = f"{start['all_shards_s']:.2f} s"
        if "startup_2_of_3_blackholed_no_sentinel_retry" in data:
            no_retry = data["startup_2_of_3_blackholed_no_sentinel_retry"]["all_shards_s"]
            startup += f" ({no_retry:.2f} s with sentinel retries off)"
        rows.append(
            [
                data["label"],
                startup,
                f"{planned['lost_acked']} of {planned['acked']}",
                f"{planned['write_errors']} / {planned['longest_gap_ms']:.0f} ms",
                f"{planned['other_shard_errors']} (planned) / {kill['other_shard_errors']} (SIGKILL)",
                f"{frozen['other_shard_slowest_ms']:.1f} ms ({frozen['other_shard_errors']} errors)",
                "-" if after is None else f"{after:.1f} ms",
                "-"
                if kill["kill_to_first_write_s"] is None
                else f"{kill['kill_to_first_write_s']:.2f} s",
            ]
        )
    return header, rows


def scale_tables(results: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    tables = []
    mem = results["memory"]
    header = [
        "core over N shards (5 sentinels)",
        "RSS delta",
        "tracemalloc current / peak",
        "threads",
        "ring nodes",
    ]
    rows = [
        [
            f"{n} shards",
            f"{m['rss_delta_kib'] / 1024:.1f} MiB",
            f"{m['tracemalloc_current_kib'] / 1024:.2f} / {m['tracemalloc_peak_kib'] / 1024:.2f} MiB",
            str(m["threads_added"]),
            str(m["ring_nodes"]),
        ]
        for n, m in mem.items()
    ]
    tables.append(("Memory", header, rows))
    ops = results["per_op_us"]
    counts = list(ops["get"])
    header = ["single-key op (CacheClient)", *[f"{c} shards" for c in counts]]
    rows = []
    for op in ("get", "set"):
        rows += [
            [f"{op}, µs (median wall)", *[f"{ops[op][c]:.1f}" for c in counts]],
            [f"{op}, client CPU µs/op", *[f"{ops[f'{op}_client_cpu'][c]:.1f}" for c in counts]],
        ]
        if f"raw_{op}" in ops:
            rows += [
                [
                    f"  control: redis-py {op}, µs wall",
                    *[f"{ops[f'raw_{op}'][c]:.1f}" for c in counts],
                ],
                [
                    f"  control: redis-py {op}, client CPU",
                    *[f"{ops[f'raw_{op}_client_cpu'][c]:.1f}" for c in counts],
                ],
                [
                    f"  ours minus control, {op} CPU µs",
                    *[
                        f"{ops[f'{op}_client_cpu'][c] - ops[f'raw_{op}_client_cpu'][c]:+.1f}"
                        for c in counts
                    ],
                ],
            ]
    rows += [
        [
            "ring lookup, cached key, ns",
            *[f"{ops['ring_lookup']['warm_ns'][c]:.0f}" for c in counts],
        ],
        ["ring lookup, new key, ns", *[f"{ops['ring_lookup']['cold_ns'][c]:.0f}" for c in counts]],
    ]
    tables.append(("Scale", header, rows))
    return tables


def targets(
    latency: dict[str, dict[str, Any]], throughput: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The issue's targets, from medians measured side by side in this run."""
    out: list[dict[str, Any]] = []

    def med(cid: str, op: str) -> float | None:
        cell = latency.get(cid, {}).get(op)
        return None if cell is None else cell["median_us"]

    def add(name: str, ok: bool | None, detail: str) -> None:
        out.append(
            {
                "target": name,
                "result": "N/A" if ok is None else "PASS" if ok else "FAIL",
                "detail": detail,
            }
        )

    for op in ("get", "set"):
        ours, floor = med(OURS, op), med(FLOOR, op)
        if ours is None or floor is None:
            add(f"Django backend {op} <= 1.3x raw redis-py", None, "missing contender")
        else:
            add(
                f"Django backend {op} <= 1.3x raw redis-py",
                ours <= 1.3 * floor,
                f"{ours:.1f} µs vs {floor:.1f} µs = {ours / floor:.2f}x",
            )
    for op in ("get", "set"):
        ours, sharded = med(OURS, op), med("raw_sharded", op)
        cpu_ours = latency.get(OURS, {}).get(op, {}).get("client_cpu_us")
        cpu_floor = latency.get(FLOOR, {}).get(op, {}).get("client_cpu_us")
        if ours is not None and sharded is not None and cpu_ours and cpu_floor:
            out.append(
                {
                    "target": f"Django backend {op} vs redis-py on the same 4 masters",
                    "result": "INFO",
                    "detail": f"{ours / sharded:.2f}x wall; client CPU {cpu_ours:.1f} µs vs "
                    f"{cpu_floor:.1f} µs for raw redis-py = {cpu_ours / cpu_floor:.2f}x",
                }
            )
    ours, single = med(OURS, "get_many[100]"), med("django_redis_cache", "get_many[100]")
    if ours is None or single is None:
        add("get_many[100] over 4 shards <= Django RedisCache on 1 server", None, "missing")
    else:
        add(
            "get_many[100] over 4 shards <= Django RedisCache on 1 server",
            ours <= single,
            f"{ours:.0f} µs vs {single:.0f} µs = {ours / single:.2f}x",
        )
    shard = med("dr_shard", "get_many[100]")
    if ours is None or shard is None:
        add("get_many[100] >= 10x faster than django-redis ShardClient", None, "missing")
    else:
        add(
            "get_many[100] >= 10x faster than django-redis ShardClient",
            shard >= 10 * ours,
            f"{shard:,.0f} µs vs {ours:.0f} µs = {shard / ours:.1f}x faster",
        )
    ours_t = throughput.get(OURS, {}).get("median_ops_per_s")
    base_t = throughput.get("dr_default", {}).get("median_ops_per_s")
    paired = throughput.get(OURS, {}).get("x_dr_default_paired_median")
    if ours_t is None or base_t is None or paired is None:
        add("8-thread mixed ahead of django-redis DefaultClient", None, "missing")
    else:
        wins = sum(1 for r in throughput[OURS]["x_dr_default_per_round"] if r > 1)
        rounds = len(throughput[OURS]["x_dr_default_per_round"])
        add(
            "8-thread mixed ahead of django-redis DefaultClient",
            ours_t > base_t and paired > 1,
            f"medians {ours_t:,.0f} vs {base_t:,.0f} ops/s = {ours_t / base_t:.2f}x; paired "
            f"per-round ratio {paired:.2f}x, ahead in {wins} of {rounds} rounds",
        )
    return out


def _ordered(ids: Any) -> list[str]:
    return [cid for cid in SPEC_BY_ID if cid in ids]


# -- rendering -----------------------------------------------------------------------------------


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)
