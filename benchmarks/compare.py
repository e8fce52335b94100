"""``python -m benchmarks.compare --base <ref> [--head <ref or path>] [--pin]``: two versions of
sentinel_cache side by side, on one topology.

"No speed lost" is a claim about two commits, and on a shared machine two runs of ``make
bench`` at different times differ by more than the change being judged. Here both versions run
against the same servers, started once, in alternating subprocesses (each with ``PYTHONPATH``
set to its own checkout), round after round (the order flips every round), and every figure is
a median of calls measured beside the other version's: get, set, incr, get_many[10],
set_many[10] and delete_many[10], through the ``CacheClient`` and through the Django backend;
and ``aget``/``aset`` through the ``AsyncCacheClient`` with ``ASYNC_MULTIPLEX``, 64 tasks on one
event loop (``async_mux``'s shape: there a call's own time is not one call's wall time, so a
chunk's figure is its wall time per call, and the median is over chunks).

``--base``/``--head`` take a git ref (checked out with ``git worktree add --detach`` under a
temporary directory, removed at the end) or a path to a checkout; ``--head`` defaults to this
checkout's working tree, uncommitted changes included. ``--pin`` puts the servers and the
clients on one CPU (``os.sched_setaffinity``): then a loopback round trip costs little and the
same every time, and the client CPU per call (``time.process_time``) is the library's own work.
Run ``--base X --head X`` once to see the noise band of the machine before reading a ratio.
``--head-option METRICS=True`` (or ``--base-option``) passes an option to that side's caches
(Django spelling; the core gets it lower-cased): the same code with an option on and off.

The worker half of this file (``--worker``) runs inside the measured checkout and imports only
the standard library, redis-py, Django and that checkout's sentinel_cache: the base may predate
any helper of this one.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 300  # seconds, the timeout of every write (as in make bench)
SYNC_OPERATIONS = ("get", "set", "incr", "get_many[10]", "set_many[10]", "delete_many[10]")
ASYNC_OPERATIONS = ("aget", "aset")
#: contender -> the operations it is timed on
CONTENDERS: dict[str, tuple[str, ...]] = {
    "core": SYNC_OPERATIONS,
    "django": SYNC_OPERATIONS,
    "asyncio": ASYNC_OPERATIONS,
}
OPERATIONS = SYNC_OPERATIONS + ASYNC_OPERATIONS
TASKS = 64  # the asyncio contender's concurrent tasks
SINGLE_CALLS, MULTI_CALLS = 1600, 400  # timed calls per operation, contender and round
ASYNC_CALLS = TASKS * 400  # the same for an asyncio operation (its tasks share them)
CHUNKS = 4  # per operation the two contenders take turns, this many times


# -- the worker: one version, one round ----------------------------------------------------------


def _build(contender: str, spec: dict[str, Any]) -> Any:
    """The cache object of this checkout: its ``CacheClient`` or its Django backend."""
    options = spec["options"]
    if contender == "django":
        import django
        from django.conf import settings

        if not settings.configured:
            settings.configure(USE_TZ=True, INSTALLED_APPS=[], CACHES={})
            django.setup()
        from sentinel_cache.django import ShardedSentinelCache

        params = {"TIMEOUT": TIMEOUT, "OPTIONS": {"MASTERS": spec["masters"], **options}}
        return ShardedSentinelCache(spec["sentinels"], params)
    from sentinel_cache.core.config import PoolConfig
    from sentinel_cache.core.serializers import Codec

    try:  # the layered core (issue 23)
        from sentinel_cache.core.ops.client import CacheClient
        from sentinel_cache.core.topology.sharded_pool import shared_pool
    except ImportError:  # before it
        from sentinel_cache.core.client import CacheClient  # type: ignore[no-redef]
        from sentinel_cache.core.registry import shared_pool  # type: ignore[no-redef]
    core_options = {name.lower(): value for name, value in options.items()}
    if contender == "asyncio":
        from sentinel_cache.core.ops.aio import AsyncCacheClient

        core_options.setdefault("async_multiplex", True)
        config = PoolConfig.create(spec["masters"], spec["sentinels"], **core_options)
        return AsyncCacheClient(shared_pool(config), Codec())
    pool = shared_pool(PoolConfig.create(spec["masters"], spec["sentinels"], **core_options))
    return CacheClient(pool, Codec())


def _calls(cache: Any, op: str, keys: list[str], value: Any, counter: str) -> Any:
    """``(timed, untimed)``: the call measured ``n`` times, and what must run before each call
    (delete_many deletes keys that exist), both taking the call's index."""
    batches = [keys[i : i + 10] for i in range(0, 100, 10)]
    if op == "get":
        return (lambda i: cache.get(keys[i % len(keys)])), None
    if op == "set":
        return (lambda i: cache.set(keys[i % len(keys)], value, TIMEOUT)), None
    if op == "incr":
        return (lambda i: cache.incr(counter)), None
    if op == "get_many[10]":
        return (lambda i: cache.get_many(batches[i % 10])), None
    mappings = [dict.fromkeys(batch, value) for batch in batches]
    if op == "set_many[10]":
        return (lambda i: cache.set_many(mappings[i % 10], TIMEOUT)), None
    doomed = [[f"{key}:doomed" for key in batch] for batch in batches]
    refill = [dict.fromkeys(batch, value) for batch in doomed]
    return (
        (lambda i: cache.delete_many(doomed[i % 10])),
        (lambda i: cache.set_many(refill[i % 10], TIMEOUT)),
    )


class _Concurrent:
    """An asyncio operation as ``TASKS`` tasks on one loop sharing ``n`` calls: what a chunk of
    it runs (:func:`_timed` times it as one)."""

    def __init__(self, loop: Any, one: Any) -> None:
        self.loop = loop
        self.one = one  # one call, by index: a coroutine

    def __call__(self, start: int, n: int) -> None:
        per = max(1, n // TASKS)

        async def task(t: int) -> None:
            for i in range(start + t * per, start + (t + 1) * per):
                await self.one(i)

        async def every() -> None:
            await asyncio.gather(*(task(t) for t in range(TASKS)))

        self.loop.run_until_complete(every())


def _async_calls(cache: Any, op: str, keys: list[str], value: Any, loop: Any) -> Any:
    if op == "aget":
        return _Concurrent(loop, lambda i: cache.get(keys[i % len(keys)])), None
    return _Concurrent(loop, lambda i: cache.set(keys[i % len(keys)], value, TIMEOUT)), None


def _timed(call: Any, before: Any, start: int, n: int, out: list[int]) -> int:
    """``n`` calls, each one's wall time in ns appended to ``out``; the process CPU time (ns)
    spent in them (what ``before`` costs left out)."""
    clock, cpu = time.perf_counter_ns, time.process_time_ns
    if type(call) is _Concurrent:  # one figure: the chunk's wall time per call
        cpu0, t0 = cpu(), clock()
        call(start, n)
        out.append((clock() - t0) // n)
        return cpu() - cpu0
    untimed = 0
    cpu0 = cpu()
    for i in range(start, start + n):
        if before is not None:
            u0 = cpu()
            before(i)
            untimed += cpu() - u0
        t0 = clock()
        call(i)
        out.append(clock() - t0)
    return cpu() - cpu0 - untimed


class Worker:
    """One version's caches in one process, warmed up, timing the chunks it is asked for."""

    def __init__(self, spec: dict[str, Any]) -> None:
        if spec["cpu"] is not None:
            os.sched_setaffinity(0, {spec["cpu"]})  # before any thread starts: they inherit it
        value, keys = spec["value"], [f"cmp:k{i}" for i in range(spec["keyspace"])]
        # Only the contenders of the operations asked: a base from before the asyncio client
        # can still be timed on the sync ones.
        asked = set(spec.get("operations", OPERATIONS))
        self.caches = {c: _build(c, spec) for c, ops in CONTENDERS.items() if asked & set(ops)}
        self.calls: dict[str, dict[str, Any]] = {}
        self.loop = asyncio.new_event_loop()
        for contender, cache in self.caches.items():
            if CONTENDERS[contender] == ASYNC_OPERATIONS:
                calls = {
                    op: _async_calls(cache, op, keys, value, self.loop) for op in ASYNC_OPERATIONS
                }
                for call, _ in calls.values():  # warm: the shared connections opened
                    call(0, TASKS * 20)
                self.calls[contender] = calls
                continue
            counter = f"cmp:{contender}:counter"
            for i in range(0, len(keys), 100):
                cache.set_many(dict.fromkeys(keys[i : i + 100], value), TIMEOUT)
            cache.set(counter, 0, None)
            calls = {op: _calls(cache, op, keys, value, counter) for op in SYNC_OPERATIONS}
            self.calls[contender] = calls
            for call, before in calls.values():  # warm: connections, scripts, caches
                for i in range(50):
                    if before is not None:
                        before(i)
                    call(i)

    def chunk(self, contender: str, op: str, start: int, n: int) -> dict[str, Any]:
        """``n`` calls of one operation, the cyclic GC off meanwhile (as ``timeit``)."""
        import gc

        call, before = self.calls[contender][op]
        samples: list[int] = []
        gc.collect()
        gc.disable()
        try:
            cpu_ns = _timed(call, before, start, n, samples)
        finally:
            gc.enable()
        return {"ns": samples, "cpu_ns": cpu_ns, "calls": n}

    def close(self) -> None:
        for cache in self.caches.values():
            aclose = getattr(cache, "aclose", None)
            if aclose is not None:
                self.loop.run_until_complete(aclose())
            close = getattr(cache, "close", None)
            if close is not None:
                close()
        self.loop.close()


def serve() -> None:
    """The worker's loop: a spec line, then one chunk per line asked, one JSON line each."""
    worker = Worker(json.loads(sys.stdin.readline()))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        print(json.dumps(worker.chunk(**ask)), flush=True)
    worker.close()


# -- the driver: checkouts, topology, rounds, report ----------------------------------------------


@contextlib.contextmanager
def checkout(ref: str | None, workdir: Path, name: str) -> Iterator[Path]:
    """A checkout of ``ref``: this one (None), a path given, or a detached git worktree."""
    if ref is None:
        yield ROOT
        return
    if Path(ref).is_dir():
        yield Path(ref).resolve()
        return
    path = workdir / name
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), ref],
        check=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
        )


def describe(ref: str | None, path: Path) -> str:
    """The commit of a checkout, marked when its tree has uncommitted changes."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", "-C", str(path), *argv], capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "?"
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"{ref or 'this checkout'} ({commit}{dirty})"


class Process:
    """A worker subprocess running this file as a script with ``path``'s sentinel_cache."""

    def __init__(self, path: Path, spec: dict[str, Any], errors: Path) -> None:
        self.path = path
        self.errors = errors
        self.popen = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors.open("w"),
            text=True,
            env={**os.environ, "PYTHONPATH": str(path), "PYTHONHASHSEED": str(spec["hashseed"])},
            cwd=str(path),
        )
        self.ask(spec)

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps(message) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            self.popen.wait(timeout=60)
            raise RuntimeError(
                f"the worker for {self.path} ended ({self.popen.returncode}):\n"
                f"{self.errors.read_text()[-3000:]}"
            )
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.close()
        if self.popen.wait(timeout=60) != 0:
            raise RuntimeError(f"the worker for {self.path} failed: {self.errors.read_text()}")


def one_round(
    paths: dict[str, Path],
    specs: dict[str, dict[str, Any]],
    rng: random.Random,
    workdir: Path,
    operations: tuple[str, ...] = OPERATIONS,
) -> dict[str, dict[str, Any]]:
    """A fresh worker per side; every operation in a shuffled order, split in chunks, and
    before each chunk the (side, contender) pairs shuffled: both sides see the same noise."""
    workers = {side: Process(paths[side], specs[side], workdir / f"{side}.err") for side in paths}
    out = {
        side: {
            c: {op: {"ns": [], "cpu_ns": 0, "calls": 0} for op in ops}
            for c, ops in CONTENDERS.items()
        }
        for side in paths
    }
    try:
        ops = list(operations)
        rng.shuffle(ops)
        for op in ops:
            n = SINGLE_CALLS if "[" not in op else MULTI_CALLS
            if op in ASYNC_OPERATIONS:
                n = ASYNC_CALLS
            per_chunk = max(1, int(n * specs["base"]["scale"]) // CHUNKS)
            for chunk in range(CHUNKS):
                pairs = [(side, c) for side in paths for c in CONTENDERS if op in CONTENDERS[c]]
                rng.shuffle(pairs)
                for side, contender in pairs:
                    ask = {"contender": contender, "op": op, "start": chunk * per_chunk}
                    reply = workers[side].ask({**ask, "n": per_chunk})
                    result = out[side][contender][op]
                    result["ns"] += reply["ns"]
                    result["cpu_ns"] += reply["cpu_ns"]
                    result["calls"] += reply["calls"]
    finally:
        for worker in workers.values():
            worker.close()
    return out


def _options(pairs: list[str], flag: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"{flag}: expected NAME=VALUE, got {pair!r}")
        try:
            options[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[name] = text
    return options


def summarize(
    rounds: dict[str, list[dict[str, Any]]], operations: tuple[str, ...] = OPERATIONS
) -> list[dict[str, Any]]:
    """Per contender and operation: each side's median µs and CPU µs per call, head/base, and
    the range of the per-round ratios of medians (how much one round's ratio wanders)."""
    rows = []
    for contender, ops in CONTENDERS.items():
        for op in (op for op in ops if op in operations):
            row: dict[str, Any] = {"contender": contender, "op": op}
            for side in ("base", "head"):
                results = [r[contender][op] for r in rounds[side]]
                samples = [ns for r in results for ns in r["ns"]]
                calls = sum(r["calls"] for r in results)
                row[f"{side}_us"] = statistics.median(samples) / 1000
                row[f"{side}_cpu_us"] = sum(r["cpu_ns"] for r in results) / calls / 1000
                row[f"{side}_round_us"] = [statistics.median(r["ns"]) / 1000 for r in results]
            row["ratio"] = row["head_us"] / row["base_us"]
            row["cpu_ratio"] = row["head_cpu_us"] / row["base_cpu_us"]
            per_round = [
                h / b for h, b in zip(row["head_round_us"], row["base_round_us"], strict=True)
            ]
            row["round_ratios"] = [min(per_round), statistics.median(per_round), max(per_round)]
            rows.append(row)
    return rows


def render(rows: list[dict[str, Any]], header: list[str]) -> str:
    lines = [*header, ""]
    lines.append(
        "| contender | op | base µs | head µs | head/base | rounds' ratios: median (min-max) "
        "| base CPU µs | head CPU µs | CPU head/base |"
    )
    lines.append("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        low, middle, high = r["round_ratios"]
        lines.append(
            f"| {r['contender']} | {r['op']} | {r['base_us']:.1f} | {r['head_us']:.1f} "
            f"| {r['ratio']:.3f}x | {middle:.3f}x ({low:.2f}-{high:.2f}) "
            f"| {r['base_cpu_us']:.1f} | {r['head_cpu_us']:.1f} | {r['cpu_ratio']:.3f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--base", required=True, help="git ref or checkout path")
    parser.add_argument("--head", help="git ref or checkout path (default: this checkout)")
    parser.add_argument("--pin", action="store_true", help="servers and clients on one CPU")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU of --pin (default 0)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, at least 5 (default 7)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the calls per round")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--base-option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--head-option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument(
        "--only", action="append", choices=OPERATIONS, help="time only this operation (repeat)"
    )
    args = parser.parse_args(argv)
    operations = tuple(args.only or OPERATIONS)
    if args.rounds < 5:
        parser.error(f"--rounds: at least 5, got {args.rounds}")
    options = {
        "base": _options(args.base_option, "--base-option"),
        "head": _options(args.head_option, "--head-option"),
    }
    from benchmarks.measure import KEYSPACE, VALUE, pin_threads
    from sentinel_cache.testing import LocalSentinelCluster

    def log(message: str) -> None:
        print(f"[compare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compare-")))
        paths = {
            "base": stack.enter_context(checkout(args.base, workdir, "base")),
            "head": stack.enter_context(checkout(args.head, workdir, "head")),
        }
        names = {side: describe(getattr(args, side), path) for side, path in paths.items()}
        log(f"topology: {args.shards} shards, no replicas, 1 sentinel")
        cluster = stack.enter_context(
            LocalSentinelCluster(shards=args.shards, replicas=0, sentinels=1)
        )
        if args.pin:
            pin_threads(cluster.pids, {args.cpu})
        config = cluster.config()
        rounds: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
        rng = random.Random(args.seed)
        for r in range(args.rounds):
            hashseed = rng.randrange(2**32)
            specs = {
                side: {
                    "sentinels": config["sentinels"],
                    "masters": config["masters"],
                    "options": options[side],
                    "value": VALUE,
                    "keyspace": KEYSPACE,
                    "scale": args.scale,
                    "cpu": args.cpu if args.pin else None,
                    "hashseed": hashseed,  # the same str hashes (dict layouts) on both sides
                    "operations": operations,
                }
                for side in paths
            }
            for side, result in one_round(paths, specs, rng, workdir, operations).items():
                rounds[side].append(result)
            log(f"round {r + 1}/{args.rounds} done")
        server = f"{cluster.server_kind} {cluster.server_version}"
    rows = summarize(rounds, operations)
    pinning = f"pinned to CPU {args.cpu}" if args.pin else "unpinned"
    header = [
        f"base: {names['base']} {options['base'] or ''}".rstrip(),
        f"head: {names['head']} {options['head'] or ''}".rstrip(),
        f"{server}, {args.shards} shards; {pinning}; {args.rounds} rounds; "
        "median µs per call; CPU: process time per call",
    ]
    print(render(rows, header))
    if args.json is not None:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        # Run as a script: its directory is first on sys.path; only the checkout's must count.
        if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
            sys.path.pop(0)
        serve()
        sys.exit(0)
    sys.exit(main())
