"""``python -m benchmarks.async_mux [--pin] [--rounds N] [--duration S]``: ``ASYNC_MULTIPLEX``
side by side with the pool and the floors (issue 37).

64 asyncio tasks, each calling one operation back to back for ``--duration`` seconds:

* ``aget`` and ``aset`` (a 6-field dict, pickled; ``SET ... PX``) on ONE server (a one-shard
  ring over the first master): ``ours pool`` (``MAX_CONNECTIONS`` 64), ``ours mux``
  (``ASYNC_MULTIPLEX``), and the **multiplexed floor**: one connection, an ``asyncio.Protocol``
  feeding a ``hiredis.Reader``, the commands of every task written once per loop turn, one
  future per command resolved in order; pre-packed ``GET``s, a ``SET``'s value pickled and
  packed per call;
* ``aget_many[10]`` on 4 shards: ``ours pool``, ``ours mux``, the **pooled 4-shard floor**
  (``benchmarks.async_many.Floor``: one stream connection per task per shard) and the
  multiplexed floor on 4 shards (one connection per shard, each shard's ``MGET`` its command).

Every contender runs in its own worker process, the order rotating every round (interleaved,
the same servers); medians over the rounds of ops/s and CPU µs per op. ``conns`` is the number of
server connections the contender holds on the first master after its phases (``CLIENT LIST``,
by client name; the floors' are counted the same way). ``--pin`` puts everything on CPU 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from benchmarks.async_many import BATCH, KEYSPACE, TIMEOUT, VALUE, Floor, Worker

ROOT = Path(__file__).resolve().parent.parent
SINGLE = ("aget", "aset")
MANY = ("aget_many[10]",)
OPERATIONS = SINGLE + MANY
#: contender -> (shards, the operations it runs)
CONTENDERS: dict[str, tuple[int, tuple[str, ...]]] = {
    "ours pool": (1, SINGLE),
    "ours mux": (1, SINGLE),
    "mux floor": (1, SINGLE),
    "ours pool 4": (4, MANY),
    "ours mux 4": (4, MANY),
    "pooled floor 4": (4, MANY),
    "mux floor 4": (4, MANY),
}


def _keys(prefix: str) -> list[str]:
    return [f"{prefix}:k{i}" for i in range(KEYSPACE)]


class Ours:
    def __init__(self, spec: dict[str, Any], shards: int, mux: bool, name: str) -> None:
        from sentinel_cache.core.config import PoolConfig
        from sentinel_cache.core.ops.aio import AsyncCacheClient
        from sentinel_cache.core.serializers import Codec
        from sentinel_cache.core.topology.sharded_pool import shared_pool

        config = PoolConfig.create(
            spec["masters"][:shards],
            spec["sentinels"],
            max_connections=64,
            async_multiplex=mux,
            client_name=name,
        )
        self.client = AsyncCacheClient(shared_pool(config), Codec())

    async def setup(self, tasks: int) -> None:
        pass

    async def get(self, key: str) -> Any:
        return await self.client.get(key)

    async def set(self, key: str) -> Any:
        return await self.client.set(key, VALUE, TIMEOUT)

    async def get_many(self, keys: list[str]) -> Any:
        return await self.client.get_many(keys)

    async def set_many(self, mapping: dict[str, Any]) -> Any:
        return await self.client.set_many(mapping, TIMEOUT)


class _Pipe(asyncio.Protocol):
    """The multiplexed floor's connection: commands queued and written once per loop turn,
    each reply handed to the oldest future."""

    def __init__(self, hiredis: Any) -> None:
        self.reader = hiredis.Reader()
        self.futures: deque[asyncio.Future[Any]] = deque()
        self.out: list[bytes] = []
        self.transport: Any = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        reply = self.reader.gets()
        while reply is not False:
            self.futures.popleft().set_result(reply)
            reply = self.reader.gets()

    def call(self, data: bytes) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        self.futures.append(future)
        if not self.out:
            self.loop.call_soon(self._flush)
        self.out.append(data)
        return future

    def _flush(self) -> None:
        out, self.out = self.out, []
        self.transport.write(b"".join(out))


class MuxFloor:
    """The least a multiplexed asyncio client can do: one connection per server (see above)."""

    def __init__(self, spec: dict[str, Any], shards: int, name: str) -> None:
        import hiredis

        from sentinel_cache.core.ring import HashRing

        self.hiredis = hiredis
        self.addresses = [tuple(a) for a in spec["addresses"][:shards]]
        self.ring = HashRing([1] * shards)
        self.name = name
        self.pipes: list[_Pipe] = []
        self.gets: dict[str, bytes] = {}
        self.groups: dict[str, list[tuple[int, bytes, list[str]]]] = {}

    async def setup(self, tasks: int) -> None:
        loop = asyncio.get_running_loop()
        for host, port in self.addresses:
            _, pipe = await loop.create_connection(lambda: _Pipe(self.hiredis), host, port)
            await pipe.call(self.hiredis.pack_command(("CLIENT", "SETNAME", self.name)))
            self.pipes.append(pipe)

    async def get(self, key: str) -> Any:
        data = self.gets.get(key)
        if data is None:
            data = self.gets[key] = self.hiredis.pack_command(("GET", key))
        value = await self.pipes[0].call(data)
        return None if value is None else pickle.loads(value)

    async def set(self, key: str) -> Any:
        command = ("SET", key, pickle.dumps(VALUE), "PX", TIMEOUT * 1000)
        return await self.pipes[0].call(self.hiredis.pack_command(command))

    async def get_many(self, keys: list[str]) -> Any:
        plan = self.groups.get(keys[0])
        if plan is None:
            by: dict[int, list[str]] = {}
            for key in keys:
                by.setdefault(self.ring.shard_index(key), []).append(key)
            pack = self.hiredis.pack_command
            plan = self.groups[keys[0]] = [(s, pack(("MGET", *g)), g) for s, g in by.items()]
        futures = [self.pipes[shard].call(data) for shard, data, _ in plan]
        found = {}
        for (_, _, group), future in zip(plan, futures, strict=True):
            for key, value in zip(group, await future, strict=True):
                if value is not None:
                    found[key] = pickle.loads(value)
        return found

    async def set_many(self, mapping: dict[str, Any]) -> Any:
        pack = self.hiredis.pack_command
        futures = []
        for key, value in mapping.items():
            shard = self.ring.shard_index(key)
            command = ("SET", key, pickle.dumps(value), "PX", TIMEOUT * 1000)
            futures.append(self.pipes[shard].call(pack(command)))
        return [await f for f in futures]


class PooledFloor(Floor):
    """``benchmarks.async_many.Floor`` (one stream connection per task per shard), named."""

    def __init__(self, spec: dict[str, Any], name: str) -> None:
        super().__init__(spec)
        self.name = name

    async def setup(self, tasks: int) -> None:
        await super().setup(tasks)
        command = self.hiredis.pack_command(("CLIENT", "SETNAME", self.name))
        for conns in self.free:
            for reader, writer, parser in conns:
                writer.write(command)
                while parser.gets() is False:
                    parser.feed(await reader.read(65536))

    async def get(self, key: str) -> Any:  # (the single-key phases are not asked of it)
        raise NotImplementedError

    async def get_many(self, keys: list[str]) -> Any:  # type: ignore[override]
        return await super().get_many(0, keys)

    async def set_many(self, mapping: dict[str, Any]) -> Any:  # type: ignore[override]
        return await super().set_many(0, mapping)


def _make(name: str, spec: dict[str, Any]) -> Any:
    shards = CONTENDERS[name][0]
    tag = name.replace(" ", "-")
    if name.startswith("ours"):
        return Ours(spec, shards, "mux" in name, tag)
    if name.startswith("mux floor"):
        return MuxFloor(spec, shards, tag)
    return PooledFloor({**spec, "addresses": spec["addresses"][:shards]}, tag)


async def _phase(contender: Any, keys: list[str], op: str, tasks: int, seconds: float) -> dict:
    loop = asyncio.get_running_loop()
    count = [0] * tasks
    batches = [keys[i : i + BATCH] for i in range(0, len(keys), BATCH)]

    async def task(i: int) -> None:
        n, done = i * 7, 0
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            if op == "aget":
                await contender.get(keys[n % len(keys)])
            elif op == "aset":
                await contender.set(keys[n % len(keys)])
            else:
                await contender.get_many(batches[n % len(batches)])
            n += 1
            done += 1
        count[i] = done

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(tasks)))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"ops": sum(count), "wall": wall, "cpu": cpu}


async def _worker(name: str) -> None:
    spec = json.loads(sys.stdin.readline())
    contender = _make(name, spec)
    tasks = spec["tasks"]
    await contender.setup(tasks)
    keys = _keys(spec["prefix"])
    for i in range(0, len(keys), BATCH):  # the keys read, through the contender itself
        await contender.set_many(dict.fromkeys(keys[i : i + BATCH], VALUE))
    for op in CONTENDERS[name][1]:  # warm: every connection opened
        await _phase(contender, keys, op, tasks, 0.3)
    print(json.dumps({"ready": name}), flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        if order.get("quit"):
            break
        print(json.dumps(await _phase(contender, keys, order["op"], tasks, order["seconds"])))
        sys.stdout.flush()


def _connections(address: tuple[str, int]) -> dict[str, int]:
    import redis

    with redis.Redis(*address) as admin:
        counts: dict[str, int] = {}
        for client in admin.client_list():
            counts[client.get("name", "")] = counts.get(client.get("name", ""), 0) + 1
    return counts


HEADER = [
    "operation",
    "contender",
    "ops/s",
    "CPU µs/op",
    "vs mux floor",
    "vs pooled floor",
    "conns on master 0",
]


def rows(results: dict[str, dict[str, list[dict]]], conns: dict[str, int]) -> list[list[str]]:
    """The table's rows (``make bench`` puts them in its report): medians of the rounds."""
    out = []
    for op in OPERATIONS:
        rows = results.get(op, {})
        med = {
            name: (
                statistics.median(r["ops"] / r["wall"] for r in runs),
                statistics.median(r["cpu"] / r["ops"] * 1e6 for r in runs),
            )
            for name, runs in rows.items()
            if runs
        }
        mux_floor = med.get("mux floor") or med.get("mux floor 4")
        pooled = med.get("pooled floor 4")
        for name, (rate, cpu) in med.items():
            ratio_mux = f"{rate / mux_floor[0]:.2f}x" if mux_floor else "-"
            ratio_pool = f"{rate / pooled[0]:.2f}x" if pooled else "-"
            held = str(conns.get(name.replace(" ", "-"), 0))
            out.append([op, name, f"{rate:,.0f}", f"{cpu:.0f}", ratio_mux, ratio_pool, held])
    return out


def _medians(results: dict[str, dict[str, list[dict]]], op: str) -> dict[str, float]:
    """Each contender's median ops/s over the rounds of ``op``."""
    return {
        name: statistics.median(r["ops"] / r["wall"] for r in runs)
        for name, runs in results.get(op, {}).items()
        if runs
    }


def targets(results: dict[str, dict[str, list[dict]]]) -> list[dict[str, Any]]:
    """Issue 37's asyncio targets at 64 tasks, from medians of this run's rounds: ``aget`` and
    ``aset`` >= 0.6x the multiplexed floor on one server, ``aget_many[10]`` on 4 shards >=
    1.5x the pooled 4-shard floor (N/A when a contender is missing)."""
    out: list[dict[str, Any]] = []
    wanted = [(op, "ours mux", "mux floor", 0.6) for op in SINGLE]
    wanted.append(("aget_many[10]", "ours mux 4", "pooled floor 4", 1.5))
    for op, ours, ref, bound in wanted:
        name = f"{op} at 64 tasks, `ASYNC_MULTIPLEX`: >= {bound:g}x the {ref}'s throughput"
        med = _medians(results, op)
        if not med.get(ours) or not med.get(ref):
            out.append({"target": name, "result": "N/A", "detail": "missing contender"})
            continue
        ratio = med[ours] / med[ref]
        out.append(
            {
                "target": name,
                "result": "PASS" if ratio >= bound else "FAIL",
                "detail": f"{med[ours]:,.0f} vs {med[ref]:,.0f} ops/s = {ratio:.3f}x",
            }
        )
    return out


def table(results: dict[str, dict[str, list[dict]]], conns: dict[str, int]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|---|---|---:|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results, conns)]
    return "\n".join(lines)


def idle_write(rounds: int, duration: float, server: str | None) -> str:
    """``--idle-write``: ours mux on one server, ``aget`` by 1 task and by 64, with
    ``WRITE_AT_ONCE_WHEN_IDLE`` on and off (in this process, interleaved): medians of ops/s."""
    from sentinel_cache.core.config import PoolConfig
    from sentinel_cache.core.ops import async_mux
    from sentinel_cache.core.ops.aio import AsyncCacheClient
    from sentinel_cache.core.serializers import Codec
    from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
    from sentinel_cache.testing import LocalSentinelCluster

    found: dict[tuple[bool, int], list[float]] = {}
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1, server=server) as cluster:
        config = PoolConfig.create(
            cluster.master_names, cluster.sentinel_addresses, async_multiplex=True
        )
        core = ShardedSentinelPool.from_config(config)

        async def phase(tasks: int) -> float:
            client = AsyncCacheClient(core, Codec())
            await client.set("idle", VALUE, TIMEOUT)
            done = [0]

            async def task() -> None:
                deadline = time.perf_counter() + duration
                while time.perf_counter() < deadline:
                    await client.get("idle")
                    done[0] += 1

            await asyncio.gather(*(task() for _ in range(tasks)))
            await client.aclose()
            return done[0] / duration

        try:
            for _ in range(rounds):
                for flag in (True, False):
                    async_mux.WRITE_AT_ONCE_WHEN_IDLE = flag
                    for tasks in (1, 64):
                        found.setdefault((flag, tasks), []).append(asyncio.run(phase(tasks)))
        finally:
            async_mux.WRITE_AT_ONCE_WHEN_IDLE = True
            core.close()
    lines = [
        "| write at once when idle | tasks | aget ops/s (median) | rounds |",
        "|---|---:|---:|---|",
    ]
    for (flag, tasks), rates in sorted(found.items()):
        each = ", ".join(f"{r:,.0f}" for r in rates)
        lines.append(f"| {flag} | {tasks} | {statistics.median(rates):,.0f} | {each} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.async_mux")
    parser.add_argument("--pin", action="store_true", help="servers and clients on CPU 0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per phase")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--server", default=None, help="redis, embedded, ... (default: env)")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument(
        "--idle-write", action="store_true", help="only: a lone call written at once or not"
    )
    args = parser.parse_args(argv)
    if args.pin:
        os.sched_setaffinity(0, {0})  # inherited by the servers and workers started below
    if args.idle_write:
        print(idle_write(args.rounds, args.duration, args.server))
        return {}
    from sentinel_cache.testing import LocalSentinelCluster

    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            LocalSentinelCluster(shards=4, replicas=0, sentinels=1, server=args.server)
        )
        addresses = [tuple(cluster.master_address(n)) for n in cluster.master_names]
        spec = {
            "sentinels": [f"{h}:{p}" for h, p in cluster.sentinel_addresses],
            "masters": list(cluster.master_names),
            "addresses": addresses,
            "msetex": False,
            "tasks": args.tasks,
        }
        workers = []
        for name in CONTENDERS:
            worker = _Named(name, spec)
            stack.callback(worker.close)
            workers.append(worker)
        results: dict[str, dict[str, list[dict]]] = {op: {} for op in OPERATIONS}
        for round_ in range(args.rounds):
            turn = workers[round_ % len(workers) :] + workers[: round_ % len(workers)]
            for op in OPERATIONS:
                for worker in turn:
                    if op in CONTENDERS[worker.name][1]:
                        order = {"op": op, "seconds": args.duration}
                        results[op].setdefault(worker.name, []).append(worker.ask(order))
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        conns = _connections(addresses[0])
        server = (
            os.environ.get("SENTINEL_CACHE_SERVER", "auto") if args.server is None else args.server
        )
        print(
            f"# {args.tasks} tasks, {args.rounds} rounds x {args.duration:g} s, "
            f"{'pinned to CPU 0' if args.pin else 'unpinned'}, server {server}"
        )
        print(table(results, conns))
        out = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "results": results,
            "conns": conns,
        }
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
        return out


class _Named(Worker):
    """``async_many``'s worker process, started on this module's worker."""

    def __init__(self, name: str, spec: dict[str, Any]) -> None:
        import subprocess

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.async_mux", "--worker", name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            cwd=str(ROOT),
        )
        self.ask({**spec, "prefix": f"bench:{name.replace(' ', '-')}"})


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        asyncio.run(_worker(sys.argv[2]))
    else:
        main()
