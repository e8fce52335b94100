"""A key that holds a non-string value (a list, hash, ... written by someone else).

Decided behaviour, the same through every client and adapter: it reads as a miss (``get``
returns the default; ``get_many`` leaves it out, since ``MGET`` answers nil for it) and ``set``
overwrites it; ``has_key``, ``delete``, ``touch`` and ``ttl`` treat it as any key; ``incr``
raises the server's ``WRONGTYPE`` error (a ``redis.ResponseError``) and leaves the key alone.

Checked on a real server for the core sync client, the asyncio client, the Django backend (its
sync and its ``a``-prefixed methods) and the Flask backend; the list is put at the stored key
with a plain redis-py client on the key's shard master.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

HERE = Path(__file__).resolve().parent


def _support(name: str) -> ModuleType:
    """``tests/<dir>/<name>.py`` (not a package: see its docstring), as the module that
    directory's conftest imports under the same name."""
    module = sys.modules.get(name)
    if module is None:
        directory = name.split("_", 1)[0]
        spec = importlib.util.spec_from_file_location(name, HERE / directory / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


@dataclass
class Flavour:
    """One way of calling the cache: ``ops`` maps an operation to a callable (sync or async)
    taking the caller's key; ``stored`` gives the key the server sees."""

    core: ShardedSentinelPool
    db: int
    stored: Callable[[str], str]
    ops: dict[str, Callable[..., Any]]
    #: ``get_many``'s answer for these keys when ``found`` are found
    many: Callable[[list[str], dict[str, Any]], Any]
    #: ``get`` takes a default (Flask-Caching's does not)
    default: bool = True


async def _call(flavour: Flavour, op: str, *args: Any) -> Any:
    result = flavour.ops[op](*args)
    return await result if inspect.isawaitable(result) else result


def _as_dict(keys: list[str], found: dict[str, Any]) -> Any:
    return found


def _as_list(keys: list[str], found: dict[str, Any]) -> Any:
    return [found.get(key) for key in keys]


def _core_ops(client: Any) -> dict[str, Callable[..., Any]]:
    return {
        "get": client.get,
        "get_many": client.get_many,
        "set": lambda key, value: client.set(key, value, 300),
        "has_key": client.has_key,
        "delete": client.delete,
        "touch": client.touch,
        "ttl": client.ttl,
        "incr": client.incr,
    }


def _django_ops(cache: Any, prefix: str) -> dict[str, Callable[..., Any]]:
    names = ("get", "get_many", "set", "has_key", "delete", "touch", "ttl", "incr")
    return {name: getattr(cache, prefix + name) for name in names}


@pytest.fixture(params=["core", "aio", "django", "django_async", "flask"])
def flavour(request: pytest.FixtureRequest, cluster: LocalSentinelCluster) -> Iterator[Flavour]:
    kind = request.param
    run = f"wt:{uuid.uuid4().hex[:10]}:"
    if kind in ("core", "aio"):
        pool = ShardedSentinelPool(
            cluster.master_names, cluster.sentinel_addresses, listeners=False
        )
        client = (CacheClient if kind == "core" else AsyncCacheClient)(pool, Codec())
        ops = _core_ops(client)
        yield Flavour(pool, 0, str, ops, _as_dict)  # keys are stored as given
        pool.close()
    elif kind.startswith("django"):
        support = _support("django_support")
        support.configure_django()
        cache = support.build_cache(support.cache_entry(cluster, KEY_PREFIX=run))
        ops = _django_ops(cache, "a" if kind == "django_async" else "")
        yield Flavour(cache.core, support.DJANGO_DB, cache.make_key, ops, _as_dict)
        cache.clear()
        cache.core.close()
    else:
        support = _support("flask_support")
        _, _, backend = support.build_app(support.settings_for(cluster, CACHE_KEY_PREFIX=run))
        support.opened.pop(id(backend.core), None)
        ops = {
            "get": backend.get,
            "get_many": lambda keys: backend.get_many(*keys),
            "set": backend.set,
            "has_key": backend.has,
            "delete": backend.delete,
            "incr": backend.inc,  # Flask-Caching has no touch or ttl
        }
        stored = lambda key: run + key  # noqa: E731
        yield Flavour(backend.core, support.FLASK_DB, stored, ops, _as_list, default=False)
        backend.clear()
        backend.core.close()


def _direct(cluster: LocalSentinelCluster, flavour: Flavour, stored: str) -> redis.Redis:
    """A plain client on the master of ``stored``'s shard (the caller closes it)."""
    flavour.core.discover()
    address = flavour.core.shard_for(stored).address
    assert address is not None
    return cluster.node_client(address, db=flavour.db)


def test_a_key_holding_a_list(cluster: LocalSentinelCluster, flavour: Flavour) -> None:
    run = uuid.uuid4().hex[:10]
    key, other = f"wrongtype:{run}", f"wrongtype:{run}:neighbour"
    stored = flavour.stored(key)

    async def scenario(direct: redis.Redis) -> None:
        def put_list() -> None:
            direct.delete(stored)
            direct.rpush(stored, "written", "by", "someone else")

        assert await _call(flavour, "set", other, 1) is True
        put_list()
        # reads: a miss
        assert await _call(flavour, "get", key) is None
        if flavour.default:
            assert await _call(flavour, "get", key, "dflt") == "dflt"
        both = [key, other]
        assert await _call(flavour, "get_many", both) == flavour.many(both, {other: 1})
        # existence and expiry: as any key
        assert await _call(flavour, "has_key", key) is True
        if "ttl" in flavour.ops:
            assert await _call(flavour, "ttl", key) is None
            assert await _call(flavour, "touch", key, 100) is True
            assert 99 < await _call(flavour, "ttl", key) <= 100
            assert 99_000 < direct.pttl(stored) <= 100_000
        # incr: the server's error, and the list is left as it was
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            await _call(flavour, "incr", key)
        assert direct.type(stored) == b"list"
        assert direct.lrange(stored, 0, -1) == [b"written", b"by", b"someone else"]
        # delete: as any key
        assert await _call(flavour, "delete", key) is True
        assert direct.exists(stored) == 0
        assert await _call(flavour, "has_key", key) is False
        # set: overwrites it
        put_list()
        assert await _call(flavour, "set", key, {"mine": 1}) is True
        assert direct.type(stored) == b"string"
        assert await _call(flavour, "get", key) == {"mine": 1}
        found = {key: {"mine": 1}, other: 1}
        assert await _call(flavour, "get_many", both) == flavour.many(both, found)
        assert await _call(flavour, "delete", other) is True

    with closing(_direct(cluster, flavour, stored)) as direct:
        try:
            asyncio.run(scenario(direct))
        finally:
            direct.delete(stored)
