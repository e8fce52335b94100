"""The near cache on RESP3 push (issue 37 item 3): where the server accepts ``HELLO 3``, each
shard is tracked on ONE connection, whose invalidations arrive on it as push frames; whoever
reads that socket (the tracker, or a write's caller reading its reply) applies every push it
reads before anything read after it, and the ``draining`` flag stays up while the parser
holds frames not applied yet. A server that refuses ``HELLO 3`` is tracked with the RESP2
redirect (two connections), as before.

Real servers; the tracker is held where a starved one would be (its ``select``), or while it
applies one of several frames it read at once.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from test_near_cache import near_mode, near_status, outsider, tracked
from test_near_cache_arrivals import HOLD_S, _HeldSelect
from threads import Workers
from waiting import key_on, wait_until

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology import near_tracking
from sentinel_cache.core.topology.near import NearCache
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster


class _HeldWait(_HeldSelect):
    """Holds the trackers in their wait for the socket only (a ``select`` with a timeout),
    never in the zero-timeout look taken holding the writer (which would keep writes off it)."""

    def select(self, *args: Any) -> Any:
        if len(args) > 3 and args[3] == 0:
            return select.select(*args)
        return super().select(*args)


def started(cluster: LocalSentinelCluster, **options: Any) -> ShardedSentinelPool:
    core = ShardedSentinelPool(
        cluster.master_names, cluster.sentinel_addresses, near_cache=True, **options
    )
    CacheClient(core, Codec()).get("push:start")  # starts the core (nothing connects before)
    return core


@pytest.fixture
def core(cluster: LocalSentinelCluster) -> Iterator[ShardedSentinelPool]:
    made = started(cluster, near_cache_push=True, db=13)
    CacheClient(made, Codec()).clear(None)
    wait_until(lambda: tracked(made), 5, "tracking")
    yield made
    made.close()


COUNTED_DB = 14  # the counting tests' database: CLIENT LIST tells their connections by it


def tracker_connections(core: ShardedSentinelPool) -> list[int]:
    """Per master, how many connections the near cache's trackers hold there, as ``CLIENT
    LIST`` shows them: on the core's database, tracking (flag ``t``) or subscribed (``P``);
    the pools' connections are neither."""
    counts = []
    for shard in core.shards:
        address = shard.address
        assert address is not None
        with redis.Redis(host=address.host, port=address.port) as admin:
            clients = admin.client_list()
        counts.append(
            sum(
                c["db"] == str(COUNTED_DB) and ("t" in c["flags"] or "P" in c["flags"])
                for c in clients
            )
        )
    return counts


def kept(client: CacheClient, core: ShardedSentinelPool, key: str, value: Any) -> None:
    """``key`` written by us (kept by the write) and served by a hit."""
    assert client.set(key, value, 600) is True

    def hit() -> bool:
        before = near_status(core, key)["hits"]
        assert client.get(key) == value
        return bool(near_status(core, key)["hits"] > before)

    wait_until(hit, 5, f"a near-cache hit of {key}")


@pytest.mark.parametrize(
    ("push", "mode", "per_master"), [(True, "push", 1), (False, "redirect", 2)]
)
def test_one_connection_per_shard_in_push_mode_two_in_redirect(
    cluster: LocalSentinelCluster, push: bool, mode: str, per_master: int
) -> None:
    core = started(cluster, near_cache_push=push, db=COUNTED_DB)
    try:
        wait_until(lambda: tracked(core), 5, "tracking")
        assert near_mode(core) == mode
        assert tracker_connections(core) == [per_master] * len(core.shards)
    finally:
        core.close()


@pytest.mark.parametrize(
    ("options", "mode", "per_master"),
    [({}, "redirect", 2), ({"near_cache_push": "auto"}, "push", 1)],
    ids=["default", "auto"],
)
def test_the_default_is_redirect_and_auto_is_push_where_the_server_speaks_resp3(
    cluster: LocalSentinelCluster, options: dict[str, Any], mode: str, per_master: int
) -> None:
    core = started(cluster, db=COUNTED_DB, **options)
    try:
        wait_until(lambda: tracked(core), 5, "tracking")
        assert near_mode(core) == mode
        assert tracker_connections(core) == [per_master] * len(core.shards)
    finally:
        core.close()


def test_a_push_read_by_a_writes_caller_is_applied_before_the_write_returns(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tracker is held (it reads nothing); another writer overwrites a kept key, so its
    push waits on our connection ahead of the reply to our next write there. That write's
    caller reads the push before its reply and applies it: the copy is gone and the
    invalidation counted when ``set`` returns, though the tracker has not run since."""
    client = CacheClient(core, Codec())
    index = core.shard_index("push:caller:a")
    a, b = "push:caller:a", key_on(core, index, "push:caller:b")
    kept(client, core, a, "old")
    shim = _HeldWait()
    monkeypatch.setattr(near_tracking, "select", shim)
    shim.held.set()
    try:
        wait_until(lambda: len(shim.waiting) == len(core.shards), HOLD_S, "trackers held")
        before = near_status(core, a)
        with outsider(core, a) as other:
            other.set(a, Codec().dumps("new"))  # acknowledged: its push is on our socket
        assert client.set(b, "mine", 600) is True  # on the writer connection: reads the push
        after = near_status(core, a)
        assert after["invalidations"] == before["invalidations"] + 1
        assert after["entries"] == before["entries"]  # a's copy went, b's came
        assert client.get(a) == "new"
        assert client.get(b) == "mine"
    finally:
        shim.held.clear()
        shim.release.set()


def test_frames_read_at_once_are_not_served_past_while_one_is_applied(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer overwrites five kept keys in one pipeline: their five pushes come in
    one read, so the parser holds four of them (nothing is left on the socket) while the
    tracker applies the first, held there. No hit serves any of the five meanwhile: the
    ``draining`` flag stays up until the parser's buffer is empty."""
    client = CacheClient(core, Codec())
    index = core.shard_index("push:burst:0")
    keys = [key_on(core, index, f"push:burst{n}") for n in range(5)]
    for key in keys:
        kept(client, core, key, "old")
    applying, release = threading.Event(), threading.Event()
    original = NearCache.invalidate

    def invalidate(self: NearCache, shard: int, raw: Any) -> None:
        if raw is not None and keys[0].encode() in raw and not applying.is_set():
            applying.set()  # the first frame, the rest in the parser's buffer: held here
            assert release.wait(HOLD_S), "the test never released the tracker"
        original(self, shard, raw)

    monkeypatch.setattr(NearCache, "invalidate", invalidate)
    writer = core.near._shards[index].writer  # type: ignore[union-attr]
    assert writer is not None and writer.mode == "push"
    try:
        with outsider(core, keys[0]) as other:
            pipe = other.pipeline(transaction=False)
            for key in keys:
                pipe.set(key, Codec().dumps("new"))
            pipe.execute()
        assert applying.wait(HOLD_S), "the first push never reached the tracker"
        on_socket = select.select([writer.connection._sock], [], [], 0)[0]
        assert not on_socket, "the pushes came in more than one read: this proves nothing"
        hits = near_status(core, keys[0])["hits"]
        got = [client.get(key) for key in keys[1:]]
        assert near_status(core, keys[0])["hits"] == hits
    finally:
        release.set()
    assert got == ["new"] * 4


def test_a_server_refusing_resp3_is_tracked_by_the_redirect(
    make_cluster: Callable[..., LocalSentinelCluster],
) -> None:
    """``HELLO`` renamed away (as on a Redis 5, or behind a proxy that speaks RESP2 only):
    "auto" tracks the shard in redirect mode, on two connections, and its invalidations still
    come; ``NEAR_CACHE_PUSH: True`` tracks nothing there (copies are never served) rather
    than fall back."""
    cluster = make_cluster(
        shards=1, replicas=0, sentinels=1, extra_server_args=["--rename-command", "HELLO", ""]
    )
    core = started(cluster, near_cache_push="auto", db=COUNTED_DB)
    try:
        wait_until(lambda: tracked(core), 5, "tracking")
        assert near_mode(core) == "redirect"
        assert tracker_connections(core) == [2]
        client = CacheClient(core, Codec())
        kept(client, core, "push:old", "old")
        with outsider(core, "push:old") as other:
            other.set("push:old", Codec().dumps("new"))
        wait_until(lambda: client.get("push:old") == "new", 2, "the redirected invalidation")
    finally:
        core.close()
    forced = started(cluster, near_cache_push=True)
    try:
        client = CacheClient(forced, Codec())
        assert client.set("push:forced", "v", 600) is True
        for _ in range(3):
            assert client.get("push:forced") == "v"
        status = forced.status()["shards"][0]["near_cache"]
        assert status["tracked"] is False and status["mode"] is None and status["hits"] == 0
    finally:
        forced.close()


def test_a_writes_reply_waiting_does_not_refuse_hits_a_push_behind_it_does(
    core: ShardedSentinelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In push mode a write's reply comes on the socket the invalidations come on. While it
    waits for its caller (a thread waiting for the GIL), a hit of another key is served: the
    hit peeks, and whole simple replies hide no invalidation. Once another writer's push is
    behind that reply, the hit is refused (the mix of 8 threads at 10% writes missed 27% of
    reads when any readable byte refused hits, 0.7 to 1.2% with the peek)."""
    client = CacheClient(core, Codec())
    near = core.near
    assert near is not None
    index = core.shard_index("push:reply:a")
    a, b = "push:reply:a", key_on(core, index, "push:reply:b")
    kept(client, core, a, "old")
    shim = _HeldWait()  # the tracker out of the way: the write's caller reads alone
    monkeypatch.setattr(near_tracking, "select", shim)
    waiting, release = threading.Event(), threading.Event()
    gated: list[threading.Thread] = []
    original = near_tracking._WriterConnection.read_response

    def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() in gated and not release.is_set():
            select.select([self._sock], [], [], HOLD_S)  # the reply has come
            waiting.set()
            assert release.wait(HOLD_S), "the test never released the write"
        return original(self, *args, **kwargs)

    monkeypatch.setattr(near_tracking._WriterConnection, "read_response", read_response)

    def write() -> None:
        gated.append(threading.current_thread())
        assert client.set(b, "mine", 600) is True

    shim.held.set()
    try:
        wait_until(lambda: len(shim.waiting) == len(core.shards), HOLD_S, "trackers held")
        with Workers(timeout=2 * HOLD_S) as workers:
            workers.spawn(write, name="push-reply-write")
            try:
                assert waiting.wait(HOLD_S), "the write never went on the writer connection"
                hits = near_status(core, a)["hits"]
                assert near.get(a) == Codec().dumps("old")  # only a reply waits: served
                assert near_status(core, a)["hits"] == hits + 1
                with outsider(core, a) as other:
                    other.set(a, Codec().dumps("new"))  # acknowledged: its push is behind
                assert near.get(a) is None
            finally:
                release.set()
    finally:
        shim.held.clear()
        shim.release.set()
    assert client.get(a) == "new" and client.get(b) == "mine"
