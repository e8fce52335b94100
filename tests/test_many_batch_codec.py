"""Multi-key calls encode and decode every value of the call in one codec call
(:meth:`~sentinel_cache.core.serializers.Codec.dumps_each`, ``loads_each``): the same bytes and
values as one by one, in every codec configuration, and an unreadable value still costs only
itself (the call decodes one by one then). Against real servers for the client's side."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.exceptions import InvalidValueError, SerializationError
from sentinel_cache.testing import LocalSentinelCluster

KEY = b"k" * 32
CODECS = {
    "pickle": lambda: Codec(),
    "json": lambda: Codec("json"),
    "zlib": lambda: Codec(compressor="zlib", compress_min_length=1),
    "signed": lambda: Codec(signing_key=KEY),
    "plain": lambda: Codec(value_format="plain"),
    "pickle-2": lambda: Codec(pickle_protocol=2),
}
# ints in and out of 64 bits, None, text, a container: each takes its own branch of dumps.
VALUES: list[Any] = [0, -7, 2**63 - 1, 2**64, None, "text", "", ["a", 1, None], {"k": "v" * 50}]


@pytest.mark.parametrize("name", sorted(CODECS))
def test_each_is_one_by_one(name: str) -> None:
    codec = CODECS[name]()
    encoded = codec.dumps_each(VALUES)
    assert encoded == [codec.dumps(value) for value in VALUES]
    assert codec.loads_each([*encoded, None]) == [*VALUES, None]


@pytest.mark.parametrize("name", sorted(CODECS))
def test_loads_each_raises_what_loads_raises(name: str) -> None:
    codec = CODECS[name]()
    bad = b"\xfe\x10not a pickle"
    with pytest.raises(InvalidValueError) as one:
        codec.loads(bad)
    with pytest.raises(InvalidValueError) as each:
        codec.loads_each([codec.dumps("fine"), bad])
    assert str(each.value) == str(one.value)


def test_dumps_each_raises_what_dumps_raises() -> None:
    codec = Codec()
    with pytest.raises(SerializationError) as one:
        codec.dumps(lambda: None)
    with pytest.raises(SerializationError) as each:
        codec.dumps_each(["fine", lambda: None])
    assert type(each.value) is type(one.value)
    assert str(each.value) == str(one.value)


@pytest.fixture
def client(cluster: LocalSentinelCluster) -> Iterator[CacheClient]:
    with ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses) as pool:
        yield CacheClient(pool, Codec())


def _spread(client: CacheClient, prefix: str) -> tuple[list[str], str, str]:
    """Eight keys on at least two shards, and two of them (returned too) on one shard."""
    index = client.core.shard_index
    keys = [f"{prefix}:{i}" for i in range(7)]  # seven keys, four shards: two share one
    keys.append(
        next(
            f"{prefix}:x{i}" for i in itertools.count() if index(f"{prefix}:x{i}") != index(keys[0])
        )
    )
    by_shard: dict[int, list[str]] = {}
    for key in keys:
        by_shard.setdefault(index(key), []).append(key)
    first, second = next(group for group in by_shard.values() if len(group) >= 2)[:2]
    return keys, first, second


def test_get_many_keeps_every_readable_value_around_an_unreadable_one(
    client: CacheClient, caplog: pytest.LogCaptureFixture
) -> None:
    keys, bad, neighbour = _spread(client, f"batch:{uuid.uuid4().hex}")
    others = [key for key in keys if key not in (bad, neighbour)]
    mapping: dict[str, Any] = {key: {"n": i} for i, key in enumerate(keys)}
    mapping[others[0]] = None  # a stored None is found, as None
    mapping[others[1]] = 41  # stored raw
    assert client.set_many(mapping, 60) == []
    assert client.get_many(keys) == mapping  # every value decoded in one call
    client.get_client(bad).set(bad, b"\xfe\x10not a pickle")
    with caplog.at_level(logging.WARNING, logger="sentinel_cache"):
        found = client.get_many([*keys, f"{keys[0]}:absent"])
    assert found == {key: value for key, value in mapping.items() if key != bad}
    assert neighbour in found  # the bad value's own shard still answers for its other keys
    assert [r for r in caplog.records if repr(bad) in r.getMessage()], caplog.text
    assert client.incr(others[1]) == 42


def test_set_many_with_a_value_it_cannot_encode_sends_nothing(client: CacheClient) -> None:
    keys, _, _ = _spread(client, f"batch:{uuid.uuid4().hex}")
    mapping: dict[str, Any] = dict.fromkeys(keys, "value")
    mapping[keys[4]] = lambda: None
    with pytest.raises(SerializationError):
        client.set_many(mapping, 60)
    assert client.get_many(keys) == {}
