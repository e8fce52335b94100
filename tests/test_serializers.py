"""Tests for sentinel_cache.core.serializers: round trips, the storage format, cross-configuration
reads, compression thresholds, configuration and properties (signing, and the refusal to
unpickle untrusted bytes, are in tests/test_serializers_signing.py).

No servers are needed (see tests/codec_samples.py).
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import pickle
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from codec_samples import INT64_MAX, INT64_MIN, KEY, SERIALIZERS, roundtrip, stored
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel_cache.core.config import CacheOptions
from sentinel_cache.core.serializers import Codec, build_codec
from sentinel_cache.exceptions import (
    ConfigurationError,
    InvalidValueError,
    SentinelCacheError,
    SerializationError,
)

# --- helpers used through dotted paths -------------------------------------------------------


class UpperJSONSerializer:
    """A Django-style serializer class: instantiated without arguments, bytes in and out."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value).upper().encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data.decode().lower())


class TextSerializer:
    """A custom serializer returning ``str`` (accepted and stored as UTF-8)."""

    def dumps(self, value: Any) -> str:
        return json.dumps(value)

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class ReversedZlib:
    """A custom compressor; reversing makes its output unreadable as plain zlib."""

    def compress(self, data: bytes) -> bytes:
        return zlib.compress(data)[::-1]

    def decompress(self, data: bytes) -> bytes:
        return zlib.decompress(data[::-1])


class Color(enum.IntEnum):
    RED = 1


# --- round trips -----------------------------------------------------------------------------

COMMON_VALUES: list[Any] = [
    "",
    "plain",
    "ünïcødé ✓ 日本語 🎉",
    {"a": 1, "b": [1, 2.5, None], "c": {"d": "e"}},
    [1, "two", 3.0, None, True],
    [],
    {},
    None,
    True,
    False,
    0.0,
    -1.5,
    1e300,
    0,
    -7,
    INT64_MAX,
    INT64_MIN,
    "x" * 5000,
]


@pytest.mark.parametrize("serializer", SERIALIZERS)
@pytest.mark.parametrize("compressor", [None, "zlib", "zstd"])
@pytest.mark.parametrize("signing_key", [None, KEY])
@pytest.mark.parametrize("value", COMMON_VALUES, ids=repr)
def test_round_trip(
    serializer: str, compressor: str | None, signing_key: bytes | None, value: Any
) -> None:
    codec = Codec(serializer, compressor=compressor, signing_key=signing_key)
    result = roundtrip(codec, value)
    assert result == value
    assert type(result) is type(value)


@pytest.mark.parametrize("serializer", ["pickle", "msgpack"])
def test_bytes_round_trip(serializer: str) -> None:
    codec = Codec(serializer)
    for value in (b"", b"\x00\xff\xfe\x80", b"42", os.urandom(3000)):
        result = roundtrip(codec, value)
        assert result == value and type(result) is bytes


def test_pickle_round_trips_arbitrary_objects() -> None:
    codec = Codec("pickle", compressor="zlib", compress_min_length=0)
    value = {"set": {1, 2}, "tuple": (1, "a"), "color": Color.RED, "big": 10**40, "bytes": b"\x00"}
    assert roundtrip(codec, value) == value


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("serializer", SERIALIZERS)
def test_bools_are_not_stored_as_ints(serializer: str, value: bool) -> None:
    codec = Codec(serializer)
    encoded = codec.dumps(value)
    assert isinstance(encoded, bytes)
    assert encoded[0] == 0xFE
    assert codec.loads(encoded) is value


def test_int_subclasses_are_serialized_not_raw() -> None:
    codec = Codec()
    assert isinstance(codec.dumps(Color.RED), bytes)
    assert codec.loads(codec.dumps(Color.RED)) is Color.RED


@pytest.mark.parametrize("serializer", SERIALIZERS)
@pytest.mark.parametrize("value", [0, 1, -1, 42, -7, INT64_MAX, INT64_MIN])
def test_64_bit_ints_stay_raw_for_incr(serializer: str, value: int) -> None:
    codec = Codec(serializer, compressor="zlib", compress_min_length=0, signing_key=KEY)
    encoded = codec.dumps(value)
    assert type(encoded) is int and encoded == value
    assert stored(codec, value) == str(value).encode()  # what INCR/DECR operate on
    assert codec.loads(str(value).encode()) == value


def test_loads_raw_decimal_integers() -> None:
    codec = Codec()
    assert codec.loads(b"42") == 42
    assert codec.loads(b"-7") == -7
    assert codec.loads(b"0") == 0
    assert codec.loads(42) == 42  # e.g. the reply of INCR itself
    assert codec.loads(b"99999999999999999999999") == 99999999999999999999999
    assert Codec(signing_key=KEY).loads(b"-7") == -7  # counters are never signed


def test_loads_none_is_none() -> None:
    assert Codec().loads(None) is None
    assert Codec(signing_key=KEY).loads(None) is None


@pytest.mark.parametrize("serializer", ["pickle", "json"])
@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 10**30, -(10**30)])
def test_ints_beyond_64_bits_are_serialized(serializer: str, value: int) -> None:
    codec = Codec(serializer)
    encoded = codec.dumps(value)
    assert isinstance(encoded, bytes) and encoded[0] == 0xFE
    assert codec.loads(encoded) == value


def test_msgpack_int_beyond_its_range_is_a_serialization_error() -> None:
    codec = Codec("msgpack")
    assert codec.loads(codec.dumps(INT64_MAX + 1)) == INT64_MAX + 1  # fits uint64
    with pytest.raises(SerializationError, match="int"):
        codec.dumps(1 << 64)


def test_accepts_bytearray_and_memoryview() -> None:
    codec = Codec()
    data = stored(codec, {"a": 1})
    assert codec.loads(bytearray(data)) == {"a": 1}  # type: ignore[arg-type]
    assert codec.loads(memoryview(data)) == {"a": 1}  # type: ignore[arg-type]
    assert codec.loads(bytearray(b"12")) == 12  # type: ignore[arg-type]


def test_str_input_is_rejected_with_a_hint() -> None:
    with pytest.raises(InvalidValueError, match="decode_responses"):
        Codec().loads("42")  # type: ignore[arg-type]


# --- json specifics --------------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        ({1, 2}, "set"),
        (Opaque(), "Opaque"),
        ({"nested": [frozenset()]}, "frozenset"),
        (b"raw", "bytes"),
        (float("nan"), "float.*NaN"),
        ({"deep": [float("-inf")]}, "float.*Infinity"),
    ],
)
def test_json_rejects_what_it_cannot_carry(value: Any, type_name: str) -> None:
    with pytest.raises(SerializationError, match=type_name) as info:
        Codec("json").dumps(value)
    assert isinstance(info.value, SentinelCacheError)
    assert isinstance(info.value, ValueError)
    assert "json" in str(info.value)


def test_json_rejects_lone_surrogates() -> None:
    """Pickle can carry them; UTF-8 JSON cannot."""
    with pytest.raises(SerializationError, match="str"):
        Codec("json").dumps("\ud800")
    assert roundtrip(Codec(), "\ud800") == "\ud800"


def test_serializer_modules_map_to_the_shared_format() -> None:
    """Flask-Caching style ``serializer=pickle`` writes what a ``"pickle"`` codec reads."""
    assert Codec(pickle).dumps("x") == Codec("pickle").dumps("x")
    assert Codec(json).dumps([1]) == b"\xfe\x20[1]"
    assert Codec(json).serializer_name == "json"


def test_json_documented_lossy_conversions() -> None:
    codec = Codec("json")
    assert roundtrip(codec, (1, 2)) == [1, 2]  # tuples come back as lists
    assert roundtrip(codec, {1: "a"}) == {"1": "a"}  # keys become strings


def test_json_payload_is_plain_utf8_json() -> None:
    """Other languages read the value by skipping the two framing bytes."""
    data = Codec("json").dumps({"name": "zoë", "n": [1, 2]})
    assert isinstance(data, bytes)
    assert data[:2] == b"\xfe\x20"
    assert json.loads(data[2:].decode("utf-8")) == {"name": "zoë", "n": [1, 2]}


def test_msgpack_rejects_sets() -> None:
    with pytest.raises(SerializationError, match="set"):
        Codec("msgpack").dumps({1, 2})


def test_pickle_error_names_the_type() -> None:
    with pytest.raises(SerializationError, match="function"):
        Codec().dumps(lambda: None)


# --- compression -----------------------------------------------------------------------------


@pytest.mark.parametrize(("compressor", "nibble"), [("zlib", 1), ("zstd", 2)])
def test_compression_threshold(compressor: str, nibble: int) -> None:
    codec = Codec(compressor=compressor, compress_min_length=200)
    small = codec.dumps("a" * 50)
    assert isinstance(small, bytes) and small[1] & 0x0F == 0
    large_value = "abc" * 1000
    large = codec.dumps(large_value)
    assert isinstance(large, bytes) and large[1] & 0x0F == nibble
    assert len(large) < len(pickle.dumps(large_value))
    assert codec.loads(large) == large_value
    incompressible = os.urandom(5000)
    packed = codec.dumps(incompressible)
    assert isinstance(packed, bytes) and packed[1] & 0x0F == 0  # kept only if smaller
    assert codec.loads(packed) == incompressible


def test_threshold_is_inclusive_and_measured_on_the_serialized_payload() -> None:
    value = "z" * 300
    payload_length = len(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    at = Codec(compressor="zlib", compress_min_length=payload_length).dumps(value)
    above = Codec(compressor="zlib", compress_min_length=payload_length + 1).dumps(value)
    assert isinstance(at, bytes) and isinstance(above, bytes)
    assert at[1] == 0x11
    assert above[1] == 0x10


def test_no_compressor_never_compresses() -> None:
    data = Codec(compress_min_length=0).dumps("a" * 10_000)
    assert isinstance(data, bytes) and data[1] == 0x10


def test_zstd_is_thread_safe() -> None:
    codec = Codec(compressor="zstd", compress_min_length=0)
    values = [{"i": i, "pad": "p" * (i % 700)} for i in range(400)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda v: codec.loads(codec.dumps(v)), values))
    assert results == values


# --- storage format and cross-configuration reads --------------------------------------------


def test_format_bytes() -> None:
    assert Codec().dumps("x") == b"\xfe\x10" + pickle.dumps("x", pickle.HIGHEST_PROTOCOL)
    assert Codec("json").dumps("x") == b'\xfe\x20"x"'
    assert Codec("msgpack").dumps("x")[:2] == b"\xfe\x30"  # type: ignore[index]
    assert Codec(UpperJSONSerializer).dumps("x") == b'\xfe\xf0"X"'
    zstd = Codec("json", compressor="zstd", compress_min_length=0).dumps("y" * 100)
    assert zstd[:2] == b"\xfe\x22"  # type: ignore[index]
    signed = Codec(signing_key=KEY).dumps("x")
    assert isinstance(signed, bytes) and signed[0] == 0xFF and signed[33:35] == b"\xfe\x10"


def test_magic_bytes_cannot_start_an_integer_or_a_pickle() -> None:
    for magic in (0xFE, 0xFF):
        assert not bytes([magic]).isdigit() and magic != ord("-")
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            for value in ("s", 1.5, None, {"a": [1]}, (1,)):
                assert pickle.dumps(value, protocol)[0] != magic


WRITERS = [
    dict(serializer="pickle"),
    dict(serializer="pickle", compressor="zlib"),
    dict(serializer="pickle", compressor="zstd"),
    dict(serializer="json"),
    dict(serializer="json", compressor="zlib"),
    dict(serializer="json", compressor="zstd"),
    dict(serializer="msgpack"),
    dict(serializer="msgpack", compressor="zstd"),
]
READERS = [
    dict(serializer="pickle"),
    dict(serializer="pickle", compressor="zstd"),
    dict(serializer="pickle", compressor="zlib"),
    dict(serializer="json"),
    dict(serializer="json", compressor="zstd"),
    dict(serializer="msgpack", compressor="zlib"),
]
CROSS_VALUE = {"name": "ünïcødé", "items": list(range(300)), "nested": {"ok": True, "x": None}}


@pytest.mark.parametrize("signing_key", [None, KEY])
@pytest.mark.parametrize("writer", WRITERS, ids=repr)
@pytest.mark.parametrize("reader", READERS, ids=repr)
def test_cross_configuration_reads(
    writer: dict[str, Any], reader: dict[str, Any], signing_key: bytes | None
) -> None:
    """Values written with other settings stay readable (compressed when the writer compresses)."""
    write = Codec(**writer, compress_min_length=64, signing_key=signing_key)
    read = Codec(**reader, signing_key=signing_key)
    data = stored(write, CROSS_VALUE)
    framed = data[33:] if signing_key else data
    assert framed[1] & 0x0F == {None: 0, "zlib": 1, "zstd": 2}[writer.get("compressor")]
    if writer["serializer"] == "pickle" and reader["serializer"] != "pickle" and not signing_key:
        # Choosing a non-pickle serializer means never unpickling unverified data.
        with pytest.raises(InvalidValueError, match="not configured for pickle"):
            read.loads(data)
        return
    assert read.loads(data) == CROSS_VALUE


def test_unsigned_reader_reads_signed_values_without_verifying() -> None:
    """Switching signing on or off across a fleet causes no misses for keyless readers."""
    data = stored(Codec(signing_key=KEY), {"a": 1})
    assert Codec().loads(data) == {"a": 1}
    # ...but a keyless json reader cannot verify, so it never unpickles it.
    with pytest.raises(InvalidValueError, match="not configured for pickle"):
        Codec("json").loads(data)
    assert Codec("json", signing_key=KEY).loads(data) == {"a": 1}


def test_legacy_plain_pickle_is_read_only_by_an_unsigned_pickle_codec() -> None:
    legacy = pickle.dumps({"old": "value"}, pickle.HIGHEST_PROTOCOL)  # e.g. django-redis
    assert Codec().loads(legacy) == {"old": "value"}
    assert Codec(compressor="zstd").loads(legacy) == {"old": "value"}
    for reader in (Codec("json"), Codec("msgpack"), Codec(signing_key=KEY)):
        with pytest.raises(InvalidValueError):
            reader.loads(legacy)


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00",
        b"hello",
        b"{}",
        b"+5",
        b" 42",
        b"4 2",
        b"1_000",
        b"-",
        b"--1",
        b"1.5",
        b"\xfe",
        b"\xfe\x10",
        b"\xfe\x10not a pickle",
        b"\xfe\x00\x80\x05N.",  # serializer id 0
        b"\xfe\x40\x80\x05N.",  # serializer id 4 (unassigned)
        b"\xfe\x13\x80\x05N.",  # compressor id 3 (unassigned)
        b"\xfe\x11not zlib",
        b"\xfe\x12not zstd",
        b"\xfe\x20{not json",
        b"\xfe\x20\xff\xfe",
        b"\xfe\x30\xc1",  # msgpack's never-used byte
        b"\xfe\xf0custom",
        b"\xfe\x1fcustom",
        b"\xff",
        b"\xff" + b"\x00" * 32,
        b"\xff" + b"\x00" * 32 + b"\xff\x10",
        b"\x80\x05garbage",
        b"\x80",
        b"\x1f\x8b\x08\x00",
    ],
)
@pytest.mark.parametrize("serializer", SERIALIZERS)
def test_garbage_is_an_invalid_value(serializer: str, garbage: bytes) -> None:
    with pytest.raises(InvalidValueError) as info:
        Codec(serializer).loads(garbage)
    assert isinstance(info.value, SentinelCacheError) and isinstance(info.value, ValueError)


def test_pickle_of_a_missing_class_is_an_invalid_value() -> None:
    data = b"\xfe\x10" + pickle.dumps(Opaque(), pickle.HIGHEST_PROTOCOL).replace(
        b"Opaque", b"Gone00"
    )
    with pytest.raises(InvalidValueError):
        Codec().loads(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.sampled_from([b"", b"\xfe\x20", b"\xfe\x21", b"\xfe\x22", b"\xfe\x30", b"\xff"]),
    body=st.binary(max_size=200),
)
def test_fuzzed_bytes_never_raise_anything_else(prefix: bytes, body: bytes) -> None:
    """Only InvalidValueError escapes. The signing codec never unpickles; the unsigned json codec
    is skipped for framed-pickle headers so random bytes are never fed to pickle."""
    data = prefix + body
    codecs = [Codec(signing_key=KEY)]
    if not (data[:1] == b"\xfe" and len(data) > 1 and data[1] >> 4 == 1):
        codecs.append(Codec("json"))
    for codec in codecs:
        with contextlib.suppress(InvalidValueError):
            codec.loads(data)


# --- configuration ---------------------------------------------------------------------------


def test_names() -> None:
    codec = Codec()
    assert (codec.serializer_name, codec.compressor_name) == ("pickle", None)
    codec = Codec(" JSON ", compressor="ZSTD")
    assert (codec.serializer_name, codec.compressor_name) == ("json", "zstd")


@pytest.mark.parametrize(
    ("kwargs", "field", "shown"),
    [
        (dict(serializer="yaml"), "SERIALIZER", "yaml"),
        (dict(serializer="no_such_pkg.mod.Serializer"), "SERIALIZER", "no_such_pkg.mod.Serializer"),
        (dict(serializer="json.NoSuchSerializer"), "SERIALIZER", "json.NoSuchSerializer"),
        (dict(serializer="os.path"), "SERIALIZER", "os.path"),
        (dict(serializer=object()), "SERIALIZER", "object"),
        (dict(compressor="lz5"), "COMPRESSOR", "lz5"),
        (dict(compressor="no_such_pkg.Compressor"), "COMPRESSOR", "no_such_pkg.Compressor"),
        (dict(compressor="json.JSONDecoder"), "COMPRESSOR", "json.JSONDecoder"),
        (dict(compress_min_length=-1), "COMPRESS_MIN_LENGTH", "-1"),
        (dict(compress_min_length=True), "COMPRESS_MIN_LENGTH", "True"),
        (dict(pickle_protocol=99), "PICKLE_PROTOCOL", "99"),
    ],
)
def test_configuration_errors_name_field_and_value(
    kwargs: dict[str, Any], field: str, shown: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        Codec(**kwargs)
    assert field in str(info.value) and shown in str(info.value)


def _block_import(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError


def test_missing_msgpack_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    data = stored(Codec("msgpack"), {"a": 1})
    _block_import(monkeypatch, "msgpack")
    with pytest.raises(ConfigurationError) as info:
        Codec("msgpack")
    message = str(info.value)
    assert "SERIALIZER" in message and "pip install sentinel-cache[msgpack]" in message
    with pytest.raises(InvalidValueError, match=r"sentinel-cache\[msgpack\]"):
        Codec().loads(data)  # reading someone else's msgpack value is a miss, not a crash


def test_missing_zstandard(monkeypatch: pytest.MonkeyPatch) -> None:
    import sentinel_cache.core.codecs as codecs

    data = stored(Codec(compressor="zstd", compress_min_length=0), "v" * 100)
    _block_import(monkeypatch, "zstandard")
    monkeypatch.setattr(codecs, "_zstd_for_reading", None)
    with pytest.raises(ConfigurationError) as info:
        Codec(compressor="zstd")
    assert "COMPRESSOR" in str(info.value) and "sentinel-cache[zstd]" in str(info.value)
    with pytest.raises(InvalidValueError, match="zstandard"):
        Codec().loads(data)


@pytest.mark.parametrize(
    "spec",
    [f"{__name__}.UpperJSONSerializer", UpperJSONSerializer, UpperJSONSerializer()],
    ids=["dotted path", "class", "instance"],
)
def test_custom_serializer(spec: Any) -> None:
    codec = Codec(spec, compressor="zlib", compress_min_length=0)
    assert codec.serializer_name.endswith("UpperJSONSerializer")
    value = {"key": ["value"] * 50}
    data = stored(codec, value)
    assert data[:2] == b"\xfe\xf1"
    assert codec.loads(data) == value
    assert roundtrip(codec, 5) == 5  # ints stay raw
    with pytest.raises(InvalidValueError, match="custom serializer"):
        Codec().loads(data)  # the header cannot say which custom serializer wrote it


def test_custom_serializer_returning_str() -> None:
    codec = Codec(f"{__name__}.TextSerializer")
    assert codec.dumps("x") == b'\xfe\xf0"x"'
    assert roundtrip(codec, {"a": [1]}) == {"a": [1]}


def test_custom_serializer_errors_are_wrapped() -> None:
    codec = Codec(f"{__name__}.UpperJSONSerializer")
    with pytest.raises(SerializationError, match="set"):
        codec.dumps({1})
    with pytest.raises(InvalidValueError):
        codec.loads(b"\xfe\xf0\xff\xfe")


def test_custom_compressor_by_dotted_path() -> None:
    codec = Codec(compressor=f"{__name__}.ReversedZlib", compress_min_length=0)
    assert codec.compressor_name == f"{__name__}.ReversedZlib"
    data = stored(codec, "c" * 500)
    assert data[:2] == b"\xfe\x1f"
    assert codec.loads(data) == "c" * 500
    with pytest.raises(InvalidValueError, match="custom compressor"):
        Codec(compressor="zlib").loads(data)


def test_build_codec_from_cache_options() -> None:
    options = CacheOptions(
        serializer="json", compressor="zlib", compress_min_length=10, signing_key=KEY
    )
    codec = build_codec(options)
    assert (codec.serializer_name, codec.compressor_name, codec.compress_min_length) == (
        "json",
        "zlib",
        10,
    )
    data = codec.dumps("q" * 100)
    assert isinstance(data, bytes) and data[0] == 0xFF and data[34] == 0x21
    assert build_codec(CacheOptions()).loads(data) == "q" * 100
    assert repr(build_codec(CacheOptions())) == (
        "Codec(serializer='pickle', compressor=None, compress_min_length=1024, signed=False)"
    )


def test_core_imports_no_web_framework() -> None:
    code = (
        "import sys, sentinel_cache.core.serializers\n"
        "bad = [m for m in ('django', 'flask', 'flask_caching') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- properties ------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(), children, max_size=6)
    ),
    max_leaves=30,
)
JSON_CODECS = [
    Codec("json"),
    Codec("json", compressor="zlib", compress_min_length=0),
    Codec("json", compressor="zstd", compress_min_length=16, signing_key=KEY),
    Codec("pickle", compressor="zlib", compress_min_length=32, signing_key=KEY),
]


def _same(a: Any, b: Any) -> bool:
    """Equality that also tells ``True`` from ``1`` and ``-0.0`` from ``0.0``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values)
def test_json_able_values_round_trip(value: Any) -> None:
    signed_readers = (Codec("json", signing_key=KEY), Codec("msgpack", signing_key=KEY))
    unsigned_readers = (Codec("msgpack"), Codec(compressor="zstd"))
    for codec in JSON_CODECS:
        data = stored(codec, value)
        assert _same(codec.loads(data), value), codec
        signed = "signed=True" in repr(codec)
        for reader in signed_readers if signed else unsigned_readers:
            assert _same(reader.loads(data), value), (codec, reader)
