"""The contenders: one small adapter per cache, all with the same operations.

Each adapter wraps one cache the way an application would call it (Django ``BaseCache``,
Flask-Caching/cachelib backend, our core ``CacheClient``, or plain redis-py) and exposes
``get``, ``set``, ``get_many``, ``set_many``, ``delete_many`` and ``incr`` (plus ``aget`` and
``aset`` where the cache has an async API). Values always go through the cache's own
serializer, so pickling is part of every contender's cost, the raw redis-py floor included.

A contender whose module is missing or fails to build (a backend still being written) is
reported as skipped with the reason, and the run goes on without it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.sentinel import Sentinel

from benchmarks.contender import NODE_KWARGS, SENTINEL_KWARGS, TIMEOUT, Contender, Topology
from benchmarks.floor import floor_one, floor_sharded

__all__ = ["NODE_KWARGS", "SENTINEL_KWARGS", "TIMEOUT", "Contender", "Topology"]


class RedisPy(Contender):
    """Plain redis-py with pickled values: what a hand-written cache layer would do."""

    def __init__(self, client: redis.Redis, closers: Sequence[Callable[[], None]] = ()) -> None:
        self.client = client
        self._closers = list(closers)

    def get(self, key: str) -> Any:
        data = self.client.get(key)
        if data is None:
            return None
        return int(data) if data.isdigit() else pickle.loads(data)

    def set(self, key: str, value: Any) -> Any:
        data = value if type(value) is int else pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        return self.client.set(key, data, ex=TIMEOUT)

    def get_many(self, keys: Sequence[str]) -> Any:
        return {
            k: pickle.loads(v)
            for k, v in zip(keys, self.client.mget(keys), strict=True)
            if v is not None
        }

    def set_many(self, mapping: Mapping[str, Any]) -> Any:
        pipe = self.client.pipeline(transaction=False)
        for key, value in mapping.items():
            pipe.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=TIMEOUT)
        return pipe.execute()

    def delete_many(self, keys: Sequence[str]) -> Any:
        return self.client.delete(*keys)

    def incr(self, key: str) -> Any:
        return self.client.incrby(key, 1)

    def close(self) -> None:
        self.client.close()
        for close in self._closers:
            close()


class ShardedRedisPy(RedisPy):
    """Plain redis-py over every master, each key sent to the master our ring picks: the floor
    for a sharded cache (the same servers and key placement as ours, no library around it)."""

    def __init__(self, clients: Sequence[redis.Redis]) -> None:
        from sentinel_cache.core.ring import HashRing

        self.clients = list(clients)
        self.client = self.clients[0]
        self._closers = []
        self._index = HashRing([1] * len(self.clients)).shard_index

    def get(self, key: str) -> Any:
        data = self.clients[self._index(key)].get(key)
        if data is None:
            return None
        return int(data) if data.isdigit() else pickle.loads(data)

    def set(self, key: str, value: Any) -> Any:
        data = value if type(value) is int else pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        return self.clients[self._index(key)].set(key, data, ex=TIMEOUT)

    def _groups(self, keys: Sequence[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for key in keys:
            groups.setdefault(self._index(key), []).append(key)
        return groups

    def get_many(self, keys: Sequence[str]) -> Any:
        found = {}
        for index, group in self._groups(keys).items():  # one MGET per master, in turn
            for k, v in zip(group, self.clients[index].mget(group), strict=True):
                if v is not None:
                    found[k] = pickle.loads(v)
        return found

    def set_many(self, mapping: Mapping[str, Any]) -> Any:
        for index, group in self._groups(list(mapping)).items():
            pipe = self.clients[index].pipeline(transaction=False)
            for key in group:
                pipe.set(key, pickle.dumps(mapping[key], pickle.HIGHEST_PROTOCOL), ex=TIMEOUT)
            pipe.execute()

    def delete_many(self, keys: Sequence[str]) -> Any:
        return sum(self.clients[i].delete(*g) for i, g in self._groups(keys).items())

    def incr(self, key: str) -> Any:
        return self.clients[self._index(key)].incrby(key, 1)

    def close(self) -> None:
        for client in self.clients:
            client.close()


class RedisAsyncio(RedisPy):
    """redis.asyncio on one master for ``aget``/``aset`` (the async peer; its sync calls, used
    only to fill and probe, go through plain redis-py on the same master)."""

    has_async = True

    def __init__(self, host: str, port: int) -> None:
        import redis.asyncio

        super().__init__(redis.Redis(host=host, port=port, **NODE_KWARGS))
        self.aclient = redis.asyncio.Redis(host=host, port=port, **NODE_KWARGS)

    async def aget(self, key: str) -> Any:
        data = await self.aclient.get(key)
        if data is None:
            return None
        return int(data) if data.isdigit() else pickle.loads(data)

    async def aset(self, key: str, value: Any) -> Any:
        data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        return await self.aclient.set(key, data, ex=TIMEOUT)

    async def aclose(self) -> None:
        await self.aclient.aclose()  # its connections belong to the loop that ends


class DjangoCache(Contender):
    """Any Django ``BaseCache``: the calls a view makes (``cache.get(key)`` ...)."""

    def __init__(self, cache: Any, *, native_async: bool) -> None:
        self.cache = cache
        self.has_async = True
        self.native_async = native_async

    def get(self, key: str) -> Any:
        return self.cache.get(key)

    def set(self, key: str, value: Any) -> Any:
        return self.cache.set(key, value, TIMEOUT)

    def get_many(self, keys: Sequence[str]) -> Any:
        return self.cache.get_many(keys)

    def set_many(self, mapping: Mapping[str, Any]) -> Any:
        return self.cache.set_many(mapping, TIMEOUT)

    def delete_many(self, keys: Sequence[str]) -> Any:
        return self.cache.delete_many(keys)

    def incr(self, key: str) -> Any:
        return self.cache.incr(key)

    async def aget(self, key: str) -> Any:
        return await self.cache.aget(key)

    async def aset(self, key: str, value: Any) -> Any:
        return await self.cache.aset(key, value, TIMEOUT)

    def close(self) -> None:
        self.cache.close()


class FlaskCache(Contender):
    """A Flask-Caching/cachelib backend object (what ``Cache.get`` delegates to)."""

    def __init__(self, backend: Any, closers: Sequence[Callable[[], None]] = ()) -> None:
        self.backend = backend
        self._closers = list(closers)

    def get(self, key: str) -> Any:
        return self.backend.get(key)

    def set(self, key: str, value: Any) -> Any:
        return self.backend.set(key, value, TIMEOUT)

    def get_many(self, keys: Sequence[str]) -> Any:
        return self.backend.get_many(*keys)

    def set_many(self, mapping: Mapping[str, Any]) -> Any:
        return self.backend.set_many(mapping, TIMEOUT)

    def delete_many(self, keys: Sequence[str]) -> Any:
        return self.backend.delete_many(*keys)

    def incr(self, key: str) -> Any:
        return self.backend.inc(key)

    def close(self) -> None:
        for close in self._closers:
            close()


class CoreClient(Contender):
    """sentinel_cache's framework-free ``CacheClient`` (what both adapters call)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def get(self, key: str) -> Any:
        return self.client.get(key)

    def set(self, key: str, value: Any) -> Any:
        return self.client.set(key, value, TIMEOUT)

    def get_many(self, keys: Sequence[str]) -> Any:
        return self.client.get_many(keys)

    def set_many(self, mapping: Mapping[str, Any]) -> Any:
        return self.client.set_many(mapping, TIMEOUT)

    def delete_many(self, keys: Sequence[str]) -> Any:
        return self.client.delete_many(keys)

    def incr(self, key: str) -> Any:
        return self.client.incr(key)


# -- factories ---------------------------------------------------------------------------------


def ensure_django() -> None:
    """Minimal Django settings, so cache backends can be built directly (no project needed)."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(USE_TZ=True, INSTALLED_APPS=[], CACHES={})
        django.setup()


def _raw(topo: Topology) -> Contender:
    host, port = topo.master_addresses[0]
    return RedisPy(redis.Redis(host=host, port=port, **NODE_KWARGS))


def _redis_asyncio(topo: Topology) -> Contender:
    host, port = topo.master_addresses[0]
    return RedisAsyncio(host, port)


def _raw_sharded(topo: Topology) -> Contender:
    return ShardedRedisPy(
        [redis.Redis(host=h, port=p, **NODE_KWARGS) for h, p in topo.master_addresses]
    )


def _floor(topo: Topology, *, sharded: bool) -> Contender:
    return floor_sharded(topo) if sharded else floor_one(topo)


def _master_for(topo: Topology) -> Contender:
    sentinel = Sentinel(list(topo.sentinels), sentinel_kwargs=dict(SENTINEL_KWARGS), **NODE_KWARGS)
    client = sentinel.master_for(topo.masters[0])
    return RedisPy(client, [lambda: [s.close() for s in sentinel.sentinels]])


def _django_rediscache(topo: Topology) -> Contender:
    ensure_django()
    from django.core.cache.backends.redis import RedisCache

    host, port = topo.master_addresses[0]
    cache = RedisCache(f"redis://{host}:{port}/0", {"TIMEOUT": TIMEOUT})
    return DjangoCache(cache, native_async=False)


def _django_redis(topo: Topology, client_class: str) -> Contender:
    ensure_django()
    from django_redis.cache import RedisCache

    options: dict[str, Any] = {
        "CLIENT_CLASS": f"django_redis.client.{client_class}",
        "SOCKET_TIMEOUT": NODE_KWARGS["socket_timeout"],
        "SOCKET_CONNECT_TIMEOUT": NODE_KWARGS["socket_connect_timeout"],
    }
    location: Any
    if client_class == "DefaultClient":
        host, port = topo.master_addresses[0]
        location = f"redis://{host}:{port}/0"
    elif client_class == "ShardClient":
        location = [f"redis://{h}:{p}/0" for h, p in topo.master_addresses]
    else:  # SentinelClient: the URL's host is the master name
        location = f"redis://{topo.masters[0]}/0"
        options["CONNECTION_FACTORY"] = "django_redis.pool.SentinelConnectionFactory"
        options["SENTINELS"] = list(topo.sentinels)
        options["SENTINEL_KWARGS"] = dict(SENTINEL_KWARGS)
    cache = RedisCache(location, {"TIMEOUT": TIMEOUT, "OPTIONS": options})
    return DjangoCache(cache, native_async=False)


def _flask_sentinel(topo: Topology) -> Contender:
    from flask_caching.backends.rediscache import RedisSentinelCache

    backend = RedisSentinelCache(
        sentinels=list(topo.sentinels),
        master=topo.masters[0],
        default_timeout=TIMEOUT,
        # Its delete_many checks EXISTS on the replica, which may not have the DEL yet, and
        # then raises "Failed to delete keys": keep the check's cost, not the false alarm.
        ignore_delete_many_errors=True,
        sentinel_socket_timeout=SENTINEL_KWARGS["socket_timeout"],
        sentinel_socket_connect_timeout=SENTINEL_KWARGS["socket_connect_timeout"],
        **NODE_KWARGS,
    )
    return FlaskCache(backend)


def _ours_core(topo: Topology) -> Contender:
    from sentinel_cache.core.config import PoolConfig
    from sentinel_cache.core.ops.client import CacheClient
    from sentinel_cache.core.serializers import Codec
    from sentinel_cache.core.topology.sharded_pool import shared_pool

    pool = shared_pool(PoolConfig.create(list(topo.masters), topo.sentinel_strings))
    return CoreClient(CacheClient(pool, Codec()))


def _ours_django(topo: Topology) -> Contender:
    ensure_django()
    from sentinel_cache.django import ShardedSentinelCache

    cache = ShardedSentinelCache(
        topo.sentinel_strings, {"TIMEOUT": TIMEOUT, "OPTIONS": {"MASTERS": list(topo.masters)}}
    )
    return DjangoCache(cache, native_async=True)


def _ours_flask(topo: Topology) -> Contender:
    from sentinel_cache.flask import ShardedSentinelCache

    backend = ShardedSentinelCache(
        topo.sentinel_strings, {"MASTERS": list(topo.masters)}, default_timeout=TIMEOUT
    )
    return FlaskCache(backend)


@dataclass(frozen=True)
class Spec:
    """One contender: a stable id (JSON key), a label, how many masters it spreads keys over,
    whether it is this project, a note for the report, and how to build it."""

    id: str
    label: str
    masters: str
    ours: bool
    note: str
    build: Callable[[Topology], Contender]


SPECS: tuple[Spec, ...] = (
    Spec(
        "floor",
        "floor, 1 master",
        "1",
        False,
        "benchmarks/floor.py: blocking sockets, hiredis.Reader, RESP packed by hand, pickle",
        lambda t: _floor(t, sharded=False),
    ),
    Spec(
        "floor_sharded",
        "floor, 4 masters by our ring",
        "4",
        False,
        "the same on every master, keys placed as ours; every shard's batch sent before any "
        "reply is read. The reference of every ratio",
        lambda t: _floor(t, sharded=True),
    ),
    Spec("raw", "redis-py, 1 master", "1", False, "GET/SET + pickle", _raw),
    Spec(
        "raw_sharded",
        "redis-py, 4 masters by our ring",
        "4",
        False,
        "same servers and placement as ours, shards asked in turn",
        _raw_sharded,
    ),
    Spec(
        "redis_asyncio",
        "redis.asyncio, 1 master",
        "1",
        False,
        "async tables only: GET/SET + pickle on redis.asyncio",
        _redis_asyncio,
    ),
    Spec(
        "master_for",
        "redis-py Sentinel.master_for",
        "1",
        False,
        "SentinelConnectionPool",
        _master_for,
    ),
    Spec(
        "django_redis_cache",
        "Django RedisCache, 1 master",
        "1",
        False,
        "django.core.cache.backends.redis",
        _django_rediscache,
    ),
    Spec(
        "dr_default",
        "django-redis DefaultClient",
        "1",
        False,
        "",
        lambda t: _django_redis(t, "DefaultClient"),
    ),
    Spec(
        "dr_sentinel",
        "django-redis SentinelClient",
        "1",
        False,
        "SentinelConnectionFactory; reads go to a replica",
        lambda t: _django_redis(t, "SentinelClient"),
    ),
    Spec(
        "dr_shard",
        "django-redis ShardClient",
        "4",
        False,
        "no Sentinel; one command per key",
        lambda t: _django_redis(t, "ShardClient"),
    ),
    Spec(
        "flask_sentinel",
        "Flask-Caching RedisSentinelCache",
        "1",
        False,
        "reads go to a replica; ignore_delete_many_errors=True",
        _flask_sentinel,
    ),
    Spec("ours_core", "sentinel_cache CacheClient", "4", True, "the core", _ours_core),
    Spec(
        "ours_django",
        "sentinel_cache Django backend",
        "4",
        True,
        "sentinel_cache.django.ShardedSentinelCache",
        _ours_django,
    ),
    Spec(
        "ours_flask",
        "sentinel_cache Flask backend",
        "4",
        True,
        "sentinel_cache.flask.ShardedSentinelCache",
        _ours_flask,
    ),
)

SPEC_BY_ID = {spec.id: spec for spec in SPECS}
FLOORS = ("floor", "floor_sharded")  # neither ours nor peers: the least any client can do
ASYNC_ONLY = ("redis_asyncio",)  # measured in the async tables only (its sync calls are redis-py)
PEERS = tuple(spec.id for spec in SPECS if not spec.ours and spec.id not in FLOORS)


def build_all(
    topo: Topology, only: Sequence[str] | None = None
) -> tuple[dict[str, Contender], dict[str, str]]:
    """Build every contender; returns (built, skipped id -> reason)."""
    built: dict[str, Contender] = {}
    skipped: dict[str, str] = {}
    for spec in SPECS:
        if only and spec.id not in only:
            continue
        try:
            contender = spec.build(topo)
            contender.set("bench:probe", {"probe": 1})
            if contender.get("bench:probe") is None and spec.id not in (
                "dr_sentinel",
                "flask_sentinel",  # their reads go to a replica, which may lag a moment
            ):
                raise RuntimeError("a value just set reads back as a miss")
        except Exception as exc:  # a backend still being written must not stop the run
            skipped[spec.id] = f"{type(exc).__name__}: {exc}"
            continue
        built[spec.id] = contender
    return built, skipped
