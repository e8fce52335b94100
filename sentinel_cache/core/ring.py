"""Consistent-hash ring that places keys exactly where Java Jedis ``ShardedJedis`` places them.

A Python service and a Java service sharing the same sharded Redis masters must agree on which
shard holds each key, otherwise one side misses (or, worse, shadows) the other's entries. This
module reproduces Jedis 2.x/3.x ``Sharded`` with ``Hashing.MURMUR_HASH`` bit for bit: unnamed
shards, no key-tag pattern, 160 virtual nodes per unit of weight.
"""

from __future__ import annotations

import functools
import struct
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from sentinel_cache.core.arguments import key_type_error
from sentinel_cache.exceptions import ConfigurationError

__all__ = [
    "HASH_SPACE",
    "HIGHEST_HASH",
    "LOWEST_HASH",
    "NODES_PER_WEIGHT",
    "HashRing",
    "murmur64a",
    "ring_nodes",
]

_SEED = 0x1234ABCD  # Jedis MurmurHash.hash(byte[]) seed
_M = 0xC6A4A7935BD1E995
_MASK = 0xFFFFFFFFFFFFFFFF
_SIGN = 0x8000000000000000
NODES_PER_WEIGHT = 160  # Jedis Sharded: 160 * weight virtual nodes per shard
#: The hashes run from LOWEST_HASH to HIGHEST_HASH (signed 64-bit): HASH_SPACE values in all.
LOWEST_HASH, HIGHEST_HASH = -(1 << 63), (1 << 63) - 1
HASH_SPACE = float(1 << 64)
_CACHE_SIZE = 65536

K = TypeVar("K", bound="str | bytes")


def murmur64a(data: bytes) -> int:
    """Return MurmurHash64A of ``data`` as a signed 64-bit int, like Jedis's ``long``.

    Signed because Jedis orders ring nodes in a ``TreeMap<Long>``; unsigned order would differ.
    """
    m = _M
    mask = _MASK
    length = len(data)
    nblocks = length >> 3
    h = (_SEED ^ (length * m)) & mask
    if nblocks:
        # One unpack for all blocks is much cheaper than slicing 8 bytes at a time.
        for k in struct.unpack_from(f"<{nblocks}Q", data):
            k = (k * m) & mask
            k ^= k >> 47  # MurmurHash64A's r
            h = ((h ^ ((k * m) & mask)) * m) & mask
    if length & 7:
        h = ((h ^ int.from_bytes(data[nblocks << 3 :], "little")) * m) & mask
    h ^= h >> 47
    h = (h * m) & mask
    h ^= h >> 47
    return h - (1 << 64) if h & _SIGN else h


def _encode(key: str) -> bytes:
    """Encode like Java ``String.getBytes(UTF-8)``: lone surrogates become ``?``, never an error.

    Python strs can hold surrogates (e.g. from ``surrogateescape``) that strict UTF-8 refuses;
    Java encodes a valid surrogate pair as one code point and any lone surrogate as ``?``.
    """
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError:
        # Round-trip through UTF-16 to join valid pairs, then replace what is left alone.
        joined = key.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        return joined.encode("utf-8", "replace")


def is_valid_weight(weight: object) -> bool:
    """The one rule for a shard's weight, here and in the configuration parser: a positive int.

    bool is an int subclass, but True as a weight is almost certainly a config mistake.
    """
    return isinstance(weight, int) and not isinstance(weight, bool) and weight > 0


def _validate_weights(weights: Sequence[int]) -> tuple[int, ...]:
    """Reject what Jedis would silently turn into an empty or lopsided ring."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Iterable):
        raise ConfigurationError(f"weights must be a sequence of positive ints, got {weights!r}")
    values = tuple(weights)
    if not values:
        raise ConfigurationError(f"weights must not be empty, got {weights!r}")
    for i, w in enumerate(values):
        if not is_valid_weight(w):
            raise ConfigurationError(
                f"weights[{i}] must be a positive int, got {w!r} (weights={values!r})"
            )
    return values


def ring_nodes(weights: Sequence[int]) -> list[tuple[int, int]]:
    """(hash, shard index) of every virtual node of the ring for ``weights``, sorted by hash.

    Shard ``i`` has ``160 * weights[i]`` nodes hashed from ``"SHARD-{i}-NODE-{n}"``; on a hash
    collision the later node wins (dict assignment reproduces Jedis's ``TreeMap.put``).
    """
    nodes: dict[int, int] = {}
    for i, w in enumerate(weights):
        for n in range(NODES_PER_WEIGHT * w):
            nodes[murmur64a(f"SHARD-{i}-NODE-{n}".encode("ascii"))] = i
    return sorted(nodes.items())


class HashRing:
    """Maps keys to shard indexes ``0..N-1`` exactly as Jedis ``ShardedJedis`` does.

    Shard ``i`` contributes ``160 * weights[i]`` virtual nodes hashed from
    ``"SHARD-{i}-NODE-{n}"``; a key belongs to the first node at or after its hash, wrapping
    around. Shard order therefore matters and must match the Java side's shard list.
    """

    __slots__ = ("_weights", "_node_count", "_lookup", "_hashes", "_shards")

    def __init__(self, weights: Sequence[int]) -> None:
        self._weights = _validate_weights(weights)
        nodes = ring_nodes(self._weights)
        self._hashes = [h for h, _ in nodes]
        self._shards = [i for _, i in nodes]
        self._node_count = len(nodes)
        self._lookup = self._make_lookup(self._hashes, self._shards)

    @staticmethod
    def _make_lookup(
        node_hashes: list[int], node_shards: list[int]
    ) -> Callable[[str | bytes], int]:
        """Build a per-instance LRU-cached lookup (a class-level cache would mix rings up).

        The closure captures only the lists, not ``self``, so no reference cycle keeps a
        discarded ring alive.
        """
        count = len(node_hashes)
        first = node_shards[0]

        @functools.lru_cache(maxsize=_CACHE_SIZE)
        def lookup(key: str | bytes) -> int:
            data = _encode(key) if isinstance(key, str) else key
            # tailMap(hash).firstKey(): first node >= hash, else wrap to the smallest node.
            pos = bisect_left(node_hashes, murmur64a(data))
            return node_shards[pos] if pos < count else first

        return lookup

    def shard_index(self, key: str | bytes) -> int:
        """Return the index of the shard that owns ``key`` (str is hashed as its UTF-8 bytes)."""
        if type(key) is not str and type(key) is not bytes:
            key = _coerce_key(key)
        return self._lookup(key)

    def uncached_index(self, data: bytes) -> int:
        """:meth:`shard_index` of a bytes key without the LRU cache: for keys seen once each (a
        scan), which would only evict the hot ones from it."""
        pos = bisect_left(self._hashes, murmur64a(data))
        return self._shards[pos] if pos < self._node_count else self._shards[0]

    def group_by_shard(self, keys: Iterable[K]) -> dict[int, list[K]]:
        """Split ``keys`` per shard, keeping their order, so multi-key commands can be batched."""
        groups: dict[int, list[K]] = {}
        lookup, index = self._lookup, self.shard_index
        for key in keys:
            shard = lookup(key) if type(key) is str else index(key)
            bucket = groups.get(shard)
            if bucket is None:
                groups[shard] = [key]
            else:
                bucket.append(key)
        return groups

    @property
    def shard_count(self) -> int:
        """Number of shards (the length of ``weights``)."""
        return len(self._weights)

    @property
    def weights(self) -> tuple[int, ...]:
        """The validated weights, immutable so the ring cannot drift from them."""
        return self._weights

    @property
    def node_count(self) -> int:
        """Distinct virtual nodes on the ring (fewer than ``160 * sum(weights)`` on collision)."""
        return self._node_count

    def __len__(self) -> int:
        """Number of shards, so ``len(ring)`` matches the shard list it was built for."""
        return len(self._weights)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shards={self.shard_count}, weights={self._weights!r}, "
            f"nodes={self.node_count})"
        )


def _coerce_key(key: object) -> str | bytes:
    """Accept str/bytes subclasses and bytes-like keys; refuse anything Jedis could not hash."""
    if isinstance(key, (str, bytes)):
        return key
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise key_type_error(key)
