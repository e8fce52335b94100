"""Warm adoption (``PREVIOUS_CACHE``) under races and rules (issue 36, items 1-4), on real
servers: the old cache is django-redis (pickle) on a plain redis node, ours the shared
two-shard topology, as a site switching from django-redis runs.

1. Concurrent first reads of a key only the old cache has: 3 processes of 6 threads read the
   same 200 keys at once, 5 rounds, with ``get`` and with ``get_many``; and 200 sessions read by 2 requests at once:
   not one miss, not one logout (a reader that missed on ours and then on the old cache reads
   ours again: the other reader moved the key between the two reads).
2. The old cache failing open (django-redis ``IGNORE_EXCEPTIONS``, the runbook's example) and
   its writes failing (``CLIENT PAUSE WRITE``: its reads still answer): ``delete`` and ``set``
   raise instead of acknowledging, so no acknowledged delete is undone and no old value comes
   back once ours expires.
3. ``set(nx=True)``/``set(xx=True)`` and ``get_or_set`` on a key only the old cache has behave
   as ``add``: the old value counts as present.
4. A value the old backend cannot decode is a miss to a reader and is skipped by the
   migration (counted, named in the report) without stopping it; with ours on JSON, values
   JSON cannot store are served as the old cache decodes them (not copied), and a tuple is
   the same list from the first read on; such a value is present to the conditional writes
   (``add``, ``set(nx=True)`` refuse it, the ``get_or_set`` twins return it, ``set(xx=True)``
   stores over it; Django and Flask), a poison value absent to them.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import redis
from minimal_django import configure_django

configure_django()

from adoption_support import OUR_DB, log_in, migrate, ours, site  # noqa: E402
from django.core.cache import caches  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from threads import Workers  # noqa: E402

from sentinel_cache.core.admin.reshard.previous import Adopter  # noqa: E402
from sentinel_cache.exceptions import ShardUnavailableError  # noqa: E402
from sentinel_cache.testing import LocalSentinelCluster  # noqa: E402

DJANGO_REDIS = "django_redis.cache.RedisCache"


@dataclass(frozen=True)
class Old:
    """The old server's topology and its address."""

    topology: LocalSentinelCluster
    address: tuple[str, int]


KEYS = 200
ROUNDS = 5
HANDLES, THREADS = 3, 6  # reading processes, threads in each
JOIN_S = 120  # a round of 200 reads per thread takes well under a second on an idle machine


@pytest.fixture(scope="module")
def old(server_kind: str) -> Iterator[Old]:
    """The server the site ran on before: one plain redis node (its sentinel is not used)."""
    with LocalSentinelCluster(shards=1, replicas=0, sentinels=1) as topology:
        yield Old(topology, topology.master_address(topology.master_names[0]))


@pytest.fixture
def old_server(old: Old) -> Iterator[redis.Redis]:
    client = old.topology.node_client(old.address, db=0)
    client.flushall()
    yield client
    client.execute_command("CLIENT", "UNPAUSE")
    client.flushall()
    client.close()


def _site(cluster: LocalSentinelCluster, old: Old, db: int = 0, **options: Any) -> tuple[Any, str]:
    """Settings of a site adopting django-redis in database ``db`` (extra django-redis
    ``options``: a database of their own, as django-redis shares one pool per URL); its
    prefix."""
    prefix = f"r{uuid.uuid4().hex[:8]}"
    entry = {
        "BACKEND": DJANGO_REDIS,
        "LOCATION": "redis://{}:{}/{}".format(*old.address, db),
        "KEY_PREFIX": prefix,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient", **options},
    }
    return entry, prefix


def _forget_ours(cache: Any) -> None:
    """Our copies removed behind the cache's back (no tombstones: the next round copies)."""
    cache.has_key("-")  # connected: each shard's master known
    for shard in cache.core.shards:
        for key in shard.client.scan_iter(match=f"{cache.key_prefix}:*"):
            shard.client.delete(key)


KEY_VALUES = {f"k{i}": {"i": i} for i in range(KEYS)}
GO, DONE = "races:go", "races:done"  # lists on the old server: the rounds' signals


def _read_round(many: bool) -> list[str]:
    """THREADS threads of this process, started at once, each reading every key with its own
    Django cache object (``get``, or ``get_many`` in batches of 20): the keys missed."""
    misses: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def reader() -> None:
        handle = caches["default"]  # per thread, as in a threaded server
        start.wait(timeout=JOIN_S)
        missed: list[str] = []
        names = list(KEY_VALUES)
        if many:
            for i in range(0, len(names), 20):
                got = handle.get_many(names[i : i + 20])
                missed += [key for key in names[i : i + 20] if got.get(key) != KEY_VALUES[key]]
        else:
            missed = [key for key in names if handle.get(key) != KEY_VALUES[key]]
        with lock:
            misses.extend(missed)

    with Workers(timeout=JOIN_S) as workers:
        for _ in range(THREADS):
            workers.spawn(reader)
    return misses


def _reader_process(params: dict[str, Any]) -> None:
    """A reading process (``python tests/test_adoption_races.py <json>``): the site's caches,
    then one round of :func:`_read_round` per ``GO`` message, its misses pushed to ``DONE``,
    until ``stop``."""
    signals = redis.Redis(*params["old"])
    caches_setting = {"default": params["ours"], "old": params["previous"]}
    with override_settings(CACHES=caches_setting):
        while True:
            popped = signals.blpop([GO], timeout=JOIN_S)
            if popped is None or popped[1] == b"stop":
                return
            try:
                outcome: dict[str, Any] = {"misses": _read_round(popped[1] == b"get_many")}
            except Exception as exc:  # reported to the test, which fails naming it
                outcome = {"error": f"{type(exc).__name__}: {exc}"}
            signals.rpush(DONE, json.dumps(outcome))


def _concurrent_reads(
    old: Old, ours_entry: dict[str, Any], old_entry: dict[str, Any], many: bool
) -> list[tuple[int, str]]:
    """ROUNDS rounds: the old cache holds KEYS keys, ours none; HANDLES processes of THREADS
    threads read them all at once. The misses (round, key)."""
    params = {
        "old": list(old.address),
        "ours": {**ours_entry, "OPTIONS": {**ours_entry["OPTIONS"], "PREVIOUS_CACHE": "old"}},
        "previous": old_entry,
    }
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    signals = redis.Redis(*old.address)
    processes = [
        subprocess.Popen([sys.executable, __file__, json.dumps(params)], env=env)
        for _ in range(HANDLES)
    ]
    misses: list[tuple[int, str]] = []
    try:
        for round_ in range(ROUNDS):
            _forget_ours(caches["default"])
            caches["old"].set_many(KEY_VALUES, timeout=600)
            signals.rpush(GO, *["get_many" if many else "get"] * HANDLES)
            for _ in range(HANDLES):
                popped = signals.blpop([DONE], timeout=JOIN_S)
                assert popped is not None, f"round {round_}: a reading process did not report"
                outcome = json.loads(popped[1])
                assert "error" not in outcome, outcome["error"]
                misses.extend((round_, key) for key in outcome["misses"])
        signals.rpush(GO, *["stop"] * HANDLES)
        for process in processes:
            assert process.wait(timeout=JOIN_S) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        signals.close()
    return misses


@pytest.mark.parametrize("many", [False, True], ids=["get", "get_many"])
def test_concurrent_first_reads_of_old_only_keys_never_miss(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis, many: bool
) -> None:
    """3 processes x 6 threads read 200 keys only the old cache has, at once, 5 rounds."""
    entry, prefix = _site(cluster, old)
    ours_entry = ours(cluster, KEY_PREFIX=prefix)
    with site(ours_entry, entry):
        misses = _concurrent_reads(old, ours_entry, entry, many)
        reads = ROUNDS * HANDLES * THREADS * KEYS
        print(f"\n{len(misses)} misses of {reads} reads ({'get_many' if many else 'get'})")
        assert misses == []


def test_sessions_read_by_two_requests_at_once_stay_logged_in(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    """200 users logged in through the old cache; each one's first two requests on ours come
    at once: 400 requests, none logged out (a miss would make the session a new, empty one)."""
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        users = log_in(200)
        pair = threading.Barrier(2)
        logged_out: list[str] = []
        lock = threading.Lock()

        def request(session_key: str, user: str) -> None:
            client = Client()
            client.cookies["sessionid"] = session_key
            pair.wait(timeout=JOIN_S)
            response = client.get("/whoami")
            assert response.status_code == 200
            if response.json()["user"] != user:
                with lock:
                    logged_out.append(session_key)

        for session_key, user in users.items():
            pair.reset()
            with Workers(timeout=JOIN_S) as workers:
                workers.spawn(request, session_key, user)
                workers.spawn(request, session_key, user)
        print(f"\n{len(logged_out)} of {2 * len(users)} requests logged out")
        assert logged_out == []


def test_deletes_and_writes_racing_first_reads_are_final(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    """200 old-only keys; 6 threads read them all while 2 delete one half and 2 write new
    values over a quarter, at once: afterwards every acknowledged delete reads as a miss and
    every write reads its value, here and after the migration (no adopted old value undid
    either), and the old cache holds none of them."""
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        caches["old"].set_many(KEY_VALUES, timeout=600)
        names = list(KEY_VALUES)
        deleted, written = names[::2], names[1::4]
        start = threading.Barrier(10)

        def read() -> None:
            handle = caches["default"]
            start.wait(timeout=JOIN_S)
            for key in names:
                handle.get(key)
            handle.get_many(names)

        def delete(keys: list[str]) -> None:
            handle = caches["default"]
            start.wait(timeout=JOIN_S)
            for key in keys:
                handle.delete(key)

        def write(keys: list[str]) -> None:
            handle = caches["default"]
            start.wait(timeout=JOIN_S)
            for key in keys:
                handle.set(key, "new", 600)

        with Workers(timeout=JOIN_S) as workers:
            for _ in range(6):
                workers.spawn(read)
            workers.spawn(delete, deleted[::2])
            workers.spawn(delete, deleted[1::2])
            workers.spawn(write, written[::2])
            workers.spawn(write, written[1::2])
        cache = caches["default"]
        for when in ("after the race", "after the migration"):
            got = cache.get_many(names)
            undone = [key for key in deleted if key in got]
            overwritten = [key for key in written if got.get(key) != "new"]
            print(f"\n{when}: {len(undone)} deletes undone, {len(overwritten)} writes lost")
            assert undone == [] and overwritten == []
            migrate()
        left = {key.decode() for key in old_server.keys(f"{prefix}:*")}
        assert not left & {caches["old"].make_key(key) for key in deleted + written}


PAUSED_S = 30  # CLIENT PAUSE WRITE on the old server: far longer than the test takes
OLD_TIMEOUT_S = 0.3  # django-redis's socket timeout: a paused DEL fails after it


def test_a_fail_open_old_cache_that_cannot_delete_fails_the_write(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    """django-redis with IGNORE_EXCEPTIONS, its server refusing writes for a while (reads still
    served), and ours with IGNORE_EXCEPTIONS too (the runbook's settings): every delete and set
    raises, none is acknowledged, and once the pause ends and ours has expired every old value
    is still what a read returns (nothing acknowledged as deleted comes back)."""
    entry, prefix = _site(cluster, old, 1, IGNORE_EXCEPTIONS=True, SOCKET_TIMEOUT=OLD_TIMEOUT_S)
    fail_open = ours(cluster, KEY_PREFIX=prefix, OPTIONS={"IGNORE_EXCEPTIONS": True})
    with site(fail_open, entry):
        cache, previous = caches["default"], caches["old"]
        deleted = {f"d{i}": f"old{i}" for i in range(5)}
        expiring = {f"e{i}": f"old{i}" for i in range(5)}
        previous.set_many({**deleted, **expiring}, timeout=600)
        cache.has_key("-")  # connected: each shard's master known
        old_server.execute_command("CLIENT", "PAUSE", PAUSED_S * 1000, "WRITE")
        acknowledged: list[str] = []
        for key in deleted:
            try:
                cache.delete(key)
                acknowledged.append(key)
            except ShardUnavailableError as exc:
                assert "PREVIOUS_CACHE" in str(exc) and "CACHES['old']" in str(exc)
        for key in expiring:
            try:
                cache.set(key, "new", 1)
                acknowledged.append(key)
            except ShardUnavailableError as exc:
                assert "PREVIOUS_CACHE" in str(exc) and "CACHES['old']" in str(exc)
        old_server.execute_command("CLIENT", "UNPAUSE")
        for key in expiring:  # ours (if written, for 1 s) expired: wait until it is gone there
            made = cache.make_key(key)
            shard = cache.core.shard_for(made)
            deadline = time.monotonic() + 10
            # Only our 1-s write is waited for: a copy adopted from the old cache keeps its
            # 600-s TTL, and waiting for it to go cost the full 10 s a key (50 s of 56).
            while 0 < shard.client.pttl(made) <= 1000 and time.monotonic() < deadline:
                time.sleep(0.05)
        undone = [key for key in acknowledged if cache.get(key) is not None]
        print(f"\n{len(acknowledged)} of 10 writes acknowledged, {len(undone)} undone")
        assert acknowledged == [] and undone == []
        # The writes that raised left the old values where they were: still served.
        assert cache.get_many([*deleted, *expiring]) == {**deleted, **expiring}


@pytest.mark.parametrize("backend", [DJANGO_REDIS, "django.core.cache.backends.redis.RedisCache"])
def test_a_write_fails_when_the_old_cache_cannot_be_read(
    cluster: LocalSentinelCluster, backend: str
) -> None:
    """The old cache's server gone (nothing listens on its port): ``set`` and ``set_many``
    cannot move the old copies first, nor delete them, and raise ShardUnavailableError naming
    it and PREVIOUS_CACHE; nothing is written here."""
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    prefix = f"r{uuid.uuid4().hex[:8]}"
    entry: dict[str, Any] = {
        "BACKEND": backend,
        "LOCATION": f"redis://127.0.0.1:{port}/0",
        "KEY_PREFIX": prefix,
    }
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        cache = caches["default"]
        for write in (lambda: cache.set("k", "new", 60), lambda: cache.set_many({"k": "new"})):
            with pytest.raises(ShardUnavailableError) as raised:
                write()
            assert "PREVIOUS_CACHE" in str(raised.value) and "CACHES['old']" in str(raised.value)
        assert cache.client.get_many([cache.make_key("k")]) == {}  # ours, read plainly


def test_conditional_sets_see_the_old_value_as_add_does(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        cache, previous = caches["default"], caches["old"]
        previous.set_many({"xx": "old", "nx": "old", "add": "old", "gos": "old"}, timeout=600)
        assert cache.set("xx", "new", 60, xx=True) is True  # the old value counts as present
        assert cache.get("xx") == "new"
        assert cache.set("nx", "new", 60, nx=True) is False  # ... so nx refuses, as add does
        assert cache.get("nx") == "old"
        assert cache.add("add", "new") is False and cache.get("add") == "old"
        assert cache.get_or_set("gos", "computed") == "old"
        assert cache.set("absent", "new", 60, xx=True) is False and cache.get("absent") is None
        assert cache.set("absent", "new", 60, nx=True) is True and cache.get("absent") == "new"
        assert not old_server.keys(f"{prefix}:*")  # all moved or replaced


@contextmanager
def _read_between_forget_and_write(read: Callable[[], Any]) -> Iterator[list[Any]]:
    """``Adopter.forget`` patched: once it has deleted the old copies (the write's step before
    it writes ours), ``read`` runs in another thread and returns before the write goes on. The
    list holds what the read returned (an entry per forced interleaving)."""
    seen: list[Any] = []
    original = Adopter.forget
    between, done = threading.Event(), threading.Event()

    def forget(self: Adopter, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not between.is_set():  # the first write's only: the reader's own path never forgets
            between.set()
            assert done.wait(timeout=JOIN_S), "the reader did not run between the two steps"

    def reader() -> None:
        assert between.wait(timeout=JOIN_S), "no write reached its delete of the old copy"
        try:
            seen.append(read())
        finally:
            done.set()

    with mock.patch.object(Adopter, "forget", forget), Workers(timeout=JOIN_S) as workers:
        workers.spawn(reader)
        yield seen


@pytest.mark.parametrize(
    ("write", "read"),
    # Not aset with aget: both rules run in asgiref's one shared thread, so the read would
    # wait for the write it is to run inside.
    [("set", "get"), ("set", "get_many"), ("set_many", "get"), ("aset", "get"), ("set", "aget")],
)
def test_a_read_between_a_writes_delete_of_the_old_copy_and_its_write_finds_the_key(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis, write: str, read: str
) -> None:
    """A key only the old cache has, overwritten; a read forced between the write's delete of
    the old copy and its write here: it returns the old value (moved here before the delete),
    never a miss; the write then lands and the old cache holds nothing."""
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        caches["old"].set("k", "old", timeout=600)

        def get() -> Any:
            handle = caches["default"]  # the reader's own, as in a threaded server
            if read == "get_many":
                return handle.get_many(["k"]).get("k")
            if read == "aget":
                return asyncio.run(handle.aget("k"))
            return handle.get("k")

        cache = caches["default"]
        with _read_between_forget_and_write(get) as seen:
            if write == "set_many":
                assert cache.set_many({"k": "new", "k2": "new"}, 600) == []
            elif write == "aset":
                asyncio.run(cache.aset("k", "new", 600))
            else:
                cache.set("k", "new", 600)
        print(f"\n{write} racing {read}: the read between its steps returned {seen}")
        assert seen == ["old"]
        assert cache.get("k") == "new" and not old_server.keys(f"{prefix}:*")
        assert 0 < cache.ttl("k") <= 600


def test_flask_a_read_between_a_writes_delete_of_the_old_copy_and_its_write_finds_the_key(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    """Flask-Caching's RedisCache adopted: ``set`` and ``set_many`` of keys only it has, a
    ``get`` and a ``get_many`` forced between each write's two steps: the old values."""
    cache, previous, backend, key_prefix = _flask_site(cluster, old)
    try:
        previous.set_many({"a": "old-a", "b": "old-b"}, timeout=600)
        with _read_between_forget_and_write(lambda: cache.get("a")) as seen:
            assert cache.set("a", "new-a", timeout=600)
        with _read_between_forget_and_write(lambda: cache.get_many("b")) as seen_many:
            assert cache.set_many({"b": "new-b"}, timeout=600) == ["b"]
        print(f"\nFlask: the reads between the steps returned {seen}, {seen_many}")
        assert seen == ["old-a"] and seen_many == [["old-b"]]
        assert cache.get_many("a", "b") == ["new-a", "new-b"]
        assert not old_server.keys(f"{key_prefix}*")
    finally:
        _flask_done(backend, key_prefix)


def _counting_round_trips() -> Any:
    """Round trips of this thread from now on, to any server (ours and the old one): each
    outermost ``send_packed_command`` (a pipeline or transaction is one), whatever connection
    class sends it; other threads (the sentinel listeners) are not counted."""
    from sentinel_cache.core.topology import lean, near_tracking
    from sentinel_cache.core.topology._sync import connection

    counted: dict[str, Any] = {"trips": 0, "sent": []}  # "sent": each trip's first command
    me, depth = threading.get_ident(), threading.local()
    classes = [redis.connection.AbstractConnection] + [
        value
        for module in (lean, connection, near_tracking)
        for value in vars(module).values()
        if isinstance(value, type) and "send_packed_command" in vars(value)
    ]
    stack = ExitStack()

    def wrap(real: Any) -> Any:
        def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            level = getattr(depth, "level", 0)
            if level == 0 and threading.get_ident() == me:
                counted["trips"] += 1
                counted["sent"].append(repr(args[0])[:60] if args else "?")
            depth.level = level + 1
            try:
                return real(self, *args, **kwargs)
            finally:
                depth.level = level

        return send

    for cls in classes:
        stack.enter_context(
            mock.patch.object(cls, "send_packed_command", wrap(vars(cls)["send_packed_command"]))
        )
    return stack, counted


def test_what_a_write_costs_while_previous_cache_is_set(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    """docs/migration.md's figures: a write of S shards' keys costs its S round trips, plus
    the old cache's read and delete and the tombstones (S), plus, for keys the old cache holds,
    their TTL (1), the shards' clocks (S) and the copies (S)."""
    entry, prefix = _site(cluster, old)
    # A long SOCKET_TIMEOUT: a resend after a read stalled by a loaded machine is a trip more.
    with site(ours(cluster, KEY_PREFIX=prefix, OPTIONS={"SOCKET_TIMEOUT": 30}), entry):
        cache, previous = caches["default"], caches["old"]
        trips: dict[str, int] = {}
        sent: dict[str, list[str]] = {}  # for the failure message
        for tag in ("warm", "run"):  # the first pass opens each pool's connections
            one, ten = f"{tag}:one", {f"{tag}:{i}": "new" for i in range(10)}
            previous.set_many({one: "old", **dict.fromkeys(ten, "old")}, timeout=600)
            shards = len({cache.core.shard_for(cache.make_key(key)) for key in ten})
            writes: list[tuple[str, Any, tuple[Any, ...]]] = [
                ("set, on the old cache", cache.set, (one, "new", 600)),
                ("set, here", cache.set, (one, "newer", 600)),
                ("set, on neither", cache.set, (f"{tag}:absent", "new", 600)),
                ("set_many of 10, on the old cache", cache.set_many, (ten, 600)),
                ("set_many of 10, here", cache.set_many, (ten, 600)),
            ]
            stack, counted = _counting_round_trips()
            with stack:
                for what, write, args in writes:
                    counted["trips"], counted["sent"] = 0, []
                    write(*args)
                    trips[what], sent[what] = counted["trips"], counted["sent"]
            assert cache.get_many([one, *ten]) == {one: "newer", **ten}
        print(f"\nround trips while PREVIOUS_CACHE is set ({shards} shards for 10 keys): {trips}")
        assert trips == {
            "set, on the old cache": 1 + 6,
            "set, here": 1 + 3,
            "set, on neither": 1 + 3,
            "set_many of 10, on the old cache": shards + 3 + 3 * shards,
            "set_many of 10, here": shards + 2 + shards,
        }, sent
        assert not old_server.keys(f"{prefix}:*")


def _flask_site(cluster: LocalSentinelCluster, old: Old, **options: Any) -> tuple[Any, ...]:
    """A Flask app on ours adopting Flask-Caching's RedisCache on the old server: (our cache,
    the old one, our backend, the prefix both use)."""
    from flask import Flask
    from flask_caching import Cache

    host, port = old.address
    key_prefix = f"f{uuid.uuid4().hex[:8]}_"
    before = {
        "CACHE_TYPE": "RedisCache",
        "CACHE_REDIS_URL": f"redis://{host}:{port}/0",
        "CACHE_KEY_PREFIX": key_prefix,
    }
    old_app = Flask("before")
    old_app.config.update(before)
    previous = Cache(old_app)
    config = cluster.config()
    app = Flask("after")
    app.config.update(
        CACHE_TYPE="sentinel_cache.flask.ShardedSentinelCache",
        CACHE_REDIS_SENTINELS=config["sentinels"],
        CACHE_REDIS_SENTINEL_MASTERS=config["masters"],
        CACHE_REDIS_DB=OUR_DB,  # as the Django tests here: keys removed by prefix, never flushed
        CACHE_KEY_PREFIX=key_prefix,
        CACHE_OPTIONS={"PREVIOUS_CACHE": before, **options},
    )
    cache = Cache(app)
    return cache, previous, app.extensions["cache"][cache], key_prefix


def _flask_done(backend: Any, key_prefix: str) -> None:
    for shard in backend.core.shards:
        for stored in shard.client.scan_iter(match=f"{key_prefix}*"):
            shard.client.delete(stored)
    backend.core.close()


def _poison(server: redis.Redis, previous: Any, key: str) -> None:
    """A value django-redis's pickle cannot load, under its key."""
    server.set(previous.make_key(key), b"\x80\x05not a pickle")


def test_a_poison_value_is_skipped_and_the_migration_converges(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        cache, previous = caches["default"], caches["old"]
        keys = {f"m{i}": i * 3 + 1000 for i in range(2000)}
        previous.set_many(keys, timeout=600)
        _poison(old_server, previous, "poison")
        assert cache.get("poison") is None  # a miss to a reader, logged; not an error
        first = migrate("--batch", "500")["default"]
        print(f"\nfirst run: {first['moved']} moved; {first['shards'][0]['error']}")
        assert first["complete"] and first["moved"] == 2000
        (server,) = first["shards"]
        assert "1 keys skipped" in server["error"] and "'poison'" in server["error"]
        again = migrate()["default"]
        assert again["complete"] and again["scanned"] == 1 and again["moved"] == 0
        assert cache.get_many(list(keys)) == keys
        assert old_server.keys(f"{prefix}:*") == [previous.make_key("poison").encode()]
        cache.set("poison", "fixed")  # a write replaces it (the old copy deleted first)
        assert cache.get("poison") == "fixed" and not old_server.keys(f"{prefix}:*")


def test_the_report_names_the_first_100_skipped_keys_and_counts_the_others(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        previous = caches["old"]
        previous.set_many({f"good{i}": i for i in range(20)}, timeout=600)
        for i in range(105):
            _poison(old_server, previous, f"bad{i:03}")
        report = migrate()["default"]
        assert report["complete"] and report["moved"] == 20
        (server,) = report["shards"]
        named = re.findall(r"'bad\d{3}'", server["error"])
        assert server["error"].startswith("105 keys skipped")
        assert "(105 its backend cannot decode" in server["error"]
        assert len(named) == len(set(named)) == 100 and server["error"].endswith(" and 5 more")


VALUES = {
    "datetime": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
    "set": {1, 2, 3},
    "decimal": decimal.Decimal("1.10"),
    "bytes": b"\x00\xff raw",
}


def test_values_json_cannot_store_are_served_and_kept_and_a_tuple_reads_alike(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    """The old cache on pickle, ours on JSON: no read raises; what JSON cannot store is served
    as the old cache decodes it on every read (not copied, kept there); a tuple is a list from
    the first read on, as it is once on ours; the migration moves the tuple and names the
    others."""
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix, OPTIONS={"SERIALIZER": "json"}), entry):
        cache, previous = caches["default"], caches["old"]
        previous.set_many({**VALUES, "tuple": (1, 2)}, timeout=600)
        raised: list[str] = []
        for name, value in VALUES.items():
            for _ in range(2):
                try:
                    assert cache.get(name) == value
                except Exception as exc:  # counted: the test fails below naming them
                    raised.append(f"{name}: {type(exc).__name__}")
        print(f"\n{len(raised)} of {2 * len(VALUES)} reads raised: {raised}")
        assert raised == []
        assert [cache.get("tuple"), cache.get("tuple")] == [[1, 2], [1, 2]]
        report = migrate()["default"]
        assert report["complete"] and report["moved"] == 0  # the tuple was moved by its read
        (server,) = report["shards"]
        assert "4 keys skipped" in server["error"]
        assert all(repr(name) in server["error"] for name in VALUES)
        assert cache.get_many(list(VALUES)) == VALUES


def _held_on_old(old_server: redis.Redis, made: list[str]) -> list[str]:
    return [key for key, there in zip(made, old_server.mget(made), strict=True) if there]


def test_values_json_cannot_store_are_present_to_conditional_writes(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    """The old cache on pickle, ours on JSON: a value JSON cannot store is what ``get``
    returns, so ``add`` and ``set(nx=True)`` refuse it and leave it, the ``get_or_set`` twins
    return it without computing, ``set(xx=True)`` stores over it (the old copy gone); a value
    pickle cannot load is absent to all of them. Sync and async."""
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix, OPTIONS={"SERIALIZER": "json"}), entry):
        cache, previous = caches["default"], caches["old"]
        computed: list[str] = []

        def compute(name: str) -> Any:
            computed.append(name)
            return "computed"

        def held(keys: list[str]) -> list[str]:
            return _held_on_old(old_server, [previous.make_key(key) for key in keys])

        previous.set_many(VALUES, timeout=600)
        wrong: list[str] = []
        for name, value in VALUES.items():
            answers = {
                "add": cache.add(name, "new"),
                "set nx": cache.set(name, "new", 60, nx=True),
                "get_or_set": cache.get_or_set(name, lambda name=name: compute(name)),
                "get_or_set_many": cache.get_or_set_many({name: "new", "absent-" + name: 1}),
                "aadd": asyncio.run(cache.aadd(name, "new")),
                "aget_or_set": asyncio.run(cache.aget_or_set(name, "new")),
            }
            expected = {
                "add": False,
                "set nx": False,
                "get_or_set": value,
                "get_or_set_many": {name: value, "absent-" + name: 1},
                "aadd": False,
                "aget_or_set": value,
            }
            wrong += [
                f"{name} {op}: {answers[op]!r}" for op in answers if answers[op] != expected[op]
            ]
            if cache.get(name) != value:
                wrong.append(f"{name}: get after them {cache.get(name)!r}")
        print(f"\n{len(wrong)} wrong answers of {7 * len(VALUES)}: {wrong}")
        assert wrong == [] and computed == []
        assert held(list(VALUES)) == [previous.make_key(name) for name in VALUES]  # left there
        for name in VALUES:
            assert cache.set(name, "new", 60, xx=True) is True  # present: stored over it
            assert cache.get(name) == "new"
        assert held(list(VALUES)) == []
        # A value pickle cannot load: absent to every one of them (its old copy deleted).
        for name, write in {
            "p-add": lambda key: cache.add(key, "new") is True,
            "p-nx": lambda key: cache.set(key, "new", 60, nx=True) is True,
            "p-xx": lambda key: cache.set(key, "new", 60, xx=True) is False,
            "p-gos": lambda key: cache.get_or_set(key, lambda: compute(key)) == "computed",
        }.items():
            _poison(old_server, previous, name)
            assert write(name), name
            assert held([name]) == []
        assert computed == ["p-gos"]


def test_flask_values_json_cannot_store_are_present_to_add_and_get_or_set_many(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis
) -> None:
    """Flask-Caching's RedisCache (pickle) adopted by ours on JSON: ``add`` refuses a value
    JSON cannot store and leaves it, ``get_or_set_many`` returns it (the other keys added)."""
    cache, previous, backend, key_prefix = _flask_site(cluster, old, SERIALIZER="json")
    try:
        previous.set_many(VALUES, timeout=600)
        made = [f"{key_prefix}{name}" for name in VALUES]
        wrong: list[str] = []
        for name, value in VALUES.items():
            if cache.add(name, "new") is not False:
                wrong.append(f"{name} add")
            got = cache.cache.get_or_set_many({name: "new", "absent-" + name: 1})
            if got != {name: value, "absent-" + name: 1}:
                wrong.append(f"{name} get_or_set_many: {got!r}")
            if cache.get(name) != value:
                wrong.append(f"{name} get after them")
        print(f"\n{len(wrong)} wrong answers of {3 * len(VALUES)}: {wrong}")
        assert wrong == []
        assert _held_on_old(old_server, made) == made
        assert cache.set("set", "new") and cache.get("set") == "new"  # a write replaces it
    finally:
        _flask_done(backend, key_prefix)


if __name__ == "__main__":  # a reading process of test_concurrent_first_reads_...
    _reader_process(json.loads(sys.argv[1]))


@pytest.mark.parametrize("expiring", ["touch", "expire", "expire_at"])
def test_a_write_that_expires_an_adopted_key_is_not_undone_by_an_earlier_readers_copy(
    cluster: LocalSentinelCluster, old: Old, old_server: redis.Redis, expiring: str
) -> None:
    """A key only the old cache has. A reader reads its old value there; before the reader's
    copy lands here, a write that adopts first and expires the key at once (``touch(k, 0)``,
    django-redis's ``expire(k, 0)`` or ``expire_at`` in the past) adopts it and expires it.
    The reader's late copy must not bring the value back: the write leaves tombstones, as a
    delete does."""
    entry, prefix = _site(cluster, old)
    with site(ours(cluster, KEY_PREFIX=prefix), entry):
        caches["old"].set("k", "old", timeout=600)
        original = Adopter._written
        copying, expired = threading.Event(), threading.Event()
        readers: list[threading.Thread] = []

        def written(self: Adopter, *args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() in readers:  # the reader's copy: after the write
                copying.set()
                assert expired.wait(timeout=JOIN_S), "the expiring write did not end"
            return original(self, *args, **kwargs)

        def read() -> Any:
            readers.append(threading.current_thread())
            return caches["default"].get("k")

        cache = caches["default"]
        with mock.patch.object(Adopter, "_written", written), Workers(timeout=JOIN_S) as workers:
            workers.spawn(read)
            assert copying.wait(timeout=JOIN_S), "the reader never reached its copy"
            try:
                if expiring == "touch":
                    assert cache.touch("k", 0) is True
                elif expiring == "expire":
                    cache.expire("k", 0)
                else:
                    cache.expire_at("k", datetime.datetime.now() - datetime.timedelta(hours=1))
            finally:
                expired.set()
        got = cache.get("k")
        print(f"\n{expiring} racing a reader's copy: the key reads {got!r} afterwards")
        assert got is None
        assert not old_server.keys(f"{prefix}:*")
