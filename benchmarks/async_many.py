"""``python -m benchmarks.async_many [--pin] [--rounds N] [--base REF]``: async multi-key side by side.

64 asyncio tasks, each calling one operation back to back for ``--duration`` seconds:
``aget_many[10]``, ``aset_many[10]`` (timeout 300 s) and ``adelete_many[10]``, through

* ``ours``: :class:`~sentinel_cache.core.ops.aio.AsyncCacheClient` (what the Django backend's
  ``aget_many`` runs) on 4 shards, one connection per task per shard allowed;
* ``redis.asyncio``: plain ``redis.asyncio`` on ONE master (``MGET``; a non-transactional
  pipeline of ``SET ... EX``; ``DEL``), a ``BlockingConnectionPool`` of 64;
* ``floor``: asyncio streams on the same 4 shards and placement as ours, one connection per
  task per shard, the same commands as ours (pre-packed per batch of keys; a write's values
  pickled and packed per call), a ``hiredis.Reader`` per connection, every shard's batch
  written before any reply is read; values unpickled on reads.
* ``ours@base`` (with ``--base REF``): ours from another commit (``git worktree add --detach``).

Every contender runs in its own worker process (``process_time`` is its CPU alone, threads
included), started once; only one works at a time, the order rotating every round, so all of
them are measured interleaved against the same servers. Each has its own keys (1,000, filled
through itself). Figures are medians over the rounds: ops/s (calls of all tasks / wall time)
and CPU µs per op; the ratios are ours to redis.asyncio and to the floor, from the same run.

``--pin`` puts this process, the servers and the workers on CPU 0 (``os.sched_setaffinity``):
the client's CPU per op is then its own work, round trips are cheap and steady.
``--profile OP`` runs only ours (or ``--profile-kind``), one phase under cProfile, and writes
the top functions to ``benchmarks/results/``.

The worker half (``--worker``) imports only the standard library, redis-py, hiredis and the
checkout on its ``PYTHONPATH``, so ``--base`` may name a commit that predates this file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ("aget_many[10]", "aset_many[10]", "adelete_many[10]")
TIMEOUT = 300
KEYSPACE = 1000
BATCH = 10
VALUE = {
    "id": 12345,
    "name": "user-12345",
    "email": "user-12345@example.com",
    "roles": ["reader", "writer"],
    "score": 3.14159,
    "active": True,
}


# -- the worker: one contender, in its own process ------------------------------------------------


def _batches(prefix: str) -> tuple[list[list[str]], list[list[str]]]:
    """The read keys (filled once, never deleted) and the written keys, 10 per batch."""
    reads = [f"{prefix}:r{i}" for i in range(KEYSPACE)]
    writes = [f"{prefix}:w{i}" for i in range(KEYSPACE)]
    cut = range(0, KEYSPACE, BATCH)
    return [reads[i : i + BATCH] for i in cut], [writes[i : i + BATCH] for i in cut]


class Ours:
    """Our asyncio client, as the Django backend builds it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from sentinel_cache.core.config import PoolConfig
        from sentinel_cache.core.ops.aio import AsyncCacheClient
        from sentinel_cache.core.serializers import Codec
        from sentinel_cache.core.topology.sharded_pool import shared_pool

        config = PoolConfig.create(spec["masters"], spec["sentinels"], max_connections=64)
        self.client = AsyncCacheClient(shared_pool(config), Codec())

    async def setup(self, tasks: int) -> None:
        pass

    async def get_many(self, b: int, keys: list[str]) -> Any:
        return await self.client.get_many(keys)

    async def set_many(self, b: int, mapping: dict[str, Any]) -> Any:
        return await self.client.set_many(mapping, TIMEOUT)

    async def delete_many(self, b: int, keys: list[str]) -> Any:
        return await self.client.delete_many(keys)


class RedisAsyncio:
    """redis.asyncio on the first master: what an application on one server would write."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import redis.asyncio

        host, port = spec["addresses"][0]
        pool = redis.asyncio.BlockingConnectionPool(
            host=host, port=port, max_connections=64, timeout=5
        )
        self.client = redis.asyncio.Redis(connection_pool=pool)

    async def setup(self, tasks: int) -> None:
        pass

    async def get_many(self, b: int, keys: list[str]) -> Any:
        values = await self.client.mget(keys)
        return {k: pickle.loads(v) for k, v in zip(keys, values, strict=True) if v is not None}

    async def set_many(self, b: int, mapping: dict[str, Any]) -> Any:
        async with self.client.pipeline(transaction=False) as pipe:
            for key, value in mapping.items():
                pipe.set(key, pickle.dumps(value), ex=TIMEOUT)
            return await pipe.execute()

    async def delete_many(self, b: int, keys: list[str]) -> Any:
        return await self.client.delete(*keys)


class Floor:
    """The least an asyncio client can do for ours's work on 4 shards: see the module doc."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import hiredis

        from sentinel_cache.core.ops.scripts import SET_EACH
        from sentinel_cache.core.ring import HashRing

        self.hiredis = hiredis
        self.addresses = [tuple(a) for a in spec["addresses"]]
        self.msetex = spec["msetex"]
        self.ring = HashRing([1] * len(self.addresses))
        self.script = SET_EACH
        self.free: list[list[Any]] = []  # per task: one (reader, writer, hiredis.Reader) per shard
        self.packed: dict[tuple[str, str], list[tuple[int, bytes, int]]] = {}
        self.groups: dict[tuple[str, str, int], list[str]] = {}  # (op, 1st key, shard) -> keys

    def _plan(self, keys: list[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for key in keys:
            groups.setdefault(self.ring.shard_index(key), []).append(key)
        return groups

    def pack(self, op: str, b: int, keys: list[str]) -> list[tuple[int, bytes, int]]:
        """Each shard's batch: packed once per batch of keys for reads and deletes; for writes
        the values are pickled and packed per call (the serializer's cost is everyone's)."""
        batch = (op, keys[0])  # b numbers both the read and the written batches
        found = self.packed.get(batch)
        if found is not None:
            return found
        pack = self.hiredis.pack_command
        out = []
        for shard, group in self._plan(keys).items():
            self.groups[(op, keys[0], shard)] = group
            if op == "get":
                out.append((shard, pack(("MGET", *group)), 1))
            elif op == "delete":
                out.append((shard, pack(("DEL", *group)), 1))
            else:  # packed per call: pack_set
                out.append((shard, b"", 1))
        self.packed[batch] = out
        return out

    def pack_set(self, b: int, mapping: dict[str, Any]) -> list[tuple[int, bytes, int]]:
        pack, ms = self.hiredis.pack_command, TIMEOUT * 1000
        out = []
        keys = list(mapping)
        for shard, _, count in self.pack("set", b, keys):
            group = self.groups[("set", keys[0], shard)]
            values = [pickle.dumps(mapping[key]) for key in group]
            if self.msetex:
                pairs = [x for pair in zip(group, values, strict=True) for x in pair]
                command: tuple[Any, ...] = ("MSETEX", len(group), *pairs, "PX", ms)
            else:
                command = ("EVAL", self.script, len(group), *group, ms, *values)
            out.append((shard, pack(command), count))
        return out

    async def setup(self, tasks: int) -> None:
        while len(self.free) < tasks:
            conns = []
            for host, port in self.addresses:
                reader, writer = await asyncio.open_connection(host, port)
                conns.append((reader, writer, self.hiredis.Reader()))
            self.free.append(conns)

    async def _run(self, batches: list[tuple[int, bytes, int]]) -> list[Any]:
        conns = self.free.pop()
        try:
            for shard, data, _ in batches:
                conns[shard][1].write(data)
            replies = []
            for shard, _, count in batches:
                reader, _, parser = conns[shard]
                for _ in range(count):
                    reply = parser.gets()
                    while reply is False:
                        data = await reader.read(65536)
                        if not data:
                            raise ConnectionError("closed")
                        parser.feed(data)
                        reply = parser.gets()
                    replies.append((shard, reply))
            return replies
        finally:
            self.free.append(conns)

    async def get_many(self, b: int, keys: list[str]) -> Any:
        found = {}
        for shard, values in await self._run(self.pack("get", b, keys)):
            for key, value in zip(self.groups[("get", keys[0], shard)], values, strict=True):
                if value is not None:
                    found[key] = pickle.loads(value)
        return found

    async def set_many(self, b: int, mapping: dict[str, Any]) -> Any:
        return await self._run(self.pack_set(b, mapping))

    async def delete_many(self, b: int, keys: list[str]) -> Any:
        return sum(r for _, r in await self._run(self.pack("delete", b, keys)))


KINDS = {"ours": Ours, "redis.asyncio": RedisAsyncio, "floor": Floor}


async def _phase(contender: Any, prefix: str, op: str, tasks: int, seconds: float) -> dict:
    reads, writes = _batches(prefix)
    mappings = [dict.fromkeys(batch, VALUE) for batch in writes]
    loop = asyncio.get_running_loop()
    count = [0] * tasks

    async def task(i: int) -> None:
        n = i * 7
        if op == "aget_many[10]":
            call, args = contender.get_many, reads
        elif op == "aset_many[10]":
            call, args = contender.set_many, mappings
        else:
            call, args = contender.delete_many, writes
        deadline = loop.time() + seconds
        done = 0
        while loop.time() < deadline:
            b = n % len(args)
            await call(b, args[b])
            n += 1
            done += 1
        count[i] = done

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(tasks)))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"ops": sum(count), "wall": wall, "cpu": cpu}


async def _worker(kind: str) -> None:
    spec = json.loads(sys.stdin.readline())
    contender = KINDS[kind](spec)
    prefix, tasks = spec["prefix"], spec["tasks"]
    await contender.setup(tasks)
    reads, _ = _batches(prefix)
    for b, batch in enumerate(reads):  # fill the read keys through the contender itself
        await contender.set_many(b, dict.fromkeys(batch, VALUE))
    for op in OPERATIONS:  # warm: every task's connections opened
        await _phase(contender, prefix, op, tasks, 0.5)
    print(json.dumps({"ready": kind}), flush=True)
    for line in sys.stdin:  # blocking between phases: nothing else runs meanwhile
        order = json.loads(line)
        if order.get("quit"):
            break
        if order.get("profile"):
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            result = await _phase(contender, prefix, order["op"], tasks, order["seconds"])
            profiler.disable()
            profiler.dump_stats(order["profile"] + ".prof")  # for pstats' callers and callees
            with open(order["profile"], "w") as out:
                stats = pstats.Stats(profiler, stream=out)
                out.write(f"{result['ops']} ops\n")
                stats.sort_stats("tottime").print_stats(45)
                stats.sort_stats("cumulative").print_stats(45)
        else:
            result = await _phase(contender, prefix, order["op"], tasks, order["seconds"])
        print(json.dumps(result), flush=True)


# -- the parent: topology, workers, rounds, table -------------------------------------------------


class Worker:
    def __init__(self, name: str, kind: str, checkout: Path, spec: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            cwd=str(checkout),
        )
        self.ask({**spec, "prefix": f"bench:{name}"})

    def ask(self, order: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} died (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@contextlib.contextmanager
def _checkout(ref: str) -> Iterator[Path]:
    """``ref`` checked out (detached) in a temporary worktree, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="async-many-base-") as tmp:
        path = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref],
            check=True,
            capture_output=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                check=False,
                capture_output=True,
            )


def _table(results: dict[str, dict[str, list[dict]]], names: list[str]) -> str:
    lines = [
        "| operation | contender | ops/s | CPU µs/op | ops/s vs redis.asyncio | ops/s vs floor "
        "| CPU vs redis.asyncio | CPU vs floor |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op in OPERATIONS:
        med = {}
        for name in names:
            runs = results[op][name]
            med[name] = (
                statistics.median(r["ops"] / r["wall"] for r in runs),
                statistics.median(r["cpu"] / r["ops"] * 1e6 for r in runs),
            )
        for name in names:
            rate, cpu = med[name]
            ratios = [
                f"{rate / med[other][0]:.2f}x" if other in med else "-"
                for other in ("redis.asyncio", "floor")
            ] + [
                f"{cpu / med[other][1]:.2f}x" if other in med else "-"
                for other in ("redis.asyncio", "floor")
            ]
            lines.append(
                f"| {op} | {name} | {rate:,.0f} | {cpu:.0f} | " + " | ".join(ratios) + " |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.async_many")
    parser.add_argument("--pin", action="store_true", help="servers and clients on CPU 0")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per phase")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--base", help="also measure ours at this git ref")
    parser.add_argument("--server", default=None, help="redis, embedded, ... (default: env)")
    parser.add_argument("--profile", choices=OPERATIONS, help="cProfile one phase of ours")
    parser.add_argument(
        "--profile-kind", choices=sorted(KINDS), default="ours", help="whom --profile profiles"
    )
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args(argv)
    if args.pin:
        os.sched_setaffinity(0, {0})  # inherited by the servers and workers started below
    import redis

    from sentinel_cache.testing import LocalSentinelCluster

    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            LocalSentinelCluster(shards=4, replicas=0, sentinels=1, server=args.server)
        )
        addresses = [tuple(cluster.master_address(n)) for n in cluster.master_names]
        with redis.Redis(
            host=addresses[0][0], port=addresses[0][1]
        ) as probe:  # ours learns the same on its first call
            try:
                probe.execute_command("MSETEX", 1, "bench:probe", "x", "PX", 1000)
                msetex = True
            except redis.ResponseError:
                msetex = False
        spec = {
            "sentinels": [f"{h}:{p}" for h, p in cluster.sentinel_addresses],
            "masters": list(cluster.master_names),
            "addresses": addresses,
            "msetex": msetex,
            "tasks": args.tasks,
        }
        first = args.profile_kind if args.profile else "ours"
        plan: list[tuple[str, str, Path]] = [(first, first, ROOT)]
        if args.base and not args.profile:
            plan.append(("ours@base", "ours", stack.enter_context(_checkout(args.base))))
        if not args.profile:
            plan += [("redis.asyncio", "redis.asyncio", ROOT), ("floor", "floor", ROOT)]
        workers = []
        for name, kind, checkout in plan:
            worker = Worker(name, kind, checkout, spec)
            stack.callback(worker.close)
            workers.append(worker)
        if args.profile:
            out = ROOT / "benchmarks" / "results" / f"profile-async-{first}-{args.profile}.txt"
            out.parent.mkdir(parents=True, exist_ok=True)
            order = {"op": args.profile, "seconds": args.duration, "profile": str(out)}
            result = workers[0].ask(order)
            print(f"{result['ops']} ops profiled; {out}")
            return
        names = [w.name for w in workers]
        results: dict[str, dict[str, list[dict]]] = {
            op: {n: [] for n in names} for op in OPERATIONS
        }
        for round_ in range(args.rounds):
            for op in OPERATIONS:
                turn = workers[round_ % len(workers) :] + workers[: round_ % len(workers)]
                for worker in turn:
                    order = {"op": op, "seconds": args.duration}
                    results[op][worker.name].append(worker.ask(order))
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        server = (
            os.environ.get("SENTINEL_CACHE_SERVER", "auto") if args.server is None else args.server
        )
        print(
            f"# {args.tasks} tasks, {args.rounds} rounds x {args.duration:g} s, "
            f"{'pinned to CPU 0' if args.pin else 'unpinned'}, server {server}, "
            f"MSETEX {'yes' if msetex else 'no'}"
        )
        print(_table(results, names))
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=1
                )
            )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        asyncio.run(_worker(sys.argv[2]))
    else:
        main()
