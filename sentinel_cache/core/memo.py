"""What the adapters make of their settings, kept by a sound frozen copy of those settings.

Django builds a new cache backend object for every ASGI request and per thread; parsing the
same LOCATION and OPTIONS each time cost most of a construction. :class:`Memo` keeps the parsed
result under :func:`settings_key`, so an instance built from settings already seen costs a
lookup. Framework-neutral: the adapters decide what goes into the key and what is kept.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

__all__ = ["Memo", "settings_key"]

V = TypeVar("V")

# Values that equal only values of their own type and never change: kept as they are.
_AS_IS = (str, int, bytes, type(None))
_CALLABLES = (types.FunctionType, types.BuiltinFunctionType)


def _key(value: Any) -> Hashable:
    """``value``'s frozen, type-tagged copy; TypeError when it cannot be keyed safely.

    Tagged by exact type, because ``True == 1 == 1.0`` and ``[1] == (1,)`` would otherwise
    share a key though the parser treats them differently (a bool is no DB number). Floats by
    ``repr`` (``-0.0`` apart from ``0.0``, a NaN equal to itself). Classes and functions by
    identity (a dotted path's import gives the same object). Anything else (an object with
    state of its own, a str subclass such as a lazy translation) is refused: parsed each time."""
    kind = type(value)
    if kind in _AS_IS:
        return value
    if kind is bool:
        return (bool, value)
    if kind is float:
        return (float, repr(value))
    if kind is list or kind is tuple:
        return (kind, *[_key(item) for item in value])
    if kind is dict:
        return (dict, *[(_key(name), _key(item)) for name, item in value.items()])
    if kind is set or kind is frozenset:
        return (frozenset, frozenset([_key(item) for item in value]))
    if kind in _CALLABLES:
        return (types.FunctionType, value)
    if (
        isinstance(value, type)
        and kind.__eq__ is object.__eq__
        and kind.__hash__ is object.__hash__
    ):
        return (type, value)  # a class whose metaclass compares by identity
    raise TypeError(f"cannot key a {kind.__name__}")


def settings_key(*parts: Any) -> tuple[Hashable, ...] | None:
    """A key equal for equal settings and different for any difference the parser could see;
    None when some value cannot be keyed safely (the caller then parses, as without a memo)."""
    try:
        return tuple([_key(part) for part in parts])
    except (TypeError, RecursionError):
        return None


class Memo(Generic[V]):
    """At most ``size`` values by key, the oldest dropped first: settings are few, but a program
    building caches from ever-new settings must not grow memory without bound. Lookups take no
    lock; a store does, and the first value stored under a key is the one every caller gets."""

    __slots__ = ("size", "_entries", "_lock")

    def __init__(self, size: int = 64) -> None:
        if size < 1:
            raise ValueError(f"a memo keeps at least one value (got size={size!r})")
        self.size = size
        self._entries: dict[Hashable, V] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the keys: they hold passwords and signing keys
        return f"<Memo {len(self._entries)}/{self.size}>"

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> V | None:
        return self._entries.get(key)

    def put(self, key: Hashable, value: V) -> V:
        """Keep ``value`` under ``key`` unless another caller stored one first: returns the one
        kept."""
        with self._lock:
            kept = self._entries.get(key)
            if kept is not None:
                return kept
            while len(self._entries) >= self.size:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = value
            return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
