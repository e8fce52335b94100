"""``VALUE_FORMAT = "plain"`` (issue 25): the serializer's bare output, so a Java service (here
raw redis-py, standing in for Jedis, byte for byte) reads exactly what the cache stored and the
cache reads exactly what it stored; ``text`` and ``bytes`` serializers; the combinations that
cannot work refused naming the options."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from sentinel_cache import ConfigurationError, SerializationError
from sentinel_cache.core.config import parse_cache_config
from sentinel_cache.core.ops.client import CacheClient
from sentinel_cache.core.serializers import Codec, InvalidValueError, build_codec
from sentinel_cache.core.topology.sharded_pool import ShardedSentinelPool
from sentinel_cache.testing import LocalSentinelCluster

VALUES: dict[str, list[Any]] = {
    "text": ["hello", "", "ünïcödé ✓", "007", "-0", "4" * 30],
    "json": [{"a": [1, 2.5, None, True]}, [], "hello", 3.25, None],
    "bytes": [b"\x00\xff\xfe raw", b"", b"\xfe\x20\x22"],
}


@pytest.mark.parametrize("serializer", sorted(VALUES))
def test_plain_values_are_the_serializers_bare_output(serializer: str) -> None:
    codec = Codec(serializer, value_format="plain")
    for value in VALUES[serializer]:
        stored = codec.dumps(value)
        expected = {
            "text": lambda v: v.encode(),
            "json": lambda v: json.dumps(v, separators=(",", ":")).encode(),
            "bytes": lambda v: v,
        }[serializer](value)
        if serializer == "json":
            assert json.loads(stored) == value  # the bare JSON document
        else:
            assert stored == expected
        assert codec.loads(stored) == value


def test_integers_stay_plain_decimals_and_only_canonical_ones_read_as_int() -> None:
    codec = Codec("text", value_format="plain")
    assert codec.dumps(42) == 42 and codec.loads(b"42") == 42 and codec.loads(b"-7") == -7
    assert (
        codec.loads(b"007") == "007" and codec.loads(b"-0") == "-0" and codec.loads(b"4-") == "4-"
    )
    assert codec.loads(str(2**63).encode()) == str(2**63)  # past 64 bits: dumps never wrote it
    assert Codec("bytes", value_format="plain").loads(b"12") == 12


def test_plain_reads_only_its_own_serializer() -> None:
    framed = Codec("json").dumps({"x": 1})
    with pytest.raises(InvalidValueError, match="not json"):
        Codec("json", value_format="plain").loads(framed)
    with pytest.raises(InvalidValueError, match="not json"):
        Codec("json", value_format="plain").loads(b"hello")  # Java wrote text, not JSON
    with pytest.raises(InvalidValueError, match="not text"):
        Codec("text", value_format="plain").loads(b"\xff\xfe")  # not UTF-8
    # Plain pickle is django-redis's own format: each reads the other's values.
    assert Codec("pickle", value_format="plain").loads(pickle.dumps({"k": 1})) == {"k": 1}
    assert pickle.loads(Codec("pickle", value_format="plain").dumps({"k": 1})) == {"k": 1}


def test_text_and_bytes_refuse_other_types() -> None:
    for serializer, value in (("text", b"raw"), ("bytes", "str"), ("text", {"a": 1})):
        for value_format in ("plain", "framed"):
            with pytest.raises(SerializationError, match=f'SERIALIZER "{serializer}"'):
                Codec(serializer, value_format=value_format).dumps(value)
    framed = Codec("text")
    assert framed.loads(framed.dumps("hé")) == "hé"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"VALUE_FORMAT": "plain", "SIGNING_KEY": "0123456789abcdef-x"}, "SIGNING_KEY"),
        ({"VALUE_FORMAT": "plain", "COMPRESSOR": "zlib"}, "COMPRESSOR"),
        ({"VALUE_FORMAT": "bare"}, "VALUE_FORMAT"),
        ({"SERIALIZER": "yaml"}, "text"),
    ],
)
def test_impossible_combinations_are_refused_naming_the_options(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:  # parsed, then the codec built
        build_codec(parse_cache_config(["127.0.0.1:1"], {"MASTERS": ["a"], **options})[1])
    assert named in str(caught.value)


def test_raw_clients_and_the_cache_share_values_byte_for_byte(
    cluster: LocalSentinelCluster,
) -> None:
    """100 values each way per serializer: what the cache stores is exactly what a raw GET
    (Jedis's) returns, and what a raw SET stores is exactly what the cache returns."""
    pool = ShardedSentinelPool(cluster.master_names, cluster.sentinel_addresses, db=5)
    try:
        for serializer, make in (
            ("text", lambda i: f"text-{i}-é"),
            ("bytes", lambda i: bytes([i, 255 - i]) + b"raw"),
            ("json", lambda i: {"n": i, "s": f"v{i}"}),
        ):
            _, options = parse_cache_config(
                [f"{host}:{port}" for host, port in cluster.sentinel_addresses],
                {
                    "MASTERS": cluster.master_names,
                    "SERIALIZER": serializer,
                    "VALUE_FORMAT": "plain",
                },
            )
            cache = CacheClient(pool, build_codec(options))
            shards = set()
            for i in range(100):
                key, value = f"plain:{serializer}:{i}", make(i)
                assert cache.set(key, value, None)
                raw = pool.client_for(key).get(key)
                bare = json.dumps(value).encode() if serializer == "json" else value
                if serializer == "text":
                    bare = value.encode()
                assert (json.loads(raw) == value) if serializer == "json" else raw == bare
                other = f"java:{serializer}:{i}"
                pool.client_for(other).set(other, bare)  # what the Java side writes
                assert cache.get(other) == value
                shards.add(pool.shard_for(key).index)
            assert shards == {0, 1}
    finally:
        pool.close()
