"""Bad arguments are refused clearly, before anything is sent, the same in every flavour.

The rules are :mod:`sentinel_cache.core.arguments`; each is checked here through the core sync
client, the asyncio client (and a core with the near cache on, where a key is first looked up
locally), the Django backend (its sync and ``a``-prefixed methods) and the Flask backend, on the
shared topology:

* the error's type, and a message naming the argument and its value;
* nothing sent: the data commands counted by every master's ``INFO commandstats`` do not move
  (the sentinels and replicas send none of them), and a value stored first is read back as it
  was, with its TTL;
* the client works afterwards.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import math
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from sentinel_cache import (
    ArgumentTypeError,
    ArgumentValueError,
    ConfigurationError,
    IncrementError,
    InvalidArgumentError,
    SentinelCacheError,
)
from sentinel_cache.core.arguments import MAX_TIMEOUT
from sentinel_cache.core.ops.aio import AsyncCacheClient
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

try:
    from sentinel_cache.django import InvalidKeyError
except ModuleNotFoundError:  # a cell without Django: its flavours are not run there
    InvalidKeyError = ArgumentValueError  # type: ignore[misc, assignment]

HERE = Path(__file__).resolve().parent

# Every command an operation of ours may send for a key (reads too: nothing at all is sent).
DATA_COMMANDS = (
    "get", "mget", "set", "mset", "msetex", "del", "unlink", "exists", "pexpire", "persist",
    "pttl", "incrby", "eval", "evalsha", "wait",
)  # fmt: skip

BAD_TIMEOUTS: list[tuple[Any, type[InvalidArgumentError], str]] = [
    (math.nan, ArgumentValueError, "finite"),
    (math.inf, ArgumentValueError, "finite"),
    (-math.inf, ArgumentValueError, "finite"),
    (10**17, ArgumentValueError, "at most"),
    (MAX_TIMEOUT + 1, ArgumentValueError, "at most"),
    (float(MAX_TIMEOUT) * 2, ArgumentValueError, "at most"),
    ("5", ArgumentTypeError, "number of seconds"),
    (True, ArgumentTypeError, "not a bool"),
    (b"5", ArgumentTypeError, "number of seconds"),
]
BAD_DELTAS: list[tuple[Any, type[InvalidArgumentError]]] = [
    ("2", ArgumentTypeError),
    (None, ArgumentTypeError),
    (2.5, ArgumentTypeError),
    (True, ArgumentTypeError),
    (2**63, ArgumentValueError),
    (-(2**63) - 1, ArgumentValueError),
]
SURROGATE = "bad\udc80key"


def _support(name: str) -> ModuleType:
    """``tests/<dir>/<name>.py`` under the module name that directory's conftest uses."""
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
    """One way of calling the cache, by operation name (sync or async callables taking the
    caller's key); ``stored`` gives the key the server sees."""

    name: str
    core: ShardedSentinelPool
    db: int
    stored: Callable[[str], str]
    ops: dict[str, Callable[..., Any]]
    #: the keys the flavour's make-key step does not turn into a str, with their error
    bad_keys: list[tuple[Any, type[Exception]]] = field(default_factory=list)
    key_error: type[Exception] = ArgumentValueError


def _run(flavour: Flavour, op: str, *args: Any) -> Any:
    result = flavour.ops[op](*args)
    if inspect.isawaitable(result):
        return asyncio.run(_awaited(result))
    return result


async def _awaited(result: Any) -> Any:
    return await result


def _core_ops(client: Any) -> dict[str, Callable[..., Any]]:
    return {
        "get": client.get,
        "set": client.set,
        "add": client.add,
        "touch": client.touch,
        "expire": client.expire,
        "has_key": client.has_key,
        "delete": client.delete,
        "incr": client.incr,
        "ttl": client.ttl,
        "get_many": client.get_many,
        "set_many": client.set_many,
        "get_or_set_many": client.get_or_set_many,
        "delete_many": client.delete_many,
    }


def _django_ops(cache: Any, a: str) -> dict[str, Callable[..., Any]]:
    names = (
        "get", "set", "add", "touch", "expire", "has_key", "delete", "incr", "decr", "ttl",
        "get_many", "set_many", "get_or_set_many", "delete_many", "get_or_set",
    )  # fmt: skip
    return {name: getattr(cache, a + name) for name in names}


def _flask_ops(backend: Any) -> dict[str, Callable[..., Any]]:
    return {
        "get": backend.get,
        "set": backend.set,
        "add": backend.add,
        "has_key": backend.has,
        "delete": backend.delete,
        "incr": backend.inc,
        "decr": backend.dec,
        "get_many": lambda keys: backend.get_many(*keys),
        "set_many": backend.set_many,
        "get_or_set_many": backend.get_or_set_many,
        "delete_many": lambda keys: backend.delete_many(*keys),
    }


@pytest.fixture(params=["core", "aio", "near", "django", "django_async", "flask"])
def flavour(request: pytest.FixtureRequest, cluster: LocalSentinelCluster) -> Iterator[Flavour]:
    kind = request.param
    run = f"bad:{uuid.uuid4().hex[:10]}:"
    core_keys = [(["a", "list"], ArgumentTypeError), (5, ArgumentTypeError), (None, TypeError)]
    if kind in ("core", "aio", "near"):
        pool = ShardedSentinelPool(
            cluster.master_names,
            cluster.sentinel_addresses,
            listeners=False,
            near_cache=kind == "near",
        )
        client = (AsyncCacheClient if kind == "aio" else CacheClient)(pool, Codec())
        ops = _core_ops(client)
        stored = lambda key: run + key  # noqa: E731
        ops = {name: _prefixed(op, run, name.endswith("_many")) for name, op in ops.items()}
        yield Flavour(kind, pool, 0, stored, ops, core_keys)
        pool.close()
    elif kind.startswith("django"):
        support = _support("django_support")
        support.configure_django()
        cache = support.build_cache(support.cache_entry(cluster, KEY_PREFIX=run))
        ops = _django_ops(cache, "a" if kind == "django_async" else "")
        yield Flavour(kind, cache.core, support.DJANGO_DB, cache.make_key, ops, [], InvalidKeyError)
        cache.clear()
        cache.core.close()
    else:
        support = _support("flask_support")
        _, _, backend = support.build_app(support.settings_for(cluster, CACHE_KEY_PREFIX=run))
        support.opened.pop(id(backend.core), None)
        yield Flavour(
            kind, backend.core, support.FLASK_DB, lambda key: run + key, _flask_ops(backend)
        )
        backend.clear()
        backend.core.close()


def _prefixed(op: Callable[..., Any], run: str, many: bool) -> Callable[..., Any]:
    """A core operation with this run's prefix put on str keys (the core takes keys as they
    are stored); other keys (the bad ones) go as they are."""

    def fix(key: Any) -> Any:
        return run + key if type(key) is str else key

    def call(first: Any, *args: Any) -> Any:
        if many and isinstance(first, dict):
            first = {fix(key): value for key, value in first.items()}
        elif many:
            first = [fix(key) for key in first]
        else:
            first = fix(first)
        return op(first, *args)

    return call


class Masters:
    """Plain clients on every master, to read keys and count the data commands they ran."""

    def __init__(self, cluster: LocalSentinelCluster, flavour: Flavour) -> None:
        flavour.core.discover()
        self.flavour = flavour
        self.clients = [
            cluster.node_client(cluster.master_address(name), db=flavour.db)
            for name in cluster.master_names
        ]

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def commands(self) -> int:
        total = 0
        for client in self.clients:
            stats = client.info("commandstats")
            total += sum(
                int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in DATA_COMMANDS
            )
        return total

    def raw(self, key: str) -> tuple[bytes | None, int]:
        """The stored bytes and PTTL of ``key`` (the caller's key), on its shard's master."""
        stored = self.flavour.stored(key)
        index = self.flavour.core.shard_index(stored)
        client = self.clients[index]
        return client.get(stored), client.pttl(stored)


@pytest.fixture
def masters(cluster: LocalSentinelCluster, flavour: Flavour) -> Iterator[Masters]:
    made = Masters(cluster, flavour)
    yield made
    made.close()


def _refused(
    masters: Masters, flavour: Flavour, kind: type[Exception], op: str, *args: Any
) -> Exception:
    """``op(*args)`` raises ``kind`` and sends no data command."""
    before = masters.commands()
    with pytest.raises(kind) as caught:
        _run(flavour, op, *args)
    assert masters.commands() == before, f"{op}{args!r} sent commands before refusing"
    return caught.value


def _still_works(flavour: Flavour) -> None:
    key = f"after-{uuid.uuid4().hex[:6]}"
    assert _run(flavour, "set", key, {"fine": 1}, 60) is True
    assert _run(flavour, "get", key) == {"fine": 1}
    assert _run(flavour, "delete", key) is True


def _timeout_calls(flavour: Flavour, key: str, bad: Any) -> list[tuple[str, tuple[Any, ...]]]:
    calls = [
        ("set", (key, "new", bad)),
        ("add", (key, "new", bad)),
        ("add", (key + ":absent", "new", bad)),
        ("set_many", ({key: "new", key + ":other": "new"}, bad)),
        ("get_or_set_many", ({key: "new", key + ":absent": "new"}, bad)),
    ]
    if "touch" in flavour.ops:
        calls += [("touch", (key, bad)), ("expire", (key, bad))]
    if "get_or_set" in flavour.ops:
        calls.append(("get_or_set", (key, "new", bad)))
    return calls


@pytest.mark.parametrize(("bad", "kind", "reason"), BAD_TIMEOUTS, ids=repr)
def test_a_bad_timeout_is_refused_before_anything_is_sent(
    flavour: Flavour, masters: Masters, bad: Any, kind: type[InvalidArgumentError], reason: str
) -> None:
    key = f"t-{uuid.uuid4().hex[:8]}"
    assert _run(flavour, "set", key, "old", 100) is True
    before = masters.raw(key)
    assert before[0] is not None and 99_000 < before[1] <= 100_000
    for op, args in _timeout_calls(flavour, key, bad):
        error = _refused(masters, flavour, kind, op, *args)
        assert isinstance(error, SentinelCacheError)
        assert error.argument == "timeout" and error.value is bad
        assert str(error).startswith("timeout: ") and reason in str(error)
        assert repr(bad) in str(error), str(error)
        value, ttl = masters.raw(key)
        assert value == before[0], f"{op} changed the stored value"
        assert before[1] - 5_000 < ttl <= before[1], f"{op} changed the TTL"
    assert _run(flavour, "get", key) == "old"
    assert _run(flavour, "get_many", [key + ":absent", key + ":other"]) in ({}, [None, None])
    _still_works(flavour)


def test_the_longest_timeout_reaches_the_server(flavour: Flavour, masters: Masters) -> None:
    """MAX_TIMEOUT itself is taken by the server (the bound is within its range)."""
    key = f"max-{uuid.uuid4().hex[:8]}"
    assert _run(flavour, "set", key, "kept", MAX_TIMEOUT) is True
    value, ttl = masters.raw(key)
    assert value is not None and MAX_TIMEOUT * 1000 - 60_000 < ttl <= MAX_TIMEOUT * 1000
    many = {key + ":a": 1, key + ":b": 2}
    assert _run(flavour, "set_many", many, MAX_TIMEOUT) in ([], list(many))
    assert masters.raw(key + ":a")[1] > MAX_TIMEOUT * 1000 - 60_000
    if "touch" in flavour.ops:
        assert _run(flavour, "touch", key, MAX_TIMEOUT) is True
    _run(flavour, "delete_many", [key, *many])


@pytest.mark.parametrize(("bad", "kind"), BAD_DELTAS, ids=repr)
def test_a_bad_delta_is_refused_before_anything_is_sent(
    flavour: Flavour, masters: Masters, bad: Any, kind: type[InvalidArgumentError]
) -> None:
    key = f"d-{uuid.uuid4().hex[:8]}"
    assert _run(flavour, "set", key, 5, 100) is True
    for op in ("incr", "decr") if "decr" in flavour.ops else ("incr",):  # the core has incr
        error = _refused(masters, flavour, kind, op, key, bad)
        assert isinstance(error, InvalidArgumentError) and error.argument == "delta"
        assert str(error).startswith("delta: ") and repr(bad) in str(error), str(error)
    assert _run(flavour, "get", key) == 5
    assert _run(flavour, "incr", key, 2) == 7
    _still_works(flavour)


def test_incr_of_a_value_that_is_not_an_integer_names_the_key(
    flavour: Flavour, masters: Masters
) -> None:
    key = f"i-{uuid.uuid4().hex[:8]}"
    big = f"{key}:big"
    assert _run(flavour, "set", key, "text", 100) is True
    assert _run(flavour, "set", big, 2**63 - 1, 100) is True
    stored = flavour.stored(key)
    for op in ("incr", "decr") if "decr" in flavour.ops else ("incr",):
        with pytest.raises(IncrementError) as caught:
            _run(flavour, op, key)
        message = str(caught.value)
        assert repr(stored) in message and "not an integer" in message, message
        assert "script" not in message, message
        assert isinstance(caught.value, redis.ResponseError) and isinstance(caught.value, TypeError)
    # Past 64 bits the sum is Python's, written back atomically (django-redis's fallback).
    assert _run(flavour, "incr", big) == 2**63
    assert _run(flavour, "get", key) == "text"
    assert _run(flavour, "get", big) == 2**63
    _still_works(flavour)


def _key_calls(bad: Any, good: str) -> list[tuple[str, tuple[Any, ...]]]:
    calls = [
        ("get", (bad,)),
        ("set", (bad, "new", 60)),
        ("add", (bad, "new", 60)),
        ("set", (bad, "new", 0)),  # an expired-at-once set deletes: refused all the same
        ("has_key", (bad,)),
        ("delete", (bad,)),
        ("incr", (bad, 1)),
        ("get_many", ([good, bad],)),
        ("delete_many", ([good, bad],)),
    ]
    if not isinstance(bad, list):  # a list cannot be a dict key: the caller's own TypeError
        calls += [
            ("set_many", ({good: "new", bad: "new"}, 60)),
            ("set_many", ({good: "new", bad: "new"}, -1)),  # deletes: refused before any
            ("get_or_set_many", ({good: "new", bad: "new"}, 60)),
        ]
    return calls


def test_a_key_that_cannot_be_sent_gets_the_key_error(flavour: Flavour, masters: Masters) -> None:
    good = f"k-{uuid.uuid4().hex[:8]}"
    assert _run(flavour, "set", good, "old", 100) is True
    for bad, kind in [(SURROGATE, flavour.key_error), *flavour.bad_keys]:
        for op, args in _key_calls(bad, good):
            error = _refused(masters, flavour, kind, op, *args)
            if bad is None:  # a None key is the core's key error too
                assert isinstance(error, ArgumentTypeError)
            assert isinstance(error, InvalidArgumentError) and error.argument == "key"
            assert str(error).startswith("key: ")
            shown = repr(bad) if bad is not SURROGATE else repr(SURROGATE)[1:-1]
            assert shown in str(error), str(error)
            assert masters.raw(good)[0] is not None and _run(flavour, "get", good) == "old"
    if flavour.name.startswith("django"):
        from django.core.cache.backends.base import InvalidCacheKey

        assert issubclass(flavour.key_error, InvalidCacheKey)
    _still_works(flavour)


def test_a_flask_default_timeout_beyond_the_servers_range_is_a_configuration_error(
    cluster: LocalSentinelCluster,
) -> None:
    support = _support("flask_support")
    with pytest.raises(ConfigurationError) as caught:
        support.build_app(support.settings_for(cluster, CACHE_DEFAULT_TIMEOUT=MAX_TIMEOUT + 1))
    assert caught.value.option == "CACHE_DEFAULT_TIMEOUT"
    assert str(MAX_TIMEOUT + 1) in str(caught.value)
    _, _, backend = support.build_app(
        support.settings_for(cluster, CACHE_DEFAULT_TIMEOUT=MAX_TIMEOUT)
    )
    support.opened.pop(id(backend.core), None)
    backend.core.close()
    assert backend.default_timeout == MAX_TIMEOUT
