"""Failover figures: this project beside redis-py ``Sentinel.master_for``, each on a fresh
topology of the benchmark's kind (4 shards x 1 replica, 3 sentinels).

Per contender:

1. start-up with 2 of 3 sentinels black-holed (they accept and never answer; listed first):
   time from building the client to the first good write, and to a good write on every shard;
2. planned failover (``SENTINEL FAILOVER``) of one shard while a writer writes a new key every
   2 ms to it and another writer to another shard: once the old master has been demoted to a
   replica of the new one and is in sync, every acknowledged key is looked up on the new
   master; lost = acknowledged but missing. Errors on the other shard are counted too;
3. a third shard's master frozen (SIGSTOP) for ``FREEZE_S`` while a writer writes to it and
   another writer to another shard: the other shard's slowest write meanwhile (target: under
   50 ms for ours; the test suite only checks that it never waits for the frozen one);
4. SIGKILL of another shard's master: time from ``+switch-master`` (as a subscriber of our own
   on a sentinel receives it) to the first good write to that shard, and the whole outage
   (target: the first good write within 100 ms of ``+switch-master`` for ours).

``targets(results)`` gives the two targets as PASS/FAIL lines for the report.

``python -m benchmarks.failover`` runs it alone; ``benchmarks.run`` includes it in the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from benchmarks.contenders import NODE_KWARGS, SENTINEL_KWARGS
from sentinel_cache.testing import BlackHoleServer, LocalSentinelCluster
from tests.threads import Workers

WRITE_INTERVAL = 0.002
FREEZE_S = 0.8  # under the topology's down-after (1 s): the sentinels do not fail it over
OTHER_SHARD_TARGET_MS = 50.0
SWITCH_TO_WRITE_TARGET_MS = 100.0
TARGETS = (
    f"for ours, another shard's slowest write under {OTHER_SHARD_TARGET_MS:.0f} ms while a "
    f"master is frozen, and the first good write within {SWITCH_TO_WRITE_TARGET_MS:.0f} ms of "
    "+switch-master after a SIGKILL"
)
VALUE = b"x" * 64


# -- the two contenders: a write function per shard, and the keys that land on it ------------


class Subject:
    label = ""

    def writer(self, shard: int) -> Callable[[str], Any]:
        raise NotImplementedError

    def keys(self, shard: int, tag: str, count: int) -> list[str]:
        return [f"{tag}:{i}" for i in range(count)]

    def close(self) -> None:
        pass


class Ours(Subject):
    label = "sentinel_cache (core CacheClient)"

    def __init__(self, sentinels: Sequence[str], masters: Sequence[str]) -> None:
        from sentinel_cache.core.ops.client import CacheClient
        from sentinel_cache.core.serializers import Codec
        from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool

        self.pool = ShardedSentinelPool(list(masters), list(sentinels))
        self.client = CacheClient(self.pool, Codec())

    def writer(self, shard: int) -> Callable[[str], Any]:
        client = self.client

        def write(key: str) -> Any:
            if not client.set(key, VALUE, 300):
                raise RuntimeError("SET not acknowledged")

        return write

    def keys(self, shard: int, tag: str, count: int) -> list[str]:
        out: list[str] = []
        i = 0
        while len(out) < count:
            key = f"{tag}:{i}"
            if self.pool.shard_index(key) == shard:
                out.append(key)
            i += 1
        return out

    def close(self) -> None:
        self.pool.close()


class MasterFor(Subject):
    label = "redis-py Sentinel.master_for"

    def __init__(self, sentinels: Sequence[str], masters: Sequence[str]) -> None:
        addresses = [(s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])) for s in sentinels]
        self.sentinel = Sentinel(addresses, sentinel_kwargs=dict(SENTINEL_KWARGS), **NODE_KWARGS)
        self.clients = [self.sentinel.master_for(name) for name in masters]

    def writer(self, shard: int) -> Callable[[str], Any]:
        client = self.clients[shard]

        def write(key: str) -> Any:
            if not client.set(key, VALUE, ex=300):
                raise RuntimeError("SET not acknowledged")

        return write

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for s in self.sentinel.sentinels:
            s.close()


class MasterForNoSentinelRetry(MasterFor):
    """``master_for`` with redis-py's default Retry turned off on the sentinel connections."""

    label = "redis-py Sentinel.master_for, sentinel retries off"

    def __init__(self, sentinels: Sequence[str], masters: Sequence[str]) -> None:
        addresses = [(s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])) for s in sentinels]
        kwargs = {**SENTINEL_KWARGS, "retry": Retry(NoBackoff(), 0)}
        self.sentinel = Sentinel(addresses, sentinel_kwargs=kwargs, **NODE_KWARGS)
        self.clients = [self.sentinel.master_for(name) for name in masters]


SUBJECTS: dict[str, type[Subject]] = {"ours": Ours, "master_for": MasterFor}


# -- tools ---------------------------------------------------------------------------------------


@dataclass
class Write:
    key: str
    start: float
    end: float
    ok: bool
    error: str = ""


@dataclass
class Writer:
    """Writes a new key every ``WRITE_INTERVAL`` seconds until stopped; records every write."""

    write: Callable[[str], Any]
    keys: list[str]
    log: list[Write] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: Workers = field(default_factory=lambda: Workers(timeout=30))

    def start(self) -> Writer:
        self._workers.spawn(self._run, name="bench-writer")
        return self

    def _run(self) -> None:
        clock = time.monotonic
        for key in self.keys:
            if self._stop.is_set():
                return
            start = clock()
            try:
                self.write(key)
                self.log.append(Write(key, start, clock(), True))
            except Exception as exc:
                self.log.append(Write(key, start, clock(), False, type(exc).__name__))
            pause = WRITE_INTERVAL - (clock() - start)
            if pause > 0:
                time.sleep(pause)

    def stop(self) -> None:
        """Stops the writer; raises what it raised, or that it is still running."""
        self._stop.set()
        self._workers.join()

    @property
    def acked(self) -> list[str]:
        return [w.key for w in self.log if w.ok]

    @property
    def errors(self) -> int:
        return sum(1 for w in self.log if not w.ok)

    def error_kinds(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for w in self.log:
            if not w.ok:
                kinds[w.error] = kinds.get(w.error, 0) + 1
        return kinds

    def longest_gap(self) -> float:
        """The longest time without a completed good write (seconds)."""
        ends = [w.end for w in self.log if w.ok]
        return max((b - a for a, b in zip(ends, ends[1:], strict=False)), default=0.0)

    def slowest(self) -> float:
        return max((w.end - w.start for w in self.log), default=0.0)


class SwitchWatcher:
    """Subscribes to ``+switch-master`` on every sentinel and timestamps each message, so the
    first announcement (whichever sentinel made it) is the reference."""

    def __init__(self, addresses: Sequence[tuple[str, int]]) -> None:
        self.clients = [redis.Redis(host=h, port=p, socket_timeout=None) for h, p in addresses]
        self.pubsubs = []
        for client in self.clients:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe("+switch-master")
            self.pubsubs.append(pubsub)
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._workers = Workers(timeout=5)
        for pubsub in self.pubsubs:
            self._workers.spawn(self._run, pubsub, name="bench-switch-watcher")

    def _run(self, pubsub: Any) -> None:
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=0.05)
            if message is not None and message.get("type") == "message":
                data = message["data"]
                text = data.decode() if isinstance(data, bytes) else str(data)
                self.events.append((time.monotonic(), text))

    def wait(self, name: str, timeout: float) -> float:
        """When the first sentinel announced a switch of ``name``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            times = [at for at, text in list(self.events) if text.split()[0] == name]
            if times:
                return min(times)
            time.sleep(0.002)
        raise TimeoutError(f"no +switch-master for {name} within {timeout}s")

    def close(self) -> None:
        self._stop.set()
        self._workers.join()
        for pubsub in self.pubsubs:
            pubsub.close()
        for client in self.clients:
            client.close()


def _count_missing(cluster: LocalSentinelCluster, name: str, keys: list[str]) -> int:
    master = cluster.master_address(name)
    client = cluster.node_client(master)
    try:
        missing = 0
        for i in range(0, len(keys), 500):
            batch = keys[i : i + 500]
            pipe = client.pipeline(transaction=False)
            for key in batch:
                pipe.exists(key)
            missing += sum(1 for found in pipe.execute() if not found)
        return missing
    finally:
        client.close()


def _wait_demoted(
    cluster: LocalSentinelCluster, old: tuple[str, int], new: tuple[str, int]
) -> float:
    """Wait until the old master reports ROLE slave of the new master; returns when."""
    deadline = time.monotonic() + 30
    client = cluster.node_client(old, socket_timeout=1)
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, OSError):
                role = client.execute_command("ROLE")
                if role[0] in (b"slave", "slave") and int(role[2]) == new[1]:
                    return time.monotonic()
            time.sleep(0.01)
    finally:
        client.close()
    raise TimeoutError(f"{old} was not demoted to a replica of {new} within 30s")


# -- the three measurements ----------------------------------------------------------------------


def startup_blackholed(
    cluster: LocalSentinelCluster, subject_cls: type[Subject], repeats: int
) -> dict[str, Any]:
    firsts: list[float] = []
    alls: list[float] = []
    budget = time.monotonic() + 8.0  # a slow contender gets fewer repeats, at least one
    for _ in range(repeats):
        if firsts and time.monotonic() > budget:
            break
        holes = [BlackHoleServer(), BlackHoleServer()]
        try:
            sentinels = [f"{h}:{p}" for h, p in (holes[0].address, holes[1].address)]
            real = cluster.sentinel_addresses[0]
            sentinels.append(f"{real[0]}:{real[1]}")
            began = time.monotonic()
            subject = subject_cls(sentinels, cluster.master_names)
            try:
                first = None
                for shard in range(len(cluster.master_names)):
                    key = subject.keys(shard, "startup", 1)[0]
                    subject.writer(shard)(key)
                    if first is None:
                        first = time.monotonic() - began
                firsts.append(first or 0.0)
                alls.append(time.monotonic() - began)
            finally:
                subject.close()
        finally:
            for hole in holes:
                hole.close()
    return {
        "first_write_s": statistics.median(firsts),
        "all_shards_s": statistics.median(alls),
        "runs_all_shards_s": alls,
    }


def planned_failover(cluster: LocalSentinelCluster, subject: Subject) -> dict[str, Any]:
    names = cluster.master_names
    target, other = 1, 2
    name = names[target]
    main = Writer(subject.writer(target), subject.keys(target, "planned", 20000)).start()
    side = Writer(subject.writer(other), subject.keys(other, "planned-side", 20000)).start()
    try:
        time.sleep(0.3)
        old = cluster.master_address(name)
        began = time.monotonic()
        cluster.failover(name)
        new = cluster.wait_for_master_change(name, old)
        switched = time.monotonic()
        demoted = _wait_demoted(cluster, old, new)
        time.sleep(1.0)
    finally:
        main.stop()
        side.stop()
    cluster.wait_for_replication(name)
    acked = main.acked
    lost = _count_missing(cluster, name, acked)
    return {
        "writes": len(main.log),
        "acked": len(acked),
        "lost_acked": lost,
        "write_errors": main.errors,
        "write_error_kinds": main.error_kinds(),
        "longest_gap_ms": main.longest_gap() * 1000,
        "slowest_write_ms": main.slowest() * 1000,
        "other_shard_writes": len(side.log),
        "other_shard_errors": side.errors,
        "failover_to_switch_s": switched - began,
        "failover_to_demoted_s": demoted - began,
    }


def frozen_master(cluster: LocalSentinelCluster, subject: Subject) -> dict[str, Any]:
    names = cluster.master_names
    target, other = 2, 0
    address = cluster.master_address(names[target])
    main = Writer(subject.writer(target), subject.keys(target, "frozen", 20000)).start()
    side = Writer(subject.writer(other), subject.keys(other, "frozen-side", 20000)).start()
    try:
        time.sleep(0.3)
        frozen_at = time.monotonic()
        cluster.freeze_node(address)
        try:
            time.sleep(FREEZE_S)
        finally:
            cluster.thaw_node(address)
        thawed_at = time.monotonic()
        time.sleep(0.3)
    finally:
        main.stop()
        side.stop()
    during = [w for w in side.log if w.end > frozen_at and w.start < thawed_at]
    return {
        "freeze_s": FREEZE_S,
        "other_shard_writes": len(during),
        "other_shard_errors": sum(1 for w in during if not w.ok),
        "other_shard_slowest_ms": max((w.end - w.start for w in during), default=0.0) * 1000,
        "frozen_shard_errors": main.errors,
        "frozen_shard_slowest_ms": main.slowest() * 1000,
        "failed_over": cluster.master_address(names[target]) != address,
    }


def sigkill(
    cluster: LocalSentinelCluster, subject: Subject, watcher: SwitchWatcher
) -> dict[str, Any]:
    names = cluster.master_names
    target, other = 3, 0
    name = names[target]
    main = Writer(subject.writer(target), subject.keys(target, "killed", 40000)).start()
    side = Writer(subject.writer(other), subject.keys(other, "killed-side", 40000)).start()
    try:
        time.sleep(0.3)
        cluster.kill_master(name)  # returns once the process is dead and reaped
        killed_at = time.monotonic()
        switch_at = watcher.wait(name, timeout=60)
        deadline = switch_at + 15
        while time.monotonic() < deadline:
            if any(w.ok and w.end > switch_at for w in main.log[-50:]):
                break
            time.sleep(0.01)
        time.sleep(0.5)
    finally:
        main.stop()
        side.stop()
    first_good = next((w for w in main.log if w.ok and w.start > killed_at), None)
    after = None if first_good is None else first_good.end - switch_at
    outage = None if first_good is None else first_good.end - killed_at
    return {
        "switch_to_first_write_ms": None if after is None else after * 1000,
        "kill_to_first_write_s": outage,
        "kill_to_switch_s": switch_at - killed_at,
        "write_errors": main.errors,
        "write_error_kinds": main.error_kinds(),
        "other_shard_writes": len(side.log),
        "other_shard_errors": side.errors,
    }


def run_one(subject_id: str, repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    subject_cls = SUBJECTS[subject_id]
    cluster = LocalSentinelCluster(shards=4, replicas=1, sentinels=3)
    cluster.start()
    try:
        result: dict[str, Any] = {"label": subject_cls.label}
        result["startup_2_of_3_blackholed"] = startup_blackholed(cluster, subject_cls, repeats)
        if subject_cls is MasterFor:
            result["startup_2_of_3_blackholed_no_sentinel_retry"] = startup_blackholed(
                cluster, MasterForNoSentinelRetry, repeats
            )
        log(f"failover[{subject_id}]: start-up done")
        sentinels = [f"{h}:{p}" for h, p in cluster.sentinel_addresses]
        subject = subject_cls(sentinels, cluster.master_names)
        watcher = SwitchWatcher(cluster.sentinel_addresses)
        try:
            for shard in range(len(cluster.master_names)):  # connect before anything happens
                subject.writer(shard)(subject.keys(shard, "warm", 1)[0])
            result["planned"] = planned_failover(cluster, subject)
            log(f"failover[{subject_id}]: planned failover done")
            result["frozen"] = frozen_master(cluster, subject)
            log(f"failover[{subject_id}]: frozen master done")
            result["sigkill"] = sigkill(cluster, subject, watcher)
            log(f"failover[{subject_id}]: SIGKILL done")
        finally:
            watcher.close()
            subject.close()
        return result
    finally:
        cluster.stop()


def run(
    subjects: Sequence[str] = ("ours", "master_for"),
    repeats: int = 3,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for subject_id in subjects:
        try:
            out[subject_id] = run_one(subject_id, repeats, log)
        except Exception as exc:  # report it, keep the rest of the benchmark
            out[subject_id] = {"label": SUBJECTS[subject_id].label, "error": repr(exc)}
            log(f"failover[{subject_id}] failed: {exc!r}")
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Our two speed targets under faults as PASS/FAIL lines (the report's "Targets")."""
    ours = results.get("ours", {})
    frozen, kill = ours.get("frozen"), ours.get("sigkill")
    out = []
    target = (
        f"another shard's slowest write while a master is frozen {FREEZE_S:g} s "
        f"< {OTHER_SHARD_TARGET_MS:.0f} ms"
    )
    if frozen is None:
        out.append({"target": target, "result": "N/A", "detail": "not measured"})
    else:
        ok = frozen["other_shard_slowest_ms"] < OTHER_SHARD_TARGET_MS
        out.append(
            {
                "target": target,
                "result": "PASS" if ok and not frozen["other_shard_errors"] else "FAIL",
                "detail": f"{frozen['other_shard_slowest_ms']:.1f} ms over "
                f"{frozen['other_shard_writes']} writes, {frozen['other_shard_errors']} errors",
            }
        )
    target = (
        f"SIGKILL: first good write within {SWITCH_TO_WRITE_TARGET_MS:.0f} ms of +switch-master"
    )
    after = None if kill is None else kill["switch_to_first_write_ms"]
    if after is None:
        out.append({"target": target, "result": "N/A", "detail": "not measured"})
    else:
        ok = after <= SWITCH_TO_WRITE_TARGET_MS
        out.append(
            {"target": target, "result": "PASS" if ok else "FAIL", "detail": f"{after:.1f} ms"}
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SUBJECTS), action="append")
    args = parser.parse_args()
    result = run(args.only or ("ours", "master_for"), args.repeats, log=print)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
