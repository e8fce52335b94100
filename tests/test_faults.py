"""The network-fault harness (``LocalSentinelCluster(faults=True)``) against real servers.

Every chaos scenario trusts these faults to be real: a partition silences both ways and delivers
on heal, a one-way cut is one way, delay and loss cost what they say, a reset is an RST, and the
sentinels see the same partition the client does (they fail the master over through it).
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import statistics
import time
from collections.abc import Callable

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sentinel_cache.testing import LocalSentinelCluster
from sentinel_cache.testing.faults import CLIENT

MakeCluster = Callable[..., LocalSentinelCluster]
FAST = {"down_after_ms": 500, "failover_timeout_ms": 5000}
NO_RETRY = Retry(NoBackoff(), 0)  # redis-py 6 retries timeouts 3 times, with back-off, by default


def _resp(*args: str) -> bytes:
    out = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        out += b"$%d\r\n%s\r\n" % (len(data), data)
    return out


def _raw(cluster: LocalSentinelCluster, address: tuple[str, int]) -> socket.socket:
    """A plain socket through the node's proxy (no client library, no retries, no timeouts)."""
    sock = socket.create_connection(address, timeout=5)
    if cluster.requirepass:
        sock.sendall(_resp("AUTH", cluster.requirepass))
        assert sock.recv(100) == b"+OK\r\n"
    return sock


def _recv_within(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    try:
        return sock.recv(1000)
    except TimeoutError:
        return b""


def _exists(cluster: LocalSentinelCluster, address: tuple[str, int], key: str) -> bool:
    direct = cluster.node_client(address, direct=True, socket_timeout=2, retry=NO_RETRY)
    try:
        return bool(direct.exists(key))
    finally:
        direct.close()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1].startswith("Z")  # a zombie is not running
    except FileNotFoundError:
        return True


@pytest.mark.chaos
def test_partition_silences_and_heal_delivers(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3, faults=True)
    master = cluster.master_address(cluster.master_names[0])
    client = cluster.node_client(master, socket_timeout=0.3, retry=NO_RETRY)
    raw = _raw(cluster, master)
    try:
        assert client.ping()
        cluster.partition(master, peers=[CLIENT])
        with pytest.raises(redis.TimeoutError):
            client.set("during", "x")
        client.close()
        # Bytes sent into the cut are held, not lost and not refused.
        raw.sendall(_resp("SET", "held", "1"))
        assert _recv_within(raw, 0.5) == b""
        assert not _exists(cluster, master, "held")
        # A new connection is accepted and goes silent.
        fresh = cluster.node_client(
            master, socket_timeout=0.3, socket_connect_timeout=0.3, retry=NO_RETRY
        )
        with pytest.raises(redis.TimeoutError):
            fresh.ping()
        fresh.close()
        cluster.heal(master)
        assert _recv_within(raw, 2.0) == b"+OK\r\n"  # the late reply arrives after heal
        assert _exists(cluster, master, "held")
        assert client.set("after", "y") and client.get("after") == b"y"
        assert cluster.master_address(cluster.master_names[0]) == master  # no failover
    finally:
        raw.close()
        client.close()


@pytest.mark.chaos
def test_one_way_cuts(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(shards=1, replicas=0, sentinels=1, faults=True)
    name = cluster.master_names[0]
    master = cluster.master_address(name)
    raw = _raw(cluster, master)
    try:
        # inbound: the request never reaches the master.
        cluster.partition(name, peers=[CLIENT], direction="inbound")
        raw.sendall(_resp("SET", "in", "1"))
        assert _recv_within(raw, 0.4) == b""
        assert not _exists(cluster, master, "in")
        cluster.heal(name)
        assert _recv_within(raw, 2.0) == b"+OK\r\n"
        # outbound: the master executes the request but its reply is held.
        cluster.partition(name, peers=[CLIENT], direction="outbound")
        raw.sendall(_resp("SET", "out", "1"))
        deadline = time.monotonic() + 2
        while not _exists(cluster, master, "out"):
            assert time.monotonic() < deadline, "the request did not get through an outbound cut"
            time.sleep(0.01)
        assert _recv_within(raw, 0.4) == b""
        cluster.heal()
        assert _recv_within(raw, 2.0) == b"+OK\r\n"
    finally:
        raw.close()


@pytest.mark.chaos
def test_delay_and_loss_cost_what_they_say(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(shards=2, replicas=0, sentinels=1, faults=True)
    name, other = cluster.master_names
    master, other_master = cluster.master_address(name), cluster.master_address(other)
    client = cluster.node_client(master, socket_timeout=2, retry=NO_RETRY)
    untouched = cluster.node_client(other_master, socket_timeout=2, retry=NO_RETRY)

    def rtt(c: redis.Redis, n: int = 10) -> list[float]:
        times = []
        for _ in range(n):
            began = time.perf_counter()
            c.ping()
            times.append(time.perf_counter() - began)
        return times

    try:
        base = statistics.median(rtt(client))
        cluster.delay(name, 100)
        delayed = rtt(client)
        assert min(delayed) >= 0.095 and statistics.median(delayed) < 0.3, delayed
        # Other nodes are not delayed: a delayed node takes 95 ms or more on every round trip.
        # (Their speed through the proxy is make bench's, in benchmarks/ratios.py.)
        assert min(rtt(untouched)) < 0.095
        cluster.delay(name, 50, jitter_ms=40)
        jittered = rtt(client, 20)
        assert min(jittered) >= 0.009 and max(jittered) < 0.3 and len(set(jittered)) > 1
        cluster.delay(name, 0)
        cluster.loss(name, 1.0)  # every chunk "lost" once: a ~200 ms retransmission stall
        lossy = rtt(client, 3)
        assert all(0.19 <= t < 0.6 for t in lossy), lossy
        cluster.clear_faults()
        assert statistics.median(rtt(client)) < max(base * 10, 0.02)
    finally:
        client.close()
        untouched.close()


@pytest.mark.chaos
def test_reset_gives_connection_error(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(shards=1, replicas=0, sentinels=1, faults=True)
    name = cluster.master_names[0]
    master = cluster.master_address(name)
    client = cluster.node_client(master, socket_timeout=5, retry=NO_RETRY)
    raw = _raw(cluster, master)
    try:
        assert client.ping()
        with concurrent.futures.ThreadPoolExecutor(1) as executor:
            blocked = executor.submit(client.blpop, ["nothing-here"], 3)  # a call in flight
            time.sleep(0.2)
            began = time.monotonic()
            assert cluster.reset(name) >= 3  # ours and the sentinel's links at least
            with pytest.raises(redis.ConnectionError, match="reset"):
                blocked.result(timeout=5)
            assert time.monotonic() - began < 1
        with pytest.raises(ConnectionResetError):  # an RST, not a FIN (which reads as b"")
            raw.recv(100)
        assert client.ping()  # a new connection works at once
    finally:
        raw.close()
        client.close()


@pytest.mark.chaos
def test_partitioned_master_is_failed_over_through_the_proxies(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(shards=1, replicas=1, sentinels=3, faults=True, **FAST)
    name = cluster.master_names[0]
    old = cluster.master_address(name)
    replica = cluster.replica_addresses(name)[0]
    assert cluster.partition(name) == f"{old[0]}:{old[1]}"
    new = cluster.wait_for_master_change(name, old, timeout=20)
    assert new == replica
    # The old master never heard of it: it still believes it is a master (a real partition).
    direct = cluster.node_client(old, direct=True, socket_timeout=2, retry=NO_RETRY)
    try:
        assert direct.execute_command("ROLE")[0] == b"master"
    finally:
        direct.close()
    cluster.heal(name)  # named as partitioned, although the name now means the new master
    cluster.wait_for_replication(name, timeout=40)  # the sentinels demote it once it is back
    assert cluster.replica_addresses(name) == [old]


@pytest.mark.chaos
def test_sentinel_and_client_peers(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(shards=1, replicas=0, sentinels=2, faults=True)
    sentinel = cluster.sentinel_client(1, socket_timeout=0.3, retry=NO_RETRY)
    try:
        assert sentinel.ping()
        cluster.partition("sentinel:1", peers=[CLIENT])
        with pytest.raises(redis.TimeoutError):
            sentinel.ping()
        # The harness's own links go past the proxies: it still sees everything.
        assert cluster.master_address(cluster.master_names[0])
        cluster.heal("sentinel:1")
        assert sentinel.ping()
        stats = cluster.fault_stats()
        ids = {f"127.0.0.1:{p}" for _, p in cluster.sentinel_addresses}
        assert ids <= set(stats["per_source"])  # sentinels are told apart by source address
    finally:
        sentinel.close()


@pytest.mark.chaos
def test_proxy_carries_back_to_back_round_trips_in_order(make_cluster: MakeCluster) -> None:
    """Every reply through the proxy answers its own request (its rate, more than 1,000 round
    trips/s on one connection, is make bench's, in benchmarks/ratios.py)."""
    cluster = make_cluster(shards=1, replicas=0, sentinels=1, faults=True)
    client = cluster.node_client(cluster.master_address(cluster.master_names[0]))
    try:
        pipe = client.pipeline(transaction=False)
        for n in range(1000):
            pipe.set(f"k{n}", n)
        assert pipe.execute() == [True] * 1000  # one burst of 1,000 commands, as many replies
        assert [client.get(f"k{n}") for n in range(1000)] == [str(n).encode() for n in range(1000)]
    finally:
        client.close()


def test_freeze_and_thaw_node(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(shards=1, replicas=0, sentinels=1, down_after_ms=5000)
    master = cluster.master_address(cluster.master_names[0])
    client = cluster.node_client(master, socket_timeout=0.3, retry=NO_RETRY)
    try:
        cluster.freeze_node(master)
        with pytest.raises(redis.TimeoutError):
            client.ping()
        cluster.thaw_node(master)
        assert client.ping()
    finally:
        cluster.thaw_node(master)
        client.close()


def test_faults_start_and_stop_cleanly(server_kind: str) -> None:
    plain = LocalSentinelCluster(shards=1, replicas=0, sentinels=1)
    with plain:
        with pytest.raises(RuntimeError, match="faults=True"):
            plain.partition(plain.master_names[0])
        assert plain.config()["sentinels"][0].startswith("127.0.0.1:")
    cluster = LocalSentinelCluster(shards=2, replicas=1, sentinels=3, faults=True)
    with cluster:
        proxy = cluster.fault_proxy
        assert proxy is not None and proxy.pid is not None
        pids = [*cluster.pids, proxy.pid]
        assert all(h == "127.0.0.1" for h, _ in cluster.sentinel_addresses)
        assert cluster.url().startswith("sentinel://127.0.0.1:")
        master = cluster.master_address(cluster.master_names[0])
        assert master[0] == "127.0.0.1"  # sentinels report the proxied address
        cluster.partition(cluster.master_names[0])
        assert "1 partitions" in repr(cluster)
        tmpdir = cluster.tmpdir
    assert not cluster.running
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, [p for p in pids if not _gone(p)]
        time.sleep(0.05)
    assert tmpdir is not None and not os.path.exists(tmpdir)
