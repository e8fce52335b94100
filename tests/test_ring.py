"""Tests for sentinel_cache.core.ring: bit-exact Jedis ShardedJedis placement, spread, and validation.

No servers are needed. ``JAVA_VECTORS`` were produced by running Jedis's ``MurmurHash.hash64A``
(ByteBuffer version, seed 0x1234ABCD) and its ``Sharded`` TreeMap ring on a real JVM, so they
check this module against Java semantics rather than against itself. The block from
``JAVA_RING_WEIGHTS`` to ``JAVA_SURROGATE_PAIR`` is what ``scripts/ringvectors/RingVectors.java``
(JDK only) prints; ``sh scripts/ringvectors/check.sh`` regenerates it and diffs it with this file.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sentinel_cache.core.ring as ring_module
from sentinel_cache.core.ring import HashRing, murmur64a
from sentinel_cache.exceptions import ConfigurationError

# --- slow reference, written straight from the spec, independent of the optimized code --------

_MASK = (1 << 64) - 1


def ref_murmur64a(data: bytes) -> int:
    """Byte-at-a-time MurmurHash64A, seed 0x1234ABCD, returned as a signed 64-bit value."""
    m, r = 0xC6A4A7935BD1E995, 47
    h = (0x1234ABCD ^ (len(data) * m)) & _MASK
    full = len(data) - len(data) % 8
    for off in range(0, full, 8):
        k = 0
        for j in range(8):
            k |= data[off + j] << (8 * j)
        k = (k * m) & _MASK
        k ^= k >> r
        k = (k * m) & _MASK
        h ^= k
        h = (h * m) & _MASK
    tail = data[full:]
    if tail:
        t = 0
        for j, byte in enumerate(tail):
            t |= byte << (8 * j)
        h ^= t
        h = (h * m) & _MASK
    h ^= h >> r
    h = (h * m) & _MASK
    h ^= h >> r
    return h - (1 << 64) if h >= 1 << 63 else h


def ref_shard(weights: list[int], data: bytes) -> int:
    """TreeMap.put in insertion order, then tailMap(hash).firstKey() by linear scan."""
    nodes: dict[int, int] = {}
    for i, w in enumerate(weights):
        for n in range(160 * w):
            nodes[ref_murmur64a(f"SHARD-{i}-NODE-{n}".encode())] = i
    h = ref_murmur64a(data)
    ordered = sorted(nodes.items())
    for node_hash, shard in ordered:
        if node_hash >= h:
            return shard
    return ordered[0][1]


# --- vectors from a JVM: (key bytes hex, hash64A, shard on [1,1], [1,1,1], [1,1,1,1], [1,2,3]) --
# Regenerate: javac -d /tmp/rv scripts/ringvectors/RingVectors.java && java -cp /tmp/rv RingVectors
# (or sh scripts/ringvectors/check.sh, which diffs the output with the lines below).

JAVA_RING_WEIGHTS = ([1, 1], [1, 1, 1], [1, 1, 1, 1], [1, 2, 3])
JAVA_VECTORS = [
    ("", 8371356515094919947, (1, 1, 1, 2)),
    ("61", 7990182172224381693, (1, 1, 1, 1)),
    ("6b6579", 6185336482905404787, (1, 1, 3, 1)),
    ("666f6f", -7063922479176959649, (0, 0, 0, 0)),
    ("626172", -1976929963327131893, (1, 2, 2, 2)),
    ("757365723a31", 538740876973559570, (1, 1, 1, 2)),
    ("757365723a34323a70726f66696c65", 3000842432103607404, (1, 2, 3, 2)),
    ("53484152442d302d4e4f44452d30", -4813603235750630532, (0, 0, 0, 0)),
    ("30313233343536", 4323554230887933561, (0, 0, 0, 2)),
    ("3031323334353637", 1341502524665241939, (0, 0, 0, 1)),
    ("303132333435363738", 3428165416676338558, (0, 0, 3, 2)),
    ("30313233343536373839616263646566", -4122218507168152405, (1, 1, 1, 1)),
    ("3031323334353637383961626364656667", -8110892676746904408, (1, 2, 2, 2)),
    ("636166c3a9", 9011223833883438499, (0, 0, 0, 2)),
    ("e697a5e69cace8aa9ee382ade383bc", 2082394640819982216, (1, 1, 1, 1)),
    ("656d6f6a693af09f9880", 5058498671176117713, (0, 2, 2, 1)),
    ("6c6f6e653a3f3a78", 5777580979019131275, (1, 1, 1, 1)),
    ("74616209686572650a", -7255070092924090447, (1, 1, 1, 1)),
    (
        "73657373696f6e3a303132333435363738393031323334353637383930313233343536373839303132333435363738396162",
        1622268852915666349,
        (1, 2, 3, 2),
    ),
    ("58", -604441859734086157, (1, 1, 3, 1)),
    ("d2", 3837674881964980509, (0, 0, 0, 2)),
    ("3c7f", 729308304482450517, (0, 2, 2, 1)),
    ("5503", 8827701595830184734, (0, 2, 3, 2)),
    ("4e45ad", -2053863530390877661, (0, 0, 3, 2)),
    ("f8c86c", 111689627325636134, (1, 2, 2, 2)),
    ("e70ec538", 1227186175880895695, (0, 0, 3, 1)),
    ("704a56b3", 462921077623936653, (1, 1, 1, 1)),
    ("8e730035ba", -2263351956465967303, (1, 1, 1, 1)),
    ("9ea5f73499", 8064047106368759096, (1, 1, 1, 1)),
    ("c5fcca8498f1", -6097737529318555440, (1, 1, 3, 1)),
    ("77ef3a31f6c1", -1636228335596777102, (1, 1, 1, 1)),
    ("95cd27ad220eec", -4211338222164432009, (1, 1, 1, 1)),
    ("cecb0b7dad2eae", 4556973754732832095, (1, 2, 2, 2)),
    ("888e2748e295a36d", 1489749209302851601, (0, 0, 3, 2)),
    ("5634c0ee62fe6140", 1292903719958560881, (0, 0, 3, 1)),
    ("4133665c79bcf27470", 654854961717269671, (0, 2, 2, 2)),
    ("fe33df8cf4c80d2a07", -297732154889270177, (1, 2, 2, 2)),
    ("bf1f4f39b211a3ba1738", -1011045200121279517, (0, 2, 3, 2)),
    ("d0d1df19fb0ae4bd3bdd", -6008836250348965047, (1, 1, 1, 1)),
    ("59ed106f1bd07e6c06a296", 295366243527198872, (1, 1, 1, 1)),
    ("67245184d39dee0e5df6b1", 2013036143980803854, (1, 1, 1, 1)),
    ("3ca806dad74569807d9ac4e7", 8689640056591796386, (1, 1, 1, 1)),
    ("97e6b5680e8892bf05422879", 8647860830020126468, (1, 2, 2, 2)),
    ("e2665c0bfb166960d22af80a88", -6474129608546982117, (1, 2, 2, 2)),
    ("17879738d5ba8a05d3f98a3097", -5717626186995931978, (0, 0, 0, 0)),
    ("e9b8204ba9d58415af5ca09ecbb3", 7845635595298031242, (1, 1, 3, 1)),
    ("550c5b6b97dc218fe24815792876", -857696796722241430, (0, 0, 0, 0)),
    ("3c8f4517078ab0699db6e4165d5e39", -8530360537485217223, (1, 2, 3, 2)),
    ("5680416581c71ea6dc0ef0ce4a231c", -3664323516169172868, (1, 1, 1, 1)),
    ("673d142edcd1be9db7e69729c38b03be", 6054367322470182166, (0, 2, 3, 2)),
    ("b1605dab9afbf757f79bd41793111f90", 5211398044330630927, (0, 2, 2, 2)),
    ("a9c14cce92b156b8eba66373c330b5f5ed", 7332908779874491736, (0, 0, 3, 0)),
    ("cfa585877cb597ef1ce7828874e704f2b8", 9083389440335053369, (0, 0, 0, 0)),
    ("ffffffffffffffffff", 3208244195604309743, (1, 1, 1, 1)),
]
# A 1000-byte key generated identically on the JVM.
JAVA_BIG_KEY = (bytes((i * 31 + 7) & 0xFF for i in range(1000)), 3181046566598557482, (1, 1, 3, 1))
# Java's String.getBytes(UTF-8) for strings Python cannot encode strictly.
JAVA_LONE_SURROGATE = ("lone:\ud800:x", 5777580979019131275)
JAVA_SURROGATE_PAIR = ("emoji:\ud83d\ude00", 5058498671176117713)


@pytest.fixture(scope="module")
def java_rings() -> list[HashRing]:
    return [HashRing(w) for w in JAVA_RING_WEIGHTS]


def sample_keys(count: int = 10_000) -> list[str]:
    return [f"key:{i}" for i in range(count)]


# --- check values ------------------------------------------------------------------------------


def test_check_values() -> None:
    assert murmur64a(b"key") == 6185336482905404787
    assert murmur64a(b"foo") == -7063922479176959649
    ring = HashRing([1, 1])
    assert ring.shard_index("key") == 1
    assert ring.shard_index("foo") == 0


@pytest.mark.parametrize(("hex_key", "expected_hash", "expected_shards"), JAVA_VECTORS)
def test_matches_jvm(
    java_rings: list[HashRing], hex_key: str, expected_hash: int, expected_shards: tuple[int, ...]
) -> None:
    key = bytes.fromhex(hex_key)
    assert murmur64a(key) == expected_hash
    assert ref_murmur64a(key) == expected_hash
    assert tuple(r.shard_index(key) for r in java_rings) == expected_shards


def test_matches_jvm_big_key(java_rings: list[HashRing]) -> None:
    key, expected_hash, expected_shards = JAVA_BIG_KEY
    assert murmur64a(key) == expected_hash
    assert tuple(r.shard_index(key) for r in java_rings) == expected_shards


def test_node_hash_and_count_match_jvm(java_rings: list[HashRing]) -> None:
    assert murmur64a(b"SHARD-0-NODE-0") == -4813603235750630532
    # No collisions among these virtual nodes, on the JVM either.
    assert [r.node_count for r in java_rings] == [320, 480, 640, 960]


def test_str_with_surrogates_encodes_like_java() -> None:
    lone, lone_hash = JAVA_LONE_SURROGATE
    pair, pair_hash = JAVA_SURROGATE_PAIR
    ring = HashRing([1, 1])
    assert ring.shard_index(lone) == ring.shard_index(b"lone:?:x")
    assert murmur64a(b"lone:?:x") == lone_hash
    assert ring.shard_index(pair) == ring.shard_index("emoji:\U0001f600")
    assert murmur64a("emoji:\U0001f600".encode()) == pair_hash


# --- optimized code agrees with the slow reference ---------------------------------------------


def test_murmur_matches_reference_on_random_bytes() -> None:
    rng = random.Random(1234)
    for length in range(0, 18):
        for _ in range(50):
            data = bytes(rng.getrandbits(8) for _ in range(length))
            assert murmur64a(data) == ref_murmur64a(data), data
    for length in (31, 32, 33, 64, 255, 4096):
        data = rng.randbytes(length)
        assert murmur64a(data) == ref_murmur64a(data)


def test_ring_matches_reference_on_random_keys() -> None:
    rng = random.Random(99)
    weights = [1, 2, 1]
    ring = HashRing(weights)
    keys = [rng.randbytes(rng.randrange(0, 18)) for _ in range(150)]
    keys += [b"\xff\xfe\x00\x80", b"\x00" * 9, b"\xc3\x28", b"\r\n\t\x1b"]
    for key in keys:
        assert ring.shard_index(key) == ref_shard(weights, key), key


def test_arbitrary_bytes_never_crash() -> None:
    ring = HashRing([1, 1, 1])
    for key in (b"", b"\x00", b"\xff" * 17, b"\x80abc", bytes(range(256)), b"x" * 1_000_000):
        assert 0 <= ring.shard_index(key) < 3
    assert 0 <= ring.shard_index("\udcff surrogateescape") < 3


def test_collision_later_node_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """TreeMap.put semantics: on equal node hashes the later-inserted shard owns the node."""

    def fake_hash(data: bytes) -> int:
        text = data.decode()
        return int(text.rsplit("-", 1)[1]) if text.startswith("SHARD-") else int(text)

    monkeypatch.setattr(ring_module, "murmur64a", fake_hash)
    # Shard 0 puts nodes 0..319, then shard 1 overwrites nodes 0..159.
    ring = HashRing([2, 1])
    assert ring.node_count == 320
    assert [ring.shard_index(str(h)) for h in (-5, 0, 159, 160, 319)] == [1, 1, 1, 0, 0]
    assert ring.shard_index("320") == 1  # past the last node: wrap to the smallest (node 0)


# --- distribution ------------------------------------------------------------------------------

# Measured on keys "key:0".."key:9999": worst share deviation from the ideal 1/N is 1.2 points
# (2 shards), 2.0 points (3 shards), 1.7 points (4 shards); i.e. up to 6.8% relative. That is
# inherent to Jedis's 160 virtual nodes per shard, so the tolerance is 2.5 percentage points.
SPREAD_TOLERANCE = 0.025


@pytest.mark.parametrize("shards", [2, 3, 4])
def test_spread_equal_weights(shards: int) -> None:
    ring = HashRing([1] * shards)
    keys = sample_keys()
    counts = Counter(ring.shard_index(k) for k in keys)
    assert set(counts) == set(range(shards))
    for shard in range(shards):
        assert abs(counts[shard] / len(keys) - 1 / shards) < SPREAD_TOLERANCE, counts


@pytest.mark.parametrize("weights", [[1, 2], [2, 1], [1, 1, 2]])
def test_weight_two_gets_about_twice(weights: list[int]) -> None:
    ring = HashRing(weights)
    keys = sample_keys()
    counts = Counter(ring.shard_index(k) for k in keys)
    total = sum(weights)
    for shard, weight in enumerate(weights):
        assert abs(counts[shard] / len(keys) - weight / total) < SPREAD_TOLERANCE, counts
    heavy = weights.index(2)
    light = weights.index(1)
    assert 1.8 < counts[heavy] / counts[light] < 2.3, counts


# Measured moved fractions: 0.353 (2->3), 0.241 (3->4), 0.209 (4->5) vs ideal 1/(N+1).
@pytest.mark.parametrize("shards", [2, 3, 4])
def test_appending_a_shard_moves_only_its_share(shards: int) -> None:
    before = HashRing([1] * shards)
    after = HashRing([1] * (shards + 1))
    keys = sample_keys()
    moved = [k for k in keys if before.shard_index(k) != after.shard_index(k)]
    assert abs(len(moved) / len(keys) - 1 / (shards + 1)) < 0.03
    assert all(after.shard_index(k) == shards for k in moved)


# --- API ---------------------------------------------------------------------------------------


def test_str_and_utf8_bytes_agree() -> None:
    ring = HashRing([1, 1, 1, 1])
    for key in ["plain", "café", "日本語キー", "emoji:\U0001f600", "", "tab\tnl\n"]:
        assert ring.shard_index(key) == ring.shard_index(key.encode("utf-8"))


def test_bytes_like_and_subclasses_accepted() -> None:
    class Safe(str):
        pass

    ring = HashRing([1, 1, 1])
    expected = ring.shard_index(b"user:7")
    assert ring.shard_index(bytearray(b"user:7")) == expected  # type: ignore[arg-type]
    assert ring.shard_index(memoryview(b"user:7")) == expected  # type: ignore[arg-type]
    assert ring.shard_index(Safe("user:7")) == expected
    with pytest.raises(TypeError, match="int"):
        ring.shard_index(7)  # type: ignore[arg-type]


def test_caches_are_per_instance() -> None:
    """A class-level cache would let one ring answer for another."""
    two, three = HashRing([1, 1]), HashRing([1, 1, 1])
    keys = sample_keys(300)
    for _ in range(2):  # second round is served from the caches
        for key in keys:
            assert two.shard_index(key) == ref_shard_cached([1, 1], key)
            assert three.shard_index(key) == ref_shard_cached([1, 1, 1], key)
    assert any(two.shard_index(k) != three.shard_index(k) for k in keys)


_REF_RINGS: dict[tuple[int, ...], list[tuple[int, int]]] = {}


def ref_shard_cached(weights: list[int], key: str) -> int:
    """ref_shard with the node list kept, so the per-instance test stays fast."""
    ordered = _REF_RINGS.get(tuple(weights))
    if ordered is None:
        nodes: dict[int, int] = {}
        for i, w in enumerate(weights):
            for n in range(160 * w):
                nodes[ref_murmur64a(f"SHARD-{i}-NODE-{n}".encode())] = i
        ordered = _REF_RINGS[tuple(weights)] = sorted(nodes.items())
    h = ref_murmur64a(key.encode())
    return next((s for node, s in ordered if node >= h), ordered[0][1])


def test_group_by_shard_preserves_order() -> None:
    ring = HashRing([1, 1, 1])
    keys: list[str | bytes] = [*(f"k{i}" for i in range(200)), b"raw", "k3"]
    groups = ring.group_by_shard(keys)
    assert sum(len(group) for group in groups.values()) == len(keys)
    for shard, group in groups.items():
        assert group == [k for k in keys if ring.shard_index(k) == shard]
    assert ring.group_by_shard([]) == {}


def test_properties_and_repr() -> None:
    ring = HashRing([1, 2, 3])
    assert ring.shard_count == 3
    assert len(ring) == 3
    assert ring.weights == (1, 2, 3)
    assert ring.node_count == 960
    assert repr(ring) == "HashRing(shards=3, weights=(1, 2, 3), nodes=960)"
    assert HashRing((1, 1)).weights == (1, 1)


@pytest.mark.parametrize(
    ("weights", "bad"),
    [
        ([], "[]"),
        ((), "()"),
        ([0], "0"),
        ([1, -2], "-2"),
        ([1, True], "True"),
        ([1.5], "1.5"),
        ([1, "2"], "'2'"),
        ([None], "None"),
        ("11", "'11'"),
        (None, "None"),
        (3, "3"),
    ],
)
def test_bad_weights_raise(weights: object, bad: str) -> None:
    with pytest.raises(ConfigurationError, match="weights") as excinfo:
        HashRing(weights)  # type: ignore[arg-type]
    assert bad in str(excinfo.value)
    assert isinstance(excinfo.value, ValueError)


# --- properties --------------------------------------------------------------------------------

_PROPERTY_RINGS = {n: HashRing([1] * n) for n in (1, 2, 3, 5)}
_WEIGHTED = HashRing([3, 1, 2])


@settings(max_examples=300, deadline=None)
@given(key=st.one_of(st.text(), st.binary(max_size=64)), shards=st.sampled_from([1, 2, 3, 5]))
def test_shard_index_in_range_and_deterministic(key: str | bytes, shards: int) -> None:
    ring = _PROPERTY_RINGS[shards]
    first = ring.shard_index(key)
    assert 0 <= first < shards
    assert ring.shard_index(key) == first  # cached
    assert HashRing([1] * shards).shard_index(key) == first  # fresh instance, cold cache
    assert 0 <= _WEIGHTED.shard_index(key) < 3


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=40))
def test_murmur_property_matches_reference(data: bytes) -> None:
    value = murmur64a(data)
    assert value == ref_murmur64a(data)
    assert -(1 << 63) <= value < (1 << 63)
