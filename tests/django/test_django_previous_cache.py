"""Warm adoption from Django's own ``RedisCache`` (issue 25): ``OPTIONS["PREVIOUS_CACHE"]``.

The old cache is a plain redis server (the master of a one-node topology the harness starts),
written through ``django.core.cache.backends.redis.RedisCache`` as a site would; ours is the
shared two-shard topology. The scenario (tests/adoption_support.py) is the issue's target; the
other tests check each rule: reads served and copied with their TTL, writes and deletes
removing the old copy, a delete racing a read-through never undone, the system check."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from adoption_support import OUR_DB, migrate, old_keys, old_url, ours, run_scenario, site
from django.core.cache import caches
from django.test import override_settings
from durable_support import while_frozen

from sentinel_cache.django.checks import check_previous_cache
from sentinel_cache.testing import LocalSentinelCluster

REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"


@pytest.fixture(scope="module")
def old(server_kind: str) -> Iterator[LocalSentinelCluster]:
    """The server the site ran on before: one plain redis node (its sentinel is not used)."""
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as topology:
        yield topology


@pytest.fixture
def old_server(old: LocalSentinelCluster) -> Iterator[redis.Redis]:
    client = old.node_client(old.master_address(old.master_names[0]), db=0)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def adopting(
    cluster: LocalSentinelCluster, old: LocalSentinelCluster, old_server: Any
) -> Iterator[Any]:
    """A site whose "default" (ours, a fresh prefix) adopts "old" (RedisCache, same prefix)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    old_entry = {"BACKEND": REDIS_CACHE, "LOCATION": old_url(old), "KEY_PREFIX": prefix}
    with site(ours(cluster, KEY_PREFIX=prefix), old_entry):
        yield caches["default"], caches["old"]


def test_switching_from_redis_cache_loses_no_key_and_no_user(
    cluster: LocalSentinelCluster, old: LocalSentinelCluster, old_server: redis.Redis
) -> None:
    figures = run_scenario(
        cluster, [old_server], {"BACKEND": REDIS_CACHE, "LOCATION": old_url(old)}
    )
    print({k: v for k, v in figures.items() if k not in ("report", "second_run")})
    assert figures["old_keys_before"] == 800  # 600 keys and 200 sessions
    assert figures["misses"] == 0
    assert figures["ttl_kept"] == 150 and figures["persistent"] == 150
    assert figures["logged_in"] == figures["users"] == 200
    (report,) = figures["report"].values()
    assert report["complete"] and report["moved"] == 300 and report["already_present"] == 0
    (again,) = figures["second_run"].values()
    assert again["complete"] and again["scanned"] == 0
    assert figures["wrong_after"] == 0
    assert figures["on_their_shard"] == figures["keys"] == 800
    assert figures["left_on_old"] == 0


def test_a_miss_is_copied_with_its_ttl_and_leaves_the_old_server(
    adopting: Any, old_server: redis.Redis
) -> None:
    cache, previous = adopting
    previous.set("session", {"user": 7}, timeout=500)
    previous.set("forever", "kept", timeout=None)
    stored = previous.make_key("session")
    assert old_server.exists(stored)
    assert cache.get("session") == {"user": 7}
    assert not old_server.exists(stored)  # moved, not copied
    assert 490 <= cache.ttl("session") <= 500
    assert cache.get_many(["forever", "none"]) == {"forever": "kept"}
    assert cache.ttl("forever") is None
    assert cache.get("none", "default") == "default"
    previous.set("present", 1)
    assert cache.has_key("present") and not old_server.exists(previous.make_key("present"))


def test_operations_on_an_old_value_see_it(adopting: Any) -> None:
    cache, previous = adopting
    previous.set_many({"hits": 41, "name": "x", "slot": "taken", "ttl": 1})
    assert cache.incr("hits") == 42  # counted from the old value, atomically on ours
    assert cache.add("slot", "mine") is False and cache.get("slot") == "taken"
    assert cache.get_or_set("name", "computed") == "x"
    assert cache.touch("ttl", 100) is True and 90 <= cache.ttl("ttl") <= 100


def test_writes_and_deletes_remove_the_old_copy(adopting: Any, old_server: redis.Redis) -> None:
    cache, previous = adopting
    previous.set_many({f"k{i}": f"old{i}" for i in range(6)}, timeout=None)
    cache.set("k0", "new")
    cache.set_many({"k1": "new1"})
    assert cache.delete("k2") is False  # ours had no copy; the old one is gone too
    cache.delete_many(["k3", "k4"])
    assert cache.get_many([f"k{i}" for i in range(6)]) == {"k0": "new", "k1": "new1", "k5": "old5"}
    assert old_keys(old_server, "") == []  # k5 moved by the read; the others deleted


def test_clear_empties_the_old_cache_too(
    cluster: LocalSentinelCluster, old: LocalSentinelCluster, old_server: redis.Redis
) -> None:
    """In a database of its own: the clear's mark stops every copy there for 10 s."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    old_entry = {"BACKEND": REDIS_CACHE, "LOCATION": old_url(old), "KEY_PREFIX": prefix}
    with site(ours(cluster, KEY_PREFIX=prefix, OPTIONS={"DB": 8}), old_entry):
        cache, previous = caches["default"], caches["old"]
        previous.set_many({"gone": "old", "also": "old"})
        assert cache.get("also") == "old"
        cache.clear()
        assert old_keys(old_server, "") == []
        assert cache.get("gone") is None and cache.get("also") is None
        previous.set("later", "old")  # within the mark: served, not copied, kept on the old
        assert cache.get("later") == "old" and old_keys(old_server, "") != []
        # A write on it (its copy refused again) deletes the old copy: once the written value
        # expires, the old one does not come back.
        assert cache.add("later", "mine", timeout=1) is True
        assert old_keys(old_server, "") == []
        made = cache.make_key("later")
        shard = cache.core.shard_for(made)
        deadline = time.monotonic() + 10
        while shard.client.exists(made) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not shard.client.exists(made)
        assert cache.get("later") is None


def test_async_twins_follow_the_same_rules(adopting: Any) -> None:
    cache, previous = adopting
    previous.set_many({"a": 1, "b": "two", "c": 3})

    async def main() -> list[Any]:
        return [
            await cache.aget("a"),
            await cache.aget_many(["b", "missing"]),
            await cache.aincr("c", 10),
            await cache.adelete("b"),
            await cache.aget("b"),
            await cache.ahas_key("a"),
        ]

    assert asyncio.run(main()) == [1, {"b": "two"}, 13, True, None, True]
    assert previous.get_many(["a", "b", "c"]) == {}
    previous.set_many({"d": "old", "e": "old", "f": "old", "g": "old"})

    async def more() -> list[Any]:
        return [
            await cache.aget_or_set("d", "computed"),
            await cache.aadd("e", "mine"),
            await cache.aset("f", "new"),
            await cache.adelete_many(["g"]),
            await cache.aget_many(["d", "e", "f", "g"]),
        ]

    found = {"d": "old", "e": "old", "f": "new"}
    # g: no copy here (0 deleted), and the old one gone
    assert asyncio.run(more()) == ["old", False, True, 0, found]
    assert previous.get_many(["d", "e", "f", "g"]) == {}


class Paused:
    """A value whose pickling (our copy encodes it, after the old cache was read and its TTL
    too) stops until the test lets it go, once: a delete is run exactly in that gap."""

    gate: dict[str, threading.Event] = {}

    def __init__(self, text: str) -> None:
        self.text = text

    def __getstate__(self) -> dict[str, Any]:
        if self.gate:
            reached, go = self.gate.pop("reached"), self.gate.pop("go")
            reached.set()
            assert go.wait(30)
        return self.__dict__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Paused) and other.text == self.text


@pytest.mark.parametrize("write", ["delete", "set"])
def test_a_write_between_a_read_through_and_its_copy_wins(
    adopting: Any, old_server: redis.Redis, write: str
) -> None:
    """The adversary's interleaving, forced: the read-through has read the old value (and its
    TTL), then the key is deleted (or set) on ours, then the copy is sent. The delete's
    tombstone refuses it (the set's value is there): the old value never comes back."""
    cache, previous = adopting
    previous.set("k", Paused("old"), timeout=None)
    reached, go = threading.Event(), threading.Event()
    Paused.gate.update(reached=reached, go=go)
    outcome: list[Any] = []

    def reader() -> None:
        try:
            outcome.append(cache.get("k"))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert reached.wait(30)
        if write == "delete":
            cache.delete("k")
        else:
            cache.set("k", "new")
    finally:
        go.set()
        thread.join(30)
        Paused.gate.clear()
    assert not thread.is_alive()
    assert outcome == [Paused("old")]  # read before the write: served as it was
    assert cache.get("k") == (None if write == "delete" else "new")
    assert not old_server.exists(previous.make_key("k"))
    made = cache.make_key("k")
    held = [shard.name for shard in cache.core.shards if shard.client.exists(made)]
    assert held == ([] if write == "delete" else [cache.core.shard_for(made).name])


def test_the_check_names_a_bad_previous_cache(cluster: LocalSentinelCluster) -> None:
    entry = ours(cluster)

    def errors(value: Any, **others: Any) -> list[str]:
        adopting = {**entry, "OPTIONS": {**entry["OPTIONS"], "PREVIOUS_CACHE": value}}
        with override_settings(CACHES={"default": adopting, **others}):
            return [f"{e.id} {e.msg}" for e in check_previous_cache()]

    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    assert errors("old", old=locmem) == []
    (missing,) = errors("olde", old=locmem)
    assert "sentinel_cache.E004" in missing and "'olde'" in missing and "PREVIOUS_CACHE" in missing
    (itself,) = errors("default")
    assert "names this cache itself" in itself
    back = {**entry, "OPTIONS": {**entry["OPTIONS"], "PREVIOUS_CACHE": "default"}}
    loop = errors("other", other=back)  # each names the other: both reported
    assert len(loop) == 2 and "adopts from 'default' itself" in loop[0], loop
    assert "adopts from 'other' itself" in loop[1]


def test_without_the_option_the_backend_is_the_plain_class(cluster: LocalSentinelCluster) -> None:
    from django_support import build_cache

    from sentinel_cache.django import ShardedSentinelCache
    from sentinel_cache.django.previous import AdoptingCache

    assert type(build_cache(ours(cluster))) is ShardedSentinelCache
    adopting = build_cache(ours(cluster, OPTIONS={"PREVIOUS_CACHE": "old"}))
    assert isinstance(adopting, AdoptingCache) and isinstance(adopting, ShardedSentinelCache)


def test_a_bad_value_is_refused_on_first_use(cluster: LocalSentinelCluster) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django_support import build_cache

    cache = build_cache(ours(cluster, OPTIONS={"PREVIOUS_CACHE": 5}))
    with pytest.raises(ImproperlyConfigured, match=r"PREVIOUS_CACHE.*5"):
        cache.get("k")
    masters = cluster.config()["masters"]
    both = build_cache(
        ours(cluster, OPTIONS={"PREVIOUS_CACHE": "old", "PREVIOUS_MASTERS": masters})
    )
    with pytest.raises(ImproperlyConfigured, match=r"PREVIOUS_CACHE.*cannot be combined with PREV"):
        both.get("k")
    entry = ours(cluster, OPTIONS={"PREVIOUS_CACHE": "nowhere"})
    with (
        override_settings(CACHES={"default": entry}),
        pytest.raises(ImproperlyConfigured, match=r"PREVIOUS_CACHE'\] = 'nowhere'"),
    ):
        caches["default"].get("k")


def test_logouts_racing_read_throughs_are_not_undone(
    adopting: Any, old_server: redis.Redis
) -> None:
    """200 users logged in on the old cache; two readers load their sessions through ours
    (each load a read-through while the session is still on the old server) while each is
    flushed (a logout): afterwards no flushed session loads, here or on the old server."""
    from django.contrib.sessions.backends.cache import SessionStore

    cache, previous = adopting

    def store(backend: Any, session_key: str | None = None) -> SessionStore:
        session = SessionStore(session_key)
        session._cache = backend
        return session

    sessions = []
    for i in range(200):
        session = store(previous)
        session["_auth_user_id"] = str(i)
        session.save()
        sessions.append(session.session_key)
    at = [0]
    done = threading.Event()
    outcomes: dict[str, Any] = {}

    def read(name: str) -> None:
        loads = 0
        try:
            while not done.is_set():
                store(cache, sessions[at[0]]).load()
                loads += 1
            outcomes[name] = loads
        except BaseException as exc:
            outcomes[name] = exc

    readers = [threading.Thread(target=read, args=(f"reader{n}",)) for n in range(2)]
    try:
        for reader in readers:
            reader.start()
        for i, session_key in enumerate(sessions):
            at[0] = i
            store(cache, session_key).flush()  # the logout
    finally:
        done.set()
        for reader in readers:
            reader.join(60)
    assert not any(reader.is_alive() for reader in readers)
    assert all(isinstance(n, int) and n > 0 for n in outcomes.values()), outcomes
    undone = [key for key in sessions if store(cache, key).get("_auth_user_id") is not None]
    print(f"{len(undone)} of {len(sessions)} logouts undone; {outcomes}")
    assert undone == [] and old_keys(old_server, "") == []


def test_any_backend_is_read_through_with_the_default_timeout(
    cluster: LocalSentinelCluster,
) -> None:
    """A LocMemCache cannot tell its TTLs: the copy gets our TIMEOUT. It cannot list its keys:
    the migration refuses it, naming the option, before anything is moved (exit 3)."""
    import io

    from django.core.management import CommandError, call_command

    from sentinel_cache.management.commands.sentinel_reshard import Command

    old_entry = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "old"}
    prefix = f"t{uuid.uuid4().hex[:8]}"
    with site(ours(cluster, KEY_PREFIX=prefix, TIMEOUT=120), old_entry):
        cache, previous = caches["default"], caches["old"]
        previous.set("k", "v", timeout=None)
        assert cache.get("k") == "v" and previous.get("k") is None
        assert 110 <= cache.ttl("k") <= 120
        previous.set("left", "v")
        for dry_run in ([], ["--dry-run"]):
            with pytest.raises(CommandError, match=r"PREVIOUS_CACHE.*cannot list its keys") as e:
                call_command(Command(), "--from-previous-cache", *dry_run, stdout=io.StringIO())
            assert e.value.returncode == 3
        assert previous.get("left") == "v"


def test_the_command_text_dry_run_and_refusals(adopting: Any, old_server: redis.Redis) -> None:
    import io

    from django.core.management import CommandError, call_command

    from sentinel_cache.management.commands.sentinel_reshard import Command

    cache, previous = adopting
    previous.set_many({f"k{i}": i for i in range(30)})
    cache.set("k0", "ours")  # the old k0 is deleted by the write
    out = io.StringIO()
    call_command(Command(), "--from-previous-cache", "--dry-run", stdout=out)
    assert "29 keys in CACHES['old']" in out.getvalue() and "29 would be copied" in out.getvalue()
    assert len(old_keys(old_server, "")) == 29  # nothing written
    out, err = io.StringIO(), io.StringIO()
    call_command(Command(), "--from-previous-cache", "--rate", "1000", stdout=out, stderr=err)
    assert "Migration done" in out.getvalue() and "29 keys moved" in out.getvalue()
    assert "(done)" in err.getvalue()  # the progress, on stderr
    assert old_keys(old_server, "") == [] and cache.get("k0") == "ours" and cache.get("k7") == 7
    with pytest.raises(CommandError, match="--rate must be a positive number"):
        call_command(Command(), "--from-previous-cache", "--rate", "0")
    with pytest.raises(CommandError, match="--match cannot be used with --from-previous-cache"):
        call_command(Command(), "--from-previous-cache", "--match", "k1*")


def test_a_shard_down_with_ignore_exceptions(
    make_cluster: Any, old: LocalSentinelCluster, old_server: redis.Redis, caplog: Any
) -> None:
    """Our shard's master killed (no replica): with IGNORE_EXCEPTIONS a read of a key there is
    still served from the old cache (the copy fails, logged; the old copy kept), a write skips
    the shard's tombstones (logged) and fails open, having deleted the old copy."""
    ours_topology = make_cluster(shards=2, replicas=0, sentinels=1)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    old_entry = {"BACKEND": REDIS_CACHE, "LOCATION": old_url(old), "KEY_PREFIX": prefix}
    entry = ours(ours_topology, KEY_PREFIX=prefix, OPTIONS={"IGNORE_EXCEPTIONS": True})
    with site(entry, old_entry):
        cache, previous = caches["default"], caches["old"]
        down = ours_topology.master_names[1]
        keys = [f"k{i}" for i in range(40)]
        there = [k for k in keys if cache.core.shard_for(cache.make_key(k)).name == down]
        alive = [k for k in keys if k not in there]
        previous.set_many({k: f"old {k}" for k in keys}, timeout=None)
        ours_topology.kill_master(down)
        assert cache.get(there[0]) == f"old {there[0]}"  # served; not copied
        assert old_server.exists(previous.make_key(there[0]))  # kept for a later read
        assert "not copied to shard" in caplog.text
        assert cache.get(alive[0]) == f"old {alive[0]}"  # the live shard adopts it
        assert not old_server.exists(previous.make_key(alive[0]))
        assert cache.set(there[1], "new") is False  # failed open
        assert not old_server.exists(previous.make_key(there[1]))  # the old copy is gone
        assert cache.get(there[1]) is None


def test_a_stopped_migration_is_simply_run_again(adopting: Any, old_server: redis.Redis) -> None:
    """Ctrl-C after the first batch (raised from the progress callback, as the command's
    KeyboardInterrupt would come): the keys moved stay moved, the next run moves the rest."""
    from sentinel_cache.core.admin.reshard.previous import migrate_previous

    cache, previous = adopting
    values = {f"k{i}": i for i in range(200)}
    previous.set_many(values, timeout=None)
    adopter, old = cache.adoption()

    def stop(progress: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate_previous(adopter, old, batch=20, progress=stop)
    left = len(old_keys(old_server, ""))
    assert 0 < left < 200  # stopped part way
    report = migrate_previous(adopter, old, batch=20)
    assert report.complete and report.moved == left and report.scanned == left
    assert old_keys(old_server, "") == []
    assert cache.get_many(list(values)) == values


@pytest.mark.parametrize("path", ["read", "command"])
def test_durable_replicas_hold_the_old_copies_until_our_replica_has_them(
    make_cluster: Any, old: LocalSentinelCluster, old_server: redis.Redis, path: str
) -> None:
    """The backend's own DURABLE_REPLICAS reaches the adoption (its client is the adopter's):
    a read-through and ``sentinel_reshard --from-previous-cache`` remove the old copies only
    once our frozen replica has the copies (it is thawed 0.5 s later; a 4 s WAIT timeout)."""
    ours_topology = make_cluster(shards=1, replicas=1, sentinels=1)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    old_entry = {"BACKEND": REDIS_CACHE, "LOCATION": old_url(old), "KEY_PREFIX": prefix}
    durable = {"DURABLE_REPLICAS": 1, "DURABLE_TIMEOUT_MS": 4000}
    keys = [f"k{i}" for i in range(10)]
    replica = ours_topology.replica_addresses(ours_topology.master_names[0])[0]
    with site(ours(ours_topology, KEY_PREFIX=prefix, OPTIONS=durable), old_entry):
        cache, previous = caches["default"], caches["old"]
        previous.set_many({k: f"old {k}" for k in keys}, timeout=None)
        stored = [previous.make_key(k) for k in keys]

        def adopt() -> None:
            if path == "read":
                assert cache.get_many(keys) == {k: f"old {k}" for k in keys}
            else:
                (report,) = migrate().values()
                assert report["complete"] and report["moved"] == len(keys)

        _, at_thaw, _ = while_frozen(
            ours_topology, replica, adopt, lambda: old_server.exists(*stored)
        )
        assert at_thaw == [len(keys)]  # the removal waited for the copies' WAIT
        assert old_server.exists(*stored) == 0
        with ours_topology.node_client(replica, db=OUR_DB) as node:
            assert node.exists(*[cache.make_key(k) for k in keys]) == len(keys)
