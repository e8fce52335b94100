"""The value codec shared by every cache front end: serialize, compress, sign, and read back.

This module is the storage format; the serializers and compressors it frames are in
:mod:`~sentinel_cache.core.codecs`, the signer in :mod:`~sentinel_cache.core.signing`.

Storage format (one Redis string value)
=======================================

``INT``
    ``int`` values inside the signed 64-bit range are stored as plain decimal ASCII (``b"42"``,
    ``b"-7"``), exactly what redis-py sends for an ``int``, so ``INCR``/``DECR`` work on them.
    ``bool`` (and other ``int`` subclasses) and integers outside 64 bits are *not* stored raw:
    Redis ``INCR`` only understands signed 64-bit numbers and ``True`` must come back as ``True``.
    Integers are never signed, even with a signing key: counters must stay ``INCR``-able, and
    Redis cannot maintain a MAC. The trade-off: an attacker who can write to Redis can change a
    counter (or replace any cached value with an integer), but can never get bytes of their
    choosing unpickled by a signing reader.

``FRAMED = 0xFE, header, payload``
    ``header`` = serializer id << 4 | compressor id. Serializers: 1 pickle, 2 json, 3 msgpack,
    4 text (a ``str`` as UTF-8), 5 bytes (as given), 15 custom. Compressors: 0 none, 1 zlib, 2 zstd, 15 custom. The payload is the serializer's
    output, compressed when the header says so.

``SIGNED = 0xFF, mac[32], FRAMED...``
    Written when a signing key is configured. ``mac`` is HMAC-SHA256 over the complete inner
    ``FRAMED`` value (magic and header included, so the header cannot be altered either) under
    ``HMAC-SHA256(signing_key, b"sentinel_cache.core.serializers.Codec v1")``; deriving the MAC key
    keeps a signing key that is shared with another system from turning that system into an
    oracle for our values.

``0xFE``/``0xFF`` were chosen because neither can start a decimal integer, neither is a pickle
opcode (protocol >= 2 streams begin with ``0x80``, protocols 0/1 with ASCII opcodes) and
neither byte ever occurs in UTF-8, so no text value is mistaken for a framed one.

Reading rules, and why
======================

* ``None`` -> ``None`` (a miss); a plain decimal integer -> ``int``. JSON and msgpack return
  tuples as lists (JSON also turns dict keys into strings); pickle returns what was stored.
* ``FRAMED`` is decoded by its header, whatever this codec was configured to write, so settings
  can change while old values are still in Redis (a zstd reader reads zlib and uncompressed
  values). A codec not configured for pickle never unpickles an unsigned value, so choosing
  json really means no pickle runs on what Redis holds. Only the *custom* ids (15) use this
  codec's own custom serializer/compressor, because the header cannot say which one wrote them.
* A codec **with** a signing key requires a valid signature on every non-integer value; it
  rejects unsigned and tampered values (:class:`InvalidValueError`, i.e. a miss) before
  decompressing or unpickling anything, so an attacker who can write to Redis cannot make it
  unpickle attacker-controlled bytes. Consequence: a json reader with a key reads pickle values
  only if they carry a valid signature, i.e. were written by a holder of the key.
* A codec **without** a signing key reads ``SIGNED`` values by skipping the signature without
  checking it. It already trusts unsigned values (including pickles), so this is no weaker, and
  it lets signing be switched on (or off) across a fleet without a wave of misses.
* A legacy plain pickle stream (``0x80 ...``, e.g. left by django-redis or by an earlier
  version) is unpickled only when this codec's serializer is pickle and it has no signing key.
* Anything else, and any payload that fails to decode, raises :class:`InvalidValueError`.

``VALUE_FORMAT = "plain"``: the serializer's bare output, nothing around it (what another
program, a Java service, writes and reads: ``"text"``, ``"json"``, ``"bytes"``; ``"pickle"`` is
django-redis's own format). Integers are canonical decimals as in the framed format, and a
canonical decimal reads as an ``int`` whatever the serializer (``INCR`` works on it). There is no
header, so a plain codec reads only its own serializer's output (anything else is a miss) and
takes neither a compressor (a reader could not tell a compressed value) nor a signing key.

Security note: without a signing key, anyone who can write to Redis can make a pickle-configured
reader unpickle chosen bytes, which runs code. A json or msgpack reader never unpickles an
unverified value. Configure a signing key if Redis is not fully trusted. Signatures do not
cover the key name, so a value can be copied from one key to another (replayed) but not forged.
"""

from __future__ import annotations

import hmac
import pickle
import types
import zlib
from collections.abc import Iterable
from typing import Any, Protocol

from sentinel_cache.core.addresses import bad_value
from sentinel_cache.core.codecs import (
    BUILTIN_MODULES,
    Dumps,
    Loads,
    Transform,
    Zstd,
    bytes_dumps,
    bytes_loads,
    custom_dumps,
    import_optional,
    json_dumps,
    json_loads,
    msgpack_functions,
    msgpack_loads_lazy,
    no_custom,
    resolve_object,
    text_dumps,
    text_loads,
    to_bytes,
    type_name,
    zstd_decompress_lazy,
)
from sentinel_cache.core.signing import Signer
from sentinel_cache.core.signing import check_signing_key as check_signing_key
from sentinel_cache.exceptions import (
    ConfigurationError,
    InvalidValueError,
    PicklingError,
    SerializationError,
)


class CodecOptions(Protocol):
    """The parsed options a codec is built from (``config.CacheOptions``; the config module
    checks them with this module's ``check_*`` functions, so this one cannot import it)."""

    @property
    def serializer(self) -> Any: ...
    @property
    def compressor(self) -> Any: ...
    @property
    def compress_min_length(self) -> int: ...
    @property
    def signing_key(self) -> bytes | None: ...
    @property
    def value_format(self) -> str: ...


__all__ = ["Codec", "build_codec"]


MAGIC = 0xFE
SIGNED_MAGIC = 0xFF
MAC_SIZE = 32

PICKLE_ID, JSON_ID, MSGPACK_ID, TEXT_ID, BYTES_ID = 1, 2, 3, 4, 5  # serializer ids (header)
VALUE_FORMATS = ("framed", "plain")
ZLIB_ID, ZSTD_ID = 1, 2  # compressor ids (low nibble; 0 means uncompressed)
CUSTOM_ID = 15  # either nibble: this codec's own custom serializer / compressor

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_LEGACY_PICKLE = 0x80
_MINUS = 0x2D
_SIGNED_PREFIX = bytes((SIGNED_MAGIC,))
_PLAIN_PICKLE_HEADER = bytes((PICKLE_ID << 4,))


# --- the codec's own options, checked here only (the configuration parser calls these) -------


def check_compress_min_length(value: Any) -> int:
    """``COMPRESS_MIN_LENGTH``: an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_value("COMPRESS_MIN_LENGTH", value, "must be an integer >= 0")
    return value


def check_value_format(value: Any, *, compressor: Any, signing_key: Any) -> str:
    """``VALUE_FORMAT``: "framed" or "plain"; plain values carry no header, so they are neither
    compressed nor signed (a reader could not tell)."""
    if value not in VALUE_FORMATS:
        raise bad_value("VALUE_FORMAT", value, 'expected "framed" or "plain"')
    if value == "plain" and signing_key is not None:
        raise ConfigurationError(
            option="VALUE_FORMAT",
            value=value,
            reason='"plain" values carry no signature: it cannot be combined with SIGNING_KEY',
        )
    if value == "plain" and compressor is not None:
        raise bad_value(
            "COMPRESSOR", compressor, 'must be None with VALUE_FORMAT "plain" (no header)'
        )
    return str(value)


# --- the codec -------------------------------------------------------------------------------


class Codec:
    """Turns cache values into Redis strings and back; immutable and thread safe.

    ``serializer``: "pickle", "json", "msgpack", or a dotted path / class / instance with
    ``dumps(value) -> bytes`` and ``loads(bytes) -> value``. ``compressor``: None, "zlib", "zstd"
    or a dotted path to an object with ``compress``/``decompress``; applied to payloads of at
    least ``compress_min_length`` bytes and kept only when smaller. ``signing_key`` (>= 16 bytes)
    signs every non-integer value and makes reads require the signature. See the module
    docstring for the storage format and the reading rules.
    """

    __slots__ = (
        "serializer_name",
        "compressor_name",
        "compress_min_length",
        "pickle_protocol",
        "_serializer_id",
        "_dumps",
        "_loaders",
        "_compress",
        "_decompressors",
        "_prefix",
        "_compressed_prefix",
        "_signer",
        "_fast_prefix",
        "_legacy_pickle",
        "_plain_pickle",
        "value_format",
    )

    serializer_name: str
    compressor_name: str | None
    _signer: Signer | None

    def __init__(
        self,
        serializer: str | type | object = "pickle",
        compressor: str | None = None,
        compress_min_length: int = 1024,
        signing_key: bytes | None = None,
        pickle_protocol: int | None = None,
        value_format: str = "framed",
    ) -> None:
        if pickle_protocol is None:  # plain pickle is django-redis's format: its protocol too
            pickle_protocol = (
                pickle.DEFAULT_PROTOCOL if value_format == "plain" else pickle.HIGHEST_PROTOCOL
            )
        if (
            isinstance(pickle_protocol, bool)
            or not isinstance(pickle_protocol, int)
            or not 0 <= pickle_protocol <= pickle.HIGHEST_PROTOCOL
        ):
            raise bad_value(
                "PICKLE_PROTOCOL",
                pickle_protocol,
                f"must be an integer from 0 to {pickle.HIGHEST_PROTOCOL}",
            )
        self.pickle_protocol = pickle_protocol
        self.compress_min_length = check_compress_min_length(compress_min_length)

        protocol = pickle_protocol
        loaders: dict[int, Loads] = {
            PICKLE_ID: pickle.loads,
            JSON_ID: json_loads,
            MSGPACK_ID: msgpack_loads_lazy,
            TEXT_ID: text_loads,
            BYTES_ID: bytes_loads,
            CUSTOM_ID: no_custom("serializer"),
        }
        dumps: Dumps
        known = serializer.strip().lower() if isinstance(serializer, str) else None
        if isinstance(serializer, types.ModuleType) and serializer.__name__ in BUILTIN_MODULES:
            # e.g. Flask-Caching passes the pickle module: store it in the shared format.
            known = serializer.__name__
        if known == "pickle":
            self._serializer_id = PICKLE_ID

            def dumps(value: Any) -> bytes:
                return pickle.dumps(value, protocol)

        elif known == "json":
            self._serializer_id = JSON_ID
            dumps = json_dumps
        elif known == "msgpack":
            self._serializer_id = MSGPACK_ID
            module = import_optional("msgpack", "SERIALIZER", "msgpack", "msgpack")
            dumps, loaders[MSGPACK_ID] = msgpack_functions(module)
        elif known == "text":
            self._serializer_id, dumps = TEXT_ID, text_dumps
        elif known == "bytes":
            self._serializer_id, dumps = BYTES_ID, bytes_dumps
        elif isinstance(serializer, str) and "." not in serializer:
            raise bad_value(
                "SERIALIZER",
                serializer,
                'expected "pickle", "json", "msgpack", "text", "bytes" or a dotted path to a class',
            )
        else:
            target, known = resolve_object("SERIALIZER", serializer, ("dumps", "loads"))
            self._serializer_id = CUSTOM_ID
            dumps = custom_dumps(target)
            loaders[CUSTOM_ID] = target.loads
        self.serializer_name = known
        self._dumps = dumps
        self._loaders = loaders

        decompressors: dict[int, Transform] = {
            ZLIB_ID: zlib.decompress,
            ZSTD_ID: zstd_decompress_lazy,
            CUSTOM_ID: no_custom("compressor"),
        }
        compress: Transform | None = None
        compressor_id = 0
        name: str | None = None
        if compressor is not None:
            known = compressor.strip().lower() if isinstance(compressor, str) else None
            if known == "zlib":
                compressor_id, name, compress = ZLIB_ID, known, zlib.compress
            elif known == "zstd":
                zstd = Zstd(import_optional("zstandard", "COMPRESSOR", compressor, "zstd"))
                compressor_id, name = ZSTD_ID, known
                compress, decompressors[ZSTD_ID] = zstd.compress, zstd.decompress
            elif isinstance(compressor, str) and "." not in compressor:
                raise bad_value(
                    "COMPRESSOR", compressor, 'expected "zlib", "zstd" or a dotted path'
                )
            else:
                target, name = resolve_object("COMPRESSOR", compressor, ("compress", "decompress"))
                compressor_id = CUSTOM_ID
                compress = to_bytes(target.compress)
                decompressors[CUSTOM_ID] = to_bytes(target.decompress)
        self.compressor_name = name
        self._compress = compress
        self._decompressors = decompressors

        self._prefix = bytes((MAGIC, self._serializer_id << 4))
        self._compressed_prefix = bytes((MAGIC, self._serializer_id << 4 | compressor_id))

        key = check_signing_key(signing_key)
        self.value_format = check_value_format(value_format, compressor=compressor, signing_key=key)
        self._signer = None if key is None else Signer(key)
        self._legacy_pickle = self._serializer_id == PICKLE_ID and self._signer is None
        # Reading: unsigned framed pickle (what the default configuration writes) skips dispatch.
        self._fast_prefix = self._prefix[:1] + _PLAIN_PICKLE_HEADER if self._legacy_pickle else None
        self._plain_pickle = (
            self._serializer_id == PICKLE_ID
            and compress is None
            and self._signer is None
            and self.value_format == "framed"
        )
        if self.value_format == "plain":
            self._fast_prefix = None

    def __repr__(self) -> str:
        return (
            f"Codec(serializer={self.serializer_name!r}, compressor={self.compressor_name!r}, "
            f"compress_min_length={self.compress_min_length}, signed={self._signer is not None}"
            + ("" if self.value_format == "framed" else ", value_format='plain'")
            + ")"
        )

    # --- writing ---

    def dumps(self, value: Any) -> bytes | int:
        """Encode ``value``; 64-bit ``int`` values stay ``int`` so Redis can ``INCR`` them."""
        if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
            return value
        if self._plain_pickle:  # the default configuration, kept to one concatenation
            try:
                return self._prefix + pickle.dumps(value, self.pickle_protocol)
            except Exception as exc:
                raise self._serialization_error(value, exc) from exc
        try:
            payload = self._dumps(value)
        except Exception as exc:
            raise self._serialization_error(value, exc) from exc
        if self.value_format == "plain":
            return payload
        compress = self._compress
        if compress is not None and len(payload) >= self.compress_min_length:
            packed = compress(payload)
            if len(packed) < len(payload):
                data = self._compressed_prefix + packed
            else:
                data = self._prefix + payload
        else:
            data = self._prefix + payload
        if self._signer is None:
            return data
        return b"".join((_SIGNED_PREFIX, self._signer.sign(data), data))

    def _serialization_error(self, value: Any, exc: Exception) -> SerializationError:
        error = PicklingError if isinstance(exc, pickle.PickleError) else SerializationError
        return error(
            f"SERIALIZER {self.serializer_name} cannot serialize a value of type "
            f"{type_name(value)}: {exc}"
        )

    # --- reading ---

    def loads(self, data: bytes | int | None) -> Any:
        """Decode what :meth:`dumps` (with any settings) wrote; raise InvalidValueError if not."""
        if type(data) is bytes and data[:2] == self._fast_prefix:
            try:
                return pickle.loads(data[2:])
            except Exception as exc:
                raise InvalidValueError(f"stored pickle cannot be loaded: {exc!r}") from exc
        return self._load_other(data)

    def loads_all(self, values: Iterable[bytes | int | None], missing: Any) -> list[Any]:
        """:meth:`loads` of each of ``values`` (``missing`` for a None: an absent key), the
        default configuration's without a Python call per value: a multi-key read's replies.
        The first unreadable value raises InvalidValueError (decode them one by one then)."""
        prefix, load, other = self._fast_prefix, pickle.loads, self._load_other
        try:
            return [
                missing
                if data is None
                else load(data[2:])
                if type(data) is bytes and data[:2] == prefix
                else other(data)
                for data in values
            ]
        except InvalidValueError:
            raise
        except Exception as exc:  # only the pickle can fail otherwise
            raise InvalidValueError(f"stored pickle cannot be loaded: {exc!r}") from exc

    def _load_other(self, data: bytes | int | None) -> Any:
        if type(data) is not bytes:
            if data is None:
                return None
            coerced = _coerce_stored(data)
            if isinstance(coerced, int):
                return coerced
            data = coerced
        if self.value_format == "plain":
            return self._load_plain(data)
        try:
            first = data[0]
        except IndexError:
            raise InvalidValueError("stored value is empty") from None
        if first == MAGIC:
            if self._signer is not None:
                raise InvalidValueError("stored value is not signed but a signing key is set")
            return self._load_framed(data, trusted=False)
        if data.isdigit() or (first == _MINUS and data[1:].isdigit()):
            return int(data)
        if first == SIGNED_MAGIC:
            return self._load_signed(data)
        if first == _LEGACY_PICKLE and self._legacy_pickle:
            try:
                return pickle.loads(data)
            except Exception as exc:
                raise InvalidValueError(f"stored pickle cannot be loaded: {exc!r}") from exc
        raise InvalidValueError(f"stored value has an unknown format (starts {data[:4]!r})")

    def _load_plain(self, data: bytes) -> Any:
        """A bare value: a canonical decimal of the signed 64-bit range is an ``int``, what
        ``dumps`` writes for one (``b"007"`` is not, nor a longer number: they stay the
        serializer's), anything else the serializer's output."""
        if len(data) <= 20 and (data[:1].isdigit() or data[:1] == b"-"):
            digits = data[1:] if data[:1] == b"-" else data
            if digits.isdigit() and str(int(data)).encode() == data:
                number = int(data)
                if _INT64_MIN <= number <= _INT64_MAX:
                    return number
        try:
            return self._loaders[self._serializer_id](data)
        except Exception as exc:
            raise InvalidValueError(
                f"stored value is not {self.serializer_name} (VALUE_FORMAT plain): {exc!r}"
            ) from exc

    def _load_signed(self, data: bytes) -> Any:
        inner = data[1 + MAC_SIZE :]
        if len(inner) < 2 or inner[0] != MAGIC:
            raise InvalidValueError("signed value is truncated or malformed")
        if self._signer is None:
            # The signature cannot be checked; this codec trusts unsigned data anyway.
            return self._load_framed(inner, trusted=False)
        expected = self._signer.sign(inner)
        if not hmac.compare_digest(data[1 : 1 + MAC_SIZE], expected):
            raise InvalidValueError(
                "signature mismatch: value was tampered with or the key differs"
            )
        return self._load_framed(inner, trusted=True)

    def _load_framed(self, data: bytes, *, trusted: bool) -> Any:
        """``trusted``: the signature was verified. Without that, only a codec configured for
        pickle unpickles: choosing json must really mean "never run pickle on what Redis holds"."""
        if len(data) < 2:
            raise InvalidValueError("framed value is truncated")
        header = data[1]
        if header >> 4 == PICKLE_ID and not trusted and self._serializer_id != PICKLE_ID:
            raise InvalidValueError(
                "stored value is pickled, and this cache is not configured for pickle "
                "(unpickling untrusted data can run code; set a SIGNING_KEY to share pickles)"
            )
        loader = self._loaders.get(header >> 4)
        compressor_id = header & 0x0F
        decompress = self._decompressors.get(compressor_id) if compressor_id else None
        if loader is None or (compressor_id and decompress is None):
            raise InvalidValueError(f"stored value has an unknown header 0x{header:02x}")
        try:
            payload = data[2:]
            if decompress is not None:
                payload = decompress(payload)
            return loader(payload)
        except InvalidValueError:
            raise
        except Exception as exc:
            raise InvalidValueError(
                f"stored value (header 0x{header:02x}) cannot be decoded: {exc!r}"
            ) from exc


def _coerce_stored(data: object) -> bytes | int:
    """Accept what a Redis client can hand back; anything else is not a stored value of ours."""
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, int) and not isinstance(data, bool):
        return int(data)
    if isinstance(data, str):
        raise InvalidValueError("got str, not bytes: the connection must not use decode_responses")
    raise InvalidValueError(f"got {type_name(data)}, not bytes")


def build_codec(options: CodecOptions) -> Codec:
    """The codec for a cache front end's parsed options."""
    return Codec(
        serializer=options.serializer,
        compressor=options.compressor,
        compress_min_length=options.compress_min_length,
        signing_key=options.signing_key,
        value_format=options.value_format,
    )
