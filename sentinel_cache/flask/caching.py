"""``sentinel_cache.flask.Cache``: Flask-Caching's ``Cache``, whose ``@cached`` and
``@memoize`` compute a missing value once across processes. Use it instead of
``flask_caching.Cache`` (same arguments, same keys, same decorators' arguments).

Flask-Caching's decorators get the key, and on a miss call the function and store its result
if ``response_filter`` allows, with no coordination: every caller that misses a cold or
expired key computes it. Here, when the backend is ours with ``STAMPEDE_PROTECTION``, the miss
of a decorated call takes the key's lock (:mod:`sentinel_cache.core.ops._async.single_flight`): one caller
across every process computes and stores, the others wait, then get the stored value. A result
that is not stored (filtered out, an exception) lets each waiting caller compute it itself,
once. With the option off, or another backend, it is Flask-Caching's behaviour exactly.

The hook is the decorators' own calls: a decorated call marks itself (a context variable), its
``get`` of the key takes the lock on a miss, its ``set`` of that key releases it, and the
call's end releases it in any case. ``@memoize`` also keeps a version per function: a cold one
is created by the first caller and adopted by the others (Flask-Caching would let each make its
own, and compute under its own key). With ``STAMPEDE_EARLY_REFRESH``, a decorated call's read
also gets the key's time left and its last computation's duration (one round trip), and may
recompute it shortly before it expires, as ``get_or_set`` does.
"""

from __future__ import annotations

import base64
import functools
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from flask_caching import Cache as FlaskCachingCache

from sentinel_cache.core.ops.client import SingleFlight, Ticket
from sentinel_cache.core.ops.plans import MISS
from sentinel_cache.flask.cache import ShardedSentinelCache

__all__ = ["Cache"]

VERSION_SUFFIX = "_memver"  # Flask-Caching's memoize version keys: the function's name + this


class _Call:
    """One decorated call: whether its first ``get`` is still to come, and its ticket."""

    __slots__ = ("looked", "key", "ticket")

    def __init__(self) -> None:
        self.looked = False
        self.key: Any = None
        self.ticket: Ticket | None = None


_call: ContextVar[_Call | None] = ContextVar("sentinel_cache_flask_call", default=None)


def _single_flight(decorated: Callable[..., Any]) -> Callable[..., Any]:
    """``decorated`` (Flask-Caching's wrapper) run as a marked call; its attributes
    (``uncached``, ``cache_timeout``, ``make_cache_key``...) are the same object's, live."""

    def call(*args: Any, **kwargs: Any) -> Any:
        mark = _call.set(_Call())
        try:
            return decorated(*args, **kwargs)
        finally:
            state = _call.get()
            _call.reset(mark)
            if state is not None and state.ticket is not None:
                state.ticket.end()

    functools.update_wrapper(call, decorated, updated=())
    call.__dict__ = decorated.__dict__  # shared: setting cache_timeout on either changes both
    return call


class Cache(FlaskCachingCache):
    """``flask_caching.Cache`` with single-flight ``@cached`` and ``@memoize`` (see the
    module)."""

    def cached(self, *args: Any, **kwargs: Any) -> Any:
        decorate = super().cached(*args, **kwargs)
        return lambda f: _single_flight(decorate(f))

    def memoize(self, *args: Any, **kwargs: Any) -> Any:
        decorate = super().memoize(*args, **kwargs)
        return lambda f: _single_flight(decorate(f))

    def _flight(self) -> tuple[ShardedSentinelCache, SingleFlight] | None:
        backend = self.cache
        if isinstance(backend, ShardedSentinelCache) and backend.options.stampede_protection:
            return backend, SingleFlight(backend.client, backend.options.stampede_lock_timeout)
        return None

    def get(self, *args: Any, **kwargs: Any) -> Any:
        """Flask-Caching's; in a decorated call, a miss of its key takes the key's lock, or
        waits for the caller that holds it and looks again; with early refresh, a hit about to
        expire is a miss for one caller, who recomputes it (the others keep the value)."""
        state = _call.get()
        flight = None if state is None or state.looked else self._flight()
        if state is None or flight is None:
            return super().get(*args, **kwargs)
        state.looked = True
        backend, single = flight
        key = args[0] if args else kwargs["key"]
        final = backend.resolved_prefix() + key
        early = backend.options.stampede_early_refresh
        if early:
            value, ticket = single.read(final, early)
            value = None if value is MISS else value
        else:
            value, ticket = super().get(*args, **kwargs), None
        if value is not None and ticket is None:
            return value
        ticket = ticket or single.begin(final)
        if ticket is None:  # another caller computed it: stored, unless it was not to be
            return super().get(*args, **kwargs)
        state.key, state.ticket = key, ticket
        return None

    def has(self, *args: Any, **kwargs: Any) -> bool:
        """Flask-Caching's; False for the key a decorated call is to recompute (with
        ``cache_none`` its wrapper asks after a None)."""
        state = _call.get()
        key = args[0] if args else kwargs.get("key")
        if state is not None and state.ticket is not None and key == state.key:
            return False
        return bool(super().has(*args, **kwargs))

    def set(self, *args: Any, **kwargs: Any) -> Any:
        """Flask-Caching's; the decorated call's store of its key releases the key's lock."""
        stored = super().set(*args, **kwargs)
        state = _call.get()
        key = args[0] if args else kwargs.get("key")
        if state is not None and state.ticket is not None and key == state.key:
            state.ticket.end()
        return stored

    def get_many(self, *keys: Any) -> list[Any]:
        """Flask-Caching's; in a decorated call, a missing memoize version (a cold function)
        is added, not set, and read back: every caller adopts the first one's."""
        found = list(super().get_many(*keys))
        state = _call.get()
        if state is None or state.looked or None not in found or self._flight() is None:
            return found
        missing = [
            key
            for key, value in zip(keys, found, strict=True)
            if value is None and str(key).endswith(VERSION_SUFFIX)
        ]
        for key in missing:  # Flask-Caching's version format; they never expire (its default)
            version = base64.b64encode(uuid.uuid4().bytes)[:6].decode("utf-8")
            self.cache.add(key, version, timeout=0)
        return list(super().get_many(*keys)) if missing else found
