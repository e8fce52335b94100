"""Where the pinned CPU of a sync ``get`` and ``set`` goes, ours against the floor, on masters
with and without a replica (issue 37's "own CPU per sync call, pinned" target).

``make bench``'s pinned table runs the client and every server on CPU 0, on 4 masters with a
replica each. This tool times the same calls on the same pinned layout with 0 and with 1 replica
per master, at two depths of ours: the Django backend's ``get``/``set`` (the table's contender),
and the runner's :meth:`execute` of the same command on the key's shard (the I/O layer and its
rules: the pool's checkout and its check, packing, the send, the reply's reading and checks, the
release), against the floor's ``get``/``set`` (benchmarks/floor.py, its pickling included). A
figure is the calling thread's CPU per call (``time.thread_time``, which counts the kernel's
work in the thread's system calls) over 200 keys spread on the 4 shards; each round times every
case once, in a random order; medians of the rounds.

    python -m benchmarks.pinned_io [--rounds 5] [--calls 4000] [--replicas 0 --replicas 1]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.contenders import TIMEOUT, Topology, build_all
from benchmarks.measure import VALUE, pinned

KEYS = 200
OPS = ("get", "set")
#: What is timed of each op, in the table's column order.
DEPTHS = ("ours Django", "ours execute", "floor")


def cases(cache: Any, floor: Any) -> dict[tuple[str, str], Callable[[int], None]]:
    """Each case: ``run(n)`` makes ``n`` calls over the :data:`KEYS` keys (their shards in
    turn, as the key ring spreads them)."""
    client = cache.client
    names = [f"pinned-io:{i}" for i in range(KEYS)]
    keys = [cache.make_and_validate_key(name) for name in names]
    shards = [client.core.shard_for(key) for key in keys]
    data = client.codec.dumps(VALUE)
    gets = [[("GET", key)] for key in keys]
    sets = [[("SET", key, data, "PX", TIMEOUT * 1000)] for key in keys]
    floor_keys = [f"pinned-io-floor:{i}" for i in range(KEYS)]
    return {
        ("get", "ours Django"): getting(cache.get, names),
        ("set", "ours Django"): setting(cache.set, names),
        ("get", "ours execute"): executing(client.execute, shards, gets, write=False),
        ("set", "ours execute"): executing(client.execute, shards, sets, write=True),
        ("get", "floor"): getting(floor.get, floor_keys),
        ("set", "floor"): setting(floor.set, floor_keys),
    }


def executing(
    execute: Callable[..., Any], shards: list[Any], commands: list[Any], *, write: bool
) -> Callable[[int], None]:
    """``run(n)``: ``n`` calls of ``execute(shard, commands)``, the keys' in turn."""

    def run(n: int) -> None:
        for i in range(n):
            execute(shards[i % KEYS], commands[i % KEYS], write=write)

    return run


def getting(get: Callable[[str], Any], keys: list[str]) -> Callable[[int], None]:
    """``run(n)``: ``n`` calls of ``get(key)``, the keys in turn."""

    def run(n: int) -> None:
        call, each = get, keys
        for i in range(n):
            call(each[i % KEYS])

    return run


def setting(set_: Callable[[str, Any], Any], keys: list[str]) -> Callable[[int], None]:
    """``run(n)``: ``n`` calls of ``set_(key, VALUE)``, the keys in turn."""

    def run(n: int) -> None:
        call, each, value = set_, keys, VALUE
        for i in range(n):
            call(each[i % KEYS], value)

    return run


def cpu_per_call(run: Callable[[int], None], calls: int) -> float:
    """µs of this thread's CPU per call, the garbage collector off while timed (as timeit)."""
    gc.collect()
    gc.disable()
    try:
        began = time.thread_time_ns()
        run(calls)
        return (time.thread_time_ns() - began) / calls / 1000
    finally:
        gc.enable()


def measure(replicas: int, rounds: int, calls: int, seed: int) -> dict[tuple[str, str], float]:
    """Medians of the rounds, µs of CPU per call, for every (op, depth) on 4 masters with
    ``replicas`` replicas each, the client and every server on CPU 0."""
    from sentinel_cache.testing import LocalSentinelCluster

    rng = random.Random(seed)
    with LocalSentinelCluster(shards=4, replicas=replicas, sentinels=1) as cluster:
        built, skipped = build_all(Topology.of(cluster), ["floor_sharded", "ours_django"])
        if skipped:
            raise SystemExit(f"pinned_io: contenders not built: {skipped}")
        todo = cases(built["ours_django"].cache, built["floor_sharded"])
        samples: dict[tuple[str, str], list[float]] = {case: [] for case in todo}
        with pinned(cluster.pids):
            for run in todo.values():  # a warm-up; its sets write every key the gets read
                run(KEYS)
            for _ in range(rounds):
                order = list(todo)
                rng.shuffle(order)
                for case in order:
                    samples[case].append(cpu_per_call(todo[case], calls))
        for contender in built.values():
            contender.close()
    return {case: statistics.median(values) for case, values in samples.items()}


def table(results: dict[int, dict[tuple[str, str], float]]) -> str:
    """Markdown: one row per (replicas, op), µs per call and each of ours over the floor."""
    lines = [
        "| replicas per master | op | ours Django µs | ours execute µs | floor µs "
        "| Django / floor | execute / floor |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for replicas, figures in sorted(results.items()):
        for op in OPS:
            django, execute, floor = (figures[(op, depth)] for depth in DEPTHS)
            lines.append(
                f"| {replicas} | {op} | {django:.1f} | {execute:.1f} | {floor:.1f} "
                f"| {django / floor:.2f}x | {execute / floor:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[int, dict[tuple[str, str], float]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pinned_io", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=4000, help="calls per case and round")
    parser.add_argument(
        "--replicas", type=int, action="append", choices=(0, 1), help="repeatable (default 0, 1)"
    )
    parser.add_argument("--seed", type=int, default=37)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error(f"--rounds and --calls must be at least 1 (got {args.rounds}, {args.calls})")
    results = {
        replicas: measure(replicas, args.rounds, args.calls, args.seed)
        for replicas in (args.replicas or [0, 1])
    }
    print(
        f"# CPU per call, pinned (client and every server on CPU 0), 4 masters, "
        f"{args.rounds} rounds x {args.calls} calls, medians of the rounds"
    )
    print(table(results))
    return results


if __name__ == "__main__":
    main()
