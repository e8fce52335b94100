"""Hostile and broken input: odd keys, unreadable values, lying sentinels, forged events, fuzzing.

Trust model (what these tests pin down, and what they cannot):

* **Sentinels are trusted for topology.** Their answers pick the master; a *broken* sentinel
  (garbled replies, impossible addresses) must only cost that sentinel's vote, never crash or
  stall discovery. A *malicious* sentinel (or anyone on the path to one without TLS) can still
  name a server of its choosing: ``ROLE`` proves that a node *says* it is a master, not that it is
  the right one. Use ``requirepass``/ACLs and TLS (``SENTINEL_SSL``) on the sentinels.
* **Clients of a sentinel cannot forge events**: a sentinel refuses ``PUBLISH`` on anything but
  its hello channel, so ``+switch-master`` only comes from the sentinels themselves. Every event
  is a hint that is confirmed with ``ROLE`` before a shard moves, so an event naming a replica,
  a dead or unreachable address or a non-Redis port is ignored.
* **Data nodes are trusted with values only as far as the codec says**: unreadable values are
  misses; with pickle and no ``SIGNING_KEY`` anyone who can write to a data node can run code in
  the application (a documented property of pickle), with a signing key (or json/msgpack) they
  cannot.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from waiting import wait_until

from sentinel_cache import DiscoveryError
from sentinel_cache.core.config import (
    Address,
)
from sentinel_cache.core.ops.client import CacheClient, execute
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.listener import (
    SentinelListener,
)
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import ArgumentValueError
from sentinel_cache.testing import BlackHoleServer, LocalSentinelCluster
from sentinel_cache.testing.fake_sentinel import FakeSentinel, Raw, Script

SHORT = {"socket_timeout": 0.3, "socket_connect_timeout": 0.3}

#: The longest one reconnect round of a listener on a sentinel answering garbage takes, from the
#: configured timeouts (listener.py): the connect (``SHORT``), the wait for the rest of a
#: truncated reply (the listener's bound on its confirmations, its ping interval + 1 s: 2 s)
#: and the back-off before the next round (2 s at most, jittered up to x1.5).
LISTENER_ROUND = SHORT["socket_connect_timeout"] + 2.0 + 2.0 * 1.5
#: Rounds' worth a wait allows for one round: a loaded machine runs them late, never more often
#: (the waits end on counts, so an idle machine waits for the rounds alone).
SLACK = 5


# ----------------------------------------------------------------------------- a fake sentinel


def subscribes(fake: FakeSentinel) -> int:
    """The SUBSCRIBE commands the fake has received so far."""
    return sum(1 for args in list(fake.commands) if args[:1] and args[0].upper() == b"SUBSCRIBE")


@pytest.fixture
def fake_sentinel() -> Iterator[Callable[[Script], FakeSentinel]]:
    made: list[FakeSentinel] = []

    def factory(script: Script) -> FakeSentinel:
        fake = FakeSentinel(script)
        made.append(fake)
        return fake

    yield factory
    for fake in made:
        fake.close()


def sentinel_script(master_reply: Any, peers: Any = (), replicas: Any = ()) -> Script:
    return {
        ("SENTINEL", "GET-MASTER-ADDR-BY-NAME"): master_reply,
        ("SENTINEL", "SENTINELS"): list(peers),
        ("SENTINEL", "REPLICAS"): list(replicas),
    }


# Malformed answers to SENTINEL GET-MASTER-ADDR-BY-NAME: a sentinel sending them must lose its
# vote and nothing else. Each entry: (id, reply, needs the discovery patch).
GARBAGE_MASTER_REPLIES: list[tuple[str, Any, str]] = [
    ("integer", 5, ""),
    ("simple-string", "hello", ""),
    ("one-element", ["127.0.0.1"], ""),
    ("three-elements", ["127.0.0.1", "6379", "extra"], ""),
    ("nested", [["127.0.0.1"], ["6379"]], ""),
    ("map", {"ip": "127.0.0.1", "port": "6379"}, ""),
    ("non-numeric-port", ["127.0.0.1", "abc"], ""),
    ("float-port", ["127.0.0.1", "63.79"], ""),
    ("non-utf8-host", [b"\xff\xfe\xfd", "6379"], ""),
    ("error-reply", Raw(b"-ERR something broke\r\n"), ""),
    ("bad-type-byte", Raw(b"!\r\n"), ""),
    ("negative-bulk-length", Raw(b"$-7\r\n"), ""),
    ("huge-bulk-length", Raw(b"$99999999999\r\n"), ""),  # then silence: a timeout
    ("huge-array-length", Raw(b"*99999999999\r\n"), ""),
    ("truncated-bulk", Raw(b"*2\r\n$9\r\n127.0"), ""),
    ("port-zero", ["127.0.0.1", "0"], "vote"),
    ("port-too-big", ["127.0.0.1", "70000"], "vote"),
    ("port-negative", ["127.0.0.1", "-1"], "vote"),
    ("port-30-digits", ["127.0.0.1", "9" * 30], "crash"),  # OverflowError in the ROLE check
    ("empty-host", ["", "6379"], "vote"),
    ("host-with-nul", ["127.0.0.1\x00evil", "6379"], "vote"),
    ("host-300-chars", ["a" * 300, "6379"], "crash"),  # UnicodeError (IDNA) in the ROLE check
    ("host-with-space", ["127.0.0.1 6379", "6379"], "vote"),
]


def garbage_params() -> list[Any]:
    return [pytest.param(reply, id=name) for name, reply, _ in GARBAGE_MASTER_REPLIES]


@pytest.mark.parametrize("reply", garbage_params())
def test_garbage_from_one_sentinel_costs_only_its_vote(
    cluster: LocalSentinelCluster, fake_sentinel: Callable[[Script], FakeSentinel], reply: Any
) -> None:
    # Two sentinels: a majority needs both, so the garbage is always read and weighed.
    fake = fake_sentinel(sentinel_script(reply))
    good = Address(*cluster.sentinel_addresses[0])
    pool = ShardedSentinelPool(
        cluster.master_names, [fake.address, good], sentinel_kwargs=SHORT, listeners=False
    )
    try:
        replies = {r.sentinel: r for r in pool.sentinels.ask_all(cluster.master_names)}
        assert replies[good].error is None
        assert replies[fake.address].error is not None, replies[fake.address]
        started = time.monotonic()
        found = pool.discover()
        elapsed = time.monotonic() - started
    finally:
        pool.close()
    assert found == {name: cluster.master_address(name) for name in cluster.master_names}
    assert elapsed < 2.0


@pytest.mark.parametrize("reply", garbage_params())
def test_only_garbage_sentinels_fail_cleanly(
    fake_sentinel: Callable[[Script], FakeSentinel], reply: Any
) -> None:
    fakes = [fake_sentinel(sentinel_script(reply)) for _ in range(2)]
    pool = ShardedSentinelPool(
        ["alpha"],
        [f.address for f in fakes],
        sentinel_kwargs=SHORT,
        discovery_timeout=0.5,
        listeners=False,
        **SHORT,
    )
    started = time.monotonic()
    try:
        with pytest.raises(DiscoveryError) as info:
            pool.discover()
    finally:
        pool.close()
    assert time.monotonic() - started < 3.0
    message = str(info.value)
    assert "'alpha'" in message
    assert all(str(f.address) in message for f in fakes) or "named" in message


def test_garbage_peer_lists_are_not_learned(
    cluster: LocalSentinelCluster, fake_sentinel: Callable[[Script], FakeSentinel]
) -> None:
    master = cluster.master_address(cluster.master_names[0])
    peers = [
        5,
        ["odd"],
        ["ip", "127.0.0.1", "port", "notaport", "flags", "sentinel"],
        {"ip": "127.0.0.1"},
        ["ip", b"\xff", "port", "1", "flags", "sentinel"],
    ]
    fake = fake_sentinel(sentinel_script(list(map(str, master)), peers=peers))
    real = set(map(Address._make, cluster.sentinel_addresses))
    pool = ShardedSentinelPool(
        cluster.master_names,
        [fake.address, cluster.sentinel_addresses[0]],  # a majority needs the fake's answer
        sentinel_kwargs=SHORT,
        listeners=False,
    )
    try:
        assert pool.discover()[cluster.master_names[0]] == master
        assert set(pool.sentinels.addresses) == real | {fake.address}  # the real peers only
    finally:
        pool.close()


def test_a_flood_of_learned_sentinels_is_capped(
    cluster: LocalSentinelCluster, fake_sentinel: Callable[[Script], FakeSentinel]
) -> None:
    """One broken sentinel listing 500 peers must not make every round ask 500 sentinels (one
    thread each) and start 500 listener threads."""
    master = cluster.master_address(cluster.master_names[0])
    peers = [
        ["name", f"p{i}", "ip", "127.0.0.1", "port", str(40000 + i), "flags", "sentinel"]
        for i in range(500)
    ]
    fake = fake_sentinel(sentinel_script(list(map(str, master)), peers=peers))
    pool = ShardedSentinelPool(
        cluster.master_names,
        [fake.address, cluster.sentinel_addresses[0]],  # a majority needs the fake's answer
        sentinel_kwargs=SHORT,
        listeners=False,
    )
    try:
        pool.discover()
        assert len(pool.sentinels.addresses) <= 20, len(pool.sentinels.addresses)
    finally:
        pool.close()


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Raw(b"*3\r\n$9\r\nsubscribe\r\n:1\r\n"), id="truncated-confirmation"),
        pytest.param(Raw(b"*2\r\n:1\r\n:2\r\n"), id="wrong-shape"),
        pytest.param(Raw(b"-ERR no pub/sub here\r\n"), id="error"),
        pytest.param(7, id="integer"),
    ],
)
def test_listener_on_a_garbage_sentinel_keeps_retrying_quietly(
    cluster: LocalSentinelCluster,
    fake_sentinel: Callable[[Script], FakeSentinel],
    caplog: pytest.LogCaptureFixture,
    reply: Any,
) -> None:
    master = cluster.master_address(cluster.master_names[0])
    fake = fake_sentinel({**sentinel_script(list(map(str, master))), ("SUBSCRIBE",): reply})
    before = {t.name for t in threading.enumerate()}
    sentinels = [fake.address, *map(Address._make, cluster.sentinel_addresses)]
    pool = ShardedSentinelPool(cluster.master_names, sentinels, sentinel_kwargs=SHORT)
    try:
        with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
            pool.discover()
            fake_listener = next(
                li for li in pool.listeners.listeners() if li.address == fake.address
            )
            wait_until(
                lambda: (
                    fake_listener.connects >= 1
                    or bool(
                        fake_listener.last_error
                        and all(
                            pool.listeners.status()[f"{h}:{p}"]
                            for h, p in cluster.sentinel_addresses
                        )
                    )
                ),
                LISTENER_ROUND * SLACK,
                "the fake's first failed round and the real listeners subscribed",
            )
            # Two more reconnect rounds (each a SUBSCRIBE the fake answered with garbage).
            tried = subscribes(fake) + 2
            wait_until(
                lambda: subscribes(fake) >= tried,
                2 * LISTENER_ROUND * SLACK,
                "two more reconnect rounds",
            )
            assert fake_listener.alive and fake_listener.connects == 0
            assert pool.listeners.status()[str(fake.address)] is False
            pool.client_for("still-works").set("still-works", 1)
            pool.client_for("still-works").delete("still-works")
    finally:
        pool.close()
    about_fake = [r for r in caplog.records if str(fake.address) in r.getMessage()]
    assert len(about_fake) <= 2, [r.getMessage() for r in about_fake]  # no warning per retry
    leftover = {t.name for t in threading.enumerate()} - before
    assert not {n for n in leftover if n.startswith("sentinel_cache")}


# ----------------------------------------------------------------------------- forged events


def test_clients_cannot_publish_sentinel_events(cluster: LocalSentinelCluster) -> None:
    with cluster.sentinel_client(0) as sentinel, pytest.raises(redis.ResponseError, match="HELLO"):
        sentinel.publish("+switch-master", "shard0 127.0.0.1 1 127.0.0.1 2")


SwitchTarget = Callable[[LocalSentinelCluster, Any], Address]


def _replica(cluster: LocalSentinelCluster, _: Any) -> Address:
    return Address(*cluster.replica_addresses(cluster.master_names[0])[0])


def _closed_port(cluster: LocalSentinelCluster, _: Any) -> Address:
    return Address("127.0.0.1", 1)


def _unroutable(cluster: LocalSentinelCluster, _: Any) -> Address:
    return Address("192.0.2.1", 6379)  # TEST-NET-1 (RFC 5737): outside any network


def _black_hole(cluster: LocalSentinelCluster, holder: Any) -> Address:
    hole = BlackHoleServer()
    holder.append(hole)
    return Address(*hole.address)


def _role_garbage(cluster: LocalSentinelCluster, holder: Any) -> Address:
    fake = FakeSentinel({("ROLE",): 42})
    holder.append(fake)
    return fake.address


def _other_shards_master(cluster: LocalSentinelCluster, _: Any) -> Address:
    return Address(*cluster.master_address(cluster.master_names[1]))


@pytest.mark.parametrize(
    "target",
    [
        pytest.param(_replica, id="replica"),
        pytest.param(_closed_port, id="closed-port"),
        pytest.param(_unroutable, id="outside-the-network"),
        pytest.param(_black_hole, id="black-hole"),
        pytest.param(_role_garbage, id="garbage-role-reply"),
        pytest.param(_other_shards_master, id="other-shards-master"),
    ],
)
def test_switch_master_to_a_wrong_address_is_ignored(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture, target: SwitchTarget
) -> None:
    holder: list[Any] = []
    pool = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, listeners=False, **SHORT
    )
    try:
        pool.discover()
        listener = SentinelListener(pool, Address(*cluster.sentinel_addresses[0]), {})
        shard = pool.shards[0]
        before = shard.current()
        address = target(cluster, holder)
        data = f"{shard.name} {before[0].host} {before[0].port} {address.host} {address.port}"
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="sentinel_cache"):
            listener.handle(b"+switch-master", data.encode())  # must not raise
        elapsed = time.monotonic() - started
        assert shard.current() == before
        assert elapsed < 2.0
        assert any(str(address) in r.getMessage() for r in caplog.records)
        assert execute(pool, shard, lambda c: c.ping())
    finally:
        pool.close()
        for thing in holder:
            thing.close()


# ----------------------------------------------------------------------------- keys


def _hostile_keys() -> list[str | bytes]:
    return [
        "",
        " ",
        "k" * (1 << 20),  # 1 MB
        b"\x00" * (1 << 20),  # 1 MB of NUL bytes
        b"\x00\xff\xfe\x80binary",
        b"\x80\x81\xc3\x28 not UTF-8",
        "\x00\x01\x02\r\n\t\x1b[31m\x7f control",
        "*?[glob]\\",
        "\r\n*1\r\n$4\r\nPING\r\n",  # RESP injection attempt
        "é€😀 𝄞 ​zero-width",
        "\U0001f600" * 1000,
        "key with spaces",
    ]


def test_hostile_keys_round_trip(cluster: LocalSentinelCluster) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    cache = CacheClient(pool, Codec())
    keys = _hostile_keys()
    try:
        for key in keys:
            index = pool.shard_index(key)
            raw = key.encode() if isinstance(key, str) else key
            assert pool.shard_index(raw) == index  # a str is placed by its UTF-8 bytes
            assert cache.set(key, ("value", key), 60)
            assert cache.get(key) == ("value", key)
            assert cache.has_key(key)
            assert 0 < cache.ttl(key) <= 60
            # It is really on the master the ring names, under exactly these bytes.
            with cluster.node_client(cluster.master_address(cluster.master_names[index])) as n:
                assert n.exists(raw) == 1
        assert cache.get_many(keys) == {key: ("value", key) for key in keys}
        assert cache.delete_many(keys) == len(keys)
        assert cache.set_many({key: 1 for key in keys}, 60) == []
        assert cache.get_many(keys) == dict.fromkeys(keys, 1)
        assert cache.incr(keys[4], 5) == 6
        assert cache.delete_many(keys) == len(keys)
        assert cache.get_many(keys) == {}
    finally:
        pool.close()


def test_a_key_that_is_not_valid_unicode_fails_before_sending(
    cluster: LocalSentinelCluster,
) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    cache = CacheClient(pool, Codec())
    try:
        assert pool.shard_index("\ud800") in (0, 1)  # the ring copes (as Java would: "?")
        with pytest.raises(ArgumentValueError, match="key: is not valid Unicode"):
            cache.set("\ud800", 1, 10)  # refused before any bytes reach a server
        assert cache.set("after-surrogate", 1, 10) and cache.get("after-surrogate") == 1
        cache.delete("after-surrogate")
    finally:
        pool.close()


# ----------------------------------------------------------------------------- values


class _Boom:
    """Unpickling this calls :func:`_record`: a stand-in for code an attacker would run."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_record, ("ran",))


class _Raises:
    """Unpickling this raises ValueError (``int("not a number")``)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, ("not a number",))


RAN: list[str] = []


def _record(tag: str) -> str:
    RAN.append(tag)
    return tag


def _write_raw(cluster: LocalSentinelCluster, pool: ShardedSentinelPool, key: str, raw: bytes):
    name = cluster.master_names[pool.shard_index(key)]
    with cluster.node_client(cluster.master_address(name)) as node:
        node.set(key, raw, ex=60)


UNREADABLE = {
    "truncated-pickle": pickle.dumps({"a": list(range(50))})[:-10],
    "pickle-of-missing-function": pickle.dumps(_Boom()).replace(b"_record", b"_nother"),
    "pickle-that-raises": pickle.dumps(_Raises()),
    "framed-unknown-header": b"\xfe\x77payload",
    "framed-truncated": b"\xfe",
    "framed-bad-zlib": b"\xfe\x11not zlib at all",
    "signed-truncated": b"\xff" + b"x" * 10,
    "signed-garbage": b"\xff" + b"\x00" * 32 + b"\xfe\x10garbage",
    "text": b"plain text someone wrote",
    "empty": b"",
    "nul-bytes": b"\x00" * 100,
}


def test_unreadable_values_are_logged_misses(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    cache = CacheClient(pool, Codec())
    keys = [f"unreadable:{name}" for name in UNREADABLE]
    try:
        for key, raw in zip(keys, UNREADABLE.values(), strict=True):
            _write_raw(cluster, pool, key, raw)
        with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
            for key in keys:
                assert cache.get(key, "default") == "default", key
            assert cache.get_many(keys) == {}
        for key in keys:
            assert any(key in r.getMessage() for r in caplog.records), key
        # Absent everywhere, never "present but missing": has_key agrees with get, add stores
        # over it (and only over it), get_or_set computes and stores its value.
        assert [key for key in keys if cache.has_key(key)] == []
        for key in keys[: len(keys) // 2]:
            assert cache.add(key, "added", 60) is True, key
            assert cache.get(key) == "added" and cache.has_key(key), key
            assert cache.add(key, "again", 60) is False, key  # a readable value: add loses
            assert 0 < cache.ttl(key) <= 60, key
        for key in keys[len(keys) // 2 :]:
            assert cache.get_or_set(key, lambda: "computed", 60) == "computed", key
            assert cache.get(key) == "computed", key
        cache.delete_many(keys)
    finally:
        pool.close()


def test_pickled_code_never_runs_with_a_signing_key_or_json(
    cluster: LocalSentinelCluster,
) -> None:
    boom = pickle.dumps(_Boom())
    payloads = {
        "legacy-pickle": boom,
        "framed-pickle": b"\xfe\x10" + boom,
        "signed-with-another-key": Codec(signing_key=b"k" * 32).dumps(_Boom()),
    }
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    try:
        readers = {
            "signed": CacheClient(pool, Codec(signing_key=b"s" * 32)),
            "json": CacheClient(pool, Codec("json")),
        }
        RAN.clear()
        for name, raw in payloads.items():
            key = f"boom:{name}"
            _write_raw(cluster, pool, key, raw)
            for reader in readers.values():
                assert reader.get(key, "miss") == "miss"
        assert RAN == []
        # Without a key, a pickle codec trusts whoever can write to the data nodes (documented).
        assert CacheClient(pool, Codec()).get("boom:legacy-pickle") == "ran"
        assert RAN == ["ran"]
        CacheClient(pool, Codec()).delete_many([f"boom:{name}" for name in payloads])
    finally:
        pool.close()


def test_a_huge_key_does_not_make_a_huge_log_line(
    cluster: LocalSentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, listeners=False)
    key = "h" * (1 << 20)
    try:
        _write_raw(cluster, pool, key, b"garbage")
        with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
            assert CacheClient(pool, Codec()).get(key) is None
        assert caplog.records and max(len(r.getMessage()) for r in caplog.records) < 2000
    finally:
        CacheClient(pool, Codec()).delete(key)
        pool.close()
