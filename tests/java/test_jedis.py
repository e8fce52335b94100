"""Real Jedis against a live topology (issue 38): docs/java.md's Java example, unchanged but for
the sentinel addresses, compiled and run against Jedis 3.9.0 beside the page's Python side; and a
Jedis 2.9.0 ``ShardedJedis`` (tests/java/ShardedDriver.java) sharing keys, plain values, integers
and TTLs with the Django and Flask caches, before and after a planned failover.

One topology for the module (masters ``shard_a``, ``shard_b``, the page's names); the failover
test comes last. Each ``javac`` runs once per session (CPU is scarce)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from jedis_support import ROOT, classpath, compile_java
from test_docs import extract_blocks, substitute
from waiting import wait_until

from sentinel_cache.django import ShardedSentinelCache as DjangoCache
from sentinel_cache.testing import LocalSentinelCluster

PAGE = ROOT / "docs" / "java.md"
MASTERS = ["shard_a", "shard_b"]
_JAVA_BLOCK = re.compile(r"^```java\n(?P<code>.*?)^```$", re.S | re.M)
TIMEOUT = 60  # seconds for one driver reply or one run of the example


class JedisDriver:
    """tests/java/ShardedDriver.java in a JVM of its own: one command a line, one reply a line."""

    def __init__(self, cp: str, sentinels: Sequence[str]) -> None:
        self.process = subprocess.Popen(
            [
                "java",
                "-Xshare:auto",
                "-cp",
                cp,
                "ShardedDriver",
                ",".join(MASTERS),
                ",".join(sentinels),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="ascii",
        )
        self.masters = self.ask("resolve").split()

    def __repr__(self) -> str:
        return f"JedisDriver(pid={self.process.pid}, masters={self.masters})"

    def ask(self, command: str, *args: bytes | str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        words = [command, *(a.hex() if isinstance(a, bytes) else a for a in args)]
        self.process.stdin.write(" ".join(words) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline().rstrip("\n")
        assert reply and not reply.startswith("error "), f"Jedis: {command}: {reply or 'no reply'}"
        return reply

    def where(self, keys: Sequence[str]) -> list[int]:
        return [int(i) for i in self.ask("where", *(k.encode() for k in keys)).split()]

    def set(self, pairs: dict[str, bytes], seconds: int | None = None) -> None:
        flat = [b for k, v in pairs.items() for b in (k.encode(), v)]
        if seconds is None:
            self.ask("set", *flat)
        else:
            self.ask("setex", str(seconds), *flat)

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        reply = self.ask("get", *(k.encode() for k in keys)).split()
        return [None if v == "-" else bytes.fromhex(v) for v in reply]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            assert self.process.wait(timeout=TIMEOUT) == 0
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            assert self.process.stdout is not None
            self.process.stdout.close()


@pytest.fixture(scope="module")
def topology(jars: Path) -> Iterator[LocalSentinelCluster]:
    with LocalSentinelCluster(shards=2, replicas=1, sentinels=3, master_names=MASTERS) as live:
        yield live


@pytest.fixture(scope="module")
def sentinels(topology: LocalSentinelCluster) -> list[str]:
    return list(topology.config()["sentinels"])


@pytest.fixture(scope="module")
def driver(sharded_driver: str, sentinels: list[str]) -> Iterator[JedisDriver]:
    jedis = JedisDriver(sharded_driver, sentinels)
    yield jedis
    jedis.close()


def django_cache(sentinels: Sequence[str], serializer: str) -> Any:
    return DjangoCache(
        list(sentinels),
        {
            "KEY_FUNCTION": "sentinel_cache.django.plain_key",
            "OPTIONS": {"MASTERS": MASTERS, "VALUE_FORMAT": "plain", "SERIALIZER": serializer},
        },
    )


def flask_cache(sentinels: Sequence[str], serializer: str) -> Any:
    from flask import Flask
    from flask_caching import Cache

    app = Flask(f"jedis_{serializer}")
    app.config.update(
        CACHE_TYPE="sentinel_cache.flask.ShardedSentinelCache",
        CACHE_REDIS_SENTINELS=list(sentinels),
        CACHE_REDIS_SENTINEL_MASTERS=MASTERS,
        CACHE_OPTIONS={"VALUE_FORMAT": "plain", "SERIALIZER": serializer},
        CACHE_KEY_PREFIX="",  # docs/java.md: Flask-Caching's default is "flask_cache_"
    )
    cache = Cache(app)
    return app.extensions["cache"][cache]


@pytest.fixture(scope="module")
def caches(sentinels: list[str]) -> Iterator[dict[str, Any]]:
    made = {
        f"{side}-{serializer}": build(sentinels, serializer)
        for side, build in (("django", django_cache), ("flask", flask_cache))
        for serializer in ("text", "json")
    }
    yield made
    for cache in made.values():
        cache.core.close()


def test_the_pages_java_example_runs_against_jedis_3_beside_its_python_side(
    jars: Path, sentinels: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The page's Python block runs (it cleans up after itself), then its cache and the page's
    Java class, unchanged but for the addresses, share the keys the comments promise."""
    (python,) = [b for b in extract_blocks(PAGE) if b.kind == "run"]
    namespace: dict[str, Any] = {"__name__": "__java_page__"}
    exec(compile(substitute(python.code, sentinels), str(PAGE), "exec"), namespace)
    cache = namespace["cache"]
    (java,) = _JAVA_BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    into = tmp_path_factory.mktemp("jedis-3.9.0")
    compile_java(substitute(java, sentinels), "SharedCache", classpath(jars, "3.9.0"), into)
    try:
        cache.set("profile:7", {"name": "Grace"}, timeout=300)
        cache.set("hits", 5)
        ran = subprocess.run(
            ["java", "-cp", classpath(jars, "3.9.0", into), "SharedCache"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert ran.returncode == 0, ran.stderr
        got, incremented, ttl = ran.stdout.splitlines()
        assert json.loads(got) == {"name": "Grace"}  # what Django stored: JSON text
        assert incremented == "6"  # Django's cache.set("hits", 5), then jedis.incr
        assert 0 < int(ttl) <= 300  # the timeout Django gave it
        assert cache.get("profile:42") == {"name": "Ada"}  # Java's setex, read by Django
        assert 0 < cache.core.client_for("profile:42").ttl("profile:42") <= 300
        assert cache.get("hits") == 6
    finally:
        cache.delete_many(["profile:7", "profile:42", "hits"])
        cache.core.close()


def _keys(prefix: str, count: int) -> list[str]:
    shapes = (f"{prefix}:{{}}", f"{prefix}:ключ:{{}}", f"{prefix}:user:{{}}:profile" + "x" * 40)
    return [shapes[i % len(shapes)].format(i) for i in range(count)]


def test_10000_keys_are_placed_alike_both_ways(driver: JedisDriver, caches: dict[str, Any]) -> None:
    cache = caches["django-text"]
    keys = _keys("place", 10_000)
    ours = [cache.core.shard_index(k) for k in keys]
    assert driver.where(keys) == ours
    assert set(ours) == {0, 1}
    java_wrote = {k: f"j{i}".encode() for i, k in enumerate(keys)}
    driver.set(java_wrote)
    read = cache.get_many(keys)  # a key on the shard our ring does not name would be a miss
    assert sum(read.get(k) == v.decode() for k, v in java_wrote.items()) == 10_000
    cache.set_many({k: f"p{i}" for i, k in enumerate(keys)})
    assert sum(v == f"p{i}".encode() for i, v in enumerate(driver.get(keys))) == 10_000
    cache.delete_many(keys)


VALUES = {
    "text": lambda i: f"text-{i}-ünïcödé ✓ {'x' * (i % 7)}",
    "json": lambda i: {"n": i, "s": f"v{i}-é", "list": [1, 2.5, None, True], "nested": {"i": -i}},
}


@pytest.mark.parametrize("name", ["django-text", "django-json", "flask-text", "flask-json"])
def test_plain_values_are_shared_both_ways(
    name: str, driver: JedisDriver, caches: dict[str, Any]
) -> None:
    cache, serializer = caches[name], name.split("-")[1]
    ours = {f"v:{name}:py:{i}": VALUES[serializer](i) for i in range(100)}
    for key, value in ours.items():
        assert cache.set(key, value)
    seen = driver.get(list(ours))
    if serializer == "text":
        assert sum(s == v.encode() for s, v in zip(seen, ours.values(), strict=True)) == 100
    else:
        assert (
            sum(
                s is not None and json.loads(s) == v
                for s, v in zip(seen, ours.values(), strict=True)
            )
            == 100
        )
    theirs = {f"v:{name}:java:{i}": VALUES[serializer](i) for i in range(100)}
    encode = (lambda v: v.encode()) if serializer == "text" else (lambda v: json.dumps(v).encode())
    driver.set({k: encode(v) for k, v in theirs.items()})
    assert sum(cache.get(k) == v for k, v in theirs.items()) == 100
    cache.delete_many(list(ours) + list(theirs)) if name.startswith(
        "django"
    ) else cache.delete_many(*ours, *theirs)


@pytest.mark.parametrize("name", ["django-json", "flask-text"])
def test_integers_and_ttls_are_shared(
    name: str, driver: JedisDriver, caches: dict[str, Any]
) -> None:
    cache, key = caches[name], f"n:{name}"
    increment = cache.incr if name.startswith("django") else cache.inc
    assert cache.set(key, 5) is not False
    assert driver.ask("incr", key.encode()) == "6"
    assert cache.get(key) == 6
    assert increment(key) == 7
    assert driver.get([key]) == [b"7"]
    assert cache.set(f"{key}:ttl", "t", timeout=300) is not False
    assert 0 < int(driver.ask("ttl", f"{key}:ttl".encode())) <= 300
    driver.set({f"{key}:java": b'"j"' if name.endswith("json") else b"j"}, seconds=200)
    assert cache.get(f"{key}:java") == "j"
    assert 0 < cache.core.client_for(f"{key}:java").ttl(f"{key}:java") <= 200
    for done in (key, f"{key}:ttl", f"{key}:java"):
        cache.delete(done)


def test_placement_and_values_hold_after_a_planned_failover(
    topology: LocalSentinelCluster, driver: JedisDriver, caches: dict[str, Any]
) -> None:
    cache = caches["django-text"]
    keys = _keys("failover", 1_000)
    before = {k: f"before-{i}" for i, k in enumerate(keys)}
    cache.set_many(before)
    topology.wait_for_replication("shard_a")
    old = topology.master_address("shard_a")
    topology.failover("shard_a")
    new = topology.wait_for_master_change("shard_a", old)
    shard = cache.core.shard("shard_a")
    wait_until(lambda: shard.address == new, 30, "the cache to follow +switch-master")
    assert driver.ask("resolve").split()[0] == "{}:{}".format(*new)  # the pool's view, again
    assert driver.where(keys) == [cache.core.shard_index(k) for k in keys]
    assert (
        sum(v == before[k].encode() for k, v in zip(keys, driver.get(keys), strict=True)) == 1_000
    )
    after = {k: f"after-{i}".encode() for i, k in enumerate(keys)}
    driver.set(after)
    read = cache.get_many(keys)
    assert sum(read.get(k) == v.decode() for k, v in after.items()) == 1_000
    cache.delete_many(keys)
