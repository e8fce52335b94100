"""The codec's signing (``SIGNING_KEY``): the signed layout and its MAC, tampering and wrong
keys rejected, and the refusal to unpickle untrusted bytes: a payload that would run code (the
control proves it does, unsigned) never runs under a signing codec or json.

No servers are needed (see tests/codec_samples.py).
"""

from __future__ import annotations

import hmac
import pickle
import zlib
from typing import Any

import pytest
from codec_samples import KEY, OTHER_KEY, SERIALIZERS, stored

from sentinel_cache.core.serializers import Codec
from sentinel_cache.exceptions import ConfigurationError, InvalidValueError

SIDE_EFFECTS: list[str] = []


def record_side_effect(tag: str) -> str:
    SIDE_EFFECTS.append(tag)
    return tag


class Exploit:
    """Unpickling this calls ``record_side_effect``: a stand-in for ``os.system``."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (record_side_effect, ("executed",))


@pytest.fixture(autouse=True)
def _clear_side_effects() -> None:
    SIDE_EFFECTS.clear()


def test_signed_value_layout_and_mac() -> None:
    codec = Codec(signing_key=KEY)
    data = codec.dumps({"a": 1})
    assert isinstance(data, bytes)
    inner = data[33:]
    assert inner == Codec().dumps({"a": 1})
    mac_key = hmac.digest(KEY, b"sentinel_cache.core.serializers.Codec v1", "sha256")
    assert data[1:33] == hmac.digest(mac_key, inner, "sha256")


def test_tampering_with_any_byte_is_detected() -> None:
    codec = Codec(compressor="zlib", compress_min_length=0, signing_key=KEY)
    data = stored(codec, {"user": 1, "admin": False})
    for position in range(1, len(data)):
        tampered = bytearray(data)
        tampered[position] ^= 0x01
        with pytest.raises(InvalidValueError):
            codec.loads(bytes(tampered))
    with pytest.raises(InvalidValueError):
        codec.loads(data[:-1])
    with pytest.raises(InvalidValueError):
        codec.loads(data + b"\x00")


def test_wrong_key_is_rejected() -> None:
    data = stored(Codec(signing_key=KEY), "secret")
    with pytest.raises(InvalidValueError, match="signature"):
        Codec(signing_key=OTHER_KEY).loads(data)


@pytest.mark.parametrize("writer", ["pickle", "json", "msgpack"])
def test_unsigned_values_are_rejected_by_a_signing_codec(writer: str) -> None:
    data = stored(Codec(writer), {"a": 1})
    with pytest.raises(InvalidValueError, match="not signed"):
        Codec(signing_key=KEY).loads(data)


def _exploit_payloads() -> list[bytes]:
    body = pickle.dumps(Exploit(), pickle.HIGHEST_PROTOCOL)
    framed = b"\xfe\x10" + body
    return [
        body,  # legacy plain pickle
        framed,
        b"\xfe\x11" + zlib.compress(body),
        b"\xff" + b"\x00" * 32 + framed,  # a forged signature
        b"\xff" + hmac.digest(KEY, framed, "sha256") + framed,  # signed with the raw key
        b"\xff" + hmac.digest(OTHER_KEY, framed, "sha256") + framed,
    ]


def test_exploit_payload_is_live_for_an_unsigned_codec() -> None:
    """Control: proves the payload would run code, so the next test means something."""
    assert Codec().loads(_exploit_payloads()[1]) == "executed"
    assert SIDE_EFFECTS == ["executed"]


@pytest.mark.parametrize("serializer", SERIALIZERS)
@pytest.mark.parametrize("payload", _exploit_payloads(), ids=range(len(_exploit_payloads())))
def test_signing_codec_never_executes_untrusted_pickles(serializer: str, payload: bytes) -> None:
    codec = Codec(serializer, compressor="zstd", signing_key=KEY)
    with pytest.raises(InvalidValueError):
        codec.loads(payload)
    assert SIDE_EFFECTS == []


def test_json_codec_without_key_rejects_legacy_pickles() -> None:
    with pytest.raises(InvalidValueError):
        Codec("json").loads(_exploit_payloads()[0])
    assert SIDE_EFFECTS == []


def test_signing_key_validation_never_echoes_the_key() -> None:
    with pytest.raises(ConfigurationError, match="SIGNING_KEY") as info:
        Codec(signing_key=b"short-secret")
    assert "short-secret" not in str(info.value)
    assert Codec(signing_key="s" * 16).loads(Codec(signing_key=b"s" * 16).dumps("x")) == "x"  # type: ignore[arg-type]


def test_repr_does_not_leak_the_key() -> None:
    codec = Codec("json", compressor="zlib", signing_key=KEY)
    text = repr(codec)
    assert "json" in text and "zlib" in text and "signed=True" in text
    assert KEY.decode() not in text
