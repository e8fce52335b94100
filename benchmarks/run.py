"""``python -m benchmarks.run`` (``make bench``): the whole benchmark report in one run.

Starts a local topology (4 shards x 1 replica, 3 sentinels; real servers on 127.0.0.1) and
measures every contender side by side, interleaved over several rounds (operations shuffled per
round, contenders shuffled per chunk), because the machine is shared and absolute times are
noisy: read the medians and, above all, the ratios measured in the same run.

Sections: per-call latency (get, set, get_many/set_many/delete_many of 10 and 100 keys, incr),
an 8-thread 90/10 read/write mix (ops/s), the async API, failover figures (fresh topologies,
see ``benchmarks.failover``), memory and scale on 16 shards (``benchmarks.scale``), a profile of
our hot paths, and the targets as PASS/FAIL lines.

Output: the report on stdout (progress on stderr), ``benchmarks/results/latest.json`` and
``latest.md`` (git-ignored), and with ``--docs`` the Markdown report in
``docs/benchmarks-results.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks import failover, measure, near, profile_hot, ratios, report, reshard, scale
from benchmarks.contenders import SPEC_BY_ID, SPECS, Topology, build_all

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks-results.md"
COMMAND = ".venv/bin/python -m benchmarks.run --docs"


NOTES = [
    "- One local topology (4 masters, 1 replica each, 3 sentinels, real `redis-server` processes "
    "on 127.0.0.1) for the latency, throughput and async sections; each contender writes its "
    "own 1,000 keys (a 6-field dict, pickled by the contender's own serializer) with a 300 s "
    "timeout, and reads them back.",
    "- Interleaving: every round shuffles the operations; every operation is split into chunks "
    "and the contenders are shuffled before each chunk. Each call is timed on its own "
    "(`perf_counter_ns`), the cyclic GC is off inside the timed chunks (as `timeit` does), and "
    "the table shows the median of all calls; `latest.json` also has p90, the per-round "
    "medians and the per-round ratios. Client CPU is the thread CPU time spent inside the calls.",
    "- Two floors: the issue's floor is raw redis-py on ONE master. \"redis-py, 4 masters by our "
    'ring" is plain redis-py spread over the same 4 masters as ours: on this 2-core shared '
    "machine, talking to 4 server processes instead of 1 costs by itself (a sleeping server "
    "process must be woken and scheduled), so it separates that cost from the library's.",
    "- django-redis SentinelClient and Flask-Caching RedisSentinelCache read from a replica "
    "(their design); Flask-Caching's delete_many re-checks every key on that replica, so it runs "
    "with `ignore_delete_many_errors=True` (the replica may not have the DEL yet). django-redis "
    "ShardClient has no Sentinel support and sends one command per key in multi-key calls. "
    "Django's RedisCache builds a `redis.Redis` object on every call.",
    "- The mixed workload shares one cache object between the threads (Django makes one per "
    "thread; every contender here is thread-safe); the async section runs in one event loop.",
    "- Failover: a fresh topology per contender. Planned: `SENTINEL FAILOVER` while a writer "
    "writes a new key every 2 ms; after the old master has been demoted to a replica of the new "
    "one and is in sync, every acknowledged key is looked up on the new master. SIGKILL: the "
    "reference is the first `+switch-master` any sentinel publishes (we subscribe to all).",
]


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--chunks", type=int, default=4, help="chunks per op per round")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply calls per round")
    parser.add_argument("--threads", type=int, default=8, help="threads in the mixed workload")
    parser.add_argument("--duration", type=float, default=0.5, help="seconds per mixed run")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument(
        "--only",
        action="append",
        choices=[s.id for s in SPECS],
        help="run only these contenders (repeatable)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 rounds, a quarter of the calls: a smoke test, not a result",
    )
    parser.add_argument("--skip-failover", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--skip-ratios", action="store_true")
    parser.add_argument("--skip-near", action="store_true")
    parser.add_argument("--skip-reshard", action="store_true")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--docs", action="store_true", help=f"also write {DOCS.relative_to(ROOT)}")
    return parser


def _environment(cluster: Any) -> dict[str, Any]:
    import django
    import redis

    try:
        import hiredis

        hiredis_version = getattr(hiredis, "__version__", "yes")
    except ImportError:
        hiredis_version = "no"
    import django_redis

    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "server": f"{cluster.server_kind} {cluster.server_version}",
        "redis_py": redis.__version__,
        "hiredis": hiredis_version,
        "django": django.get_version(),
        "django_redis": ".".join(map(str, django_redis.VERSION)),
        "flask_caching": importlib.metadata.version("flask-caching"),
        "load_average_at_start": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.rounds, args.scale, args.duration = 2, 0.25, 0.25
    warnings.filterwarnings("ignore", module="django_redis")
    warnings.filterwarnings("ignore", message=".*sharded client should not specify client.*")
    from sentinel_cache.core.registry import close_all
    from sentinel_cache.testing import LocalSentinelCluster

    RESULTS.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    data: dict[str, Any] = {
        "command": COMMAND,
        "settings": {
            "rounds": args.rounds,
            "chunks": args.chunks,
            "scale": args.scale,
            "threads": args.threads,
            "duration_s": args.duration,
            "seed": args.seed,
            "calls_per_round": {
                op: measure.calls_per_round(size, args.scale) for op, size in measure.OPERATIONS
            },
        },
    }
    log("starting the topology: 4 shards x 1 replica, 3 sentinels")
    with LocalSentinelCluster(shards=4, replicas=1, sentinels=3) as cluster:
        data["environment"] = _environment(cluster)
        topo = Topology.of(cluster)
        contenders, skipped = build_all(topo, args.only)
        data["skipped"] = skipped
        for cid, why in skipped.items():
            log(f"skipped {cid}: {why}")
        try:
            log(f"latency: {len(contenders)} contenders x {len(measure.OPERATIONS)} operations")
            lat = measure.latency(
                contenders,
                rounds=args.rounds,
                chunks=args.chunks,
                scale=args.scale,
                seed=args.seed,
                progress=log,
            )
            log("mixed workload")
            thr = measure.throughput(
                contenders,
                rounds=2 * args.rounds,  # shorter runs, twice as many: finer interleaving
                threads=args.threads,
                duration=args.duration,
                seed=args.seed,
                progress=log,
            )
            async_ids = [c for c in ("ours_django", "django_redis_cache") if c in contenders]
            asy: dict[str, Any] = {}
            if async_ids:
                log("async API")
                asy = measure.async_latency(
                    {c: contenders[c] for c in async_ids},
                    rounds=args.rounds,
                    scale=args.scale,
                    chunks=args.chunks,
                    concurrency=32,
                    duration=min(2 * args.duration, 1.0),
                    seed=args.seed,
                )
            prof: dict[str, Any] = {}
            if not args.skip_profile and "ours_django" in contenders:
                log("profiling our hot paths")
                targets_to_profile = {
                    c: contenders[c] for c in ("ours_django", "raw") if c in contenders
                }
                prof = profile_hot.profile(targets_to_profile, RESULTS)
                profile_hot.pyinstrument_tree(contenders["ours_django"], RESULTS)
        finally:
            for contender in contenders.values():
                try:
                    contender.close()
                except Exception as exc:  # closing must not hide the results
                    log(f"closing a contender failed: {exc!r}")
            close_all()
    lat_header, lat_rows, lat_summary = report.latency_table(lat)
    thr_header, thr_rows, thr_summary = report.throughput_table(thr, args.threads)
    data["latency"] = lat_summary
    data["throughput"] = thr_summary
    sections: list[tuple[str, str, list[str], list[list[str]]]] = [
        (
            "Latency per call",
            "Median µs per call (ratio to the raw redis-py floor in the same run); "
            f"{args.rounds} interleaved rounds.",
            lat_header,
            lat_rows,
        ),
        (
            "Client CPU per call",
            "Thread CPU time inside the calls, µs (ratio to the floor): the client library's own "
            "work (Python + syscalls), less sensitive to the shared machine's scheduling noise.",
            *report.cpu_table(lat_summary),
        ),
        (
            f"{args.threads}-thread mixed workload",
            f"90 % get / 10 % set on 1,000 keys, {2 * args.rounds} rounds of one "
            f"{args.duration:g} s run per contender, order shuffled per round; one cache "
            "object shared by the threads.",
            thr_header,
            thr_rows,
        ),
    ]
    if asy:
        a_header, a_rows, a_summary = report.async_table(asy, 32)
        data["async"] = a_summary
        sections.append(
            (
                "Async API",
                "Sequential awaits in one event loop, and 32 concurrent tasks.",
                a_header,
                a_rows,
            )
        )
    data["profile"] = prof
    data["targets"] = report.targets(lat_summary, thr_summary)

    if not args.skip_failover:
        log("failover figures (a fresh topology per contender)")
        data["failover"] = failover.run(log=log)
        f_header, f_rows = report.failover_table(data["failover"])
        sections.append(
            (
                "Failover",
                "Fresh 4x1x3 topology per contender; writer every 2 ms on the failing shard, "
                "another on a second shard.",
                f_header,
                f_rows,
            )
        )
    # Side-by-side figures of later capabilities: (skipped?, key, module, what it runs, title,
    # targets). Each module's run() returns its results and table() their rows.
    extras = [
        (args.skip_ratios, "ratios", ratios, "set_many vs MSET, get with and without metrics",
         "Side-by-side ratios",
         "Targets: set_many at most 2x raw MSET; a get with METRICS on at most 1.10x off."),
        (args.skip_near, "near_cache", near, "hit vs raw GET, staleness, 90/10 mix",
         "Near cache",
         "Targets: a hit at most 0.05x raw GET; staleness p99 <= 5 ms, max <= 50 ms; "
         "the 90/10 mix at least 5x without it."),
        (args.skip_reshard, "reshard", reshard, "migration rate, fallback read cost, reader misses",
         "Resharding",
         "Targets: at least 25,000 keys/s with 1 KB values; 0 misses for a reader during "
         "the migration; a fallback read at most 2.5x a plain get."),
    ]  # fmt: skip
    for skipped, key, module, what, title, targets in extras:
        if not skipped:
            log(f"{title.lower()} ({what})")
            data[key] = module.run(rounds=args.rounds)
            sections.append((title, targets, *module.table(data[key])))
    if not args.skip_scale:
        log("memory and scale (16 shards, 5 sentinels)")
        data["scale"] = scale.run(rounds=args.rounds, seed=args.seed, progress=log)
        for title, header, rows in report.scale_tables(data["scale"]):
            sections.append((title, "", header, rows))
    data["environment"]["load_average_at_end"] = os.getloadavg()
    data["elapsed_s"] = time.monotonic() - began

    (RESULTS / "latest.json").write_text(json.dumps(data, indent=2, default=str))
    text = render_text(data, sections)
    markdown = render_markdown(data, sections)
    (RESULTS / "latest.md").write_text(markdown)
    if args.docs:
        DOCS.write_text(markdown)
        log(f"wrote {DOCS.relative_to(ROOT)}")
    print(text)
    log(f"done in {data['elapsed_s']:.0f} s; JSON in {(RESULTS / 'latest.json').relative_to(ROOT)}")
    return 0


def _profile_lines(prof: dict[str, Any], limit: int = 8) -> list[str]:
    lines = []
    for name, entry in prof.items():
        if not name.startswith("ours_django:"):
            continue
        raw = prof.get("raw:" + name.split(":", 1)[1])
        extra = (
            f"; raw redis-py: {raw['function_calls_per_call']:.0f} calls, "
            f"{raw['profiled_us_per_call']:.1f} µs"
            if raw
            else ""
        )
        lines.append(
            f"{name}: {entry['function_calls_per_call']:.0f} Python function calls and "
            f"{entry['profiled_us_per_call']:.1f} µs (under cProfile) per operation{extra}"
        )
        for row in entry["top"][:limit]:
            lines.append(
                f"    {row['own_us_per_op']:7.2f} µs own  {row['calls_per_op']:7.1f} calls/op  "
                f"{row['function']}"
            )
    return lines


def _environment_line(data: dict[str, Any]) -> str:
    env = data["environment"]
    load = ", ".join(f"{x:.1f}" for x in env["load_average_at_start"])
    load_end = ", ".join(f"{x:.1f}" for x in env.get("load_average_at_end", ()))
    return (
        f"{env['date']}; Python {env['python']}; {env['machine']}; {env['server']}; "
        f"redis-py {env['redis_py']} (hiredis {env['hiredis']}); Django {env['django']}; "
        f"django-redis {env['django_redis']}; Flask-Caching {env['flask_caching']}; "
        f"load average {load} at start, {load_end} at end"
    )


def render_text(
    data: dict[str, Any], sections: list[tuple[str, str, list[str], list[list[str]]]]
) -> str:
    out = ["sentinel_cache benchmarks", _environment_line(data), ""]
    for cid, why in data.get("skipped", {}).items():
        out.append(f"skipped {SPEC_BY_ID[cid].label}: {why}")
    for title, note, header, rows in sections:
        out += [f"== {title} ==", *([note] if note else []), report.text_table(header, rows), ""]
    out.append("== Targets ==")
    for t in data["targets"]:
        out.append(f"{t['result']}: {t['target']} ({t['detail']})")
    if data.get("profile"):
        out += ["", "== Profile of the Django backend (cProfile, per operation) =="]
        out += _profile_lines(data["profile"])
    out += ["", f"reproduce: {data['command']}  ({data['elapsed_s']:.0f} s)"]
    return "\n".join(out)


def render_markdown(
    data: dict[str, Any], sections: list[tuple[str, str, list[str], list[list[str]]]]
) -> str:
    out = [
        "# Benchmark results",
        "",
        "Generated by `benchmarks/run.py`; reproduce with:",
        "",
        "```sh",
        COMMAND,
        "```",
        "",
        "(`make bench` runs the same measurements and prints this report without rewriting this "
        "page.) The machine is shared and noisy: every figure below comes from one run in which "
        "the contenders were measured interleaved, so compare the ratios, not the absolute "
        "times across runs.",
        "",
        f"Environment: {_environment_line(data)}.",
        "",
    ]
    for cid, why in data.get("skipped", {}).items():
        out.append(f"Skipped {SPEC_BY_ID[cid].label}: {why}")
    out += ["## Targets", ""]
    for t in data["targets"]:
        out.append(f"- **{t['result']}** {t['target']}: {t['detail']}")
    out.append("")
    for title, note, header, rows in sections:
        out += [f"## {title}", ""]
        if note:
            out += [note, ""]
        out += [report.markdown_table(header, rows), ""]
    if data.get("profile"):
        out += [
            "## Profile of the Django backend",
            "",
            "```text",
            *_profile_lines(data["profile"]),
            "```",
            "",
        ]
    out += [
        "## How it was measured",
        "",
        *NOTES,
        "",
        "## Contenders",
        "",
        *[
            f"- **{spec.label}** ({spec.masters} master{'s' if spec.masters != '1' else ''})"
            + (f": {spec.note}" if spec.note else "")
            for spec in SPECS
        ],
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
