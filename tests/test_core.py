"""The foundation against real servers: discovery, routing, pools, registry, clean shutdown."""

from __future__ import annotations

import gc
import subprocess
import sys
import time
import warnings

import pytest
import redis

from sentinel_cache import (
    ConfigurationError,
    MasterNotFoundError,
    NoSentinelReachableError,
    PoolExhaustedError,
    SentinelCacheError,
)
from sentinel_cache.core.config import Address, PoolConfig
from sentinel_cache.core.ops.client import execute
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool, shared_pool
from sentinel_cache.testing import BlackHoleServer, LocalSentinelCluster


def test_core_imports_no_framework() -> None:
    code = (
        "import sys, sentinel_cache, sentinel_cache.core.topology.sharded_pool, sentinel_cache.core.ops.client, "
        "sentinel_cache.core.topology.listener, sentinel_cache.testing, sentinel_cache.core.serializers\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'flask', 'flask_caching')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_constructor_connects_to_nothing() -> None:
    # No server listens on port 1: a constructor that connected would fail here.
    pool = ShardedSentinelPool(["a", "b"], "127.0.0.1:1")
    assert not pool.status()["started"]
    pool.close()


def test_discovery_finds_every_master(cluster: LocalSentinelCluster) -> None:
    with ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses) as pool:
        found = pool.discover()
        assert found == {name: cluster.master_address(name) for name in cluster.master_names}
        status = pool.status()
        assert [s["name"] for s in status["shards"]] == cluster.master_names
        assert all(s["address"] for s in status["shards"])


def test_keys_land_on_the_master_the_ring_names(cluster: LocalSentinelCluster) -> None:
    with ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses) as pool:
        keys = [f"routing:{i}" for i in range(200)]
        for key in keys:
            pool.client_for(key).set(key, key)
        per_shard = {name: 0 for name in cluster.master_names}
        for key in keys:
            name = cluster.master_names[pool.shard_index(key)]
            plain = cluster.node_client(cluster.master_address(name))
            try:
                assert plain.get(key) == key.encode()
                other = cluster.master_names[1 - pool.shard_index(key)]
                other_client = cluster.node_client(cluster.master_address(other))
                assert other_client.get(key) is None
                other_client.close()
            finally:
                plain.close()
            per_shard[name] += 1
        assert all(count > 50 for count in per_shard.values()), per_shard
        pool.client_for("routing:0").delete(*[k for k in keys if pool.shard_index(k) == 0])


def test_group_by_shard_keeps_order(cluster: LocalSentinelCluster) -> None:
    with ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses) as pool:
        keys = [f"g{i}" for i in range(50)]
        groups = pool.group_by_shard(keys)
        assert sorted(k for g in groups.values() for k in g) == sorted(keys)
        for shard, group in groups.items():
            assert group == [k for k in keys if pool.shard_index(k) == shard.index]


def test_dead_and_blackholed_sentinels_cost_one_timeout(cluster: LocalSentinelCluster) -> None:
    with BlackHoleServer() as hole_a, BlackHoleServer() as hole_b:
        sentinels = [hole_a.address, hole_b.address, cluster.sentinel_addresses[0]]
        pool = ShardedSentinelPool(
            cluster.master_names,
            sentinels,
            sentinel_kwargs={"socket_timeout": 0.3, "socket_connect_timeout": 0.3},
            listeners=False,
        )
        started = time.monotonic()
        found = pool.discover()
        elapsed = time.monotonic() - started
        pool.close()
    assert set(found) == set(cluster.master_names)
    # Asked in parallel, one round waits about one socket_timeout + connect timeout (0.6 s) for
    # all shards; asked in turn, the two black holes alone would take at least 1.2 s.
    assert elapsed < 1.2, f"discovery took {elapsed:.2f}s with 2 of 3 sentinels black-holed"
    print(f"\ndiscovery with 2 of 3 sentinels black-holed: {elapsed * 1000:.0f} ms")


def test_answering_sentinel_goes_first_and_peers_are_learned(cluster: LocalSentinelCluster) -> None:
    refused = Address("127.0.0.1", 1)
    pool = ShardedSentinelPool(
        cluster.master_names, [refused, cluster.sentinel_addresses[0]], listeners=False
    )
    pool.discover()
    addresses = pool.sentinels.addresses
    assert addresses[0] == cluster.sentinel_addresses[0]
    assert set(cluster.sentinel_addresses) <= set(addresses)  # learned the other sentinels
    pool.close()


def test_no_sentinel_reachable_names_each_failure() -> None:
    with BlackHoleServer() as hole:
        pool = ShardedSentinelPool(
            ["alpha"],
            [Address("127.0.0.1", 1), hole.address],
            sentinel_kwargs={"socket_timeout": 0.2, "socket_connect_timeout": 0.2},
            discovery_timeout=0.5,
            listeners=False,
        )
        started = time.monotonic()
        with pytest.raises(NoSentinelReachableError) as info:
            pool.discover()
        assert time.monotonic() - started < 3.0
        pool.close()
    message = str(info.value)
    assert (
        "'alpha'" in message
        and "127.0.0.1:1" in message
        and f"127.0.0.1:{hole.address[1]}" in message
    )
    assert isinstance(info.value, redis.ConnectionError)
    assert isinstance(info.value, SentinelCacheError)


def test_unknown_master_name_is_a_different_error(cluster: LocalSentinelCluster) -> None:
    pool = ShardedSentinelPool(
        [cluster.master_names[0], "nobody"],
        cluster.sentinel_addresses,
        discovery_timeout=0.3,
        listeners=False,
    )
    with pytest.raises(MasterNotFoundError, match="'nobody'.*no sentinel monitors"):
        pool.discover()
    # The known shard still works.
    key = next(k for k in (f"k{i}" for i in range(100)) if pool.shard_index(k) == 0)
    pool.client_for(key).set(key, 1)
    assert pool.client_for(key).get(key) == b"1"
    pool.close()


def test_an_answer_naming_a_replica_is_rejected(cluster: LocalSentinelCluster) -> None:
    from sentinel_cache.core.topology.discovery import Discovery, SentinelReply, SentinelSet

    name = cluster.master_names[0]
    replica = Address(*cluster.replica_addresses(name)[0])
    discovery = Discovery(SentinelSet([], {}), {}, timeout=0)
    lying = SentinelReply(Address("127.0.0.1", 1), masters={name: replica})
    outcome = discovery.pick(name, [lying])
    assert isinstance(outcome, MasterNotFoundError)
    assert "ROLE is 'slave'" in str(outcome) and str(replica) in str(outcome)
    truthful = SentinelReply(
        Address("127.0.0.1", 2), masters={name: Address(*cluster.master_address(name))}
    )
    resolved = discovery.pick(name, [lying, truthful])
    assert not isinstance(resolved, BaseException)
    assert resolved.address == cluster.master_address(name)


def test_registry_shares_equal_configs() -> None:
    one = PoolConfig.create(["a"], ["127.0.0.1:1"])
    two = PoolConfig.create(("a",), "127.0.0.1:1")
    other = PoolConfig.create(["a"], ["127.0.0.1:1"], db=1)
    assert shared_pool(one) is shared_pool(two)
    assert shared_pool(one) is not shared_pool(other)
    shared_pool(one).close()
    shared_pool(other).close()
    assert shared_pool(one) is not None and not shared_pool(one).closed
    shared_pool(one).close()


def test_pool_exhaustion_is_a_clear_error(cluster: LocalSentinelCluster) -> None:
    with ShardedSentinelPool(
        cluster.master_names,
        cluster.sentinel_addresses,
        max_connections=1,
        pool_timeout=0.2,
        listeners=False,
    ) as pool:
        shard = pool.shards[0]
        pool.ready(shard, True)
        held = shard.pool.get_connection()
        started = time.monotonic()
        with pytest.raises(PoolExhaustedError, match=r"shard 0 \(shard0\).*max_connections=1"):
            execute(pool, shard, lambda c: c.ping())
        assert 0.15 < time.monotonic() - started < 1.0
        shard.pool.release(held)
        assert execute(pool, shard, lambda c: c.ping())


def test_reads_from_replicas_round_robin(cluster: LocalSentinelCluster) -> None:
    with ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, read_from_replicas=True
    ) as pool:
        pool.discover()
        shard = pool.shards[0]
        assert shard.replicas == tuple(cluster.replica_addresses(shard.name))
        key = next(k for k in (f"r{i}" for i in range(100)) if pool.shard_index(k) == 0)
        pool.client_for(key).set(key, "v")
        cluster.wait_for_replication(shard.name)
        reader = pool.client_for(key, write=False)
        assert reader is not shard.client
        assert reader.execute_command("ROLE")[0] in (b"slave", "slave")
        assert reader.get(key) == b"v"


def test_close_leaves_no_threads_or_sockets(cluster: LocalSentinelCluster) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses)
        pool.discover()
        pool.client_for("x").set("x", 1)
        deadline = time.monotonic() + 5
        while not all(s["listener_connected"] for s in pool.status()["sentinels"]):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # This pool's own threads (other tests' pools may run listeners of their own).
        listeners = pool.listeners.listeners()
        assert listeners and all(listener.alive for listener in listeners)
        pool.close()
        pool.close()  # idempotent
        gc.collect()
    assert not any(listener.alive for listener in listeners)
    assert pool.sentinels.active_threads() == 0  # no discovery thread left either
    for shard in pool.shards:
        assert all(c._sock is None for c in shard.pool._get_free_connections())
    with pytest.raises(SentinelCacheError, match="closed"):
        pool.client_for("x")


def test_config_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="masters"):
        ShardedSentinelPool([], ["h:1"])
    with pytest.raises(ConfigurationError, match="sentinels"):
        ShardedSentinelPool(["a"], "nohostport")


def test_a_name_no_sentinel_monitors_fails_without_waiting(cluster: LocalSentinelCluster) -> None:
    pool = ShardedSentinelPool(
        ["nobody"], cluster.sentinel_addresses, discovery_timeout=5.0, listeners=False
    )
    started = time.monotonic()
    with pytest.raises(MasterNotFoundError, match="no sentinel monitors"):
        pool.discover()
    # Every sentinel answered "unknown": no point retrying until the 5 s deadline.
    assert time.monotonic() - started < 1.5
    pool.close()


def test_top_level_names_are_imported_lazily() -> None:
    """``sentinel_cache.ShardedSentinelPool`` and ``.HashRing`` work, and a bare import of the
    package loads neither (it connects nothing and stays light)."""
    code = (
        "import sys, sentinel_cache\n"
        "assert 'sentinel_cache.core.topology.sharded_pool' not in sys.modules, 'sharded_pool imported eagerly'\n"
        "from sentinel_cache import HashRing, ShardedSentinelPool\n"
        "from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool as Pool\n"
        "from sentinel_cache.core.ring import HashRing as Ring\n"
        "assert ShardedSentinelPool is Pool and HashRing is Ring\n"
        "try:\n"
        "    sentinel_cache.Nope\n"
        "except AttributeError as exc:\n"
        "    assert 'Nope' in str(exc)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_set_many_with_a_timeout_uses_msetex_where_the_master_has_it(
    cluster: LocalSentinelCluster,
) -> None:
    """Valkey 9.1+ and Redis 8.4+ have MSETEX (one native command per shard); older servers
    get the script. Either way every key is stored with its TTL; each master is asked once."""
    from sentinel_cache.core.ops.client import CacheClient
    from sentinel_cache.core.serializers import Codec

    with ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, db=3) as pool:
        client = CacheClient(pool, Codec())
        mapping = {f"msetex:{i}": {"n": i} for i in range(40)}
        assert client.set_many(mapping, 30) == []
        assert client.get_many(mapping) == mapping
        assert all(29 < (client.ttl(key) or 0) <= 30 for key in mapping)
        for shard in pool.shards:
            assert shard.address is not None
            node = cluster.node_client(shard.address)
            try:
                node.execute_command("MSETEX", 1, "msetex:probe", "v", "PX", 1000)
                has = True
            except redis.ResponseError:
                has = False
            node.close()
            assert shard.allows("MSETEX") is has
            shard.learned("MSETEX", shard.generation - 1, not has)  # what an older master said
            assert shard.allows("MSETEX") is None  # ... is asked again
