"""What the codec tests share: the signing keys and the bytes Redis would hold for a value.

No servers: the Redis side is redis-py's own ``Encoder`` (what it sends for a value), and the
bytes a ``GET`` would return."""

from __future__ import annotations

from typing import Any

from redis._parsers.encoders import Encoder

from sentinel_cache.core.serializers import Codec

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

redis_encoder = Encoder("utf-8", "strict", False)


def stored(codec: Codec, value: Any) -> bytes:
    """The bytes Redis would hold (and GET would return) after ``SET key codec.dumps(value)``."""
    return bytes(redis_encoder.encode(codec.dumps(value)))


def roundtrip(codec: Codec, value: Any, reader: Codec | None = None) -> Any:
    return (reader or codec).loads(stored(codec, value))


SERIALIZERS = ["pickle", "json", "msgpack"]
