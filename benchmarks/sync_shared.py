"""``python -m benchmarks.sync_shared``: sync threads on one server, one connection per thread or
one shared, auto-pipelined connection per process? (issue 37, item 2: decided by measurement).

Hand-written clients on raw sockets and ``hiredis.Reader`` (no library code), N threads
(1, 4, 8, 16, 32) doing ``GET`` or ``SET ... EX 300`` of a small pickled value on one server:

* ``per-thread``: one blocking connection per thread in flight (a free list of connections:
  ``list.pop``/``append``, as floor.py), our model today;
* ``shared, leader``: ONE connection for the process, with automatic pipelining across threads.
  A caller queues its command and its reply slot under a lock; the first caller to find no
  leader becomes the leader and does all the I/O: it writes everyone's queued commands in one
  ``sendall``, reads, hands each reply to the slot at the head of the FIFO (waking that thread
  by releasing its slot's lock), writes what was queued meanwhile before reading again, and
  once its own reply is in hands the leadership to the oldest waiting caller. The others park
  on their slot's lock: no syscall of their own;
* ``shared, reader``: ONE connection, a dedicated reader thread dispatching replies FIFO to the
  slots; the first caller to find nobody writing writes everyone's queued commands;
* ``ours``: the library's ``CacheClient`` on one shard (through a sentinel), today's path: one
  pooled connection per thread in flight.

Each contender runs in its own worker process (``process_time`` is its CPU alone, every thread
included: the reader thread, our background threads), started once; one phase runs at a time,
the contenders' order rotating. Every round measures both modes (the order alternating):
unpinned, and pinned (the server's threads and every worker thread on CPU 0,
``os.sched_setaffinity``), each op at each thread count. Figures are medians over the rounds
of ops/s (calls of all threads / wall time) and CPU µs per op (process CPU time / ops).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hiredis

from benchmarks.measure import pin_threads

ROOT = Path(__file__).resolve().parent.parent
THREADS = (1, 4, 8, 16, 32)
OPERATIONS = ("get", "set")
MODES = ("unpinned", "pinned")
KINDS = ("per-thread", "shared, leader", "shared, reader", "ours")
KEYSPACE = 1000
TIMEOUT = 300
VALUE = {"id": 12345, "name": "user-12345", "roles": ["reader", "writer"], "score": 3.14159}

_GET = b"*2\r\n$3\r\nGET\r\n"
_SET = b"*5\r\n$3\r\nSET\r\n"
_EX = b"$2\r\nEX\r\n$3\r\n300\r\n"
_ReplyError = hiredis.ReplyError
_new_lock = threading.Lock


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(data), data)


def get_command(key: str) -> bytes:
    return _GET + _bulk(key.encode())


def set_command(key: str, value: Any) -> bytes:
    return _SET + _bulk(key.encode()) + _bulk(pickle.dumps(value, pickle.HIGHEST_PROTOCOL)) + _EX


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=2.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(5.0)
    return sock


class _Client:
    """What every contender offers: ``get``/``set`` of one key (values pickled), ``close``."""

    def call(self, command: bytes) -> Any:
        raise NotImplementedError

    def get(self, key: str) -> Any:
        data = self.call(get_command(key))
        return None if data is None else pickle.loads(data)

    def set(self, key: str, value: Any) -> bool:
        return bool(self.call(set_command(key, value)) == b"OK")

    def close(self) -> None:
        pass


class PerThread(_Client):
    """One blocking connection per thread in flight: a call takes one from a free list (or
    opens one), sends, reads its reply, gives it back; a failed call closes it."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self._free: list[tuple[socket.socket, Any]] = []  # pop/append are atomic

    def __repr__(self) -> str:
        return f"PerThread({self.address}, idle={len(self._free)})"

    def call(self, command: bytes) -> Any:
        try:
            sock, parser = self._free.pop()
        except IndexError:
            sock, parser = _connect(self.address), hiredis.Reader()
        try:
            sock.sendall(command)
            reply = parser.gets()
            while reply is False:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                parser.feed(data)
                reply = parser.gets()
        except BaseException:
            sock.close()
            raise
        self._free.append((sock, parser))
        if type(reply) is _ReplyError:
            raise reply
        return reply

    def close(self) -> None:
        while self._free:
            self._free.pop()[0].close()


class _Slot:
    """One call's place in the FIFO of replies; ``gate`` is held until the reply (or, in the
    leader design, the leadership) is handed over, so a parked thread costs no syscall of its
    own beyond the lock's futex."""

    __slots__ = ("gate", "reply", "done")

    def __init__(self) -> None:
        self.gate: Any = None
        self.reply: Any = None
        self.done = False

    def __repr__(self) -> str:
        return f"_Slot(done={self.done}, reply={self.reply!r})"

    def result(self) -> Any:
        reply = self.reply
        if isinstance(reply, BaseException):  # an error reply, or the connection's failure
            raise reply
        return reply


class _Shared(_Client):
    """One connection for every thread; replies matched to calls in the order sent."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.sock = _connect(address)
        self.parser = hiredis.Reader()
        self.lock = threading.Lock()
        self.out: list[bytes] = []  # queued, not yet written
        self.waiting: collections.deque[_Slot] = collections.deque()  # written or queued, FIFO
        self.failed: BaseException | None = None
        self.batches = 0  # sendall calls (a figure: commands per write = calls / batches)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.address}, waiting={len(self.waiting)}, "
            f"batches={self.batches}, failed={self.failed!r})"
        )

    def _dispatch(self, data: bytes, own: _Slot | None) -> None:
        """Feed ``data``; hand every complete reply to the oldest waiting slot."""
        parser, waiting = self.parser, self.waiting
        parser.feed(data)
        reply = parser.gets()
        while reply is not False:
            slot = waiting.popleft()
            slot.reply, slot.done = reply, True
            if slot is not own:
                slot.gate.release()
            reply = parser.gets()

    def _fail(self, exc: BaseException, own: _Slot | None) -> None:
        """The connection is unusable: every waiting call fails with ``exc``."""
        with self.lock:
            self.failed = exc
            self.out = []
            while self.waiting:
                slot = self.waiting.popleft()
                slot.reply, slot.done = exc, True
                if slot is not own and slot.gate is not None:
                    slot.gate.release()
        self.sock.close()


class SharedLeader(_Shared):
    """Leader/follower auto-pipelining (see the module doc); no thread of its own."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address)
        self.leading = False

    def call(self, command: bytes) -> Any:
        slot = _Slot()
        with self.lock:
            if self.failed is not None:
                raise ConnectionError(f"the shared connection failed: {self.failed!r}")
            self.out.append(command)
            self.waiting.append(slot)
            lead = not self.leading
            if lead:
                self.leading = True
            else:
                slot.gate = gate = _new_lock()
                gate.acquire()
        if not lead:
            slot.gate.acquire()  # released with our reply, or to make us the leader
            if slot.done:
                return slot.result()
        self._lead(slot)
        return slot.result()

    def _lead(self, own: _Slot) -> None:
        sock, lock = self.sock, self.lock
        try:
            while True:
                with lock:
                    out = self.out
                    if out:
                        self.out = []
                if out:
                    sock.sendall(out[0] if len(out) == 1 else b"".join(out))
                    self.batches += 1
                if own.done:
                    break
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                self._dispatch(data, own)
        except BaseException as exc:
            self._fail(exc, own)
            with lock:
                self.leading = False
            if not own.done:
                raise
            return
        with lock:  # hand over: the oldest waiting call leads (it is parked on its gate)
            if self.waiting:
                self.waiting[0].gate.release()
            else:
                self.leading = False

    def close(self) -> None:
        self.sock.close()


class SharedReader(_Shared):
    """A dedicated reader thread dispatches the replies; callers combine their writes."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address)
        self.flushing = False
        self.reader = threading.Thread(target=self._read, name="shared-reader", daemon=True)
        self.reader.start()

    def call(self, command: bytes) -> Any:
        slot = _Slot()
        slot.gate = gate = _new_lock()
        gate.acquire()
        with self.lock:
            if self.failed is not None:
                raise ConnectionError(f"the shared connection failed: {self.failed!r}")
            self.waiting.append(slot)
            self.out.append(command)
            flush = not self.flushing
            if flush:
                self.flushing = True
        if flush:  # write everyone's queued commands, until nothing is left
            try:
                while True:
                    with self.lock:
                        out = self.out
                        if not out:
                            self.flushing = False
                            break
                        self.out = []
                    self.sock.sendall(out[0] if len(out) == 1 else b"".join(out))
                    self.batches += 1
            except BaseException as exc:
                self._fail(exc, None)
                with self.lock:
                    self.flushing = False
        gate.acquire()
        return slot.result()

    def _read(self) -> None:
        sock = self.sock
        sock.settimeout(None)  # idle between phases is not a failure; close() ends the read
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                self._dispatch(data, None)
        except BaseException as exc:
            self._fail(exc, None)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.reader.join(10.0)
        self.sock.close()


class Ours(_Client):
    """The library's sync ``CacheClient`` on one shard, through the sentinel."""

    def __init__(self, masters: list[str], sentinels: list[str]) -> None:
        from sentinel_cache.core.config import PoolConfig
        from sentinel_cache.core.ops.client import CacheClient
        from sentinel_cache.core.serializers import Codec
        from sentinel_cache.core.topology.sharded_pool import shared_pool

        self.client = CacheClient(shared_pool(PoolConfig.create(masters, sentinels)), Codec())

    def __repr__(self) -> str:
        return f"Ours({self.client!r})"

    def get(self, key: str) -> Any:
        return self.client.get(key)

    def set(self, key: str, value: Any) -> bool:
        return bool(self.client.set(key, value, TIMEOUT))

    def close(self) -> None:
        self.client.close()


def build(kind: str, spec: dict[str, Any]) -> _Client:
    address = (spec["address"][0], int(spec["address"][1]))
    if kind == "per-thread":
        return PerThread(address)
    if kind == "shared, leader":
        return SharedLeader(address)
    if kind == "shared, reader":
        return SharedReader(address)
    if kind == "ours":
        return Ours(spec["masters"], spec["sentinels"])
    raise ValueError(f"unknown contender kind {kind!r}; expected one of {KINDS}")


# -- the worker: one contender, in its own process ------------------------------------------------


def phase(client: _Client, prefix: str, op: str, threads: int, seconds: float) -> dict[str, float]:
    """``threads`` threads calling ``op`` back to back for ``seconds``; every thread joined and
    its failure raised (``tests.threads.Workers``)."""
    from tests.threads import Workers

    keys = [f"{prefix}:k{i}" for i in range(KEYSPACE)]
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    end = [0.0]

    def work(index: int) -> None:
        call: Callable[..., Any] = client.get if op == "get" else client.set
        args: tuple[Any, ...] = () if op == "get" else (VALUE,)
        n = index * (KEYSPACE // threads)
        done = 0
        start.wait()
        deadline = end[0]
        while time.perf_counter() < deadline:
            call(keys[n % KEYSPACE], *args)
            n += 1
            done += 1
        counts[index] = done

    with Workers(timeout=seconds + 60.0) as workers:
        for index in range(threads):
            workers.spawn(work, index, name=f"bench-{op}-{index}")
        end[0] = time.perf_counter() + seconds
        cpu0, wall0 = time.process_time(), time.perf_counter()
        start.wait()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"ops": sum(counts), "wall": wall, "cpu": cpu}


def _worker(kind: str) -> None:
    spec = json.loads(sys.stdin.readline())
    everywhere = os.sched_getaffinity(0)
    client = build(kind, spec)
    prefix = spec["prefix"]
    keys = [f"{prefix}:k{i}" for i in range(KEYSPACE)]
    for key in keys:  # fill through the contender itself, then warm every thread count
        if client.set(key, VALUE) is not True:
            raise RuntimeError(f"{kind}: SET {key} was not acknowledged")
    if client.get(keys[0]) != VALUE:
        raise RuntimeError(f"{kind}: GET {keys[0]} did not return what was set")
    for op in OPERATIONS:
        phase(client, prefix, op, max(THREADS), 0.2)
    print(json.dumps({"ready": kind}), flush=True)
    for line in sys.stdin:  # blocking between phases: nothing else runs meanwhile
        order = json.loads(line)
        if order.get("quit"):
            break
        if "pin" in order:
            pin_threads([0], {0} if order["pin"] else everywhere)
            print(json.dumps({"pinned": order["pin"]}), flush=True)
            continue
        before = getattr(client, "batches", 0)
        result = phase(client, prefix, order["op"], order["threads"], order["seconds"])
        result["writes"] = getattr(client, "batches", 0) - before  # sendall calls (shared)
        print(json.dumps(result), flush=True)
    client.close()


# -- the parent: topology, workers, rounds, table -------------------------------------------------


class Worker:
    def __init__(self, kind: str, spec: dict[str, Any]) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.sync_shared", "--worker", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            text=True,
            cwd=str(ROOT),
        )
        self.ask({**spec, "prefix": f"bench:sync-shared:{kind.replace(', ', '-')}"})

    def __repr__(self) -> str:
        return f"Worker({self.kind!r}, pid={self.proc.pid})"

    def ask(self, order: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.kind} died (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _server_pid(host: str, port: int) -> int:
    import redis

    with redis.Redis(host=host, port=port) as plain:
        return int(plain.info("server")["process_id"])


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (every thread), from ``/proc``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    *,
    rounds: int = 3,
    seconds: float = 0.5,
    threads: Sequence[int] = THREADS,
    kinds: Sequence[str] = KINDS,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every round: both modes (order alternating), each op and thread count, every contender
    in a rotating order; returns the settings and every phase's figures."""
    from sentinel_cache.testing import LocalSentinelCluster

    results: dict[str, Any] = {
        mode: {op: {str(n): {k: [] for k in kinds} for n in threads} for op in OPERATIONS}
        for mode in MODES
    }
    data: dict[str, Any] = {
        "settings": {"rounds": rounds, "seconds": seconds, "threads": list(threads)},
        "results": results,
    }
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalSentinelCluster(shards=1, replicas=0, sentinels=1))
        name = cluster.master_names[0]
        host, port = cluster.master_address(name)
        server_pids = list(cluster.pids)
        server = _server_pid(str(host), int(port))
        everywhere = os.sched_getaffinity(0)
        stack.callback(pin_threads, server_pids, everywhere)
        spec = {
            "address": [str(host), int(port)],
            "masters": [name],
            "sentinels": [f"{h}:{p}" for h, p in cluster.sentinel_addresses],
        }
        workers = []
        for kind in kinds:
            worker = Worker(kind, spec)
            stack.callback(worker.close)
            workers.append(worker)
        for round_ in range(rounds):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                pin = mode == "pinned"
                pin_threads(server_pids, {0} if pin else everywhere)
                for worker in workers:
                    worker.ask({"pin": pin})
                for op in OPERATIONS:
                    for count in threads:
                        shift = (round_ + count) % len(workers)
                        for worker in workers[shift:] + workers[:shift]:
                            order = {"op": op, "threads": count, "seconds": seconds}
                            before = _cpu_seconds(server)
                            result = worker.ask(order)
                            result["server_cpu"] = _cpu_seconds(server) - before
                            results[mode][op][str(count)][worker.kind].append(result)
            progress(f"sync threads, shared vs per-thread: round {round_ + 1}/{rounds} done")
    return data


def medians(runs: list[dict[str, float]]) -> tuple[float, float, float]:
    """Median ops/s, client CPU µs per op and server CPU µs per op over the rounds."""
    return (
        statistics.median(r["ops"] / r["wall"] for r in runs),
        statistics.median(r["cpu"] / r["ops"] * 1e6 for r in runs),
        statistics.median(r.get("server_cpu", 0.0) / r["ops"] * 1e6 for r in runs),
    )


def round_ratio(runs: list[dict[str, float]], base: list[dict[str, float]]) -> float:
    """The median over the rounds of one round's ops/s ratio (phases of a round run minutes
    apart at most, so the machine's load moves less between them than between rounds)."""
    return statistics.median(
        (r["ops"] / r["wall"]) / (b["ops"] / b["wall"]) for r, b in zip(runs, base, strict=True)
    )


def table(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per mode, op and thread count: each contender's ops/s, client and server CPU µs
    per op, commands per write of the shared designs, and the median per-round ratio of each
    contender's ops/s to one connection per thread."""
    results = data["results"]
    by_threads = next(iter(next(iter(results.values())).values()))
    kinds = list(next(iter(by_threads.values())))  # the contenders of any thread count
    shared = [k for k in kinds if k.startswith("shared")]
    header = ["mode", "op", "threads"]
    for kind in kinds:
        header += [f"{kind} ops/s", f"{kind} CPU µs/op", f"{kind} server µs/op"]
    header += [f"{k} calls/write" for k in shared]
    header += [f"{k} / per-thread ops/s" for k in kinds if k != "per-thread"]
    rows = []
    for mode in MODES:
        for op in OPERATIONS:
            for count, cells in results[mode][op].items():
                row = [mode, op, count]
                for kind in kinds:
                    rate, cpu, server = medians(cells[kind]) if cells[kind] else (0.0, 0.0, 0.0)
                    row += [f"{rate:,.0f}", f"{cpu:.1f}", f"{server:.1f}"]
                for kind in shared:
                    per_write = [r["ops"] / r["writes"] for r in cells[kind] if r.get("writes")]
                    row.append(f"{statistics.median(per_write):.1f}" if per_write else "-")
                base = cells.get("per-thread") or []
                row += [
                    f"{round_ratio(cells[k], base):.2f}x" if base and cells[k] else "-"
                    for k in kinds
                    if k != "per-thread"
                ]
                rows.append(row)
    return header, rows


def main(argv: list[str] | None = None) -> int:
    from benchmarks.page import text_table

    parser = argparse.ArgumentParser(prog="python -m benchmarks.sync_shared")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per phase")
    parser.add_argument("--threads", type=int, action="append", help="repeatable")
    parser.add_argument("--only", action="append", choices=KINDS, help="repeatable")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(f"[sync_shared {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    data = run(
        rounds=args.rounds,
        seconds=args.seconds,
        threads=args.threads or THREADS,
        kinds=args.only or KINDS,
        progress=log,
    )
    header, rows = table(data)
    print(text_table(header, rows))
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        sys.exit(main())
