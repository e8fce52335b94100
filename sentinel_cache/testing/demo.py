"""``python -m sentinel_cache.testing demo``: the library at work, from the installed package alone.

It starts a local topology (2 shards with a replica each, 3 sentinels; the embedded Valkey when no
``redis-server``/``valkey-server`` is on ``PATH``), builds a cache from the settings ``up``
prints (through the adapters' one parser), writes and reads, then runs a planned failover of one
shard under a loop of writes and reads, and stops everything. Every write the cache acknowledged
is read back at the end: the exit code is 0 only with no failed call and no lost write. No file of
the source checkout is needed (``make demo`` is the source checkout's longer tour).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sentinel_cache.core.config import parse_cache_config
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing.cluster import LocalSentinelCluster
from sentinel_cache.testing.pasted import django_options

KEYS = 1000
#: Calls the loop makes before the failover starts, and after the cache followed it.
WARM_UP = 200
AFTER = 400
#: Bounds for every wait (the failover, the cache following it, the loop): never hang.
DEADLINE = 60.0


@dataclass
class Loop:
    """A write-then-read loop on its own thread: what it acknowledged, and what failed."""

    cache: CacheClient
    calls: int = 0
    acknowledged: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    progress: threading.Condition = field(default_factory=threading.Condition)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            key = f"demo:loop:{n}"
            try:
                if not self.cache.set(key, n, 300):
                    raise AssertionError(f"set {key!r} returned False")
                self.acknowledged[key] = n
                got = self.cache.get(key)
                if got != n:
                    raise AssertionError(f"get {key!r} returned {got!r}, not {n}")
            except Exception as exc:  # counted and shown: the demo's verdict
                self.failures.append(f"{key}: {type(exc).__name__}: {exc}")
            n += 1
            with self.progress:
                self.calls += 2
                self.progress.notify_all()

    def wait_calls(self, count: int) -> None:
        """Until the loop has made ``count`` calls in all (AssertionError past the deadline)."""
        with self.progress:
            if not self.progress.wait_for(lambda: self.calls >= count, DEADLINE):
                raise AssertionError(f"the loop made {self.calls} calls, not {count}")


def _wait(predicate: Callable[[], bool], what: str) -> float:
    """Seconds until ``predicate()`` holds; AssertionError naming ``what`` past the deadline."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > DEADLINE:
            raise AssertionError(f"timed out after {DEADLINE:.0f}s waiting for {what}")
        time.sleep(0.01)
    return time.monotonic() - started


def _address(address: Any) -> str:
    return f"{address[0]}:{address[1]}"


def run(server: str | None, say: Callable[[str], None] = print) -> int:
    """The demo; returns the exit code (0: no failed call, no lost write)."""
    cluster = LocalSentinelCluster(shards=2, replicas=1, sentinels=3, server=server)
    say("starting 2 shards (a replica each) and 3 sentinels on 127.0.0.1 ...")
    with cluster:
        say(
            f"  started {cluster.server_kind} {cluster.server_version} in "
            f"{cluster.startup_seconds:.2f}s ({cluster.server_binary})"
        )
        location, options = django_options(cluster)
        say("the cache, from the settings `up` prints (a Django CACHES entry):")
        say(f'  "LOCATION": {json.dumps(location)},')
        say(f'  "OPTIONS": {json.dumps(options)},')
        config, _ = parse_cache_config(location, options)
        pool = ShardedSentinelPool.from_config(config)
        try:
            return _tour(cluster, pool, say)
        finally:
            pool.close()
            say("stopped every server and sentinel")


def _tour(
    cluster: LocalSentinelCluster, pool: ShardedSentinelPool, say: Callable[[str], None]
) -> int:
    cache = CacheClient(pool, Codec())
    data = {f"demo:user:{i}": {"id": i, "name": f"user {i}"} for i in range(KEYS)}
    cache.set_many(data, 300)  # one batch per shard, both at once
    found = cache.get_many(list(data))
    assert found == data, f"get_many returned {len(found)} of {len(data)} values"
    counts = {s.name: int(s.client.dbsize()) for s in pool.shards}
    spread = ", ".join(f"{name} {count}" for name, count in counts.items())
    say(f"set_many and get_many of {KEYS} keys: every value read back; keys per shard: {spread}")

    name = cluster.master_names[0]
    cluster.wait_for_replication(name)
    old = cluster.master_address(name)
    loop = Loop(cache)
    worker = threading.Thread(target=loop.run, name="demo-loop", daemon=True)
    worker.start()
    try:
        loop.wait_calls(WARM_UP)
        say(f"planned failover of {name} (master {_address(old)}) under a write/read loop ...")
        started = time.monotonic()
        cluster.failover(name)
        new = cluster.wait_for_master_change(name, old, timeout=DEADLINE)
        _wait(lambda: pool.shard(name).address == tuple(new), f"the cache to follow {name}")
        followed = time.monotonic() - started
        loop.wait_calls(loop.calls + AFTER)
    finally:
        loop.stop.set()
        worker.join(DEADLINE)
    assert not worker.is_alive(), "the write/read loop did not stop"
    shard = pool.shard(name)
    say(
        f"  {name}: {_address(old)} -> {_address(new)}; the cache followed after "
        f"{followed:.2f}s (via {shard.last_switch_source})"
    )
    lost = [k for k, v in loop.acknowledged.items() if cache.get(k) != v]
    say(
        f"  {loop.calls} calls ({len(loop.acknowledged)} writes acknowledged), "
        f"{len(loop.failures)} failed, {len(lost)} acknowledged writes lost"
    )
    for failure in loop.failures[:5]:
        say(f"  failed: {failure}")
    if lost:
        say(f"  lost: {', '.join(lost[:5])}")
    return 0 if not loop.failures and not lost else 1


def add_parser(commands: Any) -> None:
    """The ``demo`` subcommand of ``python -m sentinel_cache.testing``."""
    demo = commands.add_parser(
        "demo",
        help="start a topology, write and read, fail a shard over under load, stop everything",
        description=__doc__.splitlines()[0].partition(": ")[2],
    )
    demo.add_argument(
        "--server",
        default=None,
        help="redis, valkey, embedded, auto or a binary path (default: $SENTINEL_CACHE_SERVER "
        "or auto)",
    )


def main(args: argparse.Namespace) -> int:
    return run(args.server)
