"""``python -m benchmarks.run`` (``make bench``): the whole benchmark report in one run.

Starts a local topology (4 shards x 1 replica, 3 sentinels; real servers on 127.0.0.1) and
measures every contender side by side, interleaved over several rounds (operations shuffled per
round, contenders shuffled per chunk), because the machine is shared and absolute times are
noisy: read the medians and, above all, the ratios measured in the same run.

Sections: per-call latency (get, set, get_many/set_many/delete_many of 10 and 100 keys, incr),
an 8-thread 90/10 read/write mix (ops/s), sync threads on one server with one connection each
or one shared auto-pipelined connection (``benchmarks.sync_shared``), the async API, failover
figures (fresh topologies, see ``benchmarks.failover``), the cost of building the Django backend object
(``benchmarks.construct``), stampede protection and sessions through a crash
(``benchmarks.stampede``), the full stack (Django under uvicorn and gunicorn, loaded by ``wrk``:
``benchmarks.fullstack``), memory and scale on 16 shards (``benchmarks.scale``), a profile of
our hot paths, and the targets as PASS/FAIL lines.

Output (rendered by ``benchmarks.page``): the report on stdout (progress on stderr),
``benchmarks/results/latest.json`` and ``latest.md`` (git-ignored), and with ``--docs`` the
Markdown report in ``docs/benchmarks-results.md``: that page is only ever written here, stamped
with the commit (and whether the tree had uncommitted changes), the UTC time of the run and the
options, and ``--docs`` refuses to leave a section out (``tests/test_benchmarks_results.py``
checks the page).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks import (
    async_mux,
    construct,
    failover,
    fullstack,
    fullstack_wrk,
    measure,
    near,
    page,
    processes,
    profile_hot,
    ratios,
    report,
    reshard,
    scale,
    stampede,
    sync_shared,
)
from benchmarks.async_many import main as async_many_main
from benchmarks.contenders import ASYNC_ONLY, SPECS, Topology, build_all
from benchmarks.page import (
    ASYNC,
    CPU,
    FAILOVER,
    FULLSTACK,
    LATENCY,
    MIXED,
    NEAR,
    PROCESSES,
    RATIOS,
    RESHARD,
    STAMPEDE,
    Section,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks-results.md"
COMMAND = ".venv/bin/python -m benchmarks.run --docs"
IMG = ROOT / "docs" / "img"
# The pinned tables: the floors, the plain clients and ours, on the single- and 10-key ops.
PINNED_IDS = (
    "floor", "floor_sharded", "raw", "raw_sharded", "django_redis_cache", "dr_default",
    "ours_core", "ours_django",
)  # fmt: skip
PINNED_OPS = tuple(
    (op, size) for op, size in measure.OPERATIONS if size <= 10 and not op.endswith("[100]")
)
PROCESS_IDS = ("floor", "floor_sharded", "raw", "raw_sharded", "dr_default", "ours_django")
ASYNC_IDS = ("floor", "floor_sharded", "redis_asyncio", "django_redis_cache", "ours_django")


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
    parser.add_argument("--skip-construct", action="store_true")
    parser.add_argument("--skip-near", action="store_true")
    parser.add_argument("--skip-reshard", action="store_true")
    parser.add_argument("--skip-stampede", action="store_true")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--skip-fullstack", action="store_true")
    parser.add_argument("--skip-sync-shared", action="store_true")
    parser.add_argument(
        "--fullstack-seconds", type=float, default=10.0, help="wrk run per full-stack cell"
    )
    parser.add_argument(
        "--fullstack-pin",
        action="store_true",
        help="full stack: the app server alone on one CPU, wrk and the data nodes on the others",
    )
    parser.add_argument(
        "--docs",
        action="store_true",
        help=f"also write {DOCS.relative_to(ROOT)} (every section: no --skip-* or --only)",
    )
    return parser


def _options(args: argparse.Namespace) -> list[str]:
    """The options that differ from the defaults, as given on a command line."""
    defaults = vars(_parser().parse_args([]))
    out = []
    for name, value in vars(args).items():
        if name == "docs" or value == defaults[name]:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, list):
            out += [f"{flag} {v}" for v in value]
        else:
            out.append(f"{flag} {value}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    options = _options(args)
    partial = [o for o in options if o.startswith(("--only", "--skip-"))]
    if args.docs and partial:
        parser.error(f"--docs writes every section: drop {' '.join(partial)}")
    if args.quick:
        args.rounds, args.scale, args.duration = 2, 0.25, 0.25
    try:
        fullstack_wrk.whole_seconds("--fullstack-seconds", args.fullstack_seconds)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.skip_fullstack:
        try:  # before an hour of other sections, not after
            fullstack_wrk.ensure(log)
        except fullstack_wrk.WrkError as exc:
            parser.error(f"{exc} (or leave the full-stack section out: --skip-fullstack)")
    warnings.filterwarnings("ignore", module="django_redis")
    warnings.filterwarnings("ignore", message=".*sharded client should not specify client.*")
    from sentinel_cache.core.topology.sharded_pool import close_all
    from sentinel_cache.testing import LocalSentinelCluster

    RESULTS.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    data: dict[str, Any] = {
        "command": " ".join([COMMAND, *options]),
        "options": options,
        "stamp": page.stamp(),
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
    seconds: dict[str, float] = {}
    data["section_seconds"] = seconds

    def timed(name: str, started: float) -> None:
        seconds[name] = round(time.monotonic() - started, 1)

    log("starting the topology: 4 shards x 1 replica, 3 sentinels")
    with LocalSentinelCluster(shards=4, replicas=1, sentinels=3) as cluster:
        data["environment"] = page.environment(cluster)
        topo = Topology.of(cluster)
        built, skipped = build_all(topo, args.only)
        contenders = {c: x for c, x in built.items() if c not in ASYNC_ONLY}  # the sync tables
        data["skipped"] = skipped
        for cid, why in skipped.items():
            log(f"skipped {cid}: {why}")
        try:
            log(f"latency: {len(contenders)} contenders x {len(measure.OPERATIONS)} operations")
            t0 = time.monotonic()
            lat = measure.latency(
                contenders,
                rounds=args.rounds,
                chunks=args.chunks,
                scale=args.scale,
                seed=args.seed,
                progress=log,
            )
            timed("latency", t0)
            pinned_ids = {c: contenders[c] for c in PINNED_IDS if c in contenders}
            log(f"latency pinned to CPU 0: {len(pinned_ids)} contenders, servers on CPU 0 too")
            t0 = time.monotonic()
            with measure.pinned(cluster.pids):
                pin = measure.latency(
                    pinned_ids,
                    rounds=args.rounds,
                    chunks=args.chunks,
                    scale=args.scale,
                    seed=args.seed + 7,
                    operations=PINNED_OPS,
                    prefix="bench:pinned",
                    progress=log,
                )
            timed("latency pinned", t0)
            log("mixed workload")
            t0 = time.monotonic()
            thr = measure.throughput(
                contenders,
                rounds=args.rounds,
                threads=args.threads,
                duration=args.duration,
                seed=args.seed,
                progress=log,
            )
            timed("8-thread mix", t0)
            log(f"{PROCESSES}-process mix")
            t0 = time.monotonic()
            procs = processes.run(
                topo,
                [c for c in PROCESS_IDS if c in contenders],
                processes=PROCESSES,
                rounds=2 * args.rounds,  # shorter runs, twice as many: finer interleaving
                duration=args.duration,
                seed=args.seed,
                progress=log,
            )
            timed(f"{PROCESSES}-process mix", t0)
            async_ids = [c for c in ASYNC_IDS if c in built]
            asy: dict[str, Any] = {}
            if async_ids:
                log("async API")
                t0 = time.monotonic()
                asy = measure.async_latency(
                    {c: built[c] for c in async_ids},
                    rounds=args.rounds,
                    scale=args.scale,
                    chunks=args.chunks,
                    concurrency=32,
                    duration=min(2 * args.duration, 1.0),
                    seed=args.seed,
                )
                timed("async API", t0)
            prof: dict[str, Any] = {}
            if not args.skip_profile and "ours_django" in contenders:
                log("profiling our hot paths")
                t0 = time.monotonic()
                targets_to_profile = {
                    c: contenders[c] for c in ("ours_django", "raw") if c in contenders
                }
                prof = profile_hot.profile(targets_to_profile, RESULTS)
                profile_hot.pyinstrument_tree(contenders["ours_django"], RESULTS)
                timed("profile", t0)
        finally:
            for contender in built.values():
                try:
                    contender.close()
                except Exception as exc:  # closing must not hide the results
                    log(f"closing a contender failed: {exc!r}")
            close_all()
    many: dict[str, Any] = {}
    many_rounds = max(2, args.rounds - 2)
    for mode in ("unpinned", "pinned"):
        log(f"async multi-key, 64 tasks, {mode} (benchmarks.async_many)")
        t0 = time.monotonic()
        many[mode] = _async_many(pin=mode == "pinned", rounds=many_rounds, duration=args.duration)
        timed(f"async multi-key, {mode}", t0)
    shared: dict[str, Any] = {}
    if not args.skip_sync_shared:
        log("sync threads on one server: one connection each or one shared (sync_shared)")
        t0 = time.monotonic()
        shared = sync_shared.run(
            rounds=max(2, args.rounds - 2), seconds=2 * args.duration, progress=log
        )
        timed("sync threads, shared connection", t0)
    muxed: dict[str, Any] = {}
    for mode in ("unpinned", "pinned"):
        log(
            f"async single-key and multi-key, pool vs ASYNC_MULTIPLEX, {mode} (benchmarks.async_mux)"
        )
        t0 = time.monotonic()
        muxed[mode] = _async_mux(pin=mode == "pinned", rounds=many_rounds, duration=args.duration)
        timed(f"async mux, {mode}", t0)
    lat_header, lat_rows, lat_summary = report.latency_table(lat)
    pin_header, pin_rows, pin_summary = report.latency_table(pin)
    thr_header, thr_rows, thr_summary = report.throughput_table(thr, args.threads)
    proc_header, proc_rows, proc_summary = report.processes_table(procs, PROCESSES)
    data["latency"] = lat_summary
    data["latency_pinned"] = pin_summary
    data["throughput"] = thr_summary
    data["processes"] = proc_summary
    sections: list[Section] = [
        (
            LATENCY,
            f"Median µs per call; {args.rounds} interleaved rounds. {report.RATIO_NOTE}",
            lat_header,
            lat_rows,
        ),
        (
            CPU,
            "Thread CPU time inside the calls, µs: the client library's own work (Python + "
            "syscalls), less sensitive to the shared machine's scheduling noise. "
            + report.RATIO_NOTE,
            *report.cpu_table(lat_summary),
        ),
        (
            CPU,
            "**Pinned to CPU 0**: this process (all its threads) and every server on one CPU "
            "(`os.sched_setaffinity`), so a round trip is a context switch, not a wake-up on "
            "another CPU, and the client's CPU is its own work; the same interleaving, "
            f"{args.rounds} rounds, the single-key and 10-key operations. Median µs per call "
            "(wall):",
            pin_header,
            pin_rows,
        ),
        (
            CPU,
            "Pinned to CPU 0, client CPU µs per call (the issue's targets read this table):",
            *report.cpu_table(pin_summary),
        ),
        (
            MIXED,
            f"{args.threads} threads, 90 % get / 10 % set on 1,000 keys, {args.rounds} rounds "
            f"of one {args.duration:g} s run per contender, order shuffled per round; one cache "
            "object shared by the threads. x floor / x best peer: ratios of the medians.",
            thr_header,
            thr_rows,
        ),
        (
            MIXED,
            f"{PROCESSES} processes per contender (`benchmarks/processes.py`), one thread each, "
            f"90 % get / 10 % set on the contender's 1,000 keys; {2 * args.rounds} rounds of "
            f"{args.duration:g} s, one contender at a time in a shuffled order; ops/s of all "
            "processes, and their CPU time (background threads included) per call. "
            + report.RATIO_NOTE,
            proc_header,
            proc_rows,
        ),
    ]
    if shared:
        data["sync_shared"] = shared
        sections.append((MIXED, SYNC_SHARED_NOTE, *sync_shared.table(shared)))
    if asy:
        a_header, a_rows, a_summary = report.async_table(asy, 32)
        data["async"] = a_summary
        sections.append(
            (
                ASYNC,
                "Sequential awaits in one event loop, and 32 concurrent tasks; "
                f"{args.rounds} rounds. {report.RATIO_NOTE}",
                a_header,
                a_rows,
            )
        )
    data["async_many"] = {}
    for mode, results in many.items():
        m_header, m_rows, m_summary = report.async_many_table(results)
        data["async_many"][mode] = m_summary
        sections.append(
            (
                ASYNC,
                f"`benchmarks.async_many`, {mode}"
                + (" (its servers and workers on CPU 0)" if mode == "pinned" else "")
                + f": 64 tasks, {many_rounds} rounds of {args.duration:g} s per operation, each "
                "contender in its own process: ours (AsyncCacheClient, 4 shards), redis.asyncio "
                "on one master (the peer), and its floor (asyncio streams, 4 shards).",
                m_header,
                m_rows,
            )
        )
    data["async_mux"] = muxed
    for mode, found in muxed.items():
        sections.append(
            (
                ASYNC,
                f"`benchmarks.async_mux`, {mode}"
                + (" (its servers and workers on CPU 0)" if mode == "pinned" else "")
                + f": 64 tasks, {many_rounds} rounds of {args.duration:g} s: ours with the pool "
                "and with `ASYNC_MULTIPLEX`, the multiplexed floor (one connection per server, "
                "auto-pipelined) and the pooled 4-shard floor; connections held on master 0.",
                async_mux.HEADER,
                async_mux.rows(found["results"], found["conns"]),
            )
        )
    data["profile"] = prof
    data["targets"] = report.targets(lat_summary, thr_summary)
    data["targets"] += report.micro_targets(pin_summary, data["async_many"].get("unpinned", {}))
    if "unpinned" in muxed:
        data["targets"] += async_mux.targets(muxed["unpinned"]["results"])
    charts = page.charts(lat_summary, pin_summary, thr_summary, proc_summary, data)
    image_dir = IMG if args.docs else RESULTS
    for name, svg in charts.items():
        (image_dir / name).write_text(svg)
    data["charts"] = [str((image_dir / name).relative_to(ROOT)) for name in charts]

    if not args.skip_failover:
        log("failover figures (a fresh topology per contender)")
        t0 = time.monotonic()
        data["failover"] = failover.run(log=log)
        timed("failover", t0)
        data["targets"] += failover.targets(data["failover"])
        f_header, f_rows = report.failover_table(data["failover"])
        sections.append(
            (
                FAILOVER,
                "Fresh 4x1x3 topology per contender; writer every 2 ms on the failing (or "
                f"frozen) shard, another on a second shard. Targets: {failover.TARGETS}.",
                f_header,
                f_rows,
            )
        )
    # Side-by-side figures of later capabilities: (skipped?, key, module, what it runs, title,
    # targets). Each module's run() returns its results and table() their rows.
    extras = [
        (args.skip_ratios, "ratios", ratios,
         "set_many vs MSET, get with and without metrics, fair pools, fault proxy", RATIOS,
         "Targets: set_many at most 2x raw MSET; with METRICS on, a get at most 1.03x off and a "
         "get_many[10] at most 1.05x off; one "
         "thread's (task's) GETs through the fair pool at least 0.6x the rate of redis-py's "
         "BlockingConnectionPool; more than 1,000 round trips/s through the fault proxy to a "
         "node without faults while another is delayed 100 ms."),
        (args.skip_construct, "construct", construct,
         "building the Django backend object, settings seen and first seen, vs RedisCache",
         RATIOS,
         "Building the Django backend object (`benchmarks.construct`), as Django's cache "
         "handler does for every ASGI request and thread; batches of 10 builds, interleaved. "
         "Target (issue 37): at most 25 µs from settings already seen; first seen is the parse "
         "every build paid before."),
        (args.skip_near, "near_cache", near, "hit vs raw GET, staleness, 90/10 mix",
         NEAR,
         "Targets: a hit at most 0.05x raw GET; staleness p99 <= 5 ms, max <= 50 ms; "
         "the 90/10 mix at least 5x without it."),
        (args.skip_reshard, "reshard", reshard, "migration rate, fallback read cost, reader misses",
         RESHARD,
         "Targets: at least 25,000 keys/s with 1 KB values; 0 misses for a reader during "
         "the migration; a fallback read at most 2.5x a plain get."),
        (args.skip_stampede, "stampede", stampede,
         "cold key, holder killed, early refresh, sessions through a SIGKILL", STAMPEDE,
         "Targets (issue 26): 4 x 16 callers of get_or_set on a cold key, 200 ms computation: "
         "1 computation, 64 served, the slowest within 220 ms of the first call; the holder "
         "SIGKILLed: a waiter computes within STAMPEDE_LOCK_TIMEOUT + 100 ms; 500 reads/s, "
         "2 s timeout, early refresh: one computation per stored value, 0 misses; a master "
         "SIGKILLed under 200 session requests/s (down-after 1000, OUTAGE_HOLD 5): 0 failed, "
         "0 logged out, none longer than the switch + 0.5 s, beside the options off."),
    ]  # fmt: skip
    for skipped, key, module, what, title, targets in extras:
        if not skipped:
            log(f"{title.lower()} ({what})")
            t0 = time.monotonic()
            data[key] = module.run(rounds=args.rounds)
            timed(key, t0)
            sections.append((title, targets, *module.table(data[key])))
            if hasattr(module, "targets"):
                data["targets"] += module.targets(data[key])
    if not args.skip_fullstack:
        fullstack_rounds = max(2, args.rounds - 2)
        log(f"full stack: Django under uvicorn and gunicorn, wrk, {fullstack_rounds} rounds")
        t0 = time.monotonic()
        data["fullstack"] = fullstack.run(
            rounds=fullstack_rounds,
            seconds=args.fullstack_seconds,
            pin=args.fullstack_pin,
            progress=log,
        )
        timed("full stack", t0)
        data["targets"] += fullstack.targets(data["fullstack"])
        described = False
        for note, header, rows in fullstack.tables(data["fullstack"]):
            if not described:
                note = "\n".join(
                    [
                        FULLSTACK_NOTE,
                        "",
                        note,
                        "",
                        *(f"- {line}" for line in fullstack.notes(data["fullstack"])),
                    ]
                )
                described = True
            sections.append((FULLSTACK, note, header, rows))
        svg = fullstack.chart(data["fullstack"])
        if svg is not None:
            (image_dir / fullstack.CHART).write_text(svg)
            data["charts"].append(str((image_dir / fullstack.CHART).relative_to(ROOT)))
    if not args.skip_scale:
        log("memory and scale (16 shards, 5 sentinels)")
        t0 = time.monotonic()
        data["scale"] = scale.run(rounds=args.rounds, seed=args.seed, progress=log)
        timed("scale", t0)
        for title, header, rows in report.scale_tables(data["scale"]):
            sections.append((title, "", header, rows))
    data["environment"]["load_average_at_end"] = os.getloadavg()
    data["elapsed_s"] = time.monotonic() - began

    (RESULTS / "latest.json").write_text(json.dumps(data, indent=2, default=str))
    text = page.render_text(data, sections)
    markdown = page.render_markdown(data, sections, defaults=_defaults_text())
    (RESULTS / "latest.md").write_text(markdown)
    if args.docs:
        DOCS.write_text(markdown)
        log(f"wrote {DOCS.relative_to(ROOT)}")
    print(text)
    log(f"done in {data['elapsed_s']:.0f} s; JSON in {(RESULTS / 'latest.json').relative_to(ROOT)}")
    return 0


FULLSTACK_NOTE = (
    "`benchmarks.fullstack`: a tiny Django app doing 6 cache operations per request (get, "
    "get_many of 3, set, set of a 4 KB value, incr, get of a 4 KB value) on keys spread over a "
    "keyspace, an async view under uvicorn (1 worker) and a sync one under gunicorn (sync "
    "workers; gthread 1 worker x 8 threads), loaded by `wrk` at 100 and 300 connections, each "
    "contender x server on a fresh server process, in a new random order every round. Targets "
    "(issue 37): under ASGI, ours on 1 shard >= 1.0x django-vcache's req/s and a p99 no higher, "
    ">= 2x django-redis and Django RedisCache, <= 2 connections per shard per uvicorn worker; "
    "under WSGI, >= 1.0x every contender."
)


SYNC_SHARED_NOTE = (
    "`benchmarks.sync_shared` (issue 37, item 2): sync threads on one server (its own topology, "
    "1 master, 1 sentinel), each contender in its own worker process, N threads doing `GET` or "
    "`SET ... EX 300` of a small pickled value back to back. Hand-written floors on raw sockets "
    "and hiredis: one blocking connection per thread in flight (our model), and one shared "
    "connection per process with automatic pipelining across threads (leader/follower: the "
    "first caller to find no leader writes everyone's queued commands and dispatches replies "
    "FIFO; and a variant with a dedicated reader thread); ours is the core `CacheClient` on "
    "one shard. Ops/s, client CPU µs per op (the worker's process CPU / ops) and the server's "
    "CPU µs per op, medians of the rounds, unpinned and pinned (server and workers on CPU 0) "
    "in the same rounds; the ratios are medians of the per-round ratios to one connection "
    'per thread. See docs/benchmarks.md, "Sync threads".'
)


def _async_many(*, pin: bool, rounds: int, duration: float) -> dict[str, Any]:
    """One run of ``benchmarks.async_many`` through its entry point (its own topology and
    worker processes); returns its per-round figures. ``--pin`` pins the calling thread, so
    this thread's CPUs are put back afterwards."""
    saved = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="bench-async-many-") as tmp:
        out = Path(tmp) / "async_many.json"
        argv = ["--rounds", str(rounds), "--duration", f"{duration:g}", "--json", str(out)]
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its own table: ours is built here
                async_many_main([*argv, "--pin"] if pin else argv)
        finally:
            os.sched_setaffinity(0, saved)
        results: dict[str, Any] = json.loads(out.read_text())["results"]
    return results


def _async_mux(*, pin: bool, rounds: int, duration: float) -> dict[str, Any]:
    """One run of ``benchmarks.async_mux`` (as ``_async_many``): its results and connections."""
    saved = os.sched_getaffinity(0)
    argv = ["--rounds", str(rounds), "--duration", f"{duration:g}"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return async_mux.main([*argv, "--pin"] if pin else argv)
    finally:
        os.sched_setaffinity(0, saved)


def _defaults_text() -> str:
    defaults = _parser().parse_args([])
    return f"`--rounds {defaults.rounds}`, `--scale {defaults.scale:g}`, `--duration {defaults.duration:g}`"


if __name__ == "__main__":
    sys.exit(main())
