"""The parts a :class:`~sentinel_cache.core.serializers.Codec` is built from: the built-in
serializers (text, bytes, json, msgpack) and compressors (zstd; zlib is the stdlib's), and custom
ones given as a dotted path, a class or an instance.

Apart from the codec so that its one concern, the storage format, reads on its own. Optional
extras (msgpack, zstandard) are imported only when configured, or when a value another process
wrote needs them (a missing one is then a miss, not a crash).
"""

from __future__ import annotations

import importlib
import inspect
import json
import threading
import types
from collections.abc import Callable
from typing import Any

from sentinel_cache.core.addresses import bad_value
from sentinel_cache.exceptions import InvalidValueError

BUILTIN_MODULES = frozenset({"pickle", "json", "msgpack"})

Dumps = Callable[[Any], bytes]
Loads = Callable[[bytes], Any]
Transform = Callable[[bytes], bytes]


def type_name(value: Any) -> str:
    """A value's type as error messages name it (``module.Class``; builtins bare)."""
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


# --- built-in serializers --------------------------------------------------------------------


def text_dumps(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f'SERIALIZER "text" stores str values, not {type_name(value)}')
    return value.encode("utf-8")


def text_loads(payload: bytes) -> str:
    return payload.decode("utf-8")


def bytes_dumps(value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f'SERIALIZER "bytes" stores bytes values, not {type_name(value)}')
    return bytes(value)


def bytes_loads(payload: bytes) -> bytes:
    return payload


def _json_default(value: Any) -> Any:
    """Name the exact offending type, even deep inside a container."""
    raise TypeError(f"Object of type {type_name(value)} is not JSON serializable")


_json_encoder = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_json_default
)


def json_dumps(value: Any) -> bytes:
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


def json_loads(payload: bytes) -> Any:
    return json.loads(payload)


def import_optional(module: str, field_name: str, name: str, extra: str) -> Any:
    """Import an optional extra when it is configured; a missing one is a configuration error."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise bad_value(
            field_name, name, f"needs the {module} package: pip install sentinel-cache[{extra}]"
        ) from None


def import_for_reading(module: str, extra: str) -> Any:
    """Import an optional extra to read a value another process wrote; missing means a miss."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InvalidValueError(
            f"value was written with {module}, which is not installed here "
            f"(pip install sentinel-cache[{extra}])"
        ) from None


def msgpack_functions(msgpack: Any) -> tuple[Dumps, Loads]:
    def dumps(value: Any) -> bytes:
        return msgpack.packb(value, use_bin_type=True)

    def loads(payload: bytes) -> Any:
        # strict_map_key=False: msgpack packs int keys happily, so it must also unpack them.
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)

    return dumps, loads


def msgpack_loads_lazy(payload: bytes) -> Any:
    return msgpack_functions(import_for_reading("msgpack", "msgpack"))[1](payload)


class Zstd:
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


_zstd_for_reading: Zstd | None = None
_zstd_lock = threading.Lock()


def zstd_decompress_lazy(payload: bytes) -> bytes:
    global _zstd_for_reading
    if _zstd_for_reading is None:
        module = import_for_reading("zstandard", "zstd")
        with _zstd_lock:
            if _zstd_for_reading is None:
                _zstd_for_reading = Zstd(module)
    return _zstd_for_reading.decompress(payload)


# --- custom (dotted path / class / instance) -------------------------------------------------


def resolve_object(field_name: str, spec: Any, methods: tuple[str, str]) -> tuple[Any, str]:
    """Turn a dotted path, a class, a factory or an instance into an object with ``methods``."""
    name = spec if isinstance(spec, str) else _qualified_name(spec)
    target = spec
    if isinstance(spec, str):
        target = _import_dotted(field_name, spec)
    if isinstance(target, type) or (callable(target) and not _has_methods(target, methods)):
        try:
            target = target()
        except Exception as exc:
            raise bad_value(
                field_name, spec, f"could not instantiate it without arguments: {exc}"
            ) from exc
    if not _has_methods(target, methods):
        raise bad_value(
            field_name, spec, f"must provide callable {methods[0]}() and {methods[1]}()"
        )
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
        raise bad_value(field_name, path, "expected a dotted path such as 'package.module.Class'")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as first:
        try:
            return importlib.import_module(path.strip())
        except ImportError:
            raise bad_value(field_name, path, f"cannot import it: {first}") from None


def custom_dumps(target: Any) -> Dumps:
    method = target.dumps

    def dumps(value: Any) -> bytes:
        data = method(value)
        if isinstance(data, bytes):
            return data
        if isinstance(data, (bytearray, memoryview)):
            return bytes(data)
        if isinstance(data, str):
            return data.encode("utf-8")
        raise TypeError(f"custom serializer returned {type_name(data)}, expected bytes")

    return dumps


def to_bytes(function: Callable[[bytes], Any]) -> Transform:
    def call(data: bytes) -> bytes:
        result = function(data)
        return result if isinstance(result, bytes) else bytes(result)

    return call


def no_custom(kind: str) -> Callable[[bytes], Any]:
    def fail(payload: bytes) -> Any:
        raise InvalidValueError(f"value was written by a custom {kind}; this codec has none")

    return fail
