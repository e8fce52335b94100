"""``python -m benchmarks.many_layers [--pin]``: where the client CPU of a 10-key ``get_many``
goes, layer by layer, for keys on one shard and on four.

A multi-key call pays per call (placement, plan, decoding, the Django keys) and per shard
touched (a pool checkout and release, a send and a read through the shard connection). Each
layer is timed on its own, in one process, on the same keys: the shard transport alone (checkout,
send, read, release: what every shard of a batch costs), the scatter over it, the
``CacheClient``, the Django backend, and the floor (``benchmarks.floor``: bare sockets) beside
them. ``--pin`` puts the servers and this process on one CPU, as ``benchmarks.compare --pin``
does, so ``time.process_time`` is the client's own work. Each figure is the median of the
rounds' CPU µs per call (the cyclic GC off while timing); read the differences between lines.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.compare import TIMEOUT, _build
from benchmarks.floor import Floor
from benchmarks.measure import VALUE, pin_threads
from sentinel_cache.core.ops.plans import pack
from sentinel_cache.testing import LocalSentinelCluster


def _transport(plan: dict[Any, list[tuple[Any, ...]]]) -> list[Any]:
    """Each shard's batch through its pool and connection, as the scatter sends it, without
    the safety net: checkout, send (all shards first), read, release."""
    held = []
    for shard, commands in plan.items():
        pool = shard.client.connection_pool
        connection = pool.get_connection()
        held.append((pool, connection))
        connection.send_packed_command(pack(connection, commands))
    replies = [connection.read_response() for _, connection in held]
    for pool, connection in held:
        pool.release(connection)
    return replies


def _cpu_us(call: Callable[[], Any], calls: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            began = time.process_time_ns()
            for _ in range(calls):
                call()
            samples.append((time.process_time_ns() - began) / calls / 1000)
        finally:
            gc.enable()
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.many_layers")
    parser.add_argument("--pin", action="store_true", help="servers and client on one CPU")
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--calls", type=int, default=400, help="calls per round")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    with LocalSentinelCluster(shards=4, replicas=0, sentinels=1) as cluster:
        if args.pin:
            pin_threads(cluster.pids, {args.cpu})
            os.sched_setaffinity(0, {args.cpu})
        config = cluster.config()
        spec = {"sentinels": config["sentinels"], "masters": config["masters"], "options": {}}
        core, django = _build("core", spec), _build("django", spec)
        floor = Floor([cluster.master_address(name) for name in config["masters"]])
        pool = core.core
        # Keys by shard (Django's stored keys, so every layer reads the same ones; the floor's
        # own keys, its values being bare pickles, placed by the same ring on the same shards).
        ours: dict[int, list[str]] = {}
        theirs: dict[int, list[str]] = {}
        for i in range(4000):
            ours.setdefault(pool.shard_index(f":1:layers:{i}"), []).append(f"layers:{i}")
            theirs.setdefault(pool.shard_index(f"floor:{i}"), []).append(f"floor:{i}")
        cases = {
            "1 shard": (ours[0][:10], theirs[0][:10]),
            "4 shards": (
                [ours[i % 4][i // 4] for i in range(10)],
                [theirs[i % 4][i // 4] for i in range(10)],
            ),
        }
        lines = []
        for case, (keys, floor_keys) in cases.items():
            stored = [f":1:{key}" for key in keys]
            django.set_many(dict.fromkeys(keys, VALUE), TIMEOUT)
            floor.set_many(dict.fromkeys(floor_keys, VALUE))
            groups = pool.group_by_shard(stored)
            plan = {shard: [("MGET", *group)] for shard, group in groups.items()}
            layers: dict[str, Callable[[], Any]] = {
                "shard transport alone": functools.partial(_transport, plan),
                "scatter": functools.partial(core.scatter, plan, write=False, operation="x"),
                "CacheClient.get_many": functools.partial(core.get_many, stored),
                "Django get_many": functools.partial(django.get_many, keys),
                "floor get_many": functools.partial(floor.get_many, floor_keys),
            }
            for call in layers.values():  # warm: connections, caches
                for _ in range(50):
                    call()
            for name, call in layers.items():
                lines.append(f"| {case} | {name} | {_cpu_us(call, args.calls, args.rounds):.1f} |")
        floor.close()
    mode = f"pinned to CPU {args.cpu}" if args.pin else "unpinned"
    print(f"get_many of 10 keys, 4 shards, {mode}; median client CPU µs per call\n")
    print("| keys on | layer | CPU µs |\n| --- | --- | ---: |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
