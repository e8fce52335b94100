"""The multi-process 90/10 mix: what a web server's worker processes do (issue 27's target:
"4 processes, 90/10 mix: >= 1.3x redis-py's throughput").

Each contender runs in its own ``processes`` worker processes (``python -m benchmarks.processes
--worker``), started once and built from the same :class:`~benchmarks.contenders.Topology`;
each process calls ``get`` (90 %) or ``set`` (10 %) on random keys of its contender's 1,000,
back to back on one thread. Only one contender works at a time: every round shuffles the
order, and a contender's processes all start at the same ``time.monotonic()`` instant (the clock
is system-wide) and stop ``duration`` seconds later. Figures per round: calls of all its
processes / wall time, and the processes' CPU time (``time.process_time``, their background
threads included) per call: on 2 cores shared with the servers, the client's CPU per call is
what bounds the throughput.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
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
    def __init__(self, order: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.processes", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(ROOT),
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
) -> dict[str, dict[str, Any]]:
    """``{cid: {"rounds": [{"ops", "wall", "cpu", "errors"}, ...]}}``, one entry per round
    (``ops`` and ``cpu`` summed over the contender's processes, ``wall`` the longest)."""
    rng = random.Random(seed + 3)
    topology = {
        "sentinels": topo.sentinels,
        "masters": topo.masters,
        "master_addresses": topo.master_addresses,
    }
    groups: dict[str, list[_Process]] = {}
    try:
        for cid in cids:  # all started at once: their imports overlap
            groups[cid] = [
                _Process(
                    {
                        "topology": topology,
                        "cid": cid,
                        "prefix": f"bench:mp:{cid}",
                        "fill": i == 0,
                        "seed": seed * 10 + i,
                    }
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


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        sys.exit("run by benchmarks.run (make bench); --worker is its worker half")
