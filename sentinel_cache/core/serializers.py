"""The value codec shared by every cache front end: serialize, compress, sign, and read back.

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

import hashlib
import hmac
import importlib
import inspect
import json
import pickle
import threading
import types
import zlib
from collections.abc import Callable
from typing import Any, Protocol

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
_MAC_CONTEXT = b"sentinel_cache.core.serializers.Codec v1"
_LEGACY_PICKLE = 0x80
_MINUS = 0x2D
_SIGNED_PREFIX = bytes((SIGNED_MAGIC,))
_PLAIN_PICKLE_HEADER = bytes((PICKLE_ID << 4,))

_BUILTIN_MODULES = frozenset({"pickle", "json", "msgpack"})

_Dumps = Callable[[Any], bytes]
_Loads = Callable[[bytes], Any]
_Transform = Callable[[bytes], bytes]


def _bad(field_name: str, value: Any, why: str) -> ConfigurationError:
    return ConfigurationError(option=field_name, value=value, reason=f"{why} (got {value!r})")


# --- the codec's own options, checked here only (the configuration parser calls these) -------


def check_compress_min_length(value: Any) -> int:
    """``COMPRESS_MIN_LENGTH``: an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad("COMPRESS_MIN_LENGTH", value, "must be an integer >= 0")
    return value


def check_value_format(value: Any, *, compressor: Any, signing_key: Any) -> str:
    """``VALUE_FORMAT``: "framed" or "plain"; plain values carry no header, so they are neither
    compressed nor signed (a reader could not tell)."""
    if value not in VALUE_FORMATS:
        raise _bad("VALUE_FORMAT", value, 'expected "framed" or "plain"')
    if value == "plain" and signing_key is not None:
        raise ConfigurationError(
            option="VALUE_FORMAT",
            value=value,
            reason='"plain" values carry no signature: it cannot be combined with SIGNING_KEY',
        )
    if value == "plain" and compressor is not None:
        raise _bad("COMPRESSOR", compressor, 'must be None with VALUE_FORMAT "plain" (no header)')
    return str(value)


def _text_dumps(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f'SERIALIZER "text" stores str values, not {_type_name(value)}')
    return value.encode("utf-8")


def _text_loads(payload: bytes) -> str:
    return payload.decode("utf-8")


def _bytes_dumps(value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f'SERIALIZER "bytes" stores bytes values, not {_type_name(value)}')
    return bytes(value)


def _bytes_loads(payload: bytes) -> bytes:
    return payload


def check_signing_key(value: Any) -> bytes | None:
    """``SIGNING_KEY`` as bytes: a str (UTF-8 encoded) or bytes of at least 16 characters, or
    None. The key never appears in the error."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray)) or len(value) < 16:
        raise _bad("SIGNING_KEY", "***", "must be a str or bytes of at least 16 characters")
    return bytes(value)


def _type_name(value: Any) -> str:
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


# --- built-in serializers --------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    """Name the exact offending type, even deep inside a container."""
    raise TypeError(f"Object of type {_type_name(value)} is not JSON serializable")


_json_encoder = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_json_default
)


def _json_dumps(value: Any) -> bytes:
    """Compact, strict JSON (no NaN/Infinity) that other languages can read.

    JSON turns tuples into lists and non-string dict keys into strings, and cannot carry bytes,
    sets or arbitrary objects (those raise :class:`SerializationError`).
    """
    try:
        return _json_encoder.encode(value).encode("utf-8")
    except ValueError as exc:
        if str(exc).startswith("Out of range float"):  # the stdlib message names no value
            raise ValueError("a float NaN/Infinity is not valid JSON") from None
        raise


def _json_loads(payload: bytes) -> Any:
    return json.loads(payload)


def _import_optional(module: str, field_name: str, name: str, extra: str) -> Any:
    """Import an optional extra when it is configured; a missing one is a configuration error."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise _bad(
            field_name, name, f"needs the {module} package: pip install sentinel-cache[{extra}]"
        ) from None


def _import_for_reading(module: str, extra: str) -> Any:
    """Import an optional extra to read a value another process wrote; missing means a miss."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InvalidValueError(
            f"value was written with {module}, which is not installed here "
            f"(pip install sentinel-cache[{extra}])"
        ) from None


def _msgpack_functions(msgpack: Any) -> tuple[_Dumps, _Loads]:
    def dumps(value: Any) -> bytes:
        return msgpack.packb(value, use_bin_type=True)

    def loads(payload: bytes) -> Any:
        # strict_map_key=False: msgpack packs int keys happily, so it must also unpack them.
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)

    return dumps, loads


def _msgpack_loads_lazy(payload: bytes) -> Any:
    return _msgpack_functions(_import_for_reading("msgpack", "msgpack"))[1](payload)


class _Zstd:
    """zstandard (de)compressor objects are not thread safe, so keep one pair per thread."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self._local = threading.local()

    def compress(self, data: bytes) -> bytes:
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = self._local.compressor = self._module.ZstdCompressor(level=3)
        return compressor.compress(data)

    def decompress(self, data: bytes) -> bytes:
        decompressor = getattr(self._local, "decompressor", None)
        if decompressor is None:
            decompressor = self._local.decompressor = self._module.ZstdDecompressor()
        return decompressor.decompress(data)


_zstd_for_reading: _Zstd | None = None
_zstd_lock = threading.Lock()


def _zstd_decompress_lazy(payload: bytes) -> bytes:
    global _zstd_for_reading
    if _zstd_for_reading is None:
        module = _import_for_reading("zstandard", "zstd")
        with _zstd_lock:
            if _zstd_for_reading is None:
                _zstd_for_reading = _Zstd(module)
    return _zstd_for_reading.decompress(payload)


# --- signing ---------------------------------------------------------------------------------


class _Signer:
    """HMAC-SHA256 (RFC 2104) from precomputed pad states.

    ``hmac.digest`` re-initialises OpenSSL's HMAC on every call (about 2.5 us on OpenSSL 3);
    copying two prepared SHA-256 states costs a quarter of that. The template states are never
    updated, only copied, so one signer is safe to share between threads.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, signing_key: bytes) -> None:
        # Domain separation: the MAC key is derived, never the configured key itself.
        key = hmac.digest(signing_key, _MAC_CONTEXT, "sha256").ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def sign(self, data: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


# --- custom (dotted path / class / instance) -------------------------------------------------


def _resolve_object(field_name: str, spec: Any, methods: tuple[str, str]) -> tuple[Any, str]:
    """Turn a dotted path, a class, a factory or an instance into an object with ``methods``."""
    name = spec if isinstance(spec, str) else _qualified_name(spec)
    target = spec
    if isinstance(spec, str):
        target = _import_dotted(field_name, spec)
    if isinstance(target, type) or (callable(target) and not _has_methods(target, methods)):
        try:
            target = target()
        except Exception as exc:
            raise _bad(
                field_name, spec, f"could not instantiate it without arguments: {exc}"
            ) from exc
    if not _has_methods(target, methods):
        raise _bad(field_name, spec, f"must provide callable {methods[0]}() and {methods[1]}()")
    return target, name


def _has_methods(target: Any, methods: tuple[str, str]) -> bool:
    return all(callable(getattr(target, method, None)) for method in methods)


def _qualified_name(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    kind = obj if isinstance(obj, type) or inspect.isroutine(obj) else type(obj)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"


def _import_dotted(field_name: str, path: str) -> Any:
    """``pkg.mod.Attr`` (or a module such as ``lz4.frame``), resolved with importlib."""
    module_name, dot, attr = path.strip().rpartition(".")
    if not dot or not module_name or not attr:
        raise _bad(field_name, path, "expected a dotted path such as 'package.module.Class'")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as first:
        try:
            return importlib.import_module(path.strip())
        except ImportError:
            raise _bad(field_name, path, f"cannot import it: {first}") from None


def _custom_dumps(target: Any) -> _Dumps:
    method = target.dumps

    def dumps(value: Any) -> bytes:
        data = method(value)
        if isinstance(data, bytes):
            return data
        if isinstance(data, (bytearray, memoryview)):
            return bytes(data)
        if isinstance(data, str):
            return data.encode("utf-8")
        raise TypeError(f"custom serializer returned {_type_name(data)}, expected bytes")

    return dumps


def _to_bytes(function: Callable[[bytes], Any]) -> _Transform:
    def call(data: bytes) -> bytes:
        result = function(data)
        return result if isinstance(result, bytes) else bytes(result)

    return call


def _no_custom(kind: str) -> Callable[[bytes], Any]:
    def fail(payload: bytes) -> Any:
        raise InvalidValueError(f"value was written by a custom {kind}; this codec has none")

    return fail


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
    _signer: _Signer | None

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
            raise _bad(
                "PICKLE_PROTOCOL",
                pickle_protocol,
                f"must be an integer from 0 to {pickle.HIGHEST_PROTOCOL}",
            )
        self.pickle_protocol = pickle_protocol
        self.compress_min_length = check_compress_min_length(compress_min_length)

        protocol = pickle_protocol
        loaders: dict[int, _Loads] = {
            PICKLE_ID: pickle.loads,
            JSON_ID: _json_loads,
            MSGPACK_ID: _msgpack_loads_lazy,
            TEXT_ID: _text_loads,
            BYTES_ID: _bytes_loads,
            CUSTOM_ID: _no_custom("serializer"),
        }
        dumps: _Dumps
        known = serializer.strip().lower() if isinstance(serializer, str) else None
        if isinstance(serializer, types.ModuleType) and serializer.__name__ in _BUILTIN_MODULES:
            # e.g. Flask-Caching passes the pickle module: store it in the shared format.
            known = serializer.__name__
        if known == "pickle":
            self._serializer_id = PICKLE_ID

            def dumps(value: Any) -> bytes:
                return pickle.dumps(value, protocol)

        elif known == "json":
            self._serializer_id = JSON_ID
            dumps = _json_dumps
        elif known == "msgpack":
            self._serializer_id = MSGPACK_ID
            module = _import_optional("msgpack", "SERIALIZER", "msgpack", "msgpack")
            dumps, loaders[MSGPACK_ID] = _msgpack_functions(module)
        elif known == "text":
            self._serializer_id, dumps = TEXT_ID, _text_dumps
        elif known == "bytes":
            self._serializer_id, dumps = BYTES_ID, _bytes_dumps
        elif isinstance(serializer, str) and "." not in serializer:
            raise _bad(
                "SERIALIZER",
                serializer,
                'expected "pickle", "json", "msgpack", "text", "bytes" or a dotted path to a class',
            )
        else:
            target, known = _resolve_object("SERIALIZER", serializer, ("dumps", "loads"))
            self._serializer_id = CUSTOM_ID
            dumps = _custom_dumps(target)
            loaders[CUSTOM_ID] = target.loads
        self.serializer_name = known
        self._dumps = dumps
        self._loaders = loaders

        decompressors: dict[int, _Transform] = {
            ZLIB_ID: zlib.decompress,
            ZSTD_ID: _zstd_decompress_lazy,
            CUSTOM_ID: _no_custom("compressor"),
        }
        compress: _Transform | None = None
        compressor_id = 0
        name: str | None = None
        if compressor is not None:
            known = compressor.strip().lower() if isinstance(compressor, str) else None
            if known == "zlib":
                compressor_id, name, compress = ZLIB_ID, known, zlib.compress
            elif known == "zstd":
                zstd = _Zstd(_import_optional("zstandard", "COMPRESSOR", compressor, "zstd"))
                compressor_id, name = ZSTD_ID, known
                compress, decompressors[ZSTD_ID] = zstd.compress, zstd.decompress
            elif isinstance(compressor, str) and "." not in compressor:
                raise _bad("COMPRESSOR", compressor, 'expected "zlib", "zstd" or a dotted path')
            else:
                target, name = _resolve_object("COMPRESSOR", compressor, ("compress", "decompress"))
                compressor_id = CUSTOM_ID
                compress = _to_bytes(target.compress)
                decompressors[CUSTOM_ID] = _to_bytes(target.decompress)
        self.compressor_name = name
        self._compress = compress
        self._decompressors = decompressors

        self._prefix = bytes((MAGIC, self._serializer_id << 4))
        self._compressed_prefix = bytes((MAGIC, self._serializer_id << 4 | compressor_id))

        key = check_signing_key(signing_key)
        self.value_format = check_value_format(value_format, compressor=compressor, signing_key=key)
        self._signer = None if key is None else _Signer(key)
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
            f"{_type_name(value)}: {exc}"
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
    raise InvalidValueError(f"got {_type_name(data)}, not bytes")


def build_codec(options: CodecOptions) -> Codec:
    """The codec for a cache front end's parsed options."""
    return Codec(
        serializer=options.serializer,
        compressor=options.compressor,
        compress_min_length=options.compress_min_length,
        signing_key=options.signing_key,
        value_format=options.value_format,
    )
