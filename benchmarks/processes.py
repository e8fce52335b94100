"""The multi-process 90/10 mix: what a web server's worker processes do (issue 27's target
"4 processes, 90/10 mix: >= 1.3x redis-py's throughput" was retired by issue 37: ours shards
over 4 masters, redis-py talks to one; the table stays).

Each contender runs in its own ``processes`` worker processes (``python -m benchmarks.processes
--worker``), started once and built from the same :class:`~benchmarks.contenders.Topology`;
each process calls ``get`` (90 %) or ``set`` (10 %) on random keys of its contender's 1,000,
back to back on one thread. Only one contender works at a time: every round shuffles the
order, and a contender's processes all start at the same ``time.monotonic()`` instant (the clock
is system-wide) and stop ``duration`` seconds later. Figures per round: calls of all its
processes / wall time, and the processes' CPU time (``time.process_time``, their background
threads included) per call: on 2 cores shared with the servers, the client's CPU per call is
what bounds the throughput.

``make bench`` runs it (``benchmarks.run``); on its own, ``python -m benchmarks.processes
[--rounds 6] [--duration 1] [--base REF]`` starts the same topology (4 masters with a replica
each, 3 sentinels), measures ours (the Django backend) and redis-py, and with ``--base`` ours at
another commit too (a detached worktree, its workers importing that checkout), all in the same
rounds: the 4 processes share 2 cores with the servers, so only figures of one run compare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.contenders import SPEC_BY_ID, Topology
from benchmarks.measure import KEYSPACE, VALUE, Keys

ROOT = Path(__file__).resolve().parent.parent


def _worker() -> None:
    warnings.filterwarnings("ignore", module="django_redis")
    order = json.loads(sys.stdin.readline())
    t = order["topology"]
    topo = Topology(
        sentinels=tuple((h, p) for h, p in t["sentinels"]),
        masters=tuple(t["masters"]),
        master_addresses=tuple((h, p) for h, p in t["master_addresses"]),
    )
    contender = SPEC_BY_ID[order["cid"]].build(topo)
    keys = Keys(order["prefix"])
    if order["fill"]:
        for batch in keys.batches(keys.data, 100, KEYSPACE // 100):
            contender.set_many(dict.fromkeys(batch, VALUE))
    rng = random.Random(order["seed"])
    data, get, setter = keys.data, contender.get, contender.set
    for key in data[:100]:  # warm: connections open, the ring's cache filled
        get(key)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        if order.get("quit"):
            break
        delay = order["start"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        end = order["start"] + order["seconds"]
        done = errors = 0
        cpu0, began = time.process_time(), time.monotonic()
        while True:
            for _ in range(20):  # the clock read every 20 calls
                key = data[rng.randrange(KEYSPACE)]
                try:
                    if rng.random() < 0.9:
                        get(key)
                    else:
                        setter(key, VALUE)
                except Exception:
                    errors += 1
                done += 1
            now = time.monotonic()
            if now >= end:
                break
        cpu = time.process_time() - cpu0
        print(json.dumps({"ops": done, "cpu": cpu, "wall": now - began, "errors": errors}),
              flush=True)  # fmt: skip
    contender.close()


class _Process:
    def __init__(self, order: dict[str, Any], checkout: Path = ROOT) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.processes", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(checkout),
            env={**os.environ, "PYTHONPATH": str(checkout)},  # that checkout's sentinel_cache
            text=True,
        )
        self.send(order)

    def send(self, order: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a benchmark worker died (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send({"quit": True})
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run(
    topo: Topology,
    cids: Sequence[str],
    *,
    processes: int = 4,
    rounds: int,
    duration: float,
    seed: int,
    progress: Callable[[str], None] = lambda s: None,
    checkouts: Mapping[str, tuple[str, Path]] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{cid: {"rounds": [{"ops", "wall", "cpu", "errors"}, ...]}}``, one entry per round
    (``ops`` and ``cpu`` summed over the contender's processes, ``wall`` the longest).
    ``checkouts``: names in ``cids`` that are a contender of another checkout, ``name ->
    (cid, checkout)``."""
    where = dict(checkouts or {})
    rng = random.Random(seed + 3)
    topology = {
        "sentinels": topo.sentinels,
        "masters": topo.masters,
        "master_addresses": topo.master_addresses,
    }
    groups: dict[str, list[_Process]] = {}
    try:
        for name in cids:  # all started at once: their imports overlap
            cid, checkout = where.get(name, (name, ROOT))
            groups[name] = [
                _Process(
                    {
                        "topology": topology,
                        "cid": cid,
                        "prefix": f"bench:mp:{name}",
                        "fill": i == 0,
                        "seed": seed * 10 + i,
                    },
                    checkout,
                )
                for i in range(processes)
            ]
        for group in groups.values():
            for process in group:
                process.answer()  # ready
        results: dict[str, dict[str, Any]] = {cid: {"rounds": []} for cid in cids}
        for r in range(rounds):
            order = list(cids)
            rng.shuffle(order)
            for cid in order:
                start = time.monotonic() + 0.05
                for process in groups[cid]:
                    process.send({"start": start, "seconds": duration})
                answers = [process.answer() for process in groups[cid]]
                results[cid]["rounds"].append(
                    {
                        "ops": sum(a["ops"] for a in answers),
                        "cpu": sum(a["cpu"] for a in answers),
                        "wall": max(a["wall"] for a in answers),
                        "errors": sum(a["errors"] for a in answers),
                    }
                )
            progress(f"{processes}-process mix round {r + 1}/{rounds} done")
        return results
    finally:
        for group in groups.values():
            for process in group:
                process.close()


def summary(results: Mapping[str, Mapping[str, Any]], references: Sequence[str]) -> str:
    """A table: per contender the median ops/s (and the rounds' range), CPU µs per call, and
    its throughput as a ratio to each of ``references``', round by round (median, range): a
    round's contenders ran one after the other, so its ratios are paired."""
    lines = [
        "| contender | ops/s median (min-max) | CPU µs per call | "
        + " | ".join(f"x {ref} per round: median (min-max)" for ref in references)
        + " | errors |",
        "| --- | ---: | ---: | " + " | ".join("---" for _ in references) + " | ---: |",
    ]

    def rates(name: str) -> list[float]:
        return [r["ops"] / r["wall"] for r in results[name]["rounds"]]

    for name, result in results.items():
        rounds, mine = result["rounds"], rates(name)
        cpu = statistics.median(r["cpu"] / r["ops"] * 1e6 for r in rounds)
        cells = []
        for ref in references:
            ratios = [a / b for a, b in zip(mine, rates(ref), strict=True)]
            cells.append(f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})")
        lines.append(
            f"| {name} | {statistics.median(mine):,.0f} ({min(mine):,.0f}-{max(mine):,.0f})"
            f" | {cpu:.1f} | {' | '.join(cells)} | {sum(r['errors'] for r in rounds)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.compare import checkout
    from sentinel_cache.testing import LocalSentinelCluster

    parser = argparse.ArgumentParser(prog="python -m benchmarks.processes")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per contender")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--contenders", default="ours_django,raw", help="ids, comma-separated")
    parser.add_argument("--base", help="also ours_django at this git ref (or checkout path)")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args(argv)
    cids = args.contenders.split(",")
    with contextlib.ExitStack() as stack:
        checkouts: dict[str, tuple[str, Path]] = {}
        if args.base:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-mp-")))
            path = stack.enter_context(checkout(args.base, workdir, "base"))
            checkouts["ours_django@base"] = ("ours_django", path)
        cluster = stack.enter_context(LocalSentinelCluster(shards=4, replicas=1, sentinels=3))
        results = run(
            Topology.of(cluster),
            [*cids, *checkouts],
            processes=args.processes,
            rounds=args.rounds,
            duration=args.duration,
            seed=args.seed,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            checkouts=checkouts,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"{args.processes} processes per contender, 90/10 get/set, {args.rounds} rounds of "
          f"{args.duration:g} s" + (f"; base: {args.base}" if args.base else ""))  # fmt: skip
    references = [name for name in ("raw", *checkouts) if name in results] or cids[:1]
    print(summary(results, references))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        sys.exit(main())
