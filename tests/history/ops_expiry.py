"""Expiry ops for the history recorder: keys written with a TTL short enough to expire during
the run (1-2 s), ``touch`` giving them a new one, and reads judged by the checker's
``expired-read`` rule against it. Registered into :data:`~history.recorder.OPS` on import.

Their keys are apart from the register keys: ``<prefix>:t<n>`` (200 keys written, touched and
read, so a key often goes its TTL without a write or touch) and ``<prefix>:z<value>`` (each
written once, named after its unique value, with a 1 s TTL, and read at random later by the
client that wrote it: most are first accessed after their TTL, a key the server expires lazily
on that access unless its active expiry sampled it first). Their reads emit
:class:`ExpiryRead`, not the register model's ``Read``: a miss after a TTL is the cache working.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ops_scans import prefix_of
from .recorder import (
    INFO,
    OK,
    OPS,
    Adapter,
    AsyncAdapter,
    CoreAdapter,
    DjangoAdapter,
    Op,
    OpSpec,
    Workload,
)

TTLS = (1.0, 1.5, 2.0)
LAZY_TTL = 1.0
TTL_KEYS = 200  # enough that a key often goes 1-2 s without a write or touch, and expires


@dataclass(frozen=True)
class Expiring:
    """A write of ``value`` with ``ttl`` seconds (certain: acknowledged)."""

    key: str
    value: Any
    ttl: float
    certain: bool


@dataclass(frozen=True)
class Touched:
    """A touch giving the key ``ttl`` seconds (certain: acknowledged True)."""

    key: str
    ttl: float
    certain: bool


@dataclass(frozen=True)
class ExpiryRead:
    key: str
    value: Any  # None: a miss


def set_with_ttl(adapter: Adapter, key: str, value: Any, ttl: float) -> bool:
    if isinstance(adapter, DjangoAdapter):
        return bool(adapter.cache.set(key, value, ttl))
    if isinstance(adapter, CoreAdapter):
        return bool(adapter.client.set(key, value, ttl))
    if isinstance(adapter, AsyncAdapter):
        return bool(adapter._run(adapter.client.set(key, value, ttl)))
    raise TypeError(f"no set with a TTL for {adapter!r}")


def touch_with_ttl(adapter: Adapter, key: str, ttl: float) -> bool:
    if isinstance(adapter, DjangoAdapter):
        return bool(adapter.cache.touch(key, ttl))
    if isinstance(adapter, CoreAdapter):
        return bool(adapter.client.touch(key, ttl))
    if isinstance(adapter, AsyncAdapter):
        return bool(adapter._run(adapter.client.touch(key, ttl)))
    raise TypeError(f"no touch for {adapter!r}")


def _ttl_key(rng: random.Random, w: Workload) -> str:
    return f"{prefix_of(w.keys[0])}:t{rng.randrange(TTL_KEYS)}"


def _set_ttl(rng: random.Random, w: Workload, value: Callable[[], str]) -> Any:
    return (_ttl_key(rng, w),), (value(), rng.choice(TTLS))


def _touch(rng: random.Random, w: Workload, value: Callable[[], str]) -> Any:
    return (_ttl_key(rng, w),), (rng.choice(TTLS),)


def _get_ttl(rng: random.Random, w: Workload, value: Callable[[], str]) -> Any:
    return (_ttl_key(rng, w),), ()


def _lazy_set(rng: random.Random, w: Workload, value: Callable[[], str]) -> Any:
    """A key written once (named after its unique value), with a 1 s TTL."""
    v = value()
    return (f"{prefix_of(w.keys[0])}:z{v}",), (v, LAZY_TTL)


def _lazy_get(rng: random.Random, w: Workload, value: Callable[[], str]) -> Any:
    """One of this client's earlier write-once keys (or a name it never wrote: a miss), most
    likely first accessed here, after its TTL."""
    client, _, seq = value().rpartition(":")
    return (f"{prefix_of(w.keys[0])}:z{client}:{rng.randint(1, int(seq))}",), ()


def _expiring(op: Op) -> list[Any]:
    value, ttl = op.args
    if op.kind == OK:
        return [Expiring(op.keys[0], value, ttl, True)] if op.value else []
    return [Expiring(op.keys[0], value, ttl, False)] if op.kind == INFO else []


def _touched(op: Op) -> list[Any]:
    (ttl,) = op.args
    if op.kind == OK:
        return [Touched(op.keys[0], ttl, True)] if op.value else []
    return [Touched(op.keys[0], ttl, False)] if op.kind == INFO else []


def _read(op: Op) -> list[Any]:
    return [ExpiryRead(op.keys[0], op.value)] if op.kind == OK else []


def _get(a: Adapter, k: tuple[str, ...], x: tuple[Any, ...]) -> Any:
    return a.get(k[0])


EXPIRY_OPS: dict[str, OpSpec] = {
    "set_ttl": OpSpec(_set_ttl, lambda a, k, x: set_with_ttl(a, k[0], *x), _expiring, weight=0),
    "touch_ttl": OpSpec(_touch, lambda a, k, x: touch_with_ttl(a, k[0], *x), _touched, weight=0),
    "get_ttl": OpSpec(_get_ttl, _get, _read, weight=0),
    "lazy_set": OpSpec(_lazy_set, lambda a, k, x: set_with_ttl(a, k[0], *x), _expiring, weight=0),
    "lazy_get": OpSpec(_lazy_get, _get, _read, weight=0),
}
OPS.update(EXPIRY_OPS)

registered = True
REGISTER = ("history.ops_expiry:registered", "history.ops_expiry:unchanged")


def unchanged(original: Any) -> Any:
    """The no-op patch factory of :data:`REGISTER` (imports this module in a client process)."""
    return original


def ttl_dropped(original: Any) -> Any:
    """Planted fault for ``CacheOperations.set``: the value is stored without its TTL (as a
    write path that loses the expiry argument would)."""

    def set_forever(self: Any, key: Any, value: Any, timeout: Any, *args: Any, **kw: Any) -> Any:
        return original(self, key, value, None, *args, **kw)

    return set_forever
